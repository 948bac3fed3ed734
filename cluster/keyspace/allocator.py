"""Assignment of items to members: the pure planner (its plans are applied by
`cluster.keyspace.allocate`, Gazette's `allocator/allocator.go`).

Brokers (journals over brokers) and consumers (shards over consumers) share it, parameterized by
their `KeySpaceSchema`: an item's desired replication, a member's limit and exiting state, the
consistency rule, the value of a new or re-keyed assignment, and whether a member may join an item
as its primary. The text below says "journal" for an item and "journal_limit" for a member's limit.

Gazette's allocator (`allocator/sparse_flow_network.go`) solves a max-flow; this planner is greedy and aims at the same
balance. Every member runs `run_allocator` (`allocate.py`); only the leader (the member key with the lowest
CreateRevision) writes. Each round plans from the mirror, applies the plan in guarded
transactions, waits for the mirror to catch up and plans again, until there is nothing to change.

A round first repairs every journal: it adds assignments up to the desired replication (zone
spread first, then the member whose load would grow least), sheds members that are unusable (an
exiting member from all its journals at once, when each keeps enough consistent assignments
without it) or surplus (while enough consistent assignments stay), and promotes a primary where
slot 0 is empty (a consistent replica first, then the one with the fewest primaries). A journal
assigned from nothing gets its primary on the member with the fewest primaries.

Then it rebalances. The objective is the sum over usable members of load**2 / journal_limit plus
PRIMARY_WEIGHT times the same of primaries: with equal limits it is least when every member holds
within one assignment, and is primary of within one journal, of every other. A move is made only
if it lowers the objective (or widens the journal's zone spread) and never narrows the zone
spread. Only a journal whose assignments are all consistent moves, once per round, and only
while fewer than `max_moves` journals are still taking up a move (see `_moving`), so the cluster
does not churn:

- `AddPrimary`: a member that does not hold the journal joins it as its primary; the old
  primary's assignment moves to a free slot in the same transaction. It upgrades a repair Add
  (when a member joins or comes back: not counted against `max_moves`, since the journal changes
  anyway, and allowed in a journal that is not consistent if no pipeline can hold the member's
  replica, see `_may_lead`) or adds a member beyond the replication, whose surplus the remove
  rule sheds once the journal is consistent again. The new primary syncs its peers to the
  furthest one before it takes an append, so no acknowledged append is lost; appends in flight at
  the old primary finish before the old primary accepts the new one's Replicate stream, which
  voids its pipeline.
  The new member must not hold the journal already: while a journal is consistent, its primary
  streams to every other member, and each such stream holds that member's replica lock until the
  primary's pipeline closes, which nothing but a new Replicate stream to the old primary does.
- `Add` of a member beyond the replication, the surplus shed later: moves replicas, when the
  replication is below the number of members.
- `Handoff`: a consistent replica becomes primary in place (both assignments re-keyed in one
  transaction): the only way to move a primary when every usable member holds the journal. Off
  for brokers (see IN_PLACE_HANDOFF), on for consumers.
- Over-replicating briefly, for a schema whose members cannot join as primaries (consumers: a
  shard's primary must have been its standby, Gazette's hand-off rule) and with in-place hand-off
  on: an `Add` of a member that does not hold the journal, beyond the replication, meant to take
  over the primary (even with `hot_standbys` 0). The tallies count the primary as moved at once.
  The journal then has a surplus, so it counts against `max_moves` (see `_moving`) until it is
  shed. Later rounds repair it: the member to shed from a journal with a surplus may be its
  primary's, when handing the primary to a standby, then shedding that member, lowers the
  objective more than shedding a standby does (`_shed_primary`). The primary waits until that
  standby is consistent (STANDBY: caught up) and no hand-off is under way, is then handed off in
  place (`Handoff`), and the demoted old primary is shed by the surplus rule in a later round.
  Brokers (AddPrimary) never take this path.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cluster.keyspace.keyspace import (
    BROKER_SCHEMA,
    Assignment,
    Item,
    KeySpaceSchema,
    Member,
)
from cluster.keyspace.keyspace import (
    desired_replication as desired_replication,  # The broker's, re-exported.
)

MAX_REPLICATION = 9
"""Default of `--broker.max-replication`."""
MIN_MOVES = 8
"""Rebalancing moves journals while fewer than max(MIN_MOVES, journals // MOVES_DIVISOR) of them
are still taking up a move."""
MOVES_DIVISOR = 20
MOVE_PASSES = 2
"""Passes over the journals a round makes looking for moves."""
PRIMARY_WEIGHT = 3
"""Primaries weigh three times assignments in the objective, so that a primary moves even when
that unbalances assignments by one (a later move restores them)."""
IN_PLACE_HANDOFF = BROKER_SCHEMA.in_place_handoff
"""The broker's default (its schema's) of whether rebalancing may make a replica the primary
while the old primary stays a member. Off because the broker's resolver keeps a demoted primary's
pipeline: its idle Replicate stream holds the new primary's replica lock, and the journal takes
no append until the old primary's pipeline closes (it restarts, or loses the journal). Gazette's
resolver replaces a demoted primary's replica; once ours closes the pipeline of a journal it no
longer leads, this can be on. A schema gives its own default (`KeySpaceSchema.in_place_handoff`)."""

_EPSILON = 1e-9

_log = logging.getLogger(__name__)

MemberId = tuple[str, str]


@dataclass(frozen=True)
class Add:
    """Create a new (empty) assignment of item `item_id` to a member at `slot`, under the member's lease."""

    item_id: str
    zone: str
    suffix: str
    slot: int
    lease: int
    member_key: str
    member_mod_revision: int
    item_mod_revision: int

    @property
    def journal(self) -> str:
        """The broker's name for `item_id`."""
        return self.item_id


