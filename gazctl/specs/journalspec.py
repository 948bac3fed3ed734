"""JournalSpec algebra of spec trees: union (inherit), intersect and subtract, as Gazette's journal_spec_extensions.

A field is "unset" when it has its zero value. Labels are combined by name group (see
`broker.protocol.labels`). Every function returns a new spec and leaves its arguments unchanged.
"""

from __future__ import annotations

from google.protobuf.message import Message

from broker.protocol import labels, pb
from broker.specs.durations import from_proto, to_proto

_SCALARS = ("replication", "flags", "max_append_rate")
_FRAGMENT_SCALARS = ("length", "compression_codec", "path_postfix_template")
_FRAGMENT_DURATIONS = ("refresh_interval", "retention", "flush_interval")


def copy(spec: pb.JournalSpec) -> pb.JournalSpec:
    """Return a deep copy of `spec`."""
    out = pb.JournalSpec()
    out.CopyFrom(spec)
    return out


def union(child: pb.JournalSpec, parent: pb.JournalSpec, inherit_stores: bool = True) -> pb.JournalSpec:
    """Return `child` with each unset field taken from `parent`; labels merge and `child`'s names win.

    Stores are inherited when `child` has none and `inherit_stores` holds. `suspend` is never
    inherited.
    """
    out = copy(child)
    for name in _SCALARS:
        if not getattr(out, name):
            setattr(out, name, getattr(parent, name))
    out.labels.CopyFrom(labels.union(child.labels, parent.labels))
    frag, pfrag = out.fragment, parent.fragment
    for name in _FRAGMENT_SCALARS:
        if not getattr(frag, name):
            setattr(frag, name, getattr(pfrag, name))
    if not frag.stores and inherit_stores:
        frag.stores.extend(pfrag.stores)
    for name in _FRAGMENT_DURATIONS:
        if not _ns(frag, name):
            _set_ns(frag, name, _ns(pfrag, name))
    return out


def intersect(a: pb.JournalSpec, b: pb.JournalSpec) -> pb.JournalSpec:
    """Return `a` keeping only the fields (and label name groups) equal in `b`; `suspend` is cleared."""
    out = copy(a)
    for name in _SCALARS:
        if getattr(out, name) != getattr(b, name):
            _clear(out, name)
    out.labels.CopyFrom(labels.intersect(a.labels, b.labels))
    frag, bfrag = out.fragment, b.fragment
    for name in _FRAGMENT_SCALARS:
        if getattr(frag, name) != getattr(bfrag, name):
            _clear(frag, name)
    if list(frag.stores) != list(bfrag.stores):
        del frag.stores[:]
    for name in _FRAGMENT_DURATIONS:
        if _ns(frag, name) != _ns(bfrag, name):
            _set_ns(frag, name, 0)
    out.ClearField("suspend")
    return out


def subtract(a: pb.JournalSpec, b: pb.JournalSpec) -> pb.JournalSpec:
    """Return `a` with each field (and label name group) equal in `b` unset; `suspend` is kept."""
    out = copy(a)
    for name in _SCALARS:
        if getattr(out, name) == getattr(b, name):
            _clear(out, name)
    out.labels.CopyFrom(labels.subtract(a.labels, b.labels))
    frag, bfrag = out.fragment, b.fragment
    for name in _FRAGMENT_SCALARS:
        if getattr(frag, name) == getattr(bfrag, name):
            _clear(frag, name)
    if list(frag.stores) == list(bfrag.stores):
        del frag.stores[:]
    for name in _FRAGMENT_DURATIONS:
        if _ns(frag, name) == _ns(bfrag, name):
            _set_ns(frag, name, 0)
    return out


def _ns(frag: pb.JournalSpec.Fragment, name: str) -> int:
    return from_proto(getattr(frag, name))


def _set_ns(frag: pb.JournalSpec.Fragment, name: str, ns: int) -> None:
    if ns:
        getattr(frag, name).CopyFrom(to_proto(ns))
    else:
        _clear(frag, name)


def _clear(msg: Message, name: str) -> None:
    msg.ClearField(name)
