"""Fuzzing of spec decoding: YAML, journalspace trees, values files, jinja2 templates, selectors, fragment names.

Inputs are generated with hypothesis: YAML documents (maps, lists and scalars nested at random in
block and flow style, anchors and aliases (undefined, shared, recursive, alias bombs), quoted
scalars with escapes (lone surrogates, control characters, astral characters), tags, deep
nesting, and random edits of all of these), journalspace trees (mostly valid, so decoding reaches
validation, inheritance and hoisting), spec directories (values files, jinja2 templates of random
expressions, filters, loops, macros, imports and includes), label selector strings and fragment
paths. Every decoder must return or raise a GazetteError (anything else is a crash), within the
timeout (else a hang); a journalspace tree which decodes must hoist, dump and decode back to the
same journals; a selector which parses must print and parse back to itself; and gazctl, run on a
sample of the inputs (`journals apply --dry-run`, `plan`), must exit 0, or 1 with one `error:` line,
never with a traceback.

tests/gazctl/specs/test_spec_fuzz.py runs a few hundred inputs in-process (and a few through the CLI). A
longer run prints what it found:

    python -m tests.fuzz.fuzz_specs --minutes 10 [--timeout 10] [--seed N] [--cli-every 40] [--memory-gib 4]
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from broker.errors import GazetteError
from broker.fragment.names import content_name, parse_fragment_from_relative_path
from broker.protocol import pb
from broker.protocol.selectors import format_selector, parse_selector
from broker.specs import strict
from gazctl.specs import journalspace, journalspec
from gazctl.specs.gitops import tree

NOWHERE = "http://127.0.0.1:1"
"""The broker address gazctl is given: nothing listens, so a tree that loads fails UNAVAILABLE."""


# Outcomes.


class Hang(BaseException):
    """Raised by the timer in a decoder that ran past its time (a BaseException: no `except Exception` eats it)."""


@dataclass
class Problem:
    """Something a decoder must never do: `kind` is crash, hang, roundtrip, traceback or malformed.

    Kind `memory` is no failure: a GazetteError that says the input ran out of memory (the long run
    limits its address space, so that a template building gigabytes fails instead of the machine).
    """

    kind: str
    target: str
    detail: str
    input: str
    signature: str = ""
    """What makes two problems the same (a crash's exception type and where it was raised); default: detail."""

    def show(self) -> str:
        shown = self.input if len(self.input) <= 400 else self.input[:400] + f"... ({len(self.input)} chars)"
        return f"[{self.target}] {self.detail}\n    input: {shown!r}"


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise Hang in the block after `seconds` (main thread only: SIGALRM)."""

    def expired(signum: int, frame: Any) -> None:
        raise Hang

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def attempt(target: str, shown: str, fn: Callable[[], Any], timeout: float) -> tuple[str, Any, Problem | None]:
    """Run `fn`: ("ok", result, None), ("error", the GazetteError, None), or a crash or hang Problem."""
    try:
        with time_limit(timeout):
            return "ok", fn(), None
    except GazetteError as err:
        if "MemoryError" in str(err):  # Reported well, but worth counting: what ran out of memory.
            return "error", err, Problem("memory", target, str(err).split(": ", 1)[-1][:200], shown)
        return "error", err, None
    except Hang:
        return "hang", None, Problem("hang", target, f"no answer within {timeout:g} s", shown)
    except Exception as err:
        where = traceback.extract_tb(err.__traceback__)[-1]
        at = f"{Path(where.filename).name}:{where.lineno} in {where.name}"
        detail = f"{type(err).__name__}: {err} (at {at})"
        return "crash", err, Problem("crash", target, detail, shown, signature=f"{type(err).__name__} at {at}")


# Strategies: YAML documents as trees of nodes, emitted as text.


def rare(draw: st.DrawFn, n: int) -> bool:
    """True once in about `n + 1` draws (hypothesis favours small integers, so the largest is the rare one)."""
    return bool(draw(st.integers(0, n)) == n)


@dataclass
class Scalar:
    text: str
    """The scalar as written in YAML (plain, quoted, tagged)."""


@dataclass
class Alias:
    name: str


@dataclass
class Coll:
    kind: str  # "map" or "seq"
    items: list[Any]  # seq: nodes; map: (key, value) pairs
    anchor: str | None = None
    flow: bool = False
    name: str = ""
    """A journalspace node's name (to order siblings)."""


ANCHORS = ("a", "b", "c")

_PLAIN = st.from_regex(r"[A-Za-z][A-Za-z0-9_./=%+-]{0,11}", fullmatch=True)
_CHARS = st.one_of(  # Any character, with lone surrogates and control characters far likelier than at random.
    st.characters(), st.characters(categories=["Cs"]), st.characters(categories=["Cc"]),
    st.sampled_from(["\x85", "\u2028", "\ufeff", "\ufffe", "\U0010ffff", "\x00"]),
)


def texts(chars: st.SearchStrategy[str], min_size: int = 0, max_size: int = 8) -> st.SearchStrategy[str]:
    """Strings of `chars` (`st.text` would drop lone surrogates, which are half the point)."""
    return st.lists(chars, min_size=min_size, max_size=max_size).map("".join)


_ESCAPES = st.sampled_from([
    "\\n", "\\t", "\\\\", '\\"', "\\0", "\\x01", "\\x7f", "\\u00e9", "\\u2028", "\\ud800", "\\udfff",
    "\\ud83d\\ude00", "\\U0001F600", "\\U0010FFFF", "\\uFFFE", "\\N", "\\_", "\\q", "\\x", "\\u12",
])


def _double_quoted(pieces: list[str]) -> str:
    return '"' + "".join(pieces) + '"'


SCALARS = st.one_of(
    _PLAIN.map(Scalar),
    st.sampled_from([
        "~", "null", "true", "false", "yes", "no", "0", "-1", "0x1F", "0o17", "1e400", "-.inf", ".nan", "1_000",
        "9223372036854775808", "-9223372036854775809", "1h30m", "-5s", "0s", "99999999999h", "1.5s", "''", '""',
        "!!binary AAAA", "!!str 1", "!!int x", "!foo x", "!!python/object:os.system x", "!!timestamp 2001-12-14",
        "!!set {a, b}", "!!omap [a: 1]", "|\n  text\n", ">-\n  folded\n", "a b", "a: b", "- a", "#c", "%x", "@x",
        "`x", "'it''s'", "a/", "a/b", "a/b/", "x" * 600, "ü", "名前", "a\tb",
    ]).map(Scalar),
    st.integers().map(lambda n: Scalar(str(n))),
    st.lists(st.one_of(_ESCAPES, _CHARS.filter(lambda c: c not in '"\\')), max_size=8).map(_double_quoted).map(Scalar),
    texts(_CHARS, max_size=6).map(lambda t: Scalar("'" + t.replace("'", "''") + "'")),
)


def _aliases() -> st.SearchStrategy[Alias]:
    return st.sampled_from(ANCHORS).map(Alias)


def _collections(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Coll]:
    anchors = st.one_of(st.none(), st.sampled_from(ANCHORS))
    keys = st.one_of(SCALARS, SCALARS, SCALARS, children)
    seqs = st.builds(Coll, st.just("seq"), st.lists(children, max_size=4), anchors, st.booleans())
    maps = st.builds(Coll, st.just("map"), st.lists(st.tuples(keys, children), max_size=4), anchors, st.booleans())
    return st.one_of(seqs, maps)


NODES = st.recursive(st.one_of(SCALARS, SCALARS, _aliases()), _collections, max_leaves=25)


def emit(node: Any) -> str:
    """The node as a YAML document."""
    return _value(node, 0, "doc") + "\n"


def _flow(node: Any) -> str:
    if isinstance(node, Scalar):
        return node.text
    if isinstance(node, Alias):
        return f"*{node.name}"
    anchor = f"&{node.anchor} " if node.anchor else ""
    if node.kind == "seq":
        return anchor + "[" + ", ".join(_flow(item) for item in node.items) + "]"
    return anchor + "{" + ", ".join(f"{_flow(k)}: {_flow(v)}" for k, v in node.items) + "}"


def _is_block(node: Any) -> bool:
    return isinstance(node, Coll) and not node.flow and bool(node.items)


def _value(node: Any, indent: int, context: str) -> str:
    """`node` after `key:` (context map), after `-` (seq) or alone (doc); later lines at `indent`."""
    if not _is_block(node):
        text = _flow(node)
        if isinstance(node, Scalar) and text.startswith(("|", ">")):  # Block scalars: their lines indented.
            text = text.replace("\n", "\n" + " " * (indent + 2)).rstrip(" ")
        return text if context == "doc" else " " + text
    inner = indent + 2 if context != "doc" else 0
    anchor = f"&{node.anchor}" if node.anchor else ""
    body = _block(node, inner)
    pad = " " * inner
    if context == "map":
        return f" {anchor}\n{pad}{body}" if anchor else f"\n{pad}{body}"
    if context == "seq":
        return f" {anchor}\n{pad}{body}" if anchor else f" {body}"
    return f"{anchor}\n{body}" if anchor else body


def _block(node: Coll, indent: int) -> str:
    pad = "\n" + " " * indent
    if node.kind == "seq":
        return pad.join("-" + _value(item, indent, "seq") for item in node.items)
    lines = []
    for key, value in node.items:
        key_text = _flow(key) if not isinstance(key, Coll) else "? " + _flow(key) + pad
        lines.append(f"{key_text}:{_value(value, indent, 'map')}")
    return pad.join(lines)


EDIT_CHARS = "[]{}:,-?&*!|>'\"#%@`\t\n \\\x00\x85\u2028\ufeff"


@st.composite
def edited(draw: st.DrawFn, source: st.SearchStrategy[str]) -> str:
    """A text with a few random edits: deletions, duplications, and YAML's special characters inserted."""
    text = draw(source)
    for _ in range(draw(st.integers(0, 3))):
        if not text:
            break
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 8)))
        op = draw(st.sampled_from(["delete", "duplicate", "insert", "insert"]))
        if op == "delete":
            text = text[:i] + text[j:]
        elif op == "duplicate":
            text = text[:j] + text[i:j] + text[j:]
        else:
            text = text[:i] + draw(texts(st.sampled_from(EDIT_CHARS) | _CHARS, min_size=1, max_size=3)) + text[i:]
    return text


