"""ShardSpec helpers and the spec set algebra (Gazette TestShardSpecRoutines, TestSetOperations)."""

from __future__ import annotations

from broker.protocol import labels as lbl
from broker.protocol import pb as bpb
from consumer.protocol import pb
from consumer.protocol import shard_spec as s


def spec_of(**kw: object) -> pb.ShardSpec:
    max_txn = kw.pop("max_txn", 0)
    min_txn = kw.pop("min_txn", 0)
    spec = pb.ShardSpec(**kw)  # type: ignore[arg-type]
    if max_txn:
        spec.max_txn_duration.FromSeconds(max_txn)  # type: ignore[arg-type]
    if min_txn:
        spec.min_txn_duration.FromSeconds(min_txn)  # type: ignore[arg-type]
    return spec


def test_routines() -> None:
    spec = pb.ShardSpec(
        id="shard-id", hot_standbys=4, labels=lbl.label_set(("hello", "world")), hint_prefix="/a/path", hint_backups=2,
    )
    assert s.desired_replication(spec) == 5
    assert s.desired_replication(spec, max_hot_standbys=2) == 3
    spec.disable = True
    assert s.desired_replication(spec) == 0
    spec.disable, spec.hot_standbys = False, 0
    assert s.desired_replication(spec) == 1

    assert s.label_set_ext(spec) == lbl.label_set(("hello", "world"), ("id", "shard-id"))
    assert s.hint_primary_key(spec) == "/a/path/shard-id.primary"
    assert s.hint_backup_keys(spec) == ["/a/path/shard-id.backup.0", "/a/path/shard-id.backup.1"]
    assert s.recovery_log(spec) == ""
    spec.recovery_log_prefix = "recovery/logs"
    assert s.recovery_log(spec) == "recovery/logs/shard-id"


def model() -> pb.ShardSpec:
    return spec_of(
        sources=[pb.ShardSpec.Source(journal="a/source", min_offset=1234)],
        recovery_log_prefix="log/prefix", hint_prefix="/hints/prefix", hint_backups=3, max_txn=5, min_txn=1,
        disable=True, hot_standbys=2,
        labels=bpb.LabelSet(labels=[
            bpb.Label(name="aaa", value="val"), bpb.Label(name="bbb", value="val"), bpb.Label(name="ccc", value="val"),
        ]),
        disable_wait_for_ack=True, ring_buffer_size=123, read_channel_size=456,
    )


def other() -> pb.ShardSpec:
    return spec_of(
        sources=[pb.ShardSpec.Source(journal="other/source", min_offset=5678)],
        recovery_log_prefix="other/log/prefix", hint_prefix="/hints/other/prefix", hint_backups=2, max_txn=3600,
        min_txn=60, disable=False, hot_standbys=1,
        labels=bpb.LabelSet(labels=[
            bpb.Label(name="aaa", value="other"), bpb.Label(name="bbb", value="other"),
            bpb.Label(name="ccc", value="other"),
        ]),
        disable_wait_for_ack=False, ring_buffer_size=456, read_channel_size=789,
    )


def test_set_operations() -> None:
    m, o, zero = model(), other(), pb.ShardSpec()
    assert s.union_shard_specs(zero, m) == m
    assert s.union_shard_specs(m, zero) == m

    o.disable = True  # Disable == true dominates in a union.
    o.disable_wait_for_ack = True
    assert s.union_shard_specs(o, m) == o
    o.disable = o.disable_wait_for_ack = False
    assert s.union_shard_specs(m, o) == m

    assert s.intersect_shard_specs(m, m) == m
    assert s.intersect_shard_specs(m, zero) == zero
    assert s.intersect_shard_specs(zero, m) == zero
    assert s.intersect_shard_specs(o, m) == zero
    assert s.intersect_shard_specs(m, o) == zero

    assert s.subtract_shard_specs(m, m) == zero
    assert s.subtract_shard_specs(m, zero) == m
    assert s.subtract_shard_specs(zero, m) == zero
    assert s.subtract_shard_specs(o, m) == o
    assert s.subtract_shard_specs(m, o) == m

    assert m == model() and o == other()  # Arguments are never mutated.


def test_labels_merge_by_name_and_ids_stay_with_the_left_operand() -> None:
    a = pb.ShardSpec(id="shard-a", labels=lbl.label_set(("name-2", "val-2")))
    common = spec_of(labels=lbl.label_set(("name-1", "val-1")), max_txn=1, hint_prefix="/hints")
    merged = s.union_shard_specs(a, common)
    assert merged.id == "shard-a"
    assert merged.labels == lbl.label_set(("name-1", "val-1"), ("name-2", "val-2"))
    assert merged.max_txn_duration.ToSeconds() == 1 and merged.hint_prefix == "/hints"

    # Hoisting: the intersection is the common part, and subtracting it gives the original back.
    b = s.union_shard_specs(pb.ShardSpec(id="shard-b", disable=True, labels=lbl.label_set(("name-3", "v"))), common)
    hoisted = s.intersect_shard_specs(merged, b)
    hoisted.id = ""
    assert hoisted == common
    assert s.subtract_shard_specs(merged, hoisted) == a


def test_reduce_replica_status() -> None:
    primary = pb.ReplicaStatus(code=pb.ReplicaStatus.PRIMARY)
    failed = pb.ReplicaStatus(code=pb.ReplicaStatus.FAILED, errors=["err-1"])
    standby = pb.ReplicaStatus(code=pb.ReplicaStatus.STANDBY, errors=["err-2"])
    reduced = s.reduce_replica_status(s.reduce_replica_status(primary, failed), standby)
    assert reduced == pb.ReplicaStatus(code=pb.ReplicaStatus.FAILED, errors=["err-1", "err-2"])
    assert s.reduce_replica_status(primary, pb.ReplicaStatus()) == primary