@dataclass(frozen=True)
class Remove:
    """Delete an assignment of a live journal."""

    assignment: Assignment
    item_mod_revision: int


@dataclass(frozen=True)
class Promote:
    """Move an assignment to slot 0, keeping its value and lease."""

    assignment: Assignment
    item_mod_revision: int


@dataclass(frozen=True)
class AddPrimary:
    """Add a member to a journal as its primary (`add`, at slot 0) and move the current primary's
    assignment to `slot` (value and lease kept), in one transaction."""

    add: Add
    primary: Assignment
    slot: int

    @property
    def item_id(self) -> str:
        return self.add.item_id

    @property
    def journal(self) -> str:
        return self.item_id


@dataclass(frozen=True)
class Handoff:
    """Make a replica the primary in place: the primary's assignment moves to `slot` and the
    replica's to slot 0 (values and leases kept), in one transaction."""

    primary: Assignment
    replica: Assignment
    slot: int
    item_mod_revision: int

    @property
    def item_id(self) -> str:
        return self.primary.item_id

    @property
    def journal(self) -> str:
        return self.item_id


@dataclass(frozen=True)
class DeleteOrphan:
    """Delete an assignment whose journal no longer exists."""

    assignment: Assignment


Change = Add | Remove | Promote | AddPrimary | Handoff | DeleteOrphan


def leader_of(members: Mapping[MemberId, Member]) -> Member | None:
    """The member with the lowest CreateRevision, if any."""
    return min(members.values(), key=lambda m: (m.create_revision, m.key), default=None)


def _mid(a: Assignment) -> MemberId:
    return (a.zone, a.suffix)


