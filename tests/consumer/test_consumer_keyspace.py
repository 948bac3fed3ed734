"""The consumer's keyspace: the broker's mirror, announcement and allocator with CONSUMER_SCHEMA.

Pure planning of shards over consumers (desired replication from hot standbys, the consistency
rule, the hand-off rule), then a mirror and an allocator against a real etcd."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration

from cluster.keyspace.allocate import change_txn, run_allocator
from cluster.keyspace.allocator import Add, AddPrimary, Change, Handoff, Promote, Remove, plan
from cluster.keyspace.announce import Announcement
from cluster.keyspace.errors import KeySpaceClosedError
from cluster.keyspace.keyspace import (
    Assignment,
    Item,
    KeySpace,
    Member,
    assignment_key,
    compare_mod,
    item_key,
    member_key,
    put_op,
    txn,
)
from consumer.keyspace import (
    CONSUMER_SCHEMA,
    decode_replica_status,
    default_root,
    shard_consistency,
    shard_handing_off,
)
from consumer.protocol import pb

ROOT = "/consumer.test"
Code = pb.ReplicaStatus.Code
IDLE, BACKFILL, STANDBY, PRIMARY, FAILED = Code.IDLE, Code.BACKFILL, Code.STANDBY, Code.PRIMARY, Code.FAILED


def shard_spec(shard_id: str, hot_standbys: int = 0, disable: bool = False) -> pb.ShardSpec:
    return pb.ShardSpec(
        id=shard_id,
        sources=[pb.ShardSpec.Source(journal="examples/input")],
        max_txn_duration=Duration(seconds=1),
        hot_standbys=hot_standbys,
        disable=disable,
    )


def shard(shard_id: str, hot_standbys: int = 0, disable: bool = False) -> Item:
    return Item(shard_spec(shard_id, hot_standbys, disable), 10, 10, shard_id)


def consumer_spec(zone: str, suffix: str, limit: int = 100, exiting: bool = False) -> pb.ConsumerSpec:
    spec = pb.ConsumerSpec(shard_limit=limit, exiting=exiting)
    spec.process_spec.id.zone, spec.process_spec.id.suffix = zone, suffix
    spec.process_spec.endpoint = f"http://{suffix}:8080"
    return spec


def consumer(zone: str, suffix: str, limit: int = 100, exiting: bool = False, created: int = 1) -> Member:
    return Member(consumer_spec(zone, suffix, limit, exiting), member_key(ROOT, zone, suffix), created, created,
                  hash((zone, suffix)) & 0xFFFF)


def consumers(*ms: Member) -> dict[tuple[str, str], Member]:
    return {(m.zone, m.suffix): m for m in ms}


def status(code: int, *errors: str) -> pb.ReplicaStatus:
    return pb.ReplicaStatus(code=code, errors=list(errors))  # type: ignore[arg-type]


def assigned(shard_id: str, *slots: tuple[str, str, int, int]) -> list[Assignment]:
    """Assignments of `shard_id` at (zone, suffix, slot), with the ReplicaStatus code given."""
    return [
        Assignment(shard_id, z, s, slot, status(code, *(["boom"] if code == FAILED else [])),
                   assignment_key(ROOT, shard_id, z, s, slot), 20, 20, 7)
        for z, s, slot, code in slots
    ]


def of(kind: type, changes: Sequence[object]) -> list[Any]:
    return [c for c in changes if isinstance(c, kind)]


def consumer_plan(*args: Any, **kwargs: Any) -> list[Change]:
    return plan(*args, schema=CONSUMER_SCHEMA, **kwargs)


# -- the schema ---------------------------------------------------------------------------------


def test_schema_values() -> None:
    s = CONSUMER_SCHEMA
    assert s.desired_replication(shard_spec("shard-a")) == 1
    assert s.desired_replication(shard_spec("shard-a", hot_standbys=2)) == 3
    assert s.desired_replication(shard_spec("shard-a", hot_standbys=2, disable=True)) == 0
    assert s.item_name(shard_spec("shard-a")) == "shard-a"
    spec = consumer_spec("z", "c1", limit=7)
    assert s.member_limit(spec) == 7 and not s.member_exiting(spec)
    s.mark_exiting(spec)
    assert s.member_exiting(spec)
    assert s.member_process(spec).id.suffix == "c1"
    # A new assignment is written empty, and empty decodes to IDLE.
    assert s.new_assignment == b"" and decode_replica_status(b"") == status(IDLE)
    assert s.encode_assignment(status(IDLE)) == b""
    assert s.decode_assignment(s.encode_assignment(status(FAILED, "x"))) == status(FAILED, "x")
    with pytest.raises(ValueError, match="non-empty Errors"):
        s.decode_assignment(status(FAILED).SerializeToString())
    with pytest.raises(ValueError, match="MaxTxnDuration"):
        s.decode_item(pb.ShardSpec(id="shard-a").SerializeToString())
    assert default_root("examples.word_count") == "/gazette/consumers/examples.word_count"


@pytest.mark.parametrize(
    ("codes", "expected"),
    [
        # Gazette's ShardIsConsistent (consumer/key_space.go): STANDBY or PRIMARY yes; IDLE, BACKFILL no; FAILED only
        # when the slot-0 primary is FAILED too.
        ((PRIMARY, STANDBY), [True, True]),
        ((PRIMARY, IDLE), [True, False]),
        ((PRIMARY, BACKFILL), [True, False]),
        ((STANDBY, STANDBY), [True, True]),
        ((BACKFILL, STANDBY), [False, True]),
        ((PRIMARY, FAILED), [True, False]),
        ((FAILED, FAILED), [True, True]),
        ((FAILED, STANDBY), [True, True]),
        ((IDLE, PRIMARY), [False, True]),
    ],
)
def test_consistency_rule(codes: tuple[int, int], expected: list[bool]) -> None:
    found = assigned("shard-a", ("z1", "a", 0, codes[0]), ("z2", "b", 1, codes[1]))
    assert shard_consistency(found) == expected
    # Without a primary, FAILED is never consistent.
    assert shard_consistency(assigned("shard-a", ("z2", "b", 1, FAILED))) == [False]


def test_handing_off() -> None:
    assert not shard_handing_off(assigned("s", ("z", "a", 0, PRIMARY), ("z", "b", 1, STANDBY)))
    assert not shard_handing_off(assigned("s", ("z", "a", 0, FAILED)))
    assert shard_handing_off(assigned("s", ("z", "a", 0, STANDBY), ("z", "b", 1, STANDBY)))
    assert shard_handing_off(assigned("s", ("z", "a", 0, STANDBY), ("z", "b", 1, PRIMARY)))


# -- the pure planner over shards and consumers ------------------------------------------------


def test_new_shards_get_hot_standbys_across_zones() -> None:
    ms = consumers(consumer("z1", "a"), consumer("z1", "b"), consumer("z2", "c"))
    changes = consumer_plan({"shard-a": shard("shard-a", hot_standbys=1), "shard-b": shard("shard-b")}, ms, {})
    adds = of(Add, changes)
    assert len(changes) == len(adds) == 3
    a = sorted((x for x in adds if x.item_id == "shard-a"), key=lambda x: x.slot)
    assert [x.slot for x in a] == [0, 1] and {x.zone for x in a} == {"z1", "z2"}
    [b] = [x for x in adds if x.item_id == "shard-b"]
    assert b.slot == 0
    assert len({(x.zone, x.suffix) for x in adds if x.slot == 0}) == 2, "primaries on different consumers"
    # An Add writes an empty (IDLE) value under the consumer's lease, guarded by its member key.
    compares, ops = change_txn(ROOT, a[0], CONSUMER_SCHEMA)
    assert ops[0].request_put.value == b"" and ops[0].request_put.lease == ms[(a[0].zone, a[0].suffix)].lease
    assert {c.key.decode() for c in compares} >= {a[0].member_key, item_key(ROOT, "shard-a")}


def test_disabled_and_capped_shards() -> None:
    ms = consumers(consumer("z1", "a"), consumer("z2", "b"))
    assert len(consumer_plan({"s": shard("s", hot_standbys=5)}, ms, {}, max_replication=9)) == 2
    assert len(consumer_plan({"s": shard("s", hot_standbys=5)}, ms, {}, max_replication=1)) == 1
    assert consumer_plan({"s": shard("s", disable=True)}, ms, {}) == []
    # A disabled shard loses its assignments (none needs to stay consistent).
    current = {"s": assigned("s", ("z1", "a", 0, PRIMARY), ("z2", "b", 1, STANDBY))}
    assert len(of(Remove, consumer_plan({"s": shard("s", disable=True)}, ms, current))) == 2


def test_limits_and_exiting_consumers() -> None:
    full = consumers(consumer("z", "a", limit=1), consumer("z", "b", limit=0), consumer("z", "c", exiting=True))
    current = {"old": assigned("old", ("z", "a", 0, PRIMARY))}
    assert consumer_plan({"old": shard("old"), "new": shard("new")}, full, current) == []


def test_surplus_is_removed_only_once_consistent() -> None:
    """A replacement standby must reach STANDBY before the replica it replaces goes."""
    ms = consumers(consumer("z1", "a"), consumer("z2", "b"), consumer("z3", "c", exiting=True))
    shards = {"s": shard("s", hot_standbys=1)}
    backfilling = assigned("s", ("z1", "a", 0, PRIMARY), ("z3", "c", 1, STANDBY), ("z2", "b", 2, BACKFILL))
    assert of(Remove, consumer_plan(shards, ms, {"s": backfilling})) == []
    ready = assigned("s", ("z1", "a", 0, PRIMARY), ("z3", "c", 1, STANDBY), ("z2", "b", 2, STANDBY))
    [remove] = of(Remove, consumer_plan(shards, ms, {"s": ready}))
    assert remove.assignment.suffix == "c"


def test_exiting_primary_hands_off_to_a_standby() -> None:
    """An exiting consumer's primary: a standby is added first; once it is STANDBY, the primary is
    released and the standby promoted, never a cold (IDLE) replica."""
    ms = consumers(consumer("z1", "a", exiting=True), consumer("z2", "b"), consumer("z3", "c"))
    shards = {"s": shard("s")}
    [add] = consumer_plan(shards, ms, {"s": assigned("s", ("z1", "a", 0, PRIMARY))})
    assert isinstance(add, Add)
    assert add.slot == 1 and add.suffix in ("b", "c")
    idle = assigned("s", ("z1", "a", 0, PRIMARY), ("z2", "b", 1, IDLE))
    assert consumer_plan(shards, ms, {"s": idle}) == [], "the primary stays until its replacement is STANDBY"
    standby = assigned("s", ("z1", "a", 0, PRIMARY), ("z2", "b", 1, STANDBY))
    changes = consumer_plan(shards, ms, {"s": standby})
    remove, promote = changes
    assert isinstance(remove, Remove) and isinstance(promote, Promote)
    assert remove.assignment.suffix == "a" and promote.assignment.suffix == "b"


def test_promotion_prefers_a_consistent_standby() -> None:
    ms = consumers(consumer("z1", "a"), consumer("z2", "b"), consumer("z3", "c"))
    shards = {"s": shard("s", hot_standbys=2)}
    # The primary is gone (its consumer's lease expired): b is backfilling, c is a standby.
    current = {"s": assigned("s", ("z2", "b", 1, BACKFILL), ("z3", "c", 2, STANDBY))}
    [promote] = of(Promote, consumer_plan(shards, ms, current))
    assert promote.assignment.suffix == "c"
    # A promotion re-keys the assignment to slot 0, keeping its ReplicaStatus and lease.
    _, ops = change_txn(ROOT, promote, CONSUMER_SCHEMA)
    put = ops[1].request_put
    assert put.key.decode() == assignment_key(ROOT, "s", "z3", "c", 0)
    assert decode_replica_status(put.value) == status(STANDBY) and put.lease == promote.assignment.lease


def test_a_joining_consumer_never_becomes_primary_cold() -> None:
    """Rebalancing onto a new consumer: it joins as a standby (no AddPrimary, which a schema that
    lets members join as primaries would plan), and takes primaries only by in-place hand-offs
    once it is a STANDBY."""
    shards = {f"s{i}": shard(f"s{i}", hot_standbys=1) for i in range(6)}
    current = {
        f"s{i}": assigned(f"s{i}", ("z1", "a", i % 2, PRIMARY if i % 2 == 0 else STANDBY),
                          ("z2", "b", 1 - i % 2, PRIMARY if i % 2 else STANDBY))
        for i in range(6)
    }
    ms = consumers(consumer("z1", "a"), consumer("z2", "b"), consumer("z3", "c", created=5))
    changes = consumer_plan(shards, ms, current)
    adds = of(Add, changes)
    assert adds and adds == changes, "only standbys are added"
    assert all(a.suffix == "c" and a.slot == 2 for a in adds)
    cold = plan(shards, ms, current, schema=replace(CONSUMER_SCHEMA, join_as_primary=True))
    assert of(AddPrimary, cold), "the knob is what keeps a cold consumer from becoming a primary"

    # c is now the STANDBY of four shards (their surplus shed), and primary of none.
    moved = {
        f"s{i}": assigned(f"s{i}", ("z1" if i % 2 == 0 else "z2", "a" if i % 2 == 0 else "b", 0, PRIMARY),
                          ("z3", "c", 1, STANDBY))
        for i in range(4)
    } | {f"s{i}": current[f"s{i}"] for i in (4, 5)}
    later = consumer_plan(shards, ms, moved)
    handoffs = of(Handoff, later)
    assert handoffs and handoffs == later
    assert all(h.replica.suffix == "c" and h.replica.value == status(STANDBY) for h in handoffs)
    assert consumer_plan(shards, ms, moved, in_place_handoff=False) == []
    # A hand-off re-keys both assignments, keeping their statuses and leases.
    _, ops = change_txn(ROOT, handoffs[0], CONSUMER_SCHEMA)
    puts = {op.request_put.key.decode(): op.request_put for op in ops if op.HasField("request_put")}
    h = handoffs[0]
    new_primary = puts[assignment_key(ROOT, h.item_id, "z3", "c", 0)]
    assert decode_replica_status(new_primary.value) == status(STANDBY) and new_primary.lease == h.replica.lease
    old_primary = puts[assignment_key(ROOT, h.item_id, h.primary.zone, h.primary.suffix, h.slot)]
    assert decode_replica_status(old_primary.value) == status(PRIMARY)


# -- balance without hot standbys: plan() rounds replayed over shards held in memory ---------------

MemberId = tuple[str, str]


class Shards:
    """Consumers and shard assignments in memory. `step()` plans one round and applies it as the
    etcd transactions would, checking the hand-off rules on every change; `report()` has replicas
    report their status as the consumer's resolver does (slot 0 PRIMARY, other slots STANDBY)."""

    def __init__(self, shards: dict[str, Item], *ms: Member) -> None:
        self.shards = shards
        self.members = consumers(*ms)
        self.assignments: dict[str, list[Assignment]] = {}
        self._revision = itertools.count(100)
        self.moves: Counter[str] = Counter()
        """Changes applied, by kind."""

    def join(self, m: Member) -> None:
        self.members[(m.zone, m.suffix)] = m

    def leave(self, zone: str, suffix: str) -> None:
        """The consumer's lease expires: its key and assignments are gone."""
        del self.members[(zone, suffix)]
        for name in list(self.assignments):
            kept = [a for a in self.assignments[name] if (a.zone, a.suffix) != (zone, suffix)]
            self.assignments[name] = kept
            if not kept:
                del self.assignments[name]

    def exit(self, zone: str, suffix: str) -> None:
        """The consumer is told to stop: its ConsumerSpec says it is exiting."""
        old = self.members[(zone, suffix)]
        self.members[(zone, suffix)] = consumer(zone, suffix, old.spec.shard_limit, exiting=True,
                                                created=old.create_revision)

    def plan(self, **kwargs: Any) -> list[Change]:
        return consumer_plan(self.shards, self.members, self.assignments, **kwargs)

    def _assignment(self, shard_id: str, zone: str, suffix: str, slot: int, value: pb.ReplicaStatus,
                    lease: int) -> Assignment:
        revision = next(self._revision)
        key = assignment_key(ROOT, shard_id, zone, suffix, slot)
        return Assignment(shard_id, zone, suffix, slot, value, key, revision, revision, lease)

    def _rekey(self, a: Assignment, slot: int) -> Assignment:
        return self._assignment(a.item_id, a.zone, a.suffix, slot, a.value, a.lease)

    def apply(self, changes: Sequence[Change]) -> None:
        """Apply `changes`, asserting Gazette's hand-off rules: a consumer never becomes primary
        cold (no AddPrimary; an Add at slot 0 only for a shard with no assignment), a primary moves
        only to a consistent standby and only while no other replica still reports PRIMARY, a
        shard never has two primaries, and never loses a consistent primary without a consistent
        replacement nor falls below its replication of consistent assignments."""
        before = {name: list(found) for name, found in self.assignments.items()}
        for c in changes:
            assert not isinstance(c, AddPrimary), "a consumer joined a shard as its primary, cold"
            if isinstance(c, Add):
                found = self.assignments.setdefault(c.item_id, [])
                assert (c.zone, c.suffix) not in {(a.zone, a.suffix) for a in found}, "added twice"
                assert c.slot != 0 or not before.get(c.item_id), f"{c.item_id}: a cold primary beside replicas"
                found.append(self._assignment(c.item_id, c.zone, c.suffix, c.slot, status(IDLE), c.lease))
            elif isinstance(c, Handoff):
                old = before[c.item_id]
                assert not shard_handing_off(old), f"{c.item_id}: a hand-off while another is under way"
                assert c.replica.value.code in (STANDBY, PRIMARY), f"{c.item_id}: hand-off to a replica not caught up"
                found = self.assignments[c.item_id]
                found.remove(c.primary)
                found.remove(c.replica)
                found += [self._rekey(c.primary, c.slot), self._rekey(c.replica, 0)]
            elif isinstance(c, Promote):
                found = self.assignments[c.assignment.item_id]
                assert not any(a.value.code == PRIMARY for a in found if a is not c.assignment), (
                    f"{c.assignment.item_id}: promoted while another replica is still PRIMARY"
                )
                found.remove(c.assignment)
                found.append(self._rekey(c.assignment, 0))
            else:
                self.assignments[c.assignment.item_id].remove(c.assignment)
            self.moves[type(c).__name__] += 1
        self.assignments = {name: found for name, found in self.assignments.items() if found}
        for name, old in before.items():
            if name not in self.shards:
                continue
            ok = {(a.zone, a.suffix) for a, c in zip(old, shard_consistency(old), strict=True) if c}
            now = self.assignments.get(name, [])
            held = {(a.zone, a.suffix) for a in now}
            replication = min(CONSUMER_SCHEMA.desired_replication(self.shards[name].spec), len(self.usable()))
            assert len(ok & held) >= min(replication, len(ok)), f"{name} lost consistent replicas"
            primary = next(((a.zone, a.suffix) for a in old if a.slot == 0), None)
            if replication and primary in ok and primary not in held:
                new = next(((a.zone, a.suffix) for a in now if a.slot == 0), None)
                assert new in ok, f"{name} lost its consistent primary without a consistent replacement"
        for name, now in self.assignments.items():
            assert len({a.slot for a in now}) == len(now), f"{name} has two assignments at one slot"
            assert sum(1 for a in now if a.slot == 0) <= 1, f"{name} has two primaries"
        for mid, m in self.usable().items():
            assert self.loads()[mid] <= m.spec.shard_limit, f"{mid} is over its shard_limit"

    def report(self, *names: str, one: bool = False) -> None:
        """Replicas of `names` (every shard's by default) report their status: a new or demoted
        replica STANDBY, the one at slot 0 PRIMARY. With `one`, only the first replica whose status
        would change does (statuses then arrive one at a time)."""
        for name in names or sorted(self.assignments):
            found = self.assignments[name]
            for a in sorted(found, key=lambda a: a.slot):
                code = PRIMARY if a.slot == 0 else STANDBY
                if a.value.code != code:
                    found[found.index(a)] = replace(a, value=status(code), mod_revision=next(self._revision))
                    if one:
                        return
        for name, found in self.assignments.items():
            assert sum(1 for a in found if a.value.code == PRIMARY) <= 1 or shard_handing_off(found), name

    def step(self, report: bool = True, **kwargs: Any) -> list[Change]:
        changes = self.plan(**kwargs)
        self.apply(changes)
        if report:
            self.report()
        return changes

    def converge(self, rounds: int = 100, **kwargs: Any) -> int:
        """Replay rounds (each reported) until one plans nothing; return how many made changes."""
        for n in range(rounds):
            if not self.step(**kwargs):
                return n
        raise AssertionError(f"still changing after {rounds} rounds")

    def usable(self) -> dict[MemberId, Member]:
        return {mid: m for mid, m in self.members.items() if not m.spec.exiting and m.spec.shard_limit > 0}

    def primaries(self) -> dict[str, int]:
        """Primaries per consumer suffix, consumers with none included."""
        counts = Counter(a.suffix for found in self.assignments.values() for a in found if a.slot == 0)
        return {suffix: counts[suffix] for _, suffix in sorted(self.members)}

    def loads(self) -> Counter[MemberId]:
        return Counter((a.zone, a.suffix) for found in self.assignments.values() for a in found)

    def replicas(self) -> set[int]:
        """The numbers of assignments shards have."""
        return {len(found) for found in self.assignments.values()}


