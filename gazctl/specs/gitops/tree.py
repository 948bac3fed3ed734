"""Reading a spec repository: every journalspace tree under a directory, templates rendered, all validated.

A spec directory holds journalspace YAML trees (`*.yaml`, `*.yml`), and jinja2 templates of them
(`*.yaml.j2`, `*.yml.j2`) rendered against a values file (`--values`, default `values.yaml` in
the directory when it exists; it is never read as a spec). Hidden files and directories (such as
`.git/` and `.github/`) are skipped. Templates render in jinja2's immutable sandbox: they may
import macros and include files of the directory, but not reach Python internals, change the
values other templates see, or build strings, lists and numbers of unbounded size with `*` and
`**`; anything a template raises is a TreeError at its file and line. Every journal must be
named exactly once across all files.
`revision` and `delete` have no place in such a tree: sync reads revisions from the cluster, and
a journal is deleted by removing it from the tree (`sync --prune`).

A (rendered) file whose top-level mapping has a `shards` key is a shardspace instead: shards and
shard templates (see `shards`), expanded over the tree's journals once every file is read.
"""

from __future__ import annotations

import hashlib
import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.utils import generate_lorem_ipsum

from broker.protocol import pb
from broker.specs import SpecError, strict
from broker.specs.strict import At
from gazctl.specs import journalspace
from gazctl.specs.gitops import shards as shardfiles
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
    shards: dict[str, dict[str, shardfiles.DesiredShard]] = field(default_factory=dict)
    """Every shard declared (templates expanded), by consumer group ("" for the default one) and id (sorted)."""
    notes: list[str] = field(default_factory=list)
    """Things worth saying that are not errors (a template matching no journal)."""
    shard_files: int = 0
    """How many files are shardspaces."""

    def all_shards(self) -> list[shardfiles.DesiredShard]:
        return [shard for group in self.shards.values() for shard in group.values()]


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
    """The variables of a values file: a YAML mapping of names (strings other than `self`) to values."""
    return decode_values(_read(path, "values file"), str(path))


def decode_values(text: str, file: str) -> dict[str, Any]:
    """The variables of the text of a values file (see `load_values`); errors name `file`."""

    def decode(fast: bool) -> dict[str, Any]:
        doc, at = strict.load(text, file, fast=fast)
        if doc is None:
            return {}
        if not isinstance(doc, Mapping):
            raise at.error(f"a values file must be a mapping of names to values; got {strict.describe(doc)}")
        names = strict.names(doc, at, what="template variable")
        if "self" in names:
            raise names["self"][1].error("`self` cannot be a template variable: jinja2 reserves it for the template")
        return {name: value for name, (value, _) in names.items()}

    try:
        return decode(True)  # The safe loader's plain values, as templates have always seen them.
    except SpecError as err:
        decode(False)  # The same error, at its line and column.
        raise err from None


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
    shard_files: list[shardfiles.ShardFile] = []
    texts: dict[str, str] = {}  # Rendered text by file label, to locate a duplicate's line.
    digest = hashlib.sha1()
    for path in files:
        relative = path.relative_to(root).as_posix()
        text = _read(path)
        label = str(path)
        if path.name.endswith(TEMPLATE_SUFFIX):
            text = _render(env, relative, path, variables)
            label = f"{path} (rendered)"
        shard_file = _shard_file(text, label)
        declared = [] if shard_file is not None else _journals_of(text, label)  # Valid Unicode once parsed.
        if shard_file is not None:
            shard_files.append(shard_file)
        else:
            texts[label] = text
        digest.update(os.fsencode(relative) + f"\0{len(text)}\0".encode())
        digest.update(text.encode())
        for journal in declared:
            name = journal.spec.name
            if name in journals:
                first, again = _located(journals[name], texts), _located(journal, texts)
                raise again.at.error(
                    f"journal {name!r} is also declared at {first.at.file}:{first.at.line}; name each journal once"
                )
            journals[name] = journal
    journals = dict(sorted(journals.items()))
    shards, notes = shardfiles.expand(shard_files, {name: j.spec for name, j in journals.items()})
    return SpecTree(root, files, journals, digest.hexdigest(), shards, notes, len(shard_files))


