"""The packages import one another in one direction only (docs/architecture.md draws the graph):

    broker.errors <- broker.protocol <- broker.stores, cluster.keyspace, broker.specs <- broker.fragment
    <- broker.client, cluster.server <- the broker service
    (the layers and cluster, not the broker service) <- consumer <- gazctl, pipelines
    (gazctl drives pipelines)
    everything <- gazette (the `gazette` command: `serve` and `consume` side by side)

Every import is counted, at module level or inside a function: a lazy import is a dependency too.
And no module imports itself back through others: the modules' import graph has no circle,
counting imports under `if TYPE_CHECKING:` too (a type-only import is still a dependency a reader
follows, and a circle closed by one is a circle of the design; `from __future__ import
annotations` leaves no need for it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.harness import ROOT

PACKAGES = ("broker", "cluster", "consumer", "gazctl", "gazette", "pipelines")
BROKER_LAYERS = ("protocol", "stores", "specs", "fragment", "client")
SERVICE = "broker.(service)"  # broker's own modules and the packages not named above (e.g. gateway).

ALLOWED: dict[str, set[str]] = {
    "broker.errors": set(),
    "broker.protocol": {"broker.errors"},
    "broker.stores": {"broker.errors", "broker.protocol"},
    "cluster.keyspace": {"broker.errors", "broker.protocol"},
    "broker.specs": {"broker.errors", "broker.protocol"},
    "broker.fragment": {"broker.errors", "broker.protocol", "broker.stores"},
    "broker.client": {"broker.errors", "broker.protocol", "broker.fragment"},
    "cluster.server": {"broker.errors", "broker.protocol", "cluster.keyspace", "broker.specs"},
    SERVICE: {"broker.errors", "broker.protocol", "broker.stores", "cluster.keyspace", "broker.specs",
              "broker.fragment", "cluster.server"},
}
"""What each part of `broker` and `cluster` may import, besides itself."""

RUNTIME_LAYERS = {*ALLOWED[SERVICE], "broker.client"}
"""What the packages above the runtimes may import of them: every layer of `broker` and `cluster`,
never the broker service (its gateway, server, command line, ...): that `gazette` alone does."""


def unit_of(module: str) -> str:
    """The part of the project a module belongs to: a broker or cluster layer, or a top-level package."""
    parts = module.split(".")
    if parts[0] == "cluster":
        return f"cluster.{parts[1]}" if len(parts) > 1 else "cluster.keyspace"  # The face names no layer.
    if parts[0] != "broker":
        return parts[0]
    if len(parts) > 1 and (parts[1] in BROKER_LAYERS or parts[1] == "errors"):
        return f"broker.{parts[1]}"
    return SERVICE


def may_import(importer: str, imported: str) -> bool:
    top, imported_top = importer.split(".")[0], imported.split(".")[0]
    if importer == imported:
        return True
    if top in ("broker", "cluster"):
        return imported in ALLOWED[importer]
    if top == "gazette":
        return True
    if imported in RUNTIME_LAYERS:
        return True
    if top == "consumer":
        return imported_top == "consumer"
    if top == "pipelines":
        return imported_top == "consumer"
    if top == "gazctl":
        return imported_top in ("consumer", "pipelines")
    raise AssertionError(f"unknown package {top}")


def project_modules() -> dict[str, Path]:
    """Every module of the packages (generated stubs aside), by dotted name."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports_of(path: Path) -> Iterator[tuple[int, str]]:
    """(line, imported name) of each import of a project package in `path`: for `from P import N`,
    P.N where that is a module, else P."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def project_imports() -> list[tuple[str, int, str, str]]:
    """(file, line, importing module, imported module) of every import of a project module."""
    modules = project_modules()
    found = []
    for module, path in modules.items():
        for line, name in imports_of(path):
            if name.split(".")[0] not in PACKAGES:
                continue
            while name not in modules and "." in name:  # `from P import N` of a name N, not a module.
                name = name.rpartition(".")[0]
            found.append((str(path.relative_to(ROOT)), line, module, name))
    return found


def test_every_import_points_down_the_graph() -> None:
    imports = project_imports()
    assert len(imports) > 300  # The walk found the project's modules.
    wrong = [
        f"{file}:{line}: {unit_of(module)} imports {imported} ({unit_of(imported)})"
        for file, line, module, imported in imports
        if not may_import(unit_of(module), unit_of(imported))
    ]
    assert not wrong, "imports against the package graph:\n" + "\n".join(wrong)


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_back() -> None:
    edges: dict[str, set[str]] = {}
    for _, _, module, imported in project_imports():
        if imported != module:
            edges.setdefault(module, set()).add(imported)
    found = circles(edges)
    assert not found, "modules that import one another in a circle:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_circles_are_found() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize(
    ("importer", "imported", "allowed"),
    [
        ("broker.fragment.spool", "gazctl.errors", False),
        ("broker.append", "pipelines.errors", False),
        ("broker.client.reader", "consumer.message", False),
        ("broker.protocol.labels", "broker.fragment", False),
        ("broker.client.dial", "broker.append", False),
        ("cluster.keyspace.keyspace", "broker.fragment", False),
        ("cluster.server.listener", "broker.append", False),
        ("cluster.server.listener", "consumer.process", False),
        ("cluster.keyspace.allocator", "cluster.server.logs", False),
        ("consumer.message.framing", "gazctl.selectors", False),
        ("consumer.message.framing", "pipelines.source", False),
        ("pipelines.definitions.load", "gazctl.errors", False),
        ("gazctl.commands.pipelines", "pipelines.definitions", True),
        ("broker.append", "broker.fragment.spool", True),
        ("broker.server", "cluster.server.listener", True),
        ("consumer.process", "cluster.server.listener", True),
        ("broker.client.fragments", "broker.fragment.codecs", True),
        ("consumer.message.publisher", "broker.client", True),
        ("consumer.process", "broker.gateway", False),
        ("consumer.process", "broker.server", False),
        ("consumer.cli", "broker.cli", False),
        ("consumer.cli", "gazette.cli", False),
        ("consumer.process", "cluster.server.http", True),
        ("consumer.cli", "cluster.server.command", True),
        ("gazctl.commands.common", "broker.service", False),
        ("pipelines.source.read", "broker.gateway.read", False),
        ("broker.cli", "gazette.cli", False),
        ("cluster.server.http.server", "broker.gateway", False),
        ("broker.gateway.routes", "cluster.server.http.server", True),
        ("gazette.cli", "broker.cli", True),
        ("gazette.cli", "consumer.cli", True),
    ],
)
def test_the_rules_catch_what_they_name(importer: str, imported: str, allowed: bool) -> None:
    assert may_import(unit_of(importer), unit_of(imported)) is allowed
