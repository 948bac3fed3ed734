"""Reading a spec repository: every journalspace tree under a directory, templates rendered, all validated.

A spec directory holds journalspace YAML trees (`*.yaml`, `*.yml`), and jinja2 templates of them
(`*.yaml.j2`, `*.yml.j2`) rendered against a values file (`--values`, default `values.yaml` in
the directory when it exists; it is never read as a spec). Hidden files and directories (such as
`.git/` and `.github/`) are skipped. Every journal must be named exactly once across all files.
`revision` and `delete` have no place in such a tree: sync reads revisions from the cluster, and
a journal is deleted by removing it from the tree (`sync --prune`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from broker.protocol import pb
from broker.specs import strict
from broker.specs.strict import At
from gazctl.specs import journalspace
from gazctl.specs.gitops.errors import TreeError

YAML_SUFFIXES = (".yaml", ".yml")
TEMPLATE_SUFFIX = ".j2"
VALUES_NAME = "values.yaml"


@dataclass(frozen=True)
class DesiredJournal:
    """A journal as the tree declares it: its complete (flattened) spec and where it is named."""

    spec: pb.JournalSpec
    at: At


@dataclass(frozen=True)
class SpecTree:
    """Every journal declared under a directory, by name (sorted), and a digest of the rendered files."""

    root: Path
    files: list[Path]
    journals: dict[str, DesiredJournal]
    digest: str
    """SHA-1 over the files' relative paths and rendered contents: a saved plan is for this tree only."""


def spec_files(root: Path, values: Path | None = None) -> list[Path]:
    """The spec files under `root`, in path order: YAML and YAML templates, not hidden, not `values`."""
    skip = values.resolve() if values is not None else None
    out = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(part.startswith(".") for part in relative.parts) or not path.is_file():
            continue
        name = path.name[: -len(TEMPLATE_SUFFIX)] if path.name.endswith(TEMPLATE_SUFFIX) else path.name
        if name.endswith(YAML_SUFFIXES) and path.resolve() != skip:
            out.append(path)
    return out


def default_values(root: Path) -> Path | None:
    """`values.yaml` at the root of the spec directory, if there is one."""
    path = root / VALUES_NAME
    return path if path.is_file() else None


def load_values(path: Path) -> dict[str, Any]:
    """The variables of a values file: a YAML mapping."""
    try:
        doc = YAML(typ="safe").load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise TreeError(f"{path}: cannot read values file: {err.strerror}") from None
    except YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise TreeError(f"{where}: invalid YAML in values file: {getattr(err, 'problem', err)}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise TreeError(f"{path}: a values file must be a mapping of names to values, not {type(doc).__name__}")
    return doc


def load_tree(root: Path, values: Path | None = None) -> SpecTree:
    """Read, render and validate every spec file under `root` (see the module docstring)."""
    if not root.is_dir():
        raise TreeError(f"{root}: not a directory of spec files")
    if values is None:
        values = default_values(root)
    variables = load_values(values) if values is not None else {}
    files = spec_files(root, values)
    if not files:
        raise TreeError(f"{root}: no spec files (*.yaml, *.yml, *.yaml.j2) found")

    env = _environment(root)
    journals: dict[str, DesiredJournal] = {}
    texts: dict[str, str] = {}  # Rendered text by file label, to locate a duplicate's line.
    digest = hashlib.sha1()
    for path in files:
        relative = path.relative_to(root).as_posix()
        text = _read(path)
        label = str(path)
        if path.name.endswith(TEMPLATE_SUFFIX):
            text = _render(env, relative, path, variables)
            label = f"{path} (rendered)"
        texts[label] = text
        digest.update(f"{relative}\0{len(text)}\0".encode())
        digest.update(text.encode())
        for journal in _journals_of(text, label):
            name = journal.spec.name
            if name in journals:
                first, again = _located(journals[name], texts), _located(journal, texts)
                raise again.at.error(
                    f"journal {name!r} is also declared at {first.at.file}:{first.at.line}; name each journal once"
                )
            journals[name] = journal
    return SpecTree(root, files, dict(sorted(journals.items())), digest.hexdigest())


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise TreeError(f"{path}: cannot read spec file: {err}") from None


def _environment(root: Path) -> jinja2.Environment:
    # StrictUndefined: a misspelled variable is an error, not an empty string in a spec.
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(root)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _render(env: jinja2.Environment, name: str, path: Path, variables: Mapping[str, Any]) -> str:
    try:
        return env.get_template(name).render(**variables)
    except jinja2.TemplateSyntaxError as err:
        where = err.filename or str(path)
        raise TreeError(f"{where}:{err.lineno}: template syntax error: {err.message}") from None
    except jinja2.TemplateError as err:
        line = _template_line(err, name)
        raise TreeError(f"{path}:{line}: template error: {err.message or err}") from None


def _template_line(err: BaseException, name: str) -> int | str:
    """The template line being rendered when `err` was raised (jinja2 maps its frames back to lines)."""
    line: int | str = "?"
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(name):
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _journals_of(text: str, file: str, *, fast: bool = True) -> list[DesiredJournal]:
    """The journals of one spec file; `fast` parses without positions (see `strict.with_positions`)."""

    def decode(fast: bool) -> list[DesiredJournal]:
        root = journalspace.load(text, file, fast=fast)
        _forbid_apply_fields(root)
        return [DesiredJournal(node.spec, node.at or At(file, 1, 1)) for node in journalspace.journal_nodes(root)]

    return strict.with_positions(decode) if fast else decode(False)


def _located(journal: DesiredJournal, texts: Mapping[str, str]) -> DesiredJournal:
    """`journal` as decoded with positions (the fast loader's have none)."""
    for located in _journals_of(texts[journal.at.file], journal.at.file, fast=False):
        if located.spec.name == journal.spec.name:
            return located
    return journal


def _forbid_apply_fields(node: journalspace.Node) -> None:
    for key, why in (
        ("revision", "sync reads each journal's revision from the cluster"),
        ("delete", "remove the journal from the tree and sync with --prune"),
    ):
        if key in node.fields_at:
            raise node.error(f"`{key}` is not allowed in a spec repository: {why}", key)
    for child in node.children:
        _forbid_apply_fields(child)

