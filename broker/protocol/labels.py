"""Well-known label names, LabelSet construction and algebra, and selector matching.

A LabelSet is a multi-map kept sorted by (name, value) with no duplicates. Every helper here
returns a new `pb.LabelSet` (or `pb.LabelSelector`) and leaves its arguments unchanged.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence

from broker.protocol import pb

CONTENT_TYPE = "content-type"
"""A MIME type (RFC 1521) of journal content; single-valued."""
CONTENT_TYPE_CSV = "text/csv"
CONTENT_TYPE_JSON_LINES = "application/x-ndjson"
CONTENT_TYPE_PROTO_FIXED = "application/x-protobuf-fixed"
CONTENT_TYPE_RECOVERY_LOG = "application/x-gazette-recoverylog"

MESSAGE_TYPE = "app.gazette.dev/message-type"
"""Single-valued; requires CONTENT_TYPE."""
MESSAGE_SUB_TYPE = "app.gazette.dev/message-subtype"
"""Single-valued; requires MESSAGE_TYPE."""
TAG = "app.gazette.dev/tag"
MANAGED_BY = "app.gazette.dev/managed-by"
INSTANCE = "app.gazette.dev/instance"
REGION = "app.gazette.dev/region"

META_NAME = "name"
"""Meta-label carrying a journal's name; implicit on every journal and reserved."""
META_PREFIX = "prefix"
"""Meta-label of List selectors, rewritten to `name:prefix`; reserved."""

SINGLE_VALUE_LABELS = frozenset({CONTENT_TYPE, INSTANCE, MANAGED_BY, MESSAGE_SUB_TYPE, MESSAGE_TYPE, REGION})
"""Labels which may have at most one value in a LabelSet."""

PREFIX_SUFFIX = ":prefix"
"""Suffix of a selector label name which makes its value match as a prefix."""


def label_set(*pairs: tuple[str, str]) -> pb.LabelSet:
    """Build a LabelSet from (name, value) pairs via add_value; the result is not validated."""
    out = pb.LabelSet()
    for name, value in pairs:
        _insert(out, name, value)
    return out


def label_set_from_mapping(mapping: Mapping[str, str | Sequence[str]]) -> pb.LabelSet:
    """Build a LabelSet from a name -> value (or name -> values) mapping."""
    out = pb.LabelSet()
    for name, values in mapping.items():
        for value in [values] if isinstance(values, str) else values:
            _insert(out, name, value)
    return out


def values_of(ls: pb.LabelSet, name: str) -> list[str]:
    """Return every value of label `name`, in order (empty if absent)."""
    return [label.value for label in _group(ls.labels, name)]


def value_of(ls: pb.LabelSet, name: str) -> str | None:
    """Return the first value of label `name`, or None if absent."""
    group = _group(ls.labels, name)
    return group[0].value if group else None


def add_value(ls: pb.LabelSet, name: str, value: str) -> pb.LabelSet:
    """Return `ls` plus label (name, value) in sorted position; exact duplicates are ignored."""
    out = _copy(ls)
    _insert(out, name, value)
    return out


def set_value(ls: pb.LabelSet, name: str, value: str) -> pb.LabelSet:
    """Return `ls` with every value of `name` replaced by the single `value`."""
    base, prefix = split_prefix(name)
    labels = [_clone(label) for label in ls.labels if label.name != base]
    pos = bisect.bisect_left([label.name for label in labels], base)
    labels.insert(pos, pb.Label(name=base, value=value, prefix=prefix))
    return pb.LabelSet(labels=labels)


def remove(ls: pb.LabelSet, name: str) -> pb.LabelSet:
    """Return `ls` without any label `name`."""
    return pb.LabelSet(labels=[_clone(label) for label in ls.labels if label.name != name])


def union(lhs: pb.LabelSet, rhs: pb.LabelSet) -> pb.LabelSet:
    """Return every name group of either set; where both have a name, `lhs`'s values win."""
    out = pb.LabelSet()
    for left, right in _join(lhs.labels, rhs.labels):
        out.labels.extend(left if left else right)
    return out


def intersect(lhs: pb.LabelSet, rhs: pb.LabelSet) -> pb.LabelSet:
    """Return the name groups whose complete value lists are equal in both sets."""
    out = pb.LabelSet()
    for left, right in _join(lhs.labels, rhs.labels):
        if _values(left) == _values(right):
            out.labels.extend(left)
    return out


