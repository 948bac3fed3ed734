"""ShardSpec and ReplicaStatus helpers: derived names and keys, and the spec set algebra.

Pure functions over the generated messages (Gazette's shard_spec_extensions.go). None mutates
its arguments; each returns a new message.

- `recovery_log`, `hint_primary_key`, `hint_backup_keys`: the shard's recovery log journal and
  the absolute etcd keys of its FSMHints.
- `desired_replication`: 0 if disabled, else 1 + min(hot_standbys, max_hot_standbys).
- `label_set_ext`: the spec's labels plus the meta-label `id`, which selectors match against.
- `union_shard_specs`, `intersect_shard_specs`, `subtract_shard_specs`: the field-wise algebra
  a shardspace uses to hoist common values out of its shards and push them back down.
- `reduce_replica_status`: fold statuses to their maximum code, concatenating errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from google.protobuf.duration_pb2 import Duration

from broker.protocol import labels as lbl
from broker.protocol import pb as bpb
from consumer.protocol import pb

MAX_UINT32 = 2**32 - 1
_Duration = Literal["max_txn_duration", "min_txn_duration"]
_Scalar = Literal[
    "recovery_log_prefix", "hint_prefix", "hint_backups", "disable", "hot_standbys",
    "disable_wait_for_ack", "ring_buffer_size", "read_channel_size",
]
_DURATIONS: tuple[_Duration, ...] = ("max_txn_duration", "min_txn_duration")
_SCALARS: tuple[_Scalar, ...] = (
    "recovery_log_prefix", "hint_prefix", "hint_backups", "disable", "hot_standbys",
    "disable_wait_for_ack", "ring_buffer_size", "read_channel_size",
)


def recovery_log(spec: pb.ShardSpec) -> str:
    """The shard's recovery log journal, `{recovery_log_prefix}/{id}`, or "" without a prefix."""
    if not spec.recovery_log_prefix:
        return ""
    return f"{spec.recovery_log_prefix}/{spec.id}"


def hint_primary_key(spec: pb.ShardSpec) -> str:
    """The etcd key of the primary's recorded hints, `{hint_prefix}/{id}.primary`."""
    return f"{spec.hint_prefix}/{spec.id}.primary"


def hint_backup_keys(spec: pb.ShardSpec) -> list[str]:
    """The etcd keys of backup hints, `{hint_prefix}/{id}.backup.{i}` for i < hint_backups."""
    return [f"{spec.hint_prefix}/{spec.id}.backup.{i}" for i in range(max(spec.hint_backups, 0))]


def desired_replication(spec: pb.ShardSpec, max_hot_standbys: int = MAX_UINT32) -> int:
    """Replicas the allocator should assign: 0 if disabled, else 1 + bounded hot standbys."""
    if spec.disable:
        return 0
    return 1 + min(spec.hot_standbys, max_hot_standbys)


def label_set_ext(spec: pb.ShardSpec) -> bpb.LabelSet:
    """The spec's labels with the meta-label `id` = the shard's ID."""
    return lbl.union(lbl.label_set(("id", spec.id)), spec.labels)


def union_shard_specs(a: pb.ShardSpec, b: pb.ShardSpec) -> pb.ShardSpec:
    """Each field of `a`, or of `b` where `a`'s is zero. Sources are taken whole; labels are
    the union of both sets, `a`'s values winning for the same name. The ID is `a`'s."""
    out = _copy(a)
    if not a.sources:
        out.sources.extend(_copy_source(s) for s in b.sources)
    for name in _SCALARS:
        if not getattr(a, name):
            setattr(out, name, getattr(b, name))
    for duration in _DURATIONS:
        if _ns(a, duration) == 0:
            _set_duration(out, duration, _ns(b, duration))
    _set_labels(out, lbl.union(a.labels, b.labels))
    return out


def intersect_shard_specs(a: pb.ShardSpec, b: pb.ShardSpec) -> pb.ShardSpec:
    """`a` with every field zeroed that `b` does not equal. Sources must be exactly equal;
    labels are intersected. The ID is `a`'s."""
    return _zero_where(a, b, lambda equal: not equal, lbl.intersect)


def subtract_shard_specs(a: pb.ShardSpec, b: pb.ShardSpec) -> pb.ShardSpec:
    """`a` with every field zeroed that `b` equals; labels are subtracted. The ID is `a`'s."""
    return _zero_where(a, b, lambda equal: equal, lbl.subtract)


def reduce_replica_status(into: pb.ReplicaStatus, other: pb.ReplicaStatus) -> pb.ReplicaStatus:
    """The status with the greater code of the two, and `into`'s errors then `other`'s."""
    return pb.ReplicaStatus(code=max(into.code, other.code), errors=[*into.errors, *other.errors])


def _zero_where(
    a: pb.ShardSpec,
    b: pb.ShardSpec,
    zero: Callable[[bool], bool],
    labels_op: Callable[[bpb.LabelSet, bpb.LabelSet], bpb.LabelSet],
) -> pb.ShardSpec:
    out = _copy(a)
    if zero(_sources_eq(a, b)):
        out.ClearField("sources")
    for name in _SCALARS:
        if zero(getattr(a, name) == getattr(b, name)):
            out.ClearField(name)
    for duration in _DURATIONS:
        if zero(_ns(a, duration) == _ns(b, duration)):
            out.ClearField(duration)
    _set_labels(out, labels_op(a.labels, b.labels))
    return out


def _copy(spec: pb.ShardSpec) -> pb.ShardSpec:
    out = pb.ShardSpec()
    out.CopyFrom(spec)
    return out


def _copy_source(source: pb.ShardSpec.Source) -> pb.ShardSpec.Source:
    return pb.ShardSpec.Source(journal=source.journal, min_offset=source.min_offset)


def _sources_eq(a: pb.ShardSpec, b: pb.ShardSpec) -> bool:
    return [(s.journal, s.min_offset) for s in a.sources] == [(s.journal, s.min_offset) for s in b.sources]


def _ns(spec: pb.ShardSpec, name: _Duration) -> int:
    duration: Duration = getattr(spec, name)
    return duration.seconds * 10**9 + duration.nanos


def _set_duration(spec: pb.ShardSpec, name: _Duration, ns: int) -> None:
    """Set a duration field, leaving it absent when zero (as a zero Go time.Duration)."""
    if ns == 0:
        spec.ClearField(name)
    else:
        getattr(spec, name).FromNanoseconds(ns)


def _set_labels(spec: pb.ShardSpec, labels: bpb.LabelSet) -> None:
    """Set the labels, leaving the field absent when there are none."""
    if labels.labels:
        spec.labels.CopyFrom(labels)
    else:
        spec.ClearField("labels")
