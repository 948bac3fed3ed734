"""The allocator: pure planning rules, transaction batching, and a run against a real etcd."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from broker.protocol import pb
from cluster.keyspace.allocate import batch_txns, change_txn, plan_keyspace, run_allocator
from cluster.keyspace.allocator import (
    MIN_MOVES,
    MOVES_DIVISOR,
    Add,
    AddPrimary,
    Change,
    DeleteOrphan,
    Handoff,
    Promote,
    Remove,
    desired_replication,
    leader_of,
    plan,
)
from cluster.keyspace.announce import Announcement
from cluster.keyspace.keyspace import (
    Assignment,
    Item,
    KeySpace,
    Member,
    assignment_key,
    derive_route,
    is_consistent_with,
    item_key,
    member_key,
    put_op,
    txn,
)

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
    # First the replacement is added, as the primary (the exiting one moves to a free slot); the
    # exiting replica stays while it is needed.
    changes = plan(journals, ms, {"j": assigned("j", ("z", "x", 0), ("z", "a", 1))})
    [moved] = changes
    assert isinstance(moved, AddPrimary)
    assert (moved.add.suffix, moved.add.slot, moved.primary.suffix, moved.slot) == ("b", 0, "x", 2)
    # Not yet consistent (the exiting primary has not advertised the route): still as the primary,
    # since no value names b (no pipeline streams to b's replica).
    unsettled = assigned("j", ("z", "x", 0), ("z", "a", 1), consistent=False)
    assert [type(c) for c in plan(journals, ms, {"j": unsettled})] == [AddPrimary]
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


# -- balance: plan() rounds replayed over assignments held in memory -------------------------------

MemberId = tuple[str, str]


class Cluster:
    """Members and assignments in memory. `step()` plans one round and applies it as the etcd
    transactions would, checking the safety rules of every change; `settle()` makes journals
    consistent, as their primaries do when they next append (advertising their routes)."""

    def __init__(self, journals: dict[str, Item], *ms: Member) -> None:
        self.journals = journals
        self.members = members(*ms)
        self.assignments: dict[str, list[Assignment]] = {}
        self._revision = itertools.count(100)

    def join(self, m: Member) -> None:
        self.members[(m.zone, m.suffix)] = m

    def leave(self, zone: str, suffix: str) -> None:
        """The member's lease expires: its key and assignments are gone."""
        del self.members[(zone, suffix)]
        for name in list(self.assignments):
            kept = [a for a in self.assignments[name] if (a.zone, a.suffix) != (zone, suffix)]
            self.assignments[name] = kept
            if not kept:
                del self.assignments[name]

    def plan(self, **kwargs: Any) -> list[Change]:
        return plan(self.journals, self.members, self.assignments, **kwargs)

    def _assignment(self, journal: str, zone: str, suffix: str, slot: int, route: pb.Route, lease: int) -> Assignment:
        revision = next(self._revision)
        key = assignment_key(ROOT, journal, zone, suffix, slot)
        return Assignment(journal, zone, suffix, slot, route, key, revision, revision, lease)

    def _rekey(self, a: Assignment, slot: int) -> Assignment:
        return self._assignment(a.journal, a.zone, a.suffix, slot, a.route, a.lease)

    def apply(self, changes: Sequence[Change]) -> None:
        """Apply `changes`, asserting that no journal loses a consistent primary without a
        consistent replacement, nor falls below its replication of consistent assignments."""
        before = {name: list(found) for name, found in self.assignments.items()}
        for c in changes:
            if isinstance(c, (Add, AddPrimary)):
                add = c.add if isinstance(c, AddPrimary) else c
                found = self.assignments.setdefault(add.journal, [])
                assert (add.zone, add.suffix) not in {(a.zone, a.suffix) for a in found}, "added twice"
                if isinstance(c, AddPrimary):
                    found.remove(c.primary)
                    found.append(self._rekey(c.primary, c.slot))
                empty = pb.Route(primary=-1)
                found.append(self._assignment(add.journal, add.zone, add.suffix, add.slot, empty, add.lease))
            elif isinstance(c, Handoff):
                found = self.assignments[c.journal]
                found.remove(c.primary)
                found.remove(c.replica)
                found += [self._rekey(c.primary, c.slot), self._rekey(c.replica, 0)]
            elif isinstance(c, Promote):
                found = self.assignments[c.assignment.journal]
                found.remove(c.assignment)
                found.append(self._rekey(c.assignment, 0))
            else:
                self.assignments[c.assignment.journal].remove(c.assignment)
        self.assignments = {name: found for name, found in self.assignments.items() if found}
        for name, old in before.items():
            if name not in self.journals:
                continue
            ok = {(a.zone, a.suffix) for a, c in zip(old, is_consistent_with(old), strict=True) if c}
            now = self.assignments.get(name, [])
            held = {(a.zone, a.suffix) for a in now}
            replication = min(desired_replication(self.journals[name].spec), len(self.usable()))
            assert len(ok & held) >= min(replication, len(ok)), f"{name} lost consistent replicas"
            primary = next(((a.zone, a.suffix) for a in old if a.slot == 0), None)
            if replication and primary in ok and primary not in held:
                new = next(((a.zone, a.suffix) for a in now if a.slot == 0), None)
                assert new in ok, f"{name} lost its consistent primary without a consistent replacement"
            assert len({a.slot for a in now}) == len(now), f"{name} has two assignments at one slot"
        for mid, m in self.usable().items():
            assert self.loads()[mid] <= m.spec.journal_limit, f"{mid} is over its journal_limit"

    def settle(self, *names: str) -> None:
        for name in names or list(self.assignments):
            route = derive_route(self.assignments[name])
            self.assignments[name] = [replace(a, value=route) for a in self.assignments[name]]

    def step(self, settle: bool = True, **kwargs: Any) -> list[Change]:
        changes = self.plan(**kwargs)
        self.apply(changes)
        if settle:
            self.settle()
        return changes

    def converge(self, rounds: int = 50, **kwargs: Any) -> int:
        """Replay rounds (each settled) until one plans nothing; return how many made changes."""
        for n in range(rounds):
            if not self.step(**kwargs):
                return n
        raise AssertionError(f"still changing after {rounds} rounds")

    def usable(self) -> dict[MemberId, Member]:
        return {mid: m for mid, m in self.members.items() if not m.spec.exiting and m.spec.journal_limit > 0}

    def primaries(self) -> dict[str, int]:
        """Primaries per member suffix, members with none included."""
        counts = Counter(a.suffix for found in self.assignments.values() for a in found if a.slot == 0)
        return {suffix: counts[suffix] for _, suffix in sorted(self.members)}

    def loads(self) -> Counter[MemberId]:
        return Counter((a.zone, a.suffix) for found in self.assignments.values() for a in found)