def subtract(lhs: pb.LabelSet, rhs: pb.LabelSet) -> pb.LabelSet:
    """Return `lhs`'s name groups except those whose value lists `rhs` matches exactly."""
    out = pb.LabelSet()
    for left, right in _join(lhs.labels, rhs.labels):
        if _values(left) != _values(right):
            out.labels.extend(left)
    return out


def matches(selector: pb.LabelSelector, labels: pb.LabelSet) -> bool:
    """Whether `labels` has no matched exclude group and matches every include group."""
    by_name: dict[str, list[str]] = {}
    for label in labels.labels:
        by_name.setdefault(label.name, []).append(label.value)

    if any(_group_matches(group, by_name) for group in _groups(selector.exclude.labels)):
        return False
    return all(_group_matches(group, by_name) for group in _groups(selector.include.labels))


def journal_label_set(spec: pb.JournalSpec) -> pb.LabelSet:
    """Return the spec's labels plus the implicit meta-label `name`, as selectors see them."""
    return add_value(spec.labels, META_NAME, spec.name)


def rewrite_prefix_meta_label(selector: pb.LabelSelector) -> pb.LabelSelector:
    """Rewrite each `prefix=X` of include and exclude to `name:prefix=X`, as List does."""
    out = pb.LabelSelector()
    for src, dst in ((selector.include, out.include), (selector.exclude, out.exclude)):
        rewritten = remove(src, META_PREFIX)
        for value in values_of(src, META_PREFIX):
            _insert(rewritten, META_NAME + PREFIX_SUFFIX, value)
        dst.CopyFrom(rewritten)
    return out


def split_prefix(name: str) -> tuple[str, bool]:
    """Split a `name:prefix` selector name into (name, True); other names give (name, False)."""
    if name.endswith(PREFIX_SUFFIX):
        return name[: -len(PREFIX_SUFFIX)], True
    return name, False


def _insert(ls: pb.LabelSet, name: str, value: str) -> None:
    base, prefix = split_prefix(name)
    keys = [(label.name, label.value) for label in ls.labels]
    pos = bisect.bisect_left(keys, (base, value))
    if pos < len(keys) and keys[pos] == (base, value) and ls.labels[pos].prefix == prefix:
        return  # Exact duplicate.
    ls.labels.insert(pos, pb.Label(name=base, value=value, prefix=prefix))


def _copy(ls: pb.LabelSet) -> pb.LabelSet:
    out = pb.LabelSet()
    out.CopyFrom(ls)
    return out


def _clone(label: pb.Label) -> pb.Label:
    return pb.Label(name=label.name, value=label.value, prefix=label.prefix)


def _group(labels: Sequence[pb.Label], name: str) -> list[pb.Label]:
    return [label for label in labels if label.name == name]


def _values(labels: Sequence[pb.Label]) -> list[str]:
    return [label.value for label in labels]


def _groups(labels: Iterable[pb.Label]) -> list[list[pb.Label]]:
    """Split sorted labels into runs sharing a name."""
    groups: list[list[pb.Label]] = []
    for label in labels:
        if groups and groups[-1][0].name == label.name:
            groups[-1].append(label)
        else:
            groups.append([label])
    return groups


def _join(lhs: Sequence[pb.Label], rhs: Sequence[pb.Label]) -> list[tuple[list[pb.Label], list[pb.Label]]]:
    """Full outer join of two sorted label sequences by name: (lhs group, rhs group) per name."""
    left = {group[0].name: group for group in _groups(lhs)}
    right = {group[0].name: group for group in _groups(rhs)}
    return [(left.get(name, []), right.get(name, [])) for name in sorted(left.keys() | right.keys())]


def _group_matches(group: list[pb.Label], by_name: dict[str, list[str]]) -> bool:
    """Whether any selector value of `group` matches any value of its name in the set."""
    values = by_name.get(group[0].name)
    if not values:
        return False
    for sel in group:
        for value in values:
            # An empty selector value matches any value of a present label.
            if sel.value == "" or value == sel.value or (sel.prefix and value.startswith(sel.value)):
                return True
    return False
