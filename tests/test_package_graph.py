"""The packages import one another in one direction only (docs/architecture.md draws the graph):

    broker.errors <- broker.protocol <- broker.stores, broker.keyspace, broker.specs <- broker.fragment
    <- broker.client, the broker service <- consumer <- gazctl, pipelines (gazctl drives pipelines)

Every import is counted, at module level or inside a function: a lazy import is a dependency too.
"""

from __future__ import annotations

import ast

import pytest

from tests.harness import ROOT

PACKAGES = ("broker", "consumer", "gazctl", "pipelines")
BROKER_LAYERS = ("protocol", "stores", "keyspace", "specs", "fragment", "client")
SERVICE = "broker.(service)"  # broker's own modules and the packages not named above (e.g. gateway).

ALLOWED: dict[str, set[str]] = {
    "broker.errors": set(),
    "broker.protocol": {"broker.errors"},
    "broker.stores": {"broker.errors", "broker.protocol"},
    "broker.keyspace": {"broker.errors", "broker.protocol"},
    "broker.specs": {"broker.errors", "broker.protocol"},
    "broker.fragment": {"broker.errors", "broker.protocol", "broker.stores"},
    "broker.client": {"broker.errors", "broker.protocol", "broker.fragment"},
    SERVICE: {"broker.errors", "broker.protocol", "broker.stores", "broker.keyspace", "broker.specs",
              "broker.fragment"},
}
"""What each part of `broker` may import, besides itself."""


def unit_of(module: str) -> str:
    """The part of the project a module belongs to: a broker layer, or a top-level package."""
    parts = module.split(".")
    if parts[0] != "broker":
        return parts[0]
    if len(parts) > 1 and (parts[1] in BROKER_LAYERS or parts[1] == "errors"):
        return f"broker.{parts[1]}"
    return SERVICE


def may_import(importer: str, imported: str) -> bool:
    top, imported_top = importer.split(".")[0], imported.split(".")[0]
    if importer == imported:
        return True
    if top == "broker":
        return imported in ALLOWED[importer]
    if top == "consumer":
        return imported_top in ("broker", "consumer")
    if top == "pipelines":
        return imported_top in ("broker", "consumer")
    if top == "gazctl":
        return imported_top in ("broker", "consumer", "pipelines")
    raise AssertionError(f"unknown package {top}")


def project_imports() -> list[tuple[str, int, str, str]]:
    """(file, line, importing module, imported module) of every import of a project package."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                for name in names:
                    if name.split(".")[0] in PACKAGES:
                        found.append((str(path.relative_to(ROOT)), node.lineno, module, name))
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


@pytest.mark.parametrize(
    ("importer", "imported", "allowed"),
    [
        ("broker.fragment.spool", "gazctl.errors", False),
        ("broker.append", "pipelines.errors", False),
        ("broker.client.reader", "consumer.message", False),
        ("broker.protocol.labels", "broker.fragment", False),
        ("broker.client.dial", "broker.append", False),
        ("consumer.message.framing", "gazctl.selectors", False),
        ("consumer.message.framing", "pipelines.source", False),
        ("pipelines.definitions.load", "gazctl.errors", False),
        ("gazctl.commands.pipelines", "pipelines.definitions", True),
        ("broker.append", "broker.fragment.spool", True),
        ("broker.client.fragments", "broker.fragment.codecs", True),
        ("consumer.message.publisher", "broker.client", True),
    ],
)
def test_the_rules_catch_what_they_name(importer: str, imported: str, allowed: bool) -> None:
    assert may_import(unit_of(importer), unit_of(imported)) is allowed