def journals_of(count: int, replication: int) -> dict[str, Item]:
    return {f"j{i:02}": item(f"j{i:02}", replication) for i in range(count)}


def three_zones() -> list[Member]:
    return [member("a", "broker-a"), member("b", "broker-b"), member("c", "broker-c")]


def test_three_members_twelve_journals_balance_from_scratch() -> None:
    cluster = Cluster(journals_of(12, 3), *three_zones())
    changes = cluster.step()
    assert len(changes) == len(of(Add, changes)) == 36
    assert cluster.primaries() == {"broker-a": 4, "broker-b": 4, "broker-c": 4}
    assert set(cluster.loads().values()) == {12}
    assert cluster.plan() == [], "a balanced cluster plans nothing"


def test_balance_after_a_member_leaves_and_after_it_rejoins() -> None:
    cluster = Cluster(journals_of(12, 3), *three_zones())
    cluster.converge()
    c = cluster.members[("c", "broker-c")]

    cluster.leave("c", "broker-c")
    assert cluster.converge() == 1  # One round promotes a primary for each of c's journals.
    assert cluster.primaries() == {"broker-a": 6, "broker-b": 6}
    assert all(len(found) == 2 for found in cluster.assignments.values())

    cluster.join(c)
    changes = cluster.step()
    # c is added to every journal, as primary of a third of them: the primaries it takes over
    # move to free slots in the same transactions.
    moved = of(AddPrimary, changes)
    assert len(of(Add, changes)) + len(moved) == 12 and len(moved) == 4
    assert {m.add.suffix for m in moved} == {"broker-c"} and all(m.add.slot == 0 for m in moved)
    assert Counter(m.primary.suffix for m in moved) == {"broker-a": 2, "broker-b": 2}
    assert cluster.primaries() == {"broker-a": 4, "broker-b": 4, "broker-c": 4}
    assert cluster.converge() == 0