def shard_of(change: Change) -> str:
    return change.item_id if isinstance(change, (Add, AddPrimary, Handoff)) else change.assignment.item_id


def shards_of(count: int, hot_standbys: int = 0) -> dict[str, Item]:
    return {f"s{i:02}": shard(f"s{i:02}", hot_standbys) for i in range(count)}


def test_second_consumer_takes_half_the_primaries_through_surplus_standbys() -> None:
    """hot_standbys 0: a joining consumer is added as a surplus standby of the shards it is to
    lead; once STANDBY it takes their primaries in place, and the old primaries are shed."""
    cluster = Shards(shards_of(4), consumer("z1", "a"))
    cluster.converge()
    assert cluster.primaries() == {"a": 4}
    cluster.join(consumer("z2", "b", created=5))

    adds = cluster.step(report=False)
    assert [type(c) for c in adds] == [Add, Add]
    assert {(c.suffix, c.slot) for c in of(Add, adds)} == {("b", 1)}
    moving = {shard_of(c) for c in adds}
    # Until the standbys catch up, nothing more happens: no hand-off to a replica that is IDLE or
    # backfilling, no shedding of the standbys, no more moves onto b.
    assert cluster.plan() == []
    first = sorted(moving)[0]
    cluster.report(first, one=True)  # b's standby of `first` is STANDBY, the other not yet.
    handoffs = cluster.step(report=False)
    assert [(type(c), shard_of(c)) for c in handoffs] == [(Handoff, first)]
    [h] = of(Handoff, handoffs)
    assert (h.primary.suffix, h.replica.suffix, h.slot) == ("a", "b", 2)
    # Once the other standby is STANDBY too, its shard's primary is handed off, and the demoted
    # primary of the first shard (now a surplus standby) is shed.
    cluster.report()
    changes = cluster.step()
    assert sorted((type(c).__name__, shard_of(c)) for c in changes) == [
        ("Handoff", n) for n in sorted(moving - {first})
    ] + [("Remove", first)]
    changes = cluster.step()
    assert [type(c) for c in changes] == [Remove] and {c.assignment.suffix for c in of(Remove, changes)} == {"a"}
    assert cluster.converge() == 0
    assert cluster.primaries() == {"a": 2, "b": 2}
    assert cluster.replicas() == {1}
    assert cluster.moves == {"Add": 6, "Handoff": 2, "Remove": 2}