class _Tally:
    """Assignments and primaries per member, kept current as changes are planned, and the marginal
    costs of the objective (the sum over usable members of count**2 / journal_limit, primaries
    weighted by PRIMARY_WEIGHT)."""

    def __init__(self, usable: Mapping[MemberId, Member], limits: Mapping[MemberId, int]) -> None:
        self.usable = usable
        self.limits = limits
        """Each usable member's limit (journal_limit, shard_limit)."""
        self.held: Counter[MemberId] = Counter()
        """Assignments per member once the planned changes are made: what journal_limit caps."""
        self.load: Counter[MemberId] = Counter()
        """As `held`, less the members that journals will shed once consistent: what is balanced."""
        self.primaries: Counter[MemberId] = Counter()

    def limit(self, mid: MemberId) -> int:
        return self.limits.get(mid, 0)

    def has_room(self, mid: MemberId) -> bool:
        return self.held[mid] < self.limit(mid)

    def add(self, mid: MemberId) -> None:
        self.held[mid] += 1
        self.load[mid] += 1

    def remove(self, mid: MemberId) -> None:
        self.held[mid] -= 1
        self.load[mid] -= 1

    def _grow(self, counts: Counter[MemberId], mid: MemberId) -> float:
        limit = self.limit(mid)
        return (2 * counts[mid] + 1) / limit if limit > 0 else float("inf")

    def _shrink(self, counts: Counter[MemberId], mid: MemberId) -> float:
        limit = self.limit(mid)
        # Shedding from an unusable member is free (it counts for nothing).
        return (2 * counts[mid] - 1) / limit if limit > 0 else 0.0

    def grow_load(self, mid: MemberId) -> float:
        return self._grow(self.load, mid)

    def shrink_load(self, mid: MemberId) -> float:
        return self._shrink(self.load, mid)

    def grow_primaries(self, mid: MemberId) -> float:
        return self._grow(self.primaries, mid)

    def shrink_primaries(self, mid: MemberId) -> float:
        return self._shrink(self.primaries, mid)

    def load_move(self, source: MemberId, target: MemberId) -> float:
        """The objective's change when one assignment moves from `source` to `target`."""
        return self._grow(self.load, target) - self._shrink(self.load, source)

    def primary_move(self, source: MemberId, target: MemberId) -> float:
        """The objective's change when one primary moves from `source` to `target`."""
        if source not in self.usable:
            return -float("inf")  # Always worth moving off an exiting member.
        return PRIMARY_WEIGHT * (self._grow(self.primaries, target) - self._shrink(self.primaries, source))


@dataclass
class _Journal:
    """One journal's planning state."""

    name: str
    item: Item
    current: list[Assignment]
    replication: int
    consistent: dict[str, bool]
    changes: list[Change] = field(default_factory=list)
    members: set[MemberId] = field(default_factory=set)
    """Its members once the planned (and anticipated) changes are made."""
    primary: Assignment | None = None
    """Its primary assignment, while no change planned for it touches slot 0."""
    next_slot: int = 0
    repair_adds: list[Add] = field(default_factory=list)
    upgradable: list[Add] = field(default_factory=list)
    """The repair Adds that may be upgraded to an AddPrimary (see `_may_lead`)."""
    complete: bool = False
    """Consistent, exactly `replication` assignments, all on usable members, nothing planned and
    no move made: it may move."""