def test_rejoin_while_journals_are_unsettled() -> None:
    cluster = Cluster(journals_of(12, 3), *three_zones())
    cluster.converge()
    cluster.leave("c", "broker-c")
    cluster.step(settle=False)  # Promoted, but no primary has advertised its route yet.
    # c's process comes back (its member key is newer than every assignment value): though the
    # journals are not consistent, c may be the primary of any (no pipeline streams to it).
    cluster.join(member("c", "broker-c", created=10**6))
    changes = cluster.step(settle=False)
    assert len(of(Add, changes)) == 8 and len(of(AddPrimary, changes)) == 4
    assert cluster.primaries() == {"broker-a": 4, "broker-b": 4, "broker-c": 4}


def test_member_named_by_a_newer_value_joins_an_unsettled_journal_as_a_replica() -> None:
    # b left the journal, but the primary has not advertised the route without it yet: its
    # pipeline may still stream to b's replica, holding it. b joins as a replica, until consistent.
    route = pb.Route(members=[pb.ProcessSpec.ID(zone="a", suffix="broker-a"),
                              pb.ProcessSpec.ID(zone="b", suffix="broker-b")], primary=0)
    key = assignment_key(ROOT, "j", "a", "broker-a", 0)
    stale = [Assignment("j", "a", "broker-a", 0, route, key, 20, 20, 7)]
    heavy = {f"k{i}": assigned(f"k{i}", ("a", "broker-a", 0)) for i in range(4)}
    journals = {"j": item("j", 2)} | {name: item(name) for name in heavy}
    for created, kind in ((5, Add), (30, AddPrimary)):
        ms = members(member("a", "broker-a"), member("b", "broker-b", created=created))
        changes = [c for c in plan(journals, ms, {"j": stale} | heavy) if getattr(c, "journal", "") == "j"]
        assert [type(c) for c in changes] == [kind]
    # Once consistent, b may lead whatever its key's age.
    ms = members(member("a", "broker-a"), member("b", "broker-b", created=5))
    current = assigned("j", ("a", "broker-a", 0))
    changes = [c for c in plan(journals, ms, {"j": current} | heavy) if getattr(c, "journal", "") == "j"]
    assert [type(c) for c in changes] == [AddPrimary]


def test_in_place_handoff_when_every_member_holds_the_journal() -> None:
    cluster = Cluster(journals_of(12, 3), *three_zones())
    cluster.converge()
    c = cluster.members[("c", "broker-c")]
    cluster.leave("c", "broker-c")
    cluster.step(settle=False)
    cluster.join(c)  # Its key is older than the values naming it: only Adds.
    changes = cluster.step()
    assert [type(ch) for ch in changes] == [Add] * 12
    assert cluster.primaries()["broker-c"] == 0
    # Every member holds every journal: only an in-place handoff moves a primary (off by default).
    assert cluster.plan() == []
    assert cluster.converge(in_place_handoff=True) == 1
    assert cluster.primaries() == {"broker-a": 4, "broker-b": 4, "broker-c": 4}


def test_exiting_member_is_shed_and_balance_restored() -> None:
    cluster = Cluster(journals_of(12, 3), *three_zones())
    cluster.converge()
    c = cluster.members[("c", "broker-c")]
    cluster.join(member("c", "broker-c", exiting=True))
    cluster.converge()
    assert cluster.loads()[("c", "broker-c")] == 0
    assert cluster.primaries() == {"broker-a": 6, "broker-b": 6, "broker-c": 0}
    cluster.leave("c", "broker-c")
    cluster.join(c)
    cluster.converge()
    assert cluster.primaries() == {"broker-a": 4, "broker-b": 4, "broker-c": 4}