@pytest.mark.parametrize("hot_standbys", [0, 1])
def test_three_consumers_twelve_shards(hot_standbys: int) -> None:
    replicas = hot_standbys + 1
    # From scratch.
    cluster = Shards(shards_of(12, hot_standbys), consumer("z1", "a"), consumer("z2", "b"), consumer("z3", "c"))
    assert cluster.converge() == 1
    assert cluster.primaries() == {"a": 4, "b": 4, "c": 4}
    # Joining one after another.
    cluster = Shards(shards_of(12, hot_standbys), consumer("z1", "a"))
    cluster.converge()
    assert cluster.primaries() == {"a": 12}
    cluster.join(consumer("z2", "b", created=5))
    cluster.converge()
    assert cluster.primaries() == {"a": 6, "b": 6}
    assert cluster.replicas() == {min(replicas, 2)}
    cluster.join(consumer("z3", "c", created=6))
    cluster.converge()
    assert cluster.primaries() == {"a": 4, "b": 4, "c": 4}
    assert cluster.replicas() == {replicas}
    assert set(cluster.loads().values()) == {4 * replicas}
    assert cluster.plan() == [], "a balanced cluster plans nothing"

    # c leaves (its lease expires), then comes back.
    cluster.leave("z3", "c")
    cluster.converge()
    assert cluster.primaries() == {"a": 6, "b": 6}
    cluster.join(consumer("z3", "c", created=50))
    cluster.converge()
    assert cluster.primaries() == {"a": 4, "b": 4, "c": 4}
    assert cluster.replicas() == {replicas}


