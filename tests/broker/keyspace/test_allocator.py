"""The allocator: pure planning rules, transaction batching, and a run against a real etcd."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from broker.keyspace.allocator import (
    Add,
    DeleteOrphan,
    Promote,
    Remove,
    batch_txns,
    desired_replication,
    leader_of,
    plan,
    run_allocator,
)
from broker.keyspace.announce import Announcement
from broker.keyspace.keyspace import (
    Assignment,
    Item,
    KeySpace,
    Member,
    assignment_key,
    derive_route,
    item_key,
    member_key,
)
from broker.protocol import pb

ROOT = "/root"


def item(name: str, replication: int = 1, level: int = 0) -> Item:
    spec = pb.JournalSpec(name=name, replication=replication)
    spec.suspend.level = level  # type: ignore[assignment]
    return Item(spec, mod_revision=10, create_revision=10)


def member(zone: str, suffix: str, limit: int = 100, exiting: bool = False, created: int = 1) -> Member:
    spec = pb.BrokerSpec(journal_limit=limit, exiting=exiting)
    spec.process_spec.id.zone, spec.process_spec.id.suffix = zone, suffix
    return Member(spec, member_key(ROOT, zone, suffix), created, created, lease=hash((zone, suffix)) & 0xFFFF)


def members(*ms: Member) -> dict[tuple[str, str], Member]:
    return {(m.zone, m.suffix): m for m in ms}


def assigned(journal: str, *slots: tuple[str, str, int], consistent: bool = True) -> list[Assignment]:
    """Assignments of `journal` at (zone, suffix, slot), with values equal to their route if `consistent`."""
    bare = [
        Assignment(journal, z, s, slot, pb.Route(primary=-1), assignment_key(ROOT, journal, z, s, slot), 20, 20, 7)
        for z, s, slot in slots
    ]
    route = derive_route(bare) if consistent else pb.Route(primary=-1)
    return [
        Assignment(a.journal, a.zone, a.suffix, a.slot, route, a.key, a.mod_revision, a.create_revision, a.lease)
        for a in bare
    ]


def of(kind: type, changes: Sequence[object]) -> list[Any]:
    return [c for c in changes if isinstance(c, kind)]


def test_desired_replication() -> None:
    assert desired_replication(item("a", 3).spec) == 3
    assert desired_replication(item("a", 3, pb.JournalSpec.Suspend.PARTIAL).spec) == 1
    assert desired_replication(item("a", 3, pb.JournalSpec.Suspend.FULL).spec) == 0


def test_leader_is_oldest_member() -> None:
    ms = members(member("z", "b", created=5), member("z", "a", created=9))
    assert leader_of(ms) == ms[("z", "b")]
    assert leader_of({}) is None


def test_new_journal_spreads_over_zones() -> None:
    ms = members(member("z1", "a"), member("z1", "b"), member("z2", "c"))
    changes = plan({"j": item("j", 2)}, ms, {})
    adds = of(Add, changes)
    assert len(changes) == len(adds) == 2
    assert sorted(a.slot for a in adds) == [0, 1]
    assert {a.zone for a in adds} == {"z1", "z2"}
    first = next(a for a in adds if a.slot == 0)
    assert first.member_key == member_key(ROOT, first.zone, first.suffix)
    assert first.lease == ms[(first.zone, first.suffix)].lease


def test_replication_is_capped() -> None:
    ms = members(member("z", "a"), member("z", "b"))
    assert len(plan({"j": item("j", 5)}, ms, {})) == 2
    assert len(plan({"j": item("j", 5)}, ms, {}, max_replication=1)) == 1
    assert plan({"j": item("j", 1)}, members(member("z", "a", exiting=True)), {}) == []


def test_least_loaded_within_limit() -> None:
    ms = members(member("z", "a", limit=1), member("z", "b", limit=10))
    current = {"old": assigned("old", ("z", "a", 0))}
    journals = {"old": item("old"), "new": item("new")}
    adds = of(Add, plan(journals, ms, current))
    assert [(a.journal, a.suffix) for a in adds] == [("new", "b")]
    full = members(member("z", "a", limit=1))
    assert plan(journals, full, current) == []


def test_stable_when_satisfied() -> None:
    ms = members(member("z1", "a"), member("z2", "b"), member("z3", "c"))
    current = {"j": assigned("j", ("z1", "a", 0), ("z2", "b", 1))}
    assert plan({"j": item("j", 2)}, ms, current) == []
    # Even when not yet consistent: nothing to add, nothing surplus.
    current = {"j": assigned("j", ("z1", "a", 0), ("z2", "b", 1), consistent=False)}
    assert plan({"j": item("j", 2)}, ms, current) == []


def test_new_slots_follow_the_highest() -> None:
    ms = members(member("z", "a"), member("z", "b"))
    adds = of(Add, plan({"j": item("j", 2)}, ms, {"j": assigned("j", ("z", "a", 0))}))
    assert [(a.suffix, a.slot) for a in adds] == [("b", 1)]


def test_surplus_removed_only_when_consistent() -> None:
    ms = members(member("z", "a"), member("z", "b"), member("z", "c"))
    slots = (("z", "a", 0), ("z", "b", 1), ("z", "c", 2))
    removes = of(Remove, plan({"j": item("j", 2)}, ms, {"j": assigned("j", *slots)}))
    assert len(removes) == 1 and removes[0].assignment.slot != 0
    assert plan({"j": item("j", 2)}, ms, {"j": assigned("j", *slots, consistent=False)}) == []


def test_exiting_member_is_replaced_then_shed() -> None:
    ms = members(member("z", "a"), member("z", "b"), member("z", "x", exiting=True))
    journals = {"j": item("j", 2)}
    # First the replacement is added; the exiting replica stays while it is needed.
    changes = plan(journals, ms, {"j": assigned("j", ("z", "x", 0), ("z", "a", 1))})
    assert [(type(c), c.suffix, c.slot) for c in of(Add, changes)] == [(Add, "b", 2)]
    assert of(Remove, changes) == []
    # Once the primary made every value consistent, the exiting replica goes and a primary is promoted.
    changes = plan(journals, ms, {"j": assigned("j", ("z", "x", 0), ("z", "a", 1), ("z", "b", 2))})
    assert [c.assignment.suffix for c in of(Remove, changes)] == ["x"]
    assert [c.assignment.suffix for c in of(Promote, changes)] == ["a"]


def test_promote_prefers_consistent() -> None:
    ms = members(member("z", "a"), member("z", "b"))
    good = assigned("j", ("z", "a", 1), ("z", "b", 2))
    stale = Assignment("j", "z", "a", 1, pb.Route(primary=-1), good[0].key, 20, 20, 7)
    changes = plan({"j": item("j", 2)}, ms, {"j": [stale, good[1]]})
    assert [c.assignment.suffix for c in changes if isinstance(c, Promote)] == ["b"]


def test_suspension() -> None:
    ms = members(member("z", "a"), member("z", "b"))
    current = {"j": assigned("j", ("z", "a", 0), ("z", "b", 1))}
    partial = plan({"j": item("j", 2, pb.JournalSpec.Suspend.PARTIAL)}, ms, current)
    assert [c.assignment.suffix for c in of(Remove, partial)] == ["b"]
    full = plan({"j": item("j", 2, pb.JournalSpec.Suspend.FULL)}, ms, current)
    assert sorted(c.assignment.suffix for c in of(Remove, full)) == ["a", "b"]


def test_orphans_deleted() -> None:
    ms = members(member("z", "a"))
    changes = plan({}, ms, {"gone": assigned("gone", ("z", "a", 0))})
    assert [type(c) for c in changes] == [DeleteOrphan]


def test_batches_cap_ops_and_guard_the_leader() -> None:
    ms = members(member("z", "a"), member("z", "b"))
    journals = {f"j{i:03}": item(f"j{i:03}", 2) for i in range(100)}
    changes = plan(journals, ms, {})
    assert len(changes) == 200
    leader = ms[("z", "a")]
    batches = batch_txns(ROOT, changes, leader, max_ops=128)
    assert len(batches) > 1
    assert sum(len(ops) for _, ops in batches) == 200
    for compares, ops in batches:
        assert len(compares) <= 128 and len(ops) <= 128
        assert any(c.key == leader.key.encode() and c.mod_revision == leader.mod_revision for c in compares)


# -- against etcd ---------------------------------------------------------------------------------


async def _until(check: Callable[[], bool], keyspace: KeySpace, timeout: float = 10.0) -> None:
    async def loop() -> None:
        while not check():
            await keyspace.wait_for_change()

    await asyncio.wait_for(loop(), timeout)


async def test_two_members_allocate(etcd_client: Any, etcd_prefix: str) -> None:
    anns = [
        Announcement(etcd_client, etcd_prefix, member(zone, suffix).spec, ttl=10)
        for zone, suffix in (("z1", "a"), ("z2", "b"))
    ]
    for ann in anns:
        await ann.announce()
    keyspaces = [KeySpace(etcd_client, etcd_prefix) for _ in anns]
    stop = asyncio.Event()
    tasks = []
    for ann, ks in zip(anns, keyspaces, strict=True):
        await ks.load()
        ks.watch()
        tasks.append(asyncio.create_task(run_allocator(etcd_client, ks, ann.key, 9, stop)))
    ks = keyspaces[1]
    try:
        for name, replication in (("one", 1), ("two", 2)):
            spec = pb.JournalSpec(name=name, replication=replication)
            await etcd_client.put(item_key(etcd_prefix, name).encode(), spec.SerializeToString())

        await _until(lambda: len(ks.assignments("one")) == 1 and len(ks.assignments("two")) == 2, ks)
        for name in ("one", "two"):
            found = ks.assignments(name)
            assert any(a.slot == 0 for a in found)
            assert ks.route(name).primary >= 0
            for a in found:
                assert a.lease == ks.members[(a.zone, a.suffix)].lease
        assert [(m.zone, m.suffix) for m in ks.route("two").members] == [("z1", "a"), ("z2", "b")]

        await etcd_client.delete(item_key(etcd_prefix, "two").encode())
        await _until(lambda: ks.assignments("two") == [], ks)
        assert len(ks.assignments("one")) == 1
    finally:
        stop.set()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 5)
        for ks_ in keyspaces:
            await ks_.close()
        for ann in anns:
            await ann.release()