def test_exiting_member_is_shed_from_all_its_journals_at_once() -> None:
    # Shed from j1 alone, j1 would refuse appends (two replicas of three) while j2 waits for an
    # append to become consistent, and the exiting member for j2.
    ms = members(member("a", "broker-a"), member("b", "broker-b"), member("c", "broker-c", exiting=True))
    slots = (("a", "broker-a", 0), ("b", "broker-b", 1), ("c", "broker-c", 2))
    journals = {"j1": item("j1", 3), "j2": item("j2", 3)}
    settled = {"j1": assigned("j1", *slots), "j2": assigned("j2", *slots)}
    unsettled = {"j1": settled["j1"], "j2": assigned("j2", *slots, consistent=False)}
    assert plan(journals, ms, unsettled) == []
    removes = of(Remove, plan(journals, ms, settled))
    assert sorted((r.assignment.journal, r.assignment.suffix) for r in removes) == [
        ("j1", "broker-c"), ("j2", "broker-c")
    ]


def test_new_member_takes_primaries_and_replicas_when_replication_is_below_members() -> None:
    cluster = Cluster(journals_of(12, 2), *three_zones())
    cluster.converge()
    assert cluster.primaries() == {"broker-a": 4, "broker-b": 4, "broker-c": 4}
    assert set(cluster.loads().values()) == {8}
    cluster.join(member("d", "broker-d"))
    rounds = cluster.converge()
    assert cluster.primaries() == {"broker-a": 3, "broker-b": 3, "broker-c": 3, "broker-d": 3}
    assert set(cluster.loads().values()) == {6}
    assert all(len(found) == 2 for found in cluster.assignments.values())
    assert rounds <= 6


def test_zone_spread() -> None:
    ms = [member(zone, f"{zone}-{n}") for zone in "abc" for n in (1, 2)]
    cluster = Cluster(journals_of(12, 3), *ms)
    cluster.converge()
    for found in cluster.assignments.values():
        assert sorted(a.zone for a in found) == ["a", "b", "c"]
    assert set(cluster.loads().values()) == {6}
    assert set(cluster.primaries().values()) == {2}
    # A seventh member in zone a shares zone a's journals; spread is kept on the way.
    cluster.join(member("a", "a-3"))
    cluster.converge()
    for found in cluster.assignments.values():
        assert sorted(a.zone for a in found) == ["a", "b", "c"]
    loads = cluster.loads()
    assert sorted(loads[("a", s)] for s in ("a-1", "a-2", "a-3")) == [4, 4, 4]
    primaries = cluster.primaries().values()
    assert max(primaries) - min(primaries) <= 1
    # Two zones, replication 2: never two replicas of a journal in one zone.
    cluster = Cluster(journals_of(10, 2), member("a", "a-1"), member("a", "a-2"), member("b", "b-1"))
    cluster.converge()
    for found in cluster.assignments.values():
        assert sorted(a.zone for a in found) == ["a", "b"]
    assert cluster.loads()[("b", "b-1")] == 10


def test_journal_limit_is_respected_and_balance_is_proportional() -> None:
    sized = [member("a", "small", limit=10), member("b", "medium", limit=20), member("c", "large", limit=30)]
    cluster = Cluster(journals_of(30, 1), *sized)
    cluster.converge()
    assert cluster.primaries() == {"small": 5, "medium": 10, "large": 15}
    # Members at their limit take nothing more, though journals go unassigned.
    cluster = Cluster(journals_of(12, 1), member("a", "broker-a", limit=5), member("b", "broker-b", limit=5))
    cluster.converge()
    assert cluster.primaries() == {"broker-a": 5, "broker-b": 5}
    assert len(cluster.assignments) == 10
    # A third member takes the rest, then what balances the load per limit.
    cluster.join(member("c", "broker-c", limit=4))
    cluster.converge()
    assert cluster.primaries() == {"broker-a": 4, "broker-b": 4, "broker-c": 4}


def test_rebalance_never_removes_a_consistent_primary_without_a_consistent_replacement() -> None:
    # Cluster.apply asserts it for every round; here the rounds include moves, sheds and repairs.
    cluster = Cluster(journals_of(20, 2), *three_zones())
    cluster.converge()
    cluster.join(member("d", "broker-d"))
    cluster.join(member("a", "broker-e"))
    for _ in range(300):
        # Journals settle one at a time, so rounds see every mix of consistent and not.
        changes = cluster.step(settle=False)
        unsettled = [n for n, found in cluster.assignments.items() if not all(is_consistent_with(found))]
        if not changes and not unsettled:
            break
        if unsettled:
            cluster.settle(unsettled[0])
    else:
        raise AssertionError("did not converge")
    assert sorted(cluster.primaries().values()) == [4, 4, 4, 4, 4]
    assert sorted(cluster.loads().values()) == [8, 8, 8, 8, 8]
    # The primary of a journal shedding a member is never the one shed.
    ms = members(*three_zones())
    found = assigned("j", ("a", "broker-a", 0), ("b", "broker-b", 1), ("c", "broker-c", 2))
    heavy = {f"k{i}": assigned(f"k{i}", ("a", "broker-a", 0)) for i in range(5)}
    journals = {"j": item("j", 2)} | {name: item(name) for name in heavy}
    removes = of(Remove, plan(journals, ms, {"j": found} | heavy))
    assert [r.assignment.suffix for r in removes] != ["broker-a"]
    assert all(r.assignment.slot != 0 for r in removes)