def test_joins_are_bounded_by_max_moves() -> None:
    """Each surplus standby counts as a move until its shard is back to one assignment."""
    cluster = Shards(shards_of(12), consumer("z1", "a"))
    cluster.converge()
    cluster.join(consumer("z2", "b", created=5))
    cluster.join(consumer("z3", "c", created=6))
    changes = cluster.step(report=False, max_moves=2)
    assert [type(c) for c in changes] == [Add, Add]
    assert cluster.plan(max_moves=2) == []
    cluster.report()
    rounds = cluster.converge(max_moves=2)
    assert cluster.primaries() == {"a": 4, "b": 4, "c": 4}
    assert rounds >= 8 // 2 * 3 - 1  # Add, Handoff, Remove per move, two moves at a time.
    assert cluster.moves["Add"] == 12 + 8 and cluster.moves["Handoff"] == cluster.moves["Remove"] == 8


def test_exiting_consumer_hands_its_primaries_to_consistent_standbys_only() -> None:
    cluster = Shards(shards_of(12), consumer("z1", "a"), consumer("z2", "b"), consumer("z3", "c"))
    cluster.converge()
    cluster.exit("z3", "c")
    changes = cluster.step(report=False)
    assert [type(c) for c in changes] == [Add] * 4 and {c.suffix for c in of(Add, changes)} <= {"a", "b"}
    # The standbys are IDLE: c keeps its primaries.
    assert cluster.plan() == []
    cluster.report()
    changes = cluster.step()
    assert sorted(type(c).__name__ for c in changes) == ["Promote"] * 4 + ["Remove"] * 4
    assert {c.assignment.suffix for c in of(Remove, changes)} == {"c"}
    assert all(c.assignment.value == status(STANDBY) for c in of(Promote, changes))
    assert cluster.converge() == 0
    assert cluster.primaries() == {"a": 6, "b": 6, "c": 0}
    assert cluster.replicas() == {1}


