"""The consumer's etcd keyspace (Gazette's `consumer/key_space.go`): the broker's keyspace mirror, member
announcement and allocator (`cluster.keyspace`), with the consumer's schema.

Under the application's own root (`--etcd.prefix`, by default `/gazette/consumers/<app>`), with
the broker's layout:

    <root>/items/<shard id>                          ShardSpec (validated; its id must match the key)
    <root>/members/<zone>#<suffix>                   ConsumerSpec, under the consumer's lease
    <root>/assign/<shard id>#<zone>#<suffix>#<slot>  ReplicaStatus, created empty (IDLE) under the
                                                     assigned consumer's lease; slot 0 is the primary

A shard wants `hot_standbys + 1` assignments, or none when disabled; a consumer holds at most
`shard_limit`. An assignment is consistent when its replica is STANDBY or PRIMARY, or FAILED while
the primary is FAILED too (Gazette's ShardIsConsistent). The allocator never makes a consumer the
primary of a shard it does not already hold as a standby (the hand-off rule): a primary moves
to a consistent standby in place, and a replacement is added as a standby first.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.protocol import pb as bpb
from cluster.keyspace import Assignment, KeySpaceSchema
from consumer.protocol import pb
from consumer.protocol.shard_spec import desired_replication
from consumer.protocol.validation import validate_consumer_spec, validate_replica_status, validate_shard_spec

DEFAULT_ROOT_PREFIX = "/gazette/consumers"
"""Parent of an application's default root, `/gazette/consumers/<app>`."""

Code = pb.ReplicaStatus.Code


def default_root(app: str) -> str:
    """The default keyspace root of application `app` (Gazette uses the Go type of the app)."""
    return f"{DEFAULT_ROOT_PREFIX}/{app}"


def decode_shard_spec(value: bytes) -> pb.ShardSpec:
    """A shard's item value: a valid ShardSpec."""
    spec = pb.ShardSpec.FromString(value)
    validate_shard_spec(spec)
    return spec


def decode_consumer_spec(value: bytes) -> pb.ConsumerSpec:
    """A member value: a valid ConsumerSpec."""
    spec = pb.ConsumerSpec.FromString(value)
    validate_consumer_spec(spec)
    return spec


def decode_replica_status(value: bytes) -> pb.ReplicaStatus:
    """An assignment value: a valid ReplicaStatus; empty is IDLE (just created)."""
    status = pb.ReplicaStatus.FromString(value)
    validate_replica_status(status)
    return status


def encode_replica_status(status: pb.ReplicaStatus) -> bytes:
    """An assignment value (IDLE without errors encodes empty, as when created)."""
    return status.SerializeToString()


def primary_status(assignments: Sequence[Assignment]) -> int:
    """The code of the slot-0 assignment's status, IDLE when there is none."""
    primary = next((a for a in assignments if a.slot == 0), None)
    return int(primary.value.code) if primary is not None else int(Code.IDLE)


def shard_is_consistent(assignment: Assignment, assignments: Sequence[Assignment]) -> bool:
    """Gazette's ShardIsConsistent: STANDBY or PRIMARY are consistent, IDLE and BACKFILL are not,
    and FAILED is only when the shard's primary (slot 0) is FAILED too."""
    code = assignment.value.code
    if code == Code.FAILED:
        return primary_status(assignments) == Code.FAILED
    return code in (Code.STANDBY, Code.PRIMARY)


def shard_consistency(assignments: Sequence[Assignment]) -> list[bool]:
    """`shard_is_consistent` of each of a shard's assignments."""
    return [shard_is_consistent(a, assignments) for a in assignments]


def shard_handing_off(assignments: Sequence[Assignment]) -> bool:
    """Whether a shard's primary is changing: the slot-0 replica is not yet PRIMARY (and has not
    FAILED), or a replica at another slot still reports PRIMARY."""
    for a in assignments:
        code = a.value.code
        if a.slot == 0 and code not in (Code.PRIMARY, Code.FAILED):
            return True
        if a.slot != 0 and code == Code.PRIMARY:
            return True
    return False


def _shard_id(spec: pb.ShardSpec) -> str:
    return spec.id


def _process(spec: pb.ConsumerSpec) -> bpb.ProcessSpec:
    return spec.process_spec


def _shard_limit(spec: pb.ConsumerSpec) -> int:
    return spec.shard_limit


def _exiting(spec: pb.ConsumerSpec) -> bool:
    return spec.exiting


def _mark_exiting(spec: pb.ConsumerSpec) -> None:
    spec.exiting = True


def _names_no_member(_: pb.ReplicaStatus) -> list[tuple[str, str]]:
    return []


CONSUMER_SCHEMA = KeySpaceSchema(
    kind="shard",
    decode_item=decode_shard_spec,
    item_name=_shard_id,
    desired_replication=desired_replication,
    decode_member=decode_consumer_spec,
    member_process=_process,
    member_limit=_shard_limit,
    member_exiting=_exiting,
    mark_exiting=_mark_exiting,
    decode_assignment=decode_replica_status,
    encode_assignment=encode_replica_status,
    consistency=shard_consistency,
    handing_off=shard_handing_off,
    named_members=_names_no_member,
    new_assignment=b"",
    join_as_primary=False,
    in_place_handoff=True,
)
"""Gazette's consumer keyspace: ShardSpec items, ConsumerSpec members, ReplicaStatus assignment values."""

__all__ = [
    "CONSUMER_SCHEMA",
    "DEFAULT_ROOT_PREFIX",
    "decode_consumer_spec",
    "decode_replica_status",
    "decode_shard_spec",
    "default_root",
    "encode_replica_status",
    "primary_status",
    "shard_consistency",
    "shard_handing_off",
    "shard_is_consistent",
]