def test_moves_are_bounded_per_round() -> None:
    cluster = Cluster(journals_of(60, 1), member("a", "broker-a"))
    cluster.converge()
    cluster.join(member("b", "broker-b"))
    cluster.join(member("c", "broker-c"))
    changes = cluster.step(settle=False, max_moves=5)
    assert len(changes) == 5 and all(isinstance(c, AddPrimary) for c in changes)
    # Those five journals are still taking up their moves: no more start until they settle.
    assert cluster.plan(max_moves=5) == []
    assert len(cluster.plan(max_moves=7)) == 2
    cluster.settle()
    rounds = cluster.converge(max_moves=5)
    assert cluster.primaries() == {"broker-a": 20, "broker-b": 20, "broker-c": 20}
    assert rounds >= 60 // 5
    # The default bound: max(MIN_MOVES, journals // MOVES_DIVISOR).
    cluster = Cluster(journals_of(60, 1), member("a", "broker-a"))
    cluster.converge()
    cluster.join(member("b", "broker-b"))
    assert len(cluster.plan()) == max(MIN_MOVES, 60 // MOVES_DIVISOR)


def test_balanced_cluster_plans_nothing() -> None:
    for journals, ms in (
        (journals_of(12, 3), three_zones()),
        (journals_of(13, 2), three_zones()),
        (journals_of(7, 1), [member("a", "broker-a"), member("a", "broker-b")]),
        (journals_of(12, 3), [member(zone, f"{zone}-{n}") for zone in "abc" for n in (1, 2)]),
    ):
        cluster = Cluster(journals, *ms)
        cluster.converge()
        primaries = cluster.primaries().values()
        assert max(primaries) - min(primaries) <= 1
        assert cluster.plan() == [] and cluster.plan(in_place_handoff=True) == []


def test_in_place_handoff() -> None:
    ms = members(*three_zones())
    current = {
        f"j{i}": assigned(f"j{i}", ("a", "broker-a", 0), ("b", "broker-b", 1), ("c", "broker-c", 2)) for i in range(3)
    }
    journals = {name: item(name, 3) for name in current}
    assert plan(journals, ms, current) == []
    handoffs = of(Handoff, plan(journals, ms, current, in_place_handoff=True))
    assert len(handoffs) == 2
    assert sorted((h.primary.suffix, h.replica.suffix, h.slot) for h in handoffs) == [
        ("broker-a", "broker-b", 3), ("broker-a", "broker-c", 3)
    ]
    # Never to a replica that is not consistent.
    stale = {name: assigned(name, ("a", "broker-a", 0), ("b", "broker-b", 1), ("c", "broker-c", 2), consistent=False)
             for name in current}
    assert plan(journals, ms, stale, in_place_handoff=True) == []


def test_primary_moves_are_single_transactions() -> None:
    ms = members(*three_zones())
    [primary, replica] = assigned("j", ("a", "broker-a", 0), ("b", "broker-b", 1))
    c = ms[("c", "broker-c")]
    add = Add("j", "c", "broker-c", 0, c.lease, c.key, c.mod_revision, 10)
    compares, ops = change_txn(ROOT, AddPrimary(add, primary, 2))
    puts = {op.request_put.key.decode(): op.request_put for op in ops if op.HasField("request_put")}
    deletes = [op.request_delete_range.key.decode() for op in ops if op.HasField("request_delete_range")]
    assert deletes == [primary.key]
    demoted = assignment_key(ROOT, "j", "a", "broker-a", 2)
    new = assignment_key(ROOT, "j", "c", "broker-c", 0)
    assert set(puts) == {demoted, new}
    assert (puts[demoted].value, puts[demoted].lease) == (primary.route.SerializeToString(), primary.lease)
    assert (puts[new].value, puts[new].lease) == (b"", c.lease)
    guarded = {(cmp.key.decode(), cmp.target) for cmp in compares}
    assert {(primary.key, 2), (demoted, 1), (new, 1), (c.key, 2), (item_key(ROOT, "j"), 2)} <= guarded

    compares, ops = change_txn(ROOT, Handoff(primary, replica, 2, 10))
    puts = {op.request_put.key.decode(): op.request_put for op in ops if op.HasField("request_put")}
    deletes = sorted(op.request_delete_range.key.decode() for op in ops if op.HasField("request_delete_range"))
    assert deletes == sorted([primary.key, replica.key])
    promoted = assignment_key(ROOT, "j", "b", "broker-b", 0)
    assert set(puts) == {demoted, promoted}
    assert puts[promoted].lease == replica.lease and puts[demoted].lease == primary.lease
    assert len(compares) == 5


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


async def test_primary_moves_apply_in_etcd(etcd_client: Any, etcd_prefix: str) -> None:
    """An AddPrimary, then a Handoff, each one guarded transaction that re-keys assignments with
    their values and leases; replayed, the stale guards fail."""
    anns = [
        Announcement(etcd_client, etcd_prefix, member(zone, suffix).spec, ttl=10)
        for zone, suffix in (("a", "broker-a"), ("b", "broker-b"), ("c", "broker-c"))
    ]
    for ann in anns:
        await ann.announce()
    ks = KeySpace(etcd_client, etcd_prefix)
    try:
        ops = []
        for name in ("j1", "j2"):
            spec = pb.JournalSpec(name=name, replication=2)
            ops.append(put_op(item_key(etcd_prefix, name), spec.SerializeToString()))
            route = pb.Route(members=[pb.ProcessSpec.ID(zone="a", suffix="broker-a"),
                                      pb.ProcessSpec.ID(zone="b", suffix="broker-b")], primary=0)
            for slot, ann in enumerate(anns[:2]):
                zone, suffix = ann.spec.process_spec.id.zone, ann.spec.process_spec.id.suffix
                key = assignment_key(etcd_prefix, name, zone, suffix, slot)
                ops.append(put_op(key, route.SerializeToString(), lease=ann.lease_id))
        await txn(etcd_client, [], ops)
        await ks.load()

        # broker-a is primary of both journals and broker-c of none: broker-c joins one as primary.
        [move] = plan_keyspace(ks)
        assert isinstance(move, AddPrimary) and move.add.suffix == "broker-c"
        ok, _ = await txn(etcd_client, *change_txn(etcd_prefix, move))
        assert ok
        moved = move.journal
        await ks.load()
        found = {(a.suffix, a.slot): a for a in ks.assignments(moved)}
        assert set(found) == {("broker-c", 0), ("broker-a", 2), ("broker-b", 1)}
        assert found[("broker-c", 0)].lease == anns[2].lease_id and found[("broker-c", 0)].route.primary == -1
        assert found[("broker-a", 2)].lease == anns[0].lease_id
        assert found[("broker-a", 2)].route == move.primary.route
        assert not (await txn(etcd_client, *change_txn(etcd_prefix, move)))[0], "a replay fails its guards"

        # In place: broker-b takes over the other journal.
        other = "j2" if moved == "j1" else "j1"
        primary, replica = sorted(ks.assignments(other), key=lambda a: a.slot)
        handoff = Handoff(primary, replica, 2, ks.journals[other].mod_revision)
        assert (await txn(etcd_client, *change_txn(etcd_prefix, handoff)))[0]
        await ks.load()
        found = {(a.suffix, a.slot): a for a in ks.assignments(other)}
        assert set(found) == {("broker-b", 0), ("broker-a", 2)}
        assert found[("broker-b", 0)].lease == anns[1].lease_id and found[("broker-a", 2)].lease == anns[0].lease_id
        assert ks.route(other, endpoints=False).members[ks.route(other).primary].suffix == "broker-b"
        assert not (await txn(etcd_client, *change_txn(etcd_prefix, handoff)))[0]
    finally:
        await ks.close()
        for ann in anns:
            await ann.release()