def test_never_two_primaries_while_statuses_arrive_one_at_a_time() -> None:
    """Consumers join, leave and rejoin while replicas report one status at a time: every plan keeps
    the hand-off rules (Shards.apply checks them) and the cluster ends balanced."""
    shards = shards_of(10) | {f"t{i}": shard(f"t{i}", hot_standbys=1) for i in range(5)}
    cluster = Shards(shards, consumer("z1", "a"))
    cluster.converge()
    events = [
        lambda: cluster.join(consumer("z2", "b", created=5)),
        lambda: cluster.join(consumer("z3", "c", created=6)),
        lambda: cluster.leave("z2", "b"),
        lambda: cluster.join(consumer("z2", "b", created=70)),
    ]
    for event in events:
        event()
        for _ in range(500):
            changes = cluster.step(report=False)
            unreported = [n for n, found in cluster.assignments.items()
                          if any(a.value.code != (PRIMARY if a.slot == 0 else STANDBY) for a in found)]
            if not changes and not unreported:
                break
            if unreported:
                cluster.report(unreported[0], one=True)
        else:
            raise AssertionError("did not converge")
    assert cluster.primaries() == {"a": 5, "b": 5, "c": 5}
    assert sorted(cluster.loads().values()) == [20 // 3, 20 // 3 + 1, 20 // 3 + 1]


# -- against etcd -------------------------------------------------------------------------------


async def _until(check: Callable[[], bool], keyspace: KeySpace, timeout: float = 10.0) -> None:
    async def loop() -> None:
        while not check():
            await keyspace.wait_for_change()

    await asyncio.wait_for(loop(), timeout)


async def test_keyspace_mirrors_shards_consumers_and_statuses(etcd_client: Any, etcd_prefix: str) -> None:
    """A KeySpace with the consumer schema mirrors ShardSpecs, ConsumerSpecs and ReplicaStatuses;
    announcements hold ConsumerSpecs; the allocator assigns shards with hot standbys."""
    root = etcd_prefix
    anns = [
        Announcement(etcd_client, root, consumer_spec(zone, suffix), schema=CONSUMER_SCHEMA, ttl=10)
        for zone, suffix in (("z1", "cons-a"), ("z2", "cons-b"))
    ]
    for ann in anns:
        await ann.announce()
    ks = KeySpace(etcd_client, root, schema=CONSUMER_SCHEMA, watch_delay=0.01)
    stop = asyncio.Event()
    allocator: asyncio.Task[None] | None = None
    try:
        await etcd_client.put(item_key(root, "shard-one").encode(), shard_spec("shard-one", 1).SerializeToString())
        # Invalid values are left out of the mirror: a spec that fails validation, a spec under
        # another id's key, a FAILED status without errors.
        await etcd_client.put(item_key(root, "shard-bad").encode(), pb.ShardSpec(id="shard-bad").SerializeToString())
        await etcd_client.put(item_key(root, "shard-other").encode(), shard_spec("shard-one").SerializeToString())
        await etcd_client.put(assignment_key(root, "shard-x", "z1", "a", 0).encode(),
                              status(FAILED).SerializeToString())
        await ks.load()
        ks.watch()
        assert set(ks.items) == {"shard-one"} and ks.items["shard-one"].spec == shard_spec("shard-one", 1)
        assert set(ks.members) == {("z1", "cons-a"), ("z2", "cons-b")}
        assert ks.members[("z2", "cons-b")].spec == consumer_spec("z2", "cons-b")
        assert ks.assigned_items() == []

        allocator = asyncio.create_task(run_allocator(etcd_client, ks, anns[0].key, 9, stop))
        await _until(lambda: len(ks.assignments("shard-one")) == 2, ks)
        found = ks.assignments("shard-one")
        assert sorted(a.slot for a in found) == [0, 1]
        assert {a.zone for a in found} == {"z1", "z2"}
        assert all(a.value == status(IDLE) for a in found), "created empty: IDLE"
        assert all(a.lease == ks.members[(a.zone, a.suffix)].lease for a in found)
        assert not ks.is_consistent("shard-one")
        route = ks.route("shard-one")
        assert route.primary >= 0 and list(route.endpoints) == ["http://cons-a:8080", "http://cons-b:8080"]

        # Replicas report their status (as the consumer's resolver does, keeping the lease).
        for a in found:
            code = PRIMARY if a.slot == 0 else STANDBY
            assert (await txn(etcd_client, [], [put_op(a.key, status(code).SerializeToString(), ignore_lease=True)]))[0]
        await _until(lambda: ks.is_consistent("shard-one"), ks)
        assert {a.slot: a.value.code for a in ks.assignments("shard-one")} == {0: PRIMARY, 1: STANDBY}

        # An exiting consumer is marked in its ConsumerSpec.
        await anns[1].set_exiting()
        await _until(lambda: CONSUMER_SCHEMA.member_exiting(ks.members[("z2", "cons-b")].spec), ks)

        # Disabling the shard releases its assignments.
        await etcd_client.put(item_key(root, "shard-one").encode(),
                              shard_spec("shard-one", 1, disable=True).SerializeToString())
        await _until(lambda: ks.assignments("shard-one") == [], ks)
    finally:
        stop.set()
        if allocator is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(allocator, 5)
        await ks.close()
        for ann in anns:
            await ann.release()


async def test_joining_consumer_takes_primaries_without_hot_standbys(etcd_client: Any, etcd_prefix: str) -> None:
    """Against etcd, with hot_standbys 0: a consumer that joins later is added as a surplus standby,
    takes over primaries by in-place hand-offs once it reports STANDBY, and the old assignments go;
    replicas report their statuses here as the consumer's resolver does."""
    root = etcd_prefix
    first = Announcement(etcd_client, root, consumer_spec("z1", "cons-a"), schema=CONSUMER_SCHEMA, ttl=10)
    second = Announcement(etcd_client, root, consumer_spec("z2", "cons-b"), schema=CONSUMER_SCHEMA, ttl=10)
    await first.announce()
    ks = KeySpace(etcd_client, root, schema=CONSUMER_SCHEMA, watch_delay=0.01)
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    shards = [f"shard-{i}" for i in range(4)]
    doubled: list[dict[str, list[tuple[str, int, int]]]] = []

    async def report() -> None:
        """Slot 0 reports PRIMARY, other slots STANDBY, each guarded by its ModRevision."""
        while not stop.is_set():
            generation = ks.generation
            found = layout()
            if any(sum(1 for _, slot, _ in v if slot == 0) > 1 for v in found.values()):
                doubled.append(found)
            for s in shards:
                for a in ks.assignments(s):
                    code = PRIMARY if a.slot == 0 else STANDBY
                    if a.value.code != code:
                        put = put_op(a.key, status(code).SerializeToString(), ignore_lease=True)
                        await txn(etcd_client, [compare_mod(a.key, a.mod_revision)], [put])
            await ks.wait_for_change(generation)

    def layout() -> dict[str, list[tuple[str, int, int]]]:
        return {s: sorted((a.suffix, a.slot, int(a.value.code)) for a in ks.assignments(s)) for s in shards}

    def balanced() -> bool:
        found = layout()
        if any(len(v) != 1 or v[0][1:] != (0, PRIMARY) for v in found.values()):
            return False
        return Counter(v[0][0] for v in found.values()) == Counter({"cons-a": 2, "cons-b": 2})

    try:
        await ks.load()
        ks.watch()
        for s in shards:
            await etcd_client.put(item_key(root, s).encode(), shard_spec(s).SerializeToString())
        tasks.append(asyncio.create_task(run_allocator(etcd_client, ks, first.key, 9, stop)))
        tasks.append(asyncio.create_task(report()))
        await _until(lambda: all(v == [("cons-a", 0, PRIMARY)] for v in layout().values()), ks)

        await second.announce()
        await _until(balanced, ks, timeout=20.0)
        assert not doubled, "a shard had two primaries"
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, KeySpaceClosedError):
                await asyncio.wait_for(task, 5)
        await ks.close()
        for ann in (first, second):
            await ann.release()