@st.composite
def deep_documents(draw: st.DrawFn, most: int = 3000) -> str:
    """Deeply nested documents, around the depth limit and far past it."""
    n = draw(st.one_of(st.integers(90, 110), st.integers(1, most)))
    shape = draw(st.sampled_from(["flow-seq", "flow-map", "block-seq", "block-map", "anchored", "mixed", "journals"]))
    if shape == "flow-seq":
        return "[" * n + "x" + "]" * draw(st.sampled_from([n, 0, n // 2]))
    if shape == "flow-map":
        return "{a: " * n + "x" + "}" * n
    if shape == "block-seq":
        return "- " * n + "x\n"
    if shape == "block-map":
        n = min(n, 3000)  # Its text grows with the square of its depth.
        return "".join(" " * i + "a:\n" for i in range(n)) + " " * n + "x\n"
    if shape == "anchored":
        return "".join(f"&a{i} [" for i in range(n)) + "*a0" + "]" * n
    if shape == "journals":
        text, name = "name: d/\nreplication: 1\n", "d/"
        for i in range(min(n, 200)):
            name += "e/"
            text += "  " * i + f"children:\n{'  ' * i}- name: {name}\n"
        return text
    return "a:\n" + "".join("  " * i + "- b: [{c: \n" for i in range(min(n, 500)))


@st.composite
def alias_bombs(draw: st.DrawFn) -> str:
    levels, width = draw(st.integers(1, 40)), draw(st.integers(2, 9))
    lines = ["a0: &a0 [x, x]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    if draw(st.booleans()):  # As a journalspace tree: a directory whose children repeat.
        node = "&n0 {name: a/b}"
        for i in range(1, levels + 1):
            node = f"&n{i} {{name: a/, children: [{node}" + f", *n{i - 1}" * (width - 1) + "]}"
        return f"name: a/\nchildren: [{node}]\n"
    return "\n".join(lines) + "\n"


# Journalspace trees: mostly valid nodes, so that decoding reaches validation, inheritance and hoisting.


@dataclass(frozen=True)
class Choices:
    """Values of a field: valid ones, and junk (drawn now and then)."""

    valid: tuple[str, ...]
    junk: tuple[str, ...]


FIELD_VALUES = {
    "replication": Choices(("1", "2", "3", "5"), ("0", "-1", "6", "2147483648", "three", "[]")),
    "max_append_rate": Choices(("0", "1048576", "9223372036854775807"), ("-1", "9223372036854775808", "x")),
    "revision": Choices(("0", "-1", "17"), ("-2", "9223372036854775808", "1.5")),
    "flags": Choices(("O_RDONLY", "O_WRONLY", "O_RDWR", "4"), ("O_BOGUS", "-1", "4294967296", "[]")),
    "delete": Choices(("false",), ("true", "null", "maybe")),
    "comment": Choices(("a comment", '"quoted: text"', "''"), ('"\\ud800"', "[]", "{a: b}")),
    "length": Choices(("1024", "1048576", "134217728"), ("0", "-1", "9223372036854775808", "1.5")),
    "compression_codec": Choices(("NONE", "GZIP", "ZSTANDARD", "SNAPPY", "GZIP_OFFLOAD_DECOMPRESSION"),
                                 ("INVALID", "LZ4", "3", "gzip")),
    "refresh_interval": Choices(("1m0s", "10s", "1h30m", "5m"), ("0s", "-1s", "1x", "", "9999999999999h", "5")),
    "retention": Choices(("0s", "720h", "1h0m0s"), ("-1s", "forever", "1.5")),
    "flush_interval": Choices(("0s", "6h", "10m"), ("-1m", "1y")),
    "path_postfix_template": Choices(('"date={{.Spool.FirstAppendTime.Format \\"2006-01-02\\"}}"', "plain"),
                                     ('"{{"', '"x}}"', '"{{.Bogus}}"')),
    "level": Choices(("NONE", "PARTIAL", "FULL"), ("HUGE", "7", "-1")),
    "offset": Choices(("0", "123"), ("-1", "x")),
    "label name": Choices(("app.gazette.dev/x", "content-type", "app.gazette.dev/tag", "ab"),
                          ("a", "bad label", "x" * 70, '"\\udfff"', "app.gazette.dev/managed-by")),
    "label value": Choices(("y", "application/x-ndjson", '""', "v1", "a/b"),
                           ("with space", "é", '"\\ud800"', "v" * 2000)),
    "store": Choices(("file:///", '"s3://bucket/prefix/?profile=x"', "file:///sub/"),
                     ("gs://b/", "s3://b", "::", "file:///a/../b/")),
    "segment": Choices(("aa", "bb", "part-000", "part-001", "x.y", "z_1"), ("bad name", "", "ü", "a//b", "..")),
}


@st.composite
def field_value(draw: st.DrawFn, key: str, junk: bool) -> Scalar:
    choices = FIELD_VALUES[key]
    pool = choices.junk if junk and draw(st.booleans()) else choices.valid
    return Scalar(draw(st.sampled_from(pool)))


@st.composite
def journal_nodes(draw: st.DrawFn, prefix: str, depth: int) -> Coll:
    """A journalspace node under directory `prefix`: a journal, or (while `depth` lasts) a directory."""
    junk = rare(draw, 7)
    is_dir = depth > 0 and draw(st.booleans())
    name = prefix + draw(field_value("segment", junk)).text + ("/" if is_dir else "")
    if junk and draw(st.booleans()):
        name = draw(st.sampled_from(["other/", "/abs", prefix, prefix + "../x", "a" * 600]))
    items: list[tuple[Any, Any]] = [(Scalar("name"), Scalar(name))]
    keys = ["replication", "labels", "fragment", "flags", "max_append_rate", "suspend", "comment"]
    keys += ["delete", "revision", "bogus"] if junk else ["revision"] if not is_dir else []
    for key in draw(st.lists(st.sampled_from(keys), unique=True, max_size=4)):
        items.append((Scalar(key), draw(_field(key, junk))))
    if is_dir:
        children = draw(st.lists(journal_nodes(name, depth - 1), min_size=0 if junk else 1, max_size=3,
                                 unique_by=lambda c: c.name))
        if not junk or draw(st.booleans()):
            children.sort(key=lambda c: c.name)
        items.append((Scalar("children"), Coll("seq", list(children), flow=rare(draw, 5))))
    draw(st.randoms()).shuffle(items)
    anchor = draw(st.one_of(st.none(), st.none(), st.sampled_from(ANCHORS)))
    return Coll("map", items, anchor, flow=rare(draw, 5), name=name)


def _field(key: str, junk: bool) -> st.SearchStrategy[Any]:
    if key in FIELD_VALUES:
        return field_value(key, junk)
    if key == "suspend":
        pairs = st.sampled_from(["level", "offset"]).flatmap(lambda k: field_value(k, junk).map(
            lambda v: (Scalar(k), v)))
        return st.lists(pairs, max_size=2, unique_by=lambda p: p[0].text).map(lambda items: Coll("map", items))
    if key == "labels":
        label = st.builds(
            lambda n, v: Coll("map", [(Scalar("name"), n), (Scalar("value"), v)], flow=True),
            field_value("label name", junk), field_value("label value", junk))
        labels = st.lists(label, max_size=3, unique_by=lambda c: c.items[0][1].text)
        return labels.map(lambda items: Coll("seq", sorted(items, key=lambda c: c.items[0][1].text)))
    if key == "fragment":
        fields = ["length", "compression_codec", "refresh_interval", "retention", "flush_interval",
                  "path_postfix_template", "stores"]
        pair = st.sampled_from(fields).flatmap(lambda k: (
            st.lists(field_value("store", junk), max_size=2).map(lambda s: Coll("seq", list(s)))
            if k == "stores" else field_value(k, junk)).map(lambda v: (Scalar(k), v)))
        return st.lists(pair, max_size=5, unique_by=lambda p: p[0].text).map(lambda items: Coll("map", items))
    return SCALARS


VALID_ROOT = [
    (Scalar("replication"), Scalar("1")),
    (Scalar("fragment"), Coll("map", [
        (Scalar("length"), Scalar("1024")), (Scalar("compression_codec"), Scalar("SNAPPY")),
        (Scalar("stores"), Coll("seq", [Scalar("file:///")])), (Scalar("refresh_interval"), Scalar("1m0s")),
    ])),
]


@st.composite
def journalspace_documents(draw: st.DrawFn) -> str:
    """A journalspace tree: a root directory with valid defaults (usually), and generated children."""
    if rare(draw, 4):
        return emit(draw(journal_nodes("", 4)))
    children = draw(st.lists(journal_nodes("topic/", 3), min_size=1, max_size=3, unique_by=lambda c: c.name))
    children.sort(key=lambda c: c.name)
    root = [(Scalar("name"), Scalar("topic/")), *VALID_ROOT, (Scalar("children"), Coll("seq", children))]
    return emit(Coll("map", root))


YAML_DOCUMENTS = st.one_of(
    NODES.map(emit),
    edited(NODES.map(emit)),
    journalspace_documents(),
    edited(journalspace_documents()),
    deep_documents(),
    alias_bombs(),
    texts(_CHARS, max_size=40),
)
"""Every kind of YAML text this module generates."""


# Spec directories: values files and jinja2 templates.

SMALL_INTS = st.integers(-3, 20)
"""Integers of templates in the test suite: loops and widths stay small (the long run also tries huge ones)."""
IDENTIFIERS = ["regions", "parts", "name", "n", "xs", "cfg", "loop", "range", "none"]
FILTERS = [
    "abs", "attr('x')", "batch(2)", "batch(0)", "capitalize", "center(9)", "count", "default(1)", "dictsort",
    "escape", "filesizeformat", "first", "float", "format(1)", "groupby('x')", "indent(2)", "int", "items",
    "join(',')", "last", "length", "list", "lower", "map('upper')", "map(attribute='x')", "max", "min", "pprint",
    "reject('odd')", "rejectattr('x')", "replace('a', 'b')", "reverse", "round", "safe", "select('even')",
    "selectattr('x')", "slice(3)", "slice(0)", "sort", "sort(attribute='x')", "string", "striptags", "sum", "title",
    "tojson", "trim", "truncate(3)", "unique", "upper", "urlencode", "urlize", "wordcount", "wordwrap(3)",
    "xmlattr", "bogus_filter", "int(base=99)", "round(2, 'floor')", "center(100000000000)",
]
ATTRIBUTES = ["upper", "pop", "append", "items", "keys", "__class__", "mro", "format", "join", "split", "real",
              "x", "__len__", "update", "_private", "format_map"]


def _expressions(ints: st.SearchStrategy[int]) -> st.SearchStrategy[str]:
    string = texts(_CHARS, max_size=5).map(repr) | st.sampled_from(
        ["'\\ud800'", "'a\\x00b'", "'%03d'", "'{}'", "'{0.__class__}'", "'%s%s'"])
    atoms = st.one_of(
        ints.map(str), st.floats(allow_nan=True).map(repr).map(lambda s: "(0.0*1e400)" if s in ("nan", "inf") else s),
        string, st.sampled_from(IDENTIFIERS), st.sampled_from(["none", "true", "false", "[]", "{}", "namespace()",
                                                               "cycler(1, 2)", "joiner()", "dict(a=1)", "undefined_x"]),
        ints.map(lambda n: f"range({n})"), ints.map(lambda n: f"lipsum({n})"),
    )

    def compound(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        binop = st.sampled_from(["+", "-", "*", "/", "//", "%", "**", "~", "==", "<", ">=", "in", "and", "or"])
        return st.one_of(
            st.tuples(inner, binop, inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
            st.tuples(inner, st.sampled_from(FILTERS)).map(lambda t: f"({t[0]} | {t[1]})"),
            st.tuples(inner, st.sampled_from(ATTRIBUTES)).map(lambda t: f"{t[0]}.{t[1]}"),
            st.tuples(inner, inner).map(lambda t: f"{t[0]}[{t[1]}]"),
            st.tuples(inner, st.lists(st.one_of(st.none(), ints.map(str)), min_size=2, max_size=3)).map(
                lambda t: f"{t[0]}[{':'.join(x or '' for x in t[1])}]"),
            st.tuples(inner, st.lists(inner, max_size=2)).map(lambda t: f"{t[0]}({', '.join(t[1])})"),
            st.lists(inner, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
            st.tuples(inner, inner).map(lambda t: "{" + f"{t[0]}: {t[1]}" + "}"),
            st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"),
            st.tuples(inner, st.sampled_from(["defined", "odd", "number", "divisibleby(0)", "sameas(1)"])).map(
                lambda t: f"({t[0]} is {t[1]})"),
            inner.map(lambda x: f"(not {x})"), inner.map(lambda x: f"(-{x})"),
        )

    return st.recursive(atoms, compound, max_leaves=6)


def _template_pieces(ints: st.SearchStrategy[int], lib: bool) -> st.SearchStrategy[str]:
    expr = _expressions(ints)
    pieces = [
        expr.map(lambda e: "{{ " + e + " }}"),
        expr.map(lambda e: "{% if " + e + " %}x{% else %}y{% endif %}"),
        expr.map(lambda e: "{% for item in " + e + " %}{{ item }},{% endfor %}"),
        expr.map(lambda e: "{% set v = " + e + " %}{{ v }}"),
        st.sampled_from([
            "{% include 'other.j2' %}", "{% include 't.yaml.j2' %}", "{% include 'missing.j2' %}",
            "{% macro r(n) %}{{ r(n) }}{% endmacro %}{{ r(1) }}", "{% for %}", "{{", "{% endfor %}", "{# x",
            "{% raw %}{{{% endraw %}", "{% extends 'other.j2' %}", "{% block b %}{{ super() }}{% endblock %}",
            "{{ self }}", "{% import 'other.j2' as o %}{{ o.m(1) }}", "{% filter upper %}x{% endfilter %}",
            "{% with a = 1 %}{{ a }}{% endwith %}", "{% do x %}", "{% set ns = namespace(n=0) %}{{ ns.n }}",
        ]),
    ]
    if lib:
        pieces.append(expr.map(lambda e: "{% from '_lib.j2' import journal %}{{ journal(" + e + ") }}"))
    return st.one_of(*pieces)


@st.composite
def values_documents(draw: st.DrawFn, ints: st.SearchStrategy[int] = SMALL_INTS) -> str:
    """A values file: usually a mapping of identifiers to values; now and then odd keys, or no mapping at all."""
    odd = rare(draw, 5)
    keys = st.sampled_from(IDENTIFIERS).map(Scalar)
    if odd:
        keys |= st.sampled_from(["1", "self", "null", "[a]", "{a: b}", "'sp ace'", "true", '"\\ud800"', "~"]).map(
            Scalar) | SCALARS
    values = st.one_of(ints.map(lambda n: Scalar(str(n))), NODES,
                       st.lists(st.sampled_from(["eu-west-1", "us-east-1", "a/b", "ü"]), max_size=4).map(
                           lambda xs: Coll("seq", [Scalar(x) for x in xs], flow=True)))
    doc = Coll("map", draw(st.lists(st.tuples(keys, values), max_size=5)), flow=draw(st.booleans()))
    text = emit(doc)
    return draw(st.one_of(edited(st.just(text)), YAML_DOCUMENTS)) if odd and draw(st.booleans()) else text


HEAD = "name: topic/\nreplication: 1\nfragment: {length: 1024, compression_codec: NONE, refresh_interval: 1m0s}\n"


@st.composite
def spec_dirs(draw: st.DrawFn, ints: st.SearchStrategy[int] = SMALL_INTS) -> dict[str, str | bytes]:
    """A spec directory: a values file, a library of macros, templates and YAML trees, by relative path.

    The main template is a valid tree whose journals' comments hold the generated template code (as
    JSON strings, so that what renders is mostly valid YAML); other files are rarer and wilder.
    """
    files: dict[str, str | bytes] = {}
    if not rare(draw, 4):
        files["values.yaml"] = draw(values_documents(ints))
    files["_lib.j2"] = draw(st.sampled_from([
        "{% macro journal(n) %}- name: topic/{{ n }}{% endmacro %}",
        "{% macro journal(n) %}{{ journal(n) }}{% endmacro %}",
        "{% macro journal(n) %}{{ n / 0 }}{% endmacro %}",
        "{% macro other() %}{% endmacro %}",
    ]))
    files["other.j2"] = draw(st.lists(_template_pieces(ints, False), max_size=2).map("".join))
    journals = []
    for i in range(draw(st.integers(1, 3))):
        body = "".join(draw(st.lists(_template_pieces(ints, True), min_size=1, max_size=3)))
        journals.append(f"- name: topic/part-{i:03}\n  comment: {{% filter tojson %}}{body}{{% endfilter %}}\n")
    if draw(st.booleans()):
        journals.append("{% for i in range(" + str(draw(ints)) + ") %}- name: topic/loop-{{ '%03d' % i }}\n"
                        "{% endfor %}")
    files["t.yaml.j2"] = HEAD + "children:\n" + "".join(journals)
    if rare(draw, 5):
        files["raw.yaml.j2"] = "".join(draw(st.lists(_template_pieces(ints, True), min_size=1, max_size=4)))
    if rare(draw, 5):
        files["plain.yaml"] = draw(YAML_DOCUMENTS)
    if rare(draw, 9):
        files["bad.yaml"] = draw(st.binary(max_size=12))
    return files


# Selectors and fragment names.

SELECTOR_TOKENS = st.sampled_from(["app.gazette.dev/x", "name", "prefix", "ab", "a-b_c+d", "x:prefix", "é1", "a", "ß"])
SELECTOR_VALUES = st.sampled_from(["", "v", "a/b/", "x=y", "%20", "é", "a b", "a,b", "(x)"])


@st.composite
def selector_strings(draw: st.DrawFn) -> str:
    """Selector-like strings: expressions of Gazette's grammar with odd spacing, names and values."""
    exprs = []
    for _ in range(draw(st.integers(0, 4))):
        name = draw(SELECTOR_TOKENS)
        sp = draw(st.sampled_from(["", " ", "  "]))
        form = draw(st.sampled_from(["=", "==", "!=", "in", "notin", "not in", "exists", "!"]))
        if form in ("in", "notin", "not in"):
            values = draw(st.lists(SELECTOR_VALUES, max_size=3))
            exprs.append(f"{name} {form}{sp}({', '.join(values)})")
        elif form == "exists":
            exprs.append(name)
        elif form == "!":
            exprs.append("!" + name)
        else:
            exprs.append(f"{name}{sp}{form}{sp}{draw(SELECTOR_VALUES)}")
    text = draw(st.sampled_from([",", ", ", " ,"])).join(exprs) + draw(st.sampled_from(["", ",", " ", "\n"]))
    return draw(st.one_of(st.just(text), edited(st.just(text)), texts(_CHARS, max_size=12)))


HEX = st.text("0123456789abcdefABCDEF", max_size=18)


@st.composite
def fragment_paths(draw: st.DrawFn) -> tuple[str, str]:
    """(journal, path relative to it) of a fragment file: well-formed ones, near misses, and junk.

    Each part (journal, offsets, sum, extension, postfix, separators) is now and then replaced by junk,
    lone surrogates among it (as `os.listdir` gives for the bytes of a name that is not UTF-8).
    """
    chars = _CHARS
    if rare(draw, 9):
        return draw(texts(chars, max_size=6)), draw(texts(chars, max_size=60))
    journal = draw(st.sampled_from(["a/b", "journal/part-000", "x/y=z"]))
    if rare(draw, 4):
        journal = draw(st.sampled_from(["j", "", "a//b", "/a"]) | texts(chars, max_size=6))
    begin = draw(st.integers(0, 2**63 - 1))
    end = draw(st.integers(begin, 2**63 - 1))
    fields = [f"{begin:016x}", f"{end:016x}", draw(st.binary(min_size=20, max_size=20)).hex()]
    if rare(draw, 4):
        i = draw(st.integers(0, 2))
        fields[i] = draw(st.one_of(HEX, texts(chars, max_size=4), st.sampled_from(["+1", "-1", "8" + "0" * 15])))
    ext = draw(st.sampled_from([".raw", ".gz", ".gzip", ".zst", ".sz", ".snappy", "", ".gzod", ".GZ"]))
    if rare(draw, 4):
        ext = draw(st.sampled_from([".lz4", "."]) | texts(chars, max_size=4).map(lambda t: "." + t))
    postfix = draw(st.sampled_from(["", "", "a/", "date=2024-01-01/", "x/y/"]))
    if rare(draw, 4):
        postfix = draw(st.sampled_from(["../", "/", "a//b/", "./"]) | texts(chars, max_size=6).map(lambda t: t + "/"))
    sep = "-" if not rare(draw, 9) else draw(st.sampled_from(["--", "_", ""]))
    return journal, postfix + sep.join(fields) + ext


# Checks: each returns the problems one input shows.


def check_yaml(text: str, timeout: float = 10.0) -> list[Problem]:
    """Both loaders, then every decoder of YAML text: each returns or raises a GazetteError."""
    problems = []
    for target, fn in (
        ("yaml.fast", lambda: strict.load(text, "f.yaml", fast=True)),
        ("yaml.rt", lambda: strict.load(text, "f.yaml")),
        ("values", lambda: tree.decode_values(text, "values.yaml")),
    ):
        problem = attempt(target, text, fn, timeout)[2]
        if problem:
            problems.append(problem)
    return problems + check_journalspace(text, timeout)


def check_journalspace(text: str, timeout: float = 10.0) -> list[Problem]:
    """Decode and flatten a tree; one that decodes must hoist, dump and decode back to the same journals."""
    outcome, flat, problem = attempt("journalspace", text, lambda: journalspace.load_flat(text, "f.yaml"), timeout)
    if problem or outcome != "ok" or any(f.delete for f in flat):
        return [problem] if problem else []
    pairs = [(f.spec, f.expect_mod_revision) for f in flat]

    def round_trip() -> list[journalspace.FlatSpec]:
        return journalspace.load_flat(journalspace.dump(journalspace.hoist(pairs)), "dumped.yaml")

    outcome, again, problem = attempt("journalspace.hoist", text, round_trip, timeout)
    if problem:
        return [problem]
    if outcome != "ok":
        return [Problem("roundtrip", "journalspace.hoist", f"the dumped tree does not decode: {again}", text)]
    want = sorted((_comparable(f.spec), f.expect_mod_revision) for f in flat)
    got = sorted((_comparable(f.spec), f.expect_mod_revision) for f in again)
    if want != got:
        return [Problem("roundtrip", "journalspace.hoist", "hoist/dump/decode changed the journals", text)]
    return []


def _comparable(spec: pb.JournalSpec) -> bytes:
    """The spec's bytes, without an empty `suspend` (`suspend: {}` decodes to one; a dumped tree omits it)."""
    spec = journalspec.copy(spec)
    if not (spec.suspend.level or spec.suspend.offset):
        spec.ClearField("suspend")
    return spec.SerializeToString(deterministic=True)


def write_dir(root: Path, files: dict[str, str | bytes]) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_bytes(content.encode("utf-8", "surrogatepass"))


def show_dir(files: dict[str, str | bytes]) -> str:
    return " | ".join(f"{name}: {content!r}" for name, content in files.items())


def check_tree(files: dict[str, str | bytes], timeout: float = 10.0) -> list[Problem]:
    """Read a spec directory in-process (`load_tree`, as plan does)."""
    root = Path(tempfile.mkdtemp(prefix="fuzz-specs-"))
    try:
        write_dir(root, files)
        problem = attempt("tree", show_dir(files), lambda: tree.load_tree(root), timeout)[2]
        return [problem] if problem else []
    finally:
        shutil.rmtree(root, ignore_errors=True)


def check_selector(text: str, timeout: float = 5.0) -> list[Problem]:
    """A selector string parses, or raises; one that parses prints as a string that parses back to it."""
    outcome, sel, problem = attempt("selector", text, lambda: parse_selector(text), timeout)
    if problem or outcome != "ok":
        return [problem] if problem else []
    printed = format_selector(sel)
    outcome, again, problem = attempt("selector.format", printed, lambda: parse_selector(printed), timeout)
    if problem:
        return [problem]
    if outcome != "ok" or again != sel or format_selector(again) != printed:
        detail = f"format_selector gives {printed!r}, which parses to {again}"
        return [Problem("roundtrip", "selector.format", detail, text)]
    return []


def check_fragment(journal: str, rel: str, timeout: float = 5.0) -> list[Problem]:
    """A fragment path parses, or raises FragmentNameError; one that parses names itself again."""
    shown = f"journal={journal!r} path={rel!r}"
    outcome, frag, problem = attempt(
        "fragment", shown, lambda: parse_fragment_from_relative_path(journal, rel), timeout)
    if problem or outcome != "ok":
        return [problem] if problem else []
    again = parse_fragment_from_relative_path(journal, (frag.path_postfix + "/" if frag.path_postfix else "")
                                              + content_name(frag))
    if frag.begin == frag.end:  # An empty fragment is named by the all-zero sum, whatever its own.
        frag.ClearField("sum")
        again.ClearField("sum")
    if again != frag:
        detail = f"its name does not parse back to it: {content_name(frag)} is {again}, not {frag}"
        return [Problem("roundtrip", "fragment", " ".join(detail.split()), shown)]
    return []


def check_cli(args: list[str], cwd: Path, shown: str, target: str, timeout: float = 60.0) -> list[Problem]:
    """gazctl ARGS exits 0, or 1 with one `error:` line; never a traceback, a signal or another status."""
    from tests.support.harness import run_gazctl

    try:
        done = run_gazctl(None, *args, cwd=cwd, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [Problem("hang", target, f"gazctl gave no answer within {timeout:g} s", shown)]
    if "Traceback" in done.stderr or "Traceback" in done.stdout:
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        return [Problem("traceback", target, f"gazctl printed a traceback ending {last!r}", shown)]
    if done.returncode not in (0, 1):
        return [Problem("crash", target, f"gazctl exited {done.returncode}: {done.stderr[-300:]!r}", shown)]
    lines = done.stderr.splitlines()
    if done.returncode == 1 and not (len(lines) == 1 and lines[0].startswith("error: ")):
        return [Problem("malformed", target, f"exit 1 without one error line: {done.stderr[-300:]!r}", shown)]
    return []


def check_cli_apply(text: str) -> list[Problem]:
    with tempfile.TemporaryDirectory(prefix="fuzz-specs-") as tmp:
        path = Path(tmp) / "journals.yaml"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        return check_cli(["journals", "apply", "--dry-run", "--specs", str(path)], Path(tmp), text, "cli.apply")


def check_cli_plan(files: dict[str, str | bytes]) -> list[Problem]:
    with tempfile.TemporaryDirectory(prefix="fuzz-specs-") as tmp:
        root = Path(tmp) / "specs"
        root.mkdir()
        write_dir(root, files)
        args = ["plan", str(root), "--owner", "fuzz", "--broker.address", NOWHERE]
        return check_cli(args, Path(tmp), show_dir(files), "cli.plan")


# The long run.


@dataclass
class Tally:
    inputs: Counter[str] = field(default_factory=Counter)
    problems: Counter[str] = field(default_factory=Counter)
    where: Counter[str] = field(default_factory=Counter)
    """Problems by kind and target (`crash fragment`)."""
    samples: dict[str, list[str]] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)

    def add(self, target: str, problems: list[Problem]) -> None:
        self.inputs[target] += 1
        for problem in problems:
            self.problems[problem.kind] += 1
            self.where[f"{problem.kind} {problem.target}"] += 1
            # One sample per distinct failure (its kind, target and signature).
            key = f"{problem.kind} {problem.target} {problem.signature or problem.detail[:120]}"
            if key not in self.seen and len(self.samples.get(problem.kind, [])) < 10:
                self.seen.add(key)
                self.samples.setdefault(problem.kind, []).append(problem.show())


def run(minutes: float, timeout: float, base_seed: int | None, cli_every: int) -> Tally:
    tally = Tally()
    end = time.monotonic() + minutes * 60
    rng = random.Random(base_seed)
    huge_ints = st.one_of(st.integers(-3, 50), st.sampled_from([10**6, 10**12, 2**63, -(2**63), 10**100]))
    count = 0

    def sample_cli() -> bool:
        nonlocal count
        count += 1
        return cli_every > 0 and count % cli_every == 0

    def fuzz_yaml(text: str) -> None:
        if time.monotonic() < end:
            tally.add("yaml", check_yaml(text, timeout))
            if sample_cli():
                tally.add("cli.apply", check_cli_apply(text))

    def fuzz_dir(files: dict[str, str | bytes]) -> None:
        if time.monotonic() < end:
            tally.add("tree", check_tree(files, timeout))
            if sample_cli():
                tally.add("cli.plan", check_cli_plan(files))

    def fuzz_selector(text: str) -> None:
        if time.monotonic() < end:
            tally.add("selector", check_selector(text, timeout))

    def fuzz_fragment(path: tuple[str, str]) -> None:
        if time.monotonic() < end:
            tally.add("fragment", check_fragment(*path, timeout=timeout))

    batches: list[tuple[st.SearchStrategy[Any], Callable[[Any], None]]] = [
        (YAML_DOCUMENTS, fuzz_yaml),
        (st.one_of(deep_documents(most=200_000), alias_bombs()), fuzz_yaml),
        (spec_dirs(huge_ints), fuzz_dir),
        (selector_strings(), fuzz_selector),
        (fragment_paths(), fuzz_fragment),
    ]
    log(f"fuzzing spec decoding for {minutes:g} minutes")
    while time.monotonic() < end:
        for strategy, fuzz in batches:
            # Batches of inputs, each from a seed of its own (drawn from --seed, if given).
            test = settings(max_examples=200, deadline=None, database=None, phases=[Phase.generate],
                            suppress_health_check=list(HealthCheck))(given(strategy)(fuzz))
            if base_seed is not None:
                test = seed(rng.getrandbits(64))(test)
            test()
        log(f"{sum(tally.inputs.values())} inputs: " + ", ".join(f"{n} {k}" for k, n in tally.problems.items()))
    return tally


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def report(tally: Tally, minutes: float) -> str:
    lines = [
        f"Spec decoding fuzzing, {minutes:g} minutes",
        f"inputs tried:   {sum(tally.inputs.values())} ("
        + ", ".join(f"{target} {n}" for target, n in sorted(tally.inputs.items())) + ")",
        f"crashes:        {tally.problems['crash']} (exceptions other than GazetteError)",
        f"hangs:          {tally.problems['hang']}",
        f"tracebacks:     {tally.problems['traceback']} (printed by gazctl)",
        f"malformed:      {tally.problems['malformed']} (gazctl exit 1 without one error line)",
        f"round trips:    {tally.problems['roundtrip']} (hoist/dump or format/parse that changed the value)",
        f"out of memory:  {tally.problems['memory']} (reported as one-line errors; not failures)",
    ]
    if tally.where:
        lines.append("by target:      " + ", ".join(f"{where} {n}" for where, n in sorted(tally.where.items())))
    for kind, samples in tally.samples.items():
        lines.append(f"\n{kind} (distinct, first {len(samples)}):")
        lines += [f"  {s}" for s in samples]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds one decoder may take (a hang)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--cli-every", type=int, default=40, help="run gazctl on every Nth input (0: never)")
    parser.add_argument("--memory-gib", type=float, default=4.0, help="address space limit of the run (and gazctl)")
    args = parser.parse_args(argv)
    limit = int(args.memory_gib * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    tally = run(args.minutes, args.timeout, args.seed, args.cli_every)
    print(report(tally, args.minutes))
    return 1 if sum(n for kind, n in tally.problems.items() if kind != "memory") else 0


if __name__ == "__main__":
    sys.exit(main())