def plan(
    journals: Mapping[str, Item],
    members: Mapping[MemberId, Member],
    assignments: Mapping[str, Sequence[Assignment]],
    max_replication: int = MAX_REPLICATION,
    *,
    schema: KeySpaceSchema = BROKER_SCHEMA,
    max_moves: int | None = None,
    in_place_handoff: bool | None = None,
) -> list[Change]:
    """The changes that move `assignments` toward the desired replication of every item (journal
    or shard, by name in `journals`), then toward balance (see the module's docstring).
    `in_place_handoff` defaults to the schema's."""
    if in_place_handoff is None:
        in_place_handoff = schema.in_place_handoff
    # Usable members take new assignments and keep theirs; the others (exiting, limit 0, gone)
    # are shed once enough consistent replicas exist elsewhere.
    limits = {mid: schema.member_limit(m.spec) for mid, m in members.items() if not schema.member_exiting(m.spec)}
    usable = {mid: members[mid] for mid, limit in limits.items() if limit > 0}
    tally = _Tally(usable, limits)
    for found in assignments.values():
        for a in found:
            tally.add(_mid(a))
            if a.slot == 0:
                tally.primaries[_mid(a)] += 1

    orphans: list[Change] = []
    for journal in sorted(assignments):
        if journal not in journals:
            orphans.extend(DeleteOrphan(a) for a in assignments[journal])
    moving = 0
    states: list[_Journal] = []
    for name in sorted(journals):
        item = journals[name]
        current = list(assignments.get(name, ()))
        consistent = dict(zip((a.key for a in current), schema.consistency(current), strict=True))
        replication = min(schema.desired_replication(item.spec), max_replication, len(usable))
        if _moving(current, replication, usable, schema):
            moving += 1
        states.append(_Journal(name, item, current, replication, consistent))
    unready = _unready_to_shed(states, usable)
    # A schema whose members cannot join as primaries moves a primary by over-replicating: a
    # surplus standby first, then an in-place Handoff to it, then the old primary is shed.
    via_standby = in_place_handoff and not schema.join_as_primary
    for state in states:
        _converge(state, tally, unready, schema, via_standby)

    if max_moves is None:
        max_moves = max(MIN_MOVES, len(journals) // MOVES_DIVISOR)
    _rebalance(states, tally, max_moves - moving, in_place_handoff, schema.join_as_primary)

    changes = orphans
    for state in states:
        changes.extend(state.changes)
    return changes


def _moving(
    current: Sequence[Assignment], replication: int, usable: Mapping[MemberId, Member], schema: KeySpaceSchema
) -> bool:
    """Whether a journal is still taking up a move: it has a member to shed, or its values show a
    primary hand-off under way (for brokers: the new primary has not yet advertised its route)."""
    if sum(1 for a in current if _mid(a) in usable) > replication:
        return True
    return schema.handing_off(current)


def _unready_to_shed(states: list[_Journal], usable: Mapping[MemberId, Member]) -> set[MemberId]:
    """Unusable members that some journal cannot shed yet (too few consistent assignments without
    them). A member is shed from all its journals at once: shed from some, those would refuse
    appends (short of replicas) and their writers wait, while the others wait for an append to
    become consistent, and the exiting member for all of them to be shed."""
    unready: set[MemberId] = set()
    for j in states:
        for a in j.current:
            if _mid(a) not in usable:
                others = sum(1 for r in j.current if r is not a and j.consistent[r.key])
                if others < j.replication:
                    unready.add(_mid(a))
    return unready


def _converge(
    j: _Journal, tally: _Tally, unready: set[MemberId], schema: KeySpaceSchema, via_standby: bool = False
) -> None:
    """Plan one journal's adds, removes and promotion; update `tally` as it plans. With
    `via_standby`, the member to shed from a journal with a surplus may be its primary: it hands
    the primary off to a consistent standby first (see `_shed_primary`)."""
    usable = tally.usable
    current, replication, consistent = j.current, j.replication, j.consistent
    item = j.item

    # Add: reach the replication on usable members, spreading zones, then least loaded.
    good = [a for a in current if _mid(a) in usable]
    assigned = {_mid(a) for a in current}
    zones: Counter[str] = Counter(a.zone for a in good)
    candidates = [mid for mid in sorted(usable) if mid not in assigned and tally.has_room(mid)]
    chosen: list[MemberId] = []
    for _ in range(replication - len(good)):
        if not candidates:
            break
        if not current and not chosen:
            # A journal assigned from nothing: its primary goes where primaries are fewest.
            mid = min(candidates, key=lambda m: (tally.grow_primaries(m), tally.grow_load(m), m))
            tally.primaries[mid] += 1
        else:
            mid = min(candidates, key=lambda m: (zones[m[0]], tally.grow_load(m), tally.grow_primaries(m), m))
        candidates.remove(mid)
        chosen.append(mid)
        zones[mid[0]] += 1
        tally.add(mid)
    slot = max((a.slot for a in current), default=-1) + 1
    for mid in chosen:
        member = usable[mid]
        add = Add(j.name, mid[0], mid[1], slot, member.lease, member.key, member.mod_revision, item.mod_revision)
        j.changes.append(add)
        j.repair_adds.append(add)
        slot += 1
    j.next_slot = slot

    # Remove: shed unusable members (whenever `replication` consistent assignments remain without
    # them), then surplus ones: the best to shed first, and only while that one can go.
    remaining = list(current)
    removed: list[Assignment] = []

    def still_consistent(a: Assignment) -> int:
        return sum(1 for r in remaining if r is not a and consistent[r.key])

    def remove(a: Assignment) -> None:
        remaining.remove(a)
        removed.append(a)
        j.changes.append(Remove(a, item.mod_revision))
        tally.remove(_mid(a))
        if a.slot == 0:
            tally.primaries[_mid(a)] -= 1

    for a in sorted((a for a in current if _mid(a) not in usable), key=lambda a: (a.slot == 0, _mid(a))):
        if _mid(a) not in unready and still_consistent(a) >= replication:
            remove(a)
    pending: Assignment | None = None
    handed_off = False
    while sum(1 for r in remaining if _mid(r) in usable) > replication:
        a = _best_to_shed(remaining, tally)
        swap = _shed_primary(remaining, a, tally) if via_standby else None
        if swap is not None:
            # The primary's member is the one to shed: its standby takes the primary in place once
            # consistent (and no hand-off is still under way); the old primary, demoted to a
            # standby, is shed by a later round. Until then, count the primary as moved already.
            leader, standby = swap
            if consistent[standby.key] and not schema.handing_off(current):
                j.changes.append(Handoff(leader, standby, j.next_slot, item.mod_revision))
                j.next_slot += 1
                handed_off = True
            tally.primaries[_mid(leader)] -= 1
            tally.primaries[_mid(standby)] += 1
            pending = leader
            break
        if still_consistent(a) < replication:
            pending = a
            break
        remove(a)

    # Promote: give a journal that has assignments but no primary one, preferring a usable,
    # consistent member with the fewest primaries per limit.
    promoted = False
    if remaining and not any(a.slot == 0 for a in remaining):
        chosen_primary = min(
            remaining,
            key=lambda a: (
                _mid(a) not in usable,
                not consistent[a.key],
                tally.grow_primaries(_mid(a)),
                _mid(a),
            ),
        )
        tally.primaries[_mid(chosen_primary)] += 1
        j.changes.append(Promote(chosen_primary, item.mod_revision))
        promoted = True

    j.members = {_mid(a) for a in remaining} | {(add.zone, add.suffix) for add in j.repair_adds}
    if pending is not None:
        # A surplus member waits for consistency to be shed: count it as gone already, so that
        # rebalancing does not move more off that member meanwhile.
        tally.load[_mid(pending)] -= 1
        j.members.discard(_mid(pending))
    was_consistent = bool(current) and all(consistent.values())
    primary = next((a for a in remaining if a.slot == 0), None)
    if not removed and not promoted and not handed_off and primary is not None and replication > 0:
        j.primary = primary
        if schema.join_as_primary:
            j.upgradable = [
                add for add in j.repair_adds if was_consistent or _may_lead(add, current, usable, schema)
            ]
        j.complete = (
            was_consistent
            and not schema.handing_off(current)
            and not j.changes
            and pending is None
            and len(current) == replication
            and all(_mid(a) in usable for a in current)
        )


def _may_lead(
    add: Add, current: Sequence[Assignment], usable: Mapping[MemberId, Member], schema: KeySpaceSchema
) -> bool:
    """Whether the member `add` adds may become the primary of a journal that is not consistent.

    It may if no pipeline can hold its replica of the journal: pipelines stream to the members of
    a route the primary built them for, and the primary advertises that route in the assignment
    values before the allocator may remove a member. So if no value written since the member's
    key was created names it, no primary has streamed to this process's replica of the journal.
    (A consistent journal needs no such check: its primary streams to its current members only.)
    """
    mid = (add.zone, add.suffix)
    created = usable[mid].create_revision
    for a in current:
        if a.mod_revision >= created and mid in schema.named_members(a.value):
            return False
    return True


def _best_to_shed(remaining: Sequence[Assignment], tally: _Tally) -> Assignment:
    """The surplus assignment to remove first: not the primary, from the journal's most crowded zone,
    from the member whose load is highest per limit."""
    zones = Counter(a.zone for a in remaining)
    return min(
        (a for a in remaining if _mid(a) in tally.usable),
        key=lambda a: (a.slot == 0, -zones[a.zone], -round(tally.shrink_load(_mid(a)), 9), _mid(a)),
    )


def _shed_primary(
    remaining: Sequence[Assignment], best: Assignment, tally: _Tally
) -> tuple[Assignment, Assignment] | None:
    """The (primary, standby) whose hand-off, then the shedding of the primary's member, lowers
    the objective more than shedding `best` (the surplus standby `_best_to_shed` picked) does, if
    any: how a journal completes a move that added a surplus standby to take over its primary.
    The standby is the one the primary is best moved to, whether or not it is consistent yet."""
    primary = next((a for a in remaining if a.slot == 0 and _mid(a) in tally.usable), None)
    if primary is None or best is primary:
        return None
    p = _mid(primary)
    standbys = [a for a in remaining if a.slot != 0 and _mid(a) in tally.usable]
    if not standbys:
        return None
    standby = min(standbys, key=lambda a: (round(tally.primary_move(p, _mid(a)), 9), _mid(a)))
    moved = tally.primary_move(p, _mid(standby))
    if moved >= -_EPSILON:
        return None
    zones = Counter(a.zone for a in remaining)
    # As `_best_to_shed`: from the journal's most crowded zone first, then by the objective.
    crowded, other = zones[primary.zone], zones[best.zone]
    if crowded < other:
        return None
    if crowded == other and moved - tally.shrink_load(p) >= -tally.shrink_load(_mid(best)) - _EPSILON:
        return None
    return primary, standby


@dataclass
class _Move:
    """A planned rebalancing move of one journal and its score (lower is better)."""

    score: tuple[int, float]
    kind: str
    """"upgrade" (a repair Add becomes an AddPrimary), "add", "add-primary", "add-standby" (a
    surplus standby that is to take over the primary, see `_shed_primary`) or "handoff"."""
    target: MemberId
    source: MemberId | None = None  # Whose assignment the journal sheds later ("add", "add-primary", "add-standby").
    replica: Assignment | None = None  # The replica made primary ("handoff").
    upgraded: Add | None = None


def _distinct_zones(mids: set[MemberId] | list[MemberId]) -> int:
    return len({z for z, _ in mids})


class _Targets:
    """Usable members with room, cheapest first by load and by primaries, overall and per zone:
    where a journal's moves look for a new member."""

    def __init__(self, tally: _Tally) -> None:
        room = [mid for mid in tally.usable if tally.has_room(mid)]
        self.by_load = sorted(room, key=lambda m: (tally.grow_load(m), m))
        self.by_primaries = sorted(room, key=lambda m: (tally.grow_primaries(m), tally.grow_load(m), m))
        self.zones: dict[str, list[MemberId]] = {}
        for mid in self.by_load:
            self.zones.setdefault(mid[0], []).append(mid)

    def outside(self, members: set[MemberId]) -> list[MemberId]:
        """The best few targets that are not `members`: a couple by load and by primaries, and the
        best of each zone."""
        found: set[MemberId] = set()
        for ordered, wanted in (
            (self.by_load, 2),
            (self.by_primaries, 2),
            *((zone, 1) for zone in self.zones.values()),
        ):
            others = (mid for mid in ordered if mid not in members)
            found.update(itertools.islice(others, wanted))
        return sorted(found)


def _best_move(
    j: _Journal, tally: _Tally, targets: _Targets, in_place_handoff: bool, join_as_primary: bool
) -> _Move | None:
    """The journal's move that lowers the objective most (or widens its zone spread), if any."""
    assert j.primary is not None
    p = _mid(j.primary)
    best: _Move | None = None

    def consider(move: _Move) -> None:
        nonlocal best
        zone_gain, delta = move.score
        if zone_gain < 0 or (zone_gain == 0 and delta < -_EPSILON):
            if best is None or move.score < best.score:
                best = move

    if in_place_handoff:
        for a in j.current:
            if a.slot != 0 and _mid(a) in tally.usable and j.consistent[a.key]:
                consider(_Move((0, tally.primary_move(p, _mid(a))), "handoff", _mid(a), replica=a))
    outside = targets.outside(j.members)
    if not outside:
        return best
    zones_now = _distinct_zones(j.members)
    crowding = Counter(z for z, _ in j.members)
    for source in sorted(j.members):
        rest = [m for m in j.members if m != source]
        for target in outside:
            zones_after = _distinct_zones([*rest, target])
            if zones_after < zones_now:
                continue
            if zones_after == zones_now and target[0] != source[0] and crowding[target[0]] >= crowding[source[0]]:
                continue  # It would crowd the target's zone more than it relieves the source's.
            gain = -(zones_after - zones_now)
            delta = tally.load_move(source, target)
            if source != p:
                consider(_Move((gain, delta), "add", target, source=source))
            if join_as_primary:
                consider(_Move((gain, delta + tally.primary_move(p, target)), "add-primary", target, source=source))
            elif in_place_handoff and source == p:
                consider(_Move((gain, delta + tally.primary_move(p, target)), "add-standby", target, source=source))
    return best


def _rebalance(
    states: list[_Journal], tally: _Tally, budget: int, in_place_handoff: bool, join_as_primary: bool
) -> None:
    """Plan the upgrades of repair Adds (if members may join as primaries), then up to `budget`
    other moves."""
    if join_as_primary:
        _upgrade(states, tally)
    if budget > 0:
        _move(states, tally, budget, in_place_handoff, join_as_primary)


def _upgrade(states: list[_Journal], tally: _Tally) -> None:
    """Make a repair Add an AddPrimary where the added member has fewer primaries than the
    journal's primary, best (member pair) first. Not budgeted: the journal changes anyway, and when
    every usable member holds the journal this is the only chance to move its primary."""
    groups: dict[tuple[MemberId, MemberId], list[tuple[_Journal, Add]]] = {}
    for j in states:
        if j.primary is not None:
            for add in j.upgradable:
                groups.setdefault((_mid(j.primary), (add.zone, add.suffix)), []).append((j, add))
    for group in groups.values():
        group.reverse()  # pop() takes journals in name order.
    while groups:
        pair = min(groups, key=lambda k: (tally.primary_move(*k), k))
        if tally.primary_move(*pair) >= -_EPSILON:
            return
        j, add = groups[pair].pop()
        if not groups[pair]:
            del groups[pair]
        if j.primary is not None:
            _apply_move(j, _Move((0, 0.0), "upgrade", pair[1], upgraded=add), tally)


def _improvable(tally: _Tally, journals: list[_Journal]) -> bool:
    """Whether any move could lower the objective or widen a journal's zone spread."""
    usable = [mid for mid in tally.usable if tally.has_room(mid)]
    if not usable:
        return False
    grow_load = min(tally.grow_load(m) for m in usable)
    grow_primaries = min(tally.grow_primaries(m) for m in usable)
    if any(tally.shrink_load(m) > grow_load + _EPSILON for m in tally.usable if tally.load[m] > 0):
        return True
    if any(tally.shrink_primaries(m) > grow_primaries + _EPSILON for m in tally.usable if tally.primaries[m] > 0):
        return True
    zones = len({z for z, _ in tally.usable})
    return any(_distinct_zones(j.members) < min(zones, len(j.members)) for j in journals)


def _move(
    states: list[_Journal], tally: _Tally, budget: int, in_place_handoff: bool, join_as_primary: bool
) -> None:
    """Plan up to `budget` moves of complete journals: journals whose primary, then members, are
    the most loaded go first; each takes its best move with the tallies of the moment."""
    candidates = [j for j in states if j.complete]
    for _ in range(MOVE_PASSES):
        if budget <= 0 or not candidates or not _improvable(tally, candidates):
            return
        order = sorted(
            candidates,
            key=lambda j: (
                -tally.shrink_primaries(_mid(j.primary)) if j.primary is not None else 0.0,
                -max(tally.shrink_load(m) for m in j.members),
                j.name,
            ),
        )
        moved = False
        targets = _Targets(tally)
        for j in order:
            move = _best_move(j, tally, targets, in_place_handoff, join_as_primary)
            if move is None:
                continue
            _apply_move(j, move, tally)
            moved = True
            budget -= 1
            if budget <= 0:
                return
            targets = _Targets(tally)
        if not moved:
            return
        candidates = [j for j in candidates if j.complete]


def _apply_move(j: _Journal, move: _Move, tally: _Tally) -> None:
    assert j.primary is not None
    primary, p, item = j.primary, _mid(j.primary), j.item
    target = tally.usable[move.target]

    def add_at(slot: int) -> Add:
        return Add(j.name, target.zone, target.suffix, slot, target.lease, target.key,
                   target.mod_revision, item.mod_revision)

    if move.kind == "upgrade":
        assert move.upgraded is not None
        index = j.changes.index(move.upgraded)
        j.changes[index] = AddPrimary(add_at(0), primary, move.upgraded.slot)
        j.repair_adds.remove(move.upgraded)
    elif move.kind == "handoff":
        assert move.replica is not None
        j.changes.append(Handoff(primary, move.replica, j.next_slot, item.mod_revision))
        j.next_slot += 1
    else:
        assert move.source is not None
        if move.kind in ("add", "add-standby"):
            j.changes.append(add_at(j.next_slot))
        else:
            j.changes.append(AddPrimary(add_at(0), primary, j.next_slot))
        j.next_slot += 1
        tally.add(move.target)
        tally.load[move.source] -= 1  # It holds the journal until the journal sheds it.
        j.members.discard(move.source)
        j.members.add(move.target)
    if move.kind != "add":
        tally.primaries[p] -= 1
        tally.primaries[move.target] += 1
    j.primary, j.complete = None, False  # One move per journal and round.
