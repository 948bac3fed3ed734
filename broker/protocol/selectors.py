"""Parsing and canonical printing of label selector strings, as Gazette's ParseLabelSelector / String.

A selector is a comma-separated list of expressions: `a=b`, `a==b`, `a!=b`, `a in (x,y)`,
`a notin (x,y)` (or `not in`), `a` and `!a`. A name ending in `:prefix` matches values by
prefix. At most one space is allowed around each operator, and a trailing comma is allowed.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

from broker.protocol import pb
from broker.protocol.labels import PREFIX_SUFFIX, add_value
from broker.protocol.paths import go_quote
from broker.protocol.validation import ValidationError, validate_label_selector


class SelectorError(ValidationError):
    """A selector string that does not parse, or parses to an invalid selector."""


# Go's patterns use \pL and \pN, which Python's `re` lacks. Input is matched after folding
# every non-ASCII letter or number to "a" (see _fold); ASCII classes then stand in for \pL\pN,
# and the one-to-one folding keeps match offsets valid in the original string.
_TOKEN = r" ?([A-Za-z0-9\-_+/.]{2,}(?::prefix)?)"
_PATH = r" ?([A-Za-z0-9\-_+/.=%]*)"
_END = r" ?(?:,|\Z)"  # \Z, not $: Python's $ also matches before a trailing newline.
_PAREN = r" ?\(([^)]+)\)"

_EQUAL = re.compile(_TOKEN + r" ?=?=" + _PATH + _END)
_NOT_EQUAL = re.compile(_TOKEN + r" ?!=" + _PATH + _END)
_IN = re.compile(_TOKEN + r" in" + _PAREN + _END)
_NOT_IN = re.compile(_TOKEN + r" not ?in" + _PAREN + _END)
_EXISTS = re.compile(_TOKEN + _END)
_NOT_EXISTS = re.compile(r" ?!" + _TOKEN + _END)
_SET_VALUE = re.compile(_PATH + _END)


def parse_selector(s: str) -> pb.LabelSelector:
    """Parse a selector string and validate the result, raising SelectorError."""
    folded = _fold(s)
    include = pb.LabelSet()
    exclude = pb.LabelSet()
    pos = 0
    while pos < len(s):
        if m := _EQUAL.match(folded, pos):
            include = add_value(include, _group(s, m, 1), _group(s, m, 2))
        elif m := _NOT_EQUAL.match(folded, pos):
            exclude = add_value(exclude, _group(s, m, 1), _group(s, m, 2))
        elif m := _IN.match(folded, pos):
            include = _add_values(include, _group(s, m, 1), _parse_set(s, m, pos))
        elif m := _NOT_IN.match(folded, pos):
            exclude = _add_values(exclude, _group(s, m, 1), _parse_set(s, m, pos))
        elif m := _EXISTS.match(folded, pos):
            include = add_value(include, _group(s, m, 1), "")
        elif m := _NOT_EXISTS.match(folded, pos):
            exclude = add_value(exclude, _group(s, m, 1), "")
        else:
            raise SelectorError(f"could not match {go_quote(s[pos:])} to a label selector expression")
        pos = m.end()

    selector = pb.LabelSelector(include=include, exclude=exclude)
    try:
        validate_label_selector(selector)
    except ValidationError as err:
        raise SelectorError(err.message, err.context) from None
    return selector


def format_selector(sel: pb.LabelSelector) -> str:
    """Return the canonical string of a selector; parse_selector of it yields the same selector."""
    parts = [*_format_groups(sel.include.labels, exclude=False)]
    parts.extend(_format_groups(sel.exclude.labels, exclude=True))
    return ",".join(parts)


def _format_groups(labels: Iterable[pb.Label], exclude: bool) -> list[str]:
    # Group by printed name, so `name` and `name:prefix` are separate groups sorted as printed.
    groups: dict[str, list[str]] = {}
    for label in labels:
        name = label.name + PREFIX_SUFFIX if label.prefix else label.name
        groups.setdefault(name, []).append(label.value)

    out: list[str] = []
    for name in sorted(groups):
        values = sorted(groups[name])
        if values == [""]:
            out.append("!" + name if exclude else name)
        elif len(values) == 1:
            out.append(f"{name}!={values[0]}" if exclude else f"{name}={values[0]}")
        else:
            joined = ",".join(values)
            out.append(f"{name} notin ({joined})" if exclude else f"{name} in ({joined})")
    return out


def _parse_set(s: str, m: re.Match[str], expr_pos: int) -> list[str]:
    """Parse the values within the parentheses of an `in` / `notin` match."""
    begin, end = m.span(2)
    folded = _fold(s[begin:end])
    values: list[str] = []
    pos = 0
    while pos < len(folded):
        vm = _SET_VALUE.match(folded, pos)
        if vm is None:
            err = SelectorError(
                f"could not match {go_quote(s[begin + pos : end])} to a label selector set expression"
            )
            raise err.with_context(f"parsing {go_quote(s[expr_pos:])}")
        values.append(s[begin + vm.start(1) : begin + vm.end(1)])
        pos = vm.end()
    return values


def _add_values(ls: pb.LabelSet, name: str, values: list[str]) -> pb.LabelSet:
    for value in values:
        ls = add_value(ls, name, value)
    return ls


def _group(s: str, m: re.Match[str], index: int) -> str:
    return s[m.start(index) : m.end(index)]


def _fold(s: str) -> str:
    """Replace each non-ASCII letter or number (Go's \\pL, \\pN) with "a", keeping length."""
    if s.isascii():
        return s
    return "".join("a" if not ch.isascii() and unicodedata.category(ch)[0] in "LN" else ch for ch in s)