def _shard_file(text: str, label: str) -> shardfiles.ShardFile | None:
    """The shardspace of a file that is one (a top-level `shards` key), else None."""
    if not shardfiles.is_shard_file(text):
        try:
            doc, _ = strict.load(text, label, fast=True) if "shards" in text else (None, None)
        except SpecError:
            return None  # The journalspace decoder reports it.
        if not (isinstance(doc, Mapping) and shardfiles.SHARDS_KEY in doc):
            return None
    return shardfiles.decode(text, label)


def _read(path: Path, what: str = "spec file") -> str:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise TreeError(f"{path}: cannot read {what}: {err.strerror or err}") from None
    return strict.decode_utf8(data, str(path))


MAX_REPEAT = 1 << 24
"""The longest string or list a template may build with `*` (16 Mi items)."""
MAX_POWER_BITS = 1 << 16
"""The largest integer a template may compute with `**` (65,536 bits)."""


class _Sandbox(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox, with `*`, `**` and `lipsum()` bounded (as `range()` is by the sandbox).

    Bounds stop a typo from exhausting memory or time; they cannot stop a template meant to (a loop
    over `range(99999)` within another, a filter given a width of a billion).
    """

    intercepted_binops = frozenset({"*", "**"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.globals["lipsum"] = _lipsum

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            _require_repeat(left, right)
            _require_repeat(right, left)
        elif operator == "**":
            _require_power(left, right)
        return super().call_binop(context, operator, left, right)


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # jinja2's names.
    if not (0 <= n <= 100 and 0 <= min <= 1000 and 0 <= max <= 1000):
        raise SecurityError(f"lipsum({n}, min={min}, max={max}) is larger than 100 paragraphs of 1,000 words")
    return str(generate_lorem_ipsum(n, html, min, max))


def _require_repeat(sequence: Any, times: Any) -> None:
    if isinstance(sequence, (str, list, tuple)) and isinstance(times, int) and len(sequence) * times > MAX_REPEAT:
        raise SecurityError(
            f"{type(sequence).__name__} of {len(sequence):,} items * {times:,} is longer than {MAX_REPEAT:,} items"
        )


def _require_power(base: Any, exponent: Any) -> None:
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and abs(base) > 1
        and exponent * math.log2(abs(base)) > MAX_POWER_BITS
    ):
        raise SecurityError(f"{base} ** {exponent} is larger than {MAX_POWER_BITS:,} bits")


def _environment(root: Path) -> jinja2.Environment:
    # StrictUndefined: a misspelled variable is an error, not an empty string in a spec.
    return _Sandbox(
        loader=jinja2.FileSystemLoader(str(root)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _render(env: jinja2.Environment, name: str, path: Path, variables: Mapping[str, Any]) -> str:
    """Render one template; any error it raises (its own, jinja2's, or Python's) is a TreeError at its line."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Python's SyntaxWarnings of the compiled template (`{{ 1[0] }}`).
            return env.get_template(name).render(variables)
    except jinja2.TemplateSyntaxError as err:
        where = err.filename or str(path)
        raise TreeError(f"{where}:{err.lineno}: template syntax error: {_one_line(err.message)}") from None
    except jinja2.TemplateError as err:
        line = _template_line(err, name)
        raise TreeError(f"{path}:{line}: template error: {_one_line(err.message or err)}") from None
    except RecursionError as err:
        line = _template_line(err, name)
        raise TreeError(f"{path}:{line}: template error: recursion too deep (an include or macro that calls"
                        " itself?)") from None
    except Exception as err:  # A template runs code: whatever it raises is the template's error.
        line = _template_line(err, name)
        raise TreeError(f"{path}:{line}: template error: {type(err).__name__}: {_one_line(err)}") from None


def _one_line(message: object) -> str:
    return " ".join(str(message).split()) or "(no message)"


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

