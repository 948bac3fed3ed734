"""Assignment of journals to members: a pure planner and the loop that applies its plans.

A simplified form of the protocol digest's 10.3: greedy instead of max-flow. Every member runs
`run_allocator`; only the leader (the member key with the lowest CreateRevision) writes. Each
round plans from the mirror, applies the plan in guarded transactions, waits for the mirror to
catch up and plans again, until there is nothing left to change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from broker.keyspace.errors import KeySpaceClosedError
from broker.keyspace.keyspace import (
    Assignment,
    Item,
    KeySpace,
    Member,
    assignment_key,
    compare_create,
    compare_mod,
    delete_op,
    is_consistent_with,
    item_key,
    parse_member_key,
    put_op,
    txn,
)
from broker.protocol import pb

MAX_REPLICATION = 9
"""Default of `--broker.max-replication`."""
MAX_TXN_OPS = 128
"""etcd's default --max-txn-ops: the cap on both compares and operations of one transaction."""
SETTLE_TIMEOUT = 10.0
"""Seconds to wait for the mirror to reach the revision of an applied transaction."""
RETRY_DELAY = 1.0

_log = logging.getLogger(__name__)

MemberId = tuple[str, str]


@dataclass(frozen=True)
class Add:
    """Create an empty assignment of `journal` to a member at `slot`, under the member's lease."""

    journal: str
    zone: str
    suffix: str
    slot: int
    lease: int
    member_key: str
    member_mod_revision: int
    item_mod_revision: int


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
class DeleteOrphan:
    """Delete an assignment whose journal no longer exists."""

    assignment: Assignment


Change = Add | Remove | Promote | DeleteOrphan


def desired_replication(spec: pb.JournalSpec) -> int:
    """The spec's replication, or 1 when PARTIAL-suspended, 0 when FULL-suspended."""
    level = spec.suspend.level
    if level == pb.JournalSpec.Suspend.FULL:
        return 0
    if level == pb.JournalSpec.Suspend.PARTIAL:
        return 1
    return max(0, spec.replication)


def leader_of(members: Mapping[MemberId, Member]) -> Member | None:
    """The member with the lowest CreateRevision, if any."""
    return min(members.values(), key=lambda m: (m.create_revision, m.key), default=None)


def _ratio(count: int, limit: int) -> float:
    return count / limit if limit > 0 else math.inf


def plan(
    journals: Mapping[str, Item],
    members: Mapping[MemberId, Member],
    assignments: Mapping[str, Sequence[Assignment]],
    max_replication: int = MAX_REPLICATION,
) -> list[Change]:
    """The changes that move `assignments` toward the desired replication of every journal."""
    # Usable members take new assignments and keep theirs; the others (exiting, limit 0, gone)
    # are shed once enough consistent replicas exist elsewhere.
    usable = {mid: m for mid, m in members.items() if not m.spec.exiting and m.spec.journal_limit > 0}
    load: Counter[MemberId] = Counter()
    primaries: Counter[MemberId] = Counter()
    for found in assignments.values():
        for a in found:
            load[(a.zone, a.suffix)] += 1
            if a.slot == 0:
                primaries[(a.zone, a.suffix)] += 1

    changes: list[Change] = []
    for journal in sorted(assignments):
        if journal not in journals:
            changes.extend(DeleteOrphan(a) for a in assignments[journal])
    for name in sorted(journals):
        item = journals[name]
        replication = min(desired_replication(item.spec), max_replication, len(usable))
        changes.extend(_converge(item, list(assignments.get(name, ())), replication, usable, load, primaries))
    return changes


def _converge(
    item: Item,
    current: list[Assignment],
    replication: int,
    usable: Mapping[MemberId, Member],
    load: Counter[MemberId],
    primaries: Counter[MemberId],
) -> list[Change]:
    """Adds, removes and a promotion for one journal; updates `load` and `primaries` as it plans."""
    changes: list[Change] = []
    consistent = dict(zip((a.key for a in current), is_consistent_with(current), strict=True))

    def limit(mid: MemberId) -> int:
        member = usable.get(mid)
        return member.spec.journal_limit if member is not None else 0

    # Add: reach the replication on usable members, spreading zones, then least loaded.
    good = [a for a in current if (a.zone, a.suffix) in usable]
    assigned = {(a.zone, a.suffix) for a in current}
    zones: Counter[str] = Counter(a.zone for a in good)
    candidates = [mid for mid in sorted(usable) if mid not in assigned and load[mid] < limit(mid)]
    slot = max((a.slot for a in current), default=-1) + 1
    for _ in range(replication - len(good)):
        if not candidates:
            break
        mid = min(candidates, key=lambda m: (zones[m[0]], _ratio(load[m], limit(m)), m))
        candidates.remove(mid)
        member = usable[mid]
        changes.append(
            Add(
                item.name,
                mid[0],
                mid[1],
                slot,
                member.lease,
                member.key,
                member.mod_revision,
                item.mod_revision,
            )
        )
        zones[mid[0]] += 1
        load[mid] += 1
        slot += 1

    # Remove: shed unusable members and surplus replicas, only while `replication` consistent
    # assignments remain. Unusable members go first, the primary last, then the most loaded.
    remaining = list(current)
    order = sorted(
        current,
        key=lambda a: (
            (a.zone, a.suffix) in usable,
            a.slot == 0,
            -_ratio(load[(a.zone, a.suffix)], limit((a.zone, a.suffix))),
            a.zone,
            a.suffix,
        ),
    )
    for a in order:
        mid = (a.zone, a.suffix)
        surplus = mid not in usable or sum(1 for r in remaining if (r.zone, r.suffix) in usable) > replication
        still_consistent = sum(1 for r in remaining if r is not a and consistent[r.key])
        if surplus and still_consistent >= replication:
            remaining.remove(a)
            changes.append(Remove(a, item.mod_revision))
            load[mid] -= 1
            if a.slot == 0:
                primaries[mid] -= 1

    # Promote: give a journal that has assignments but no primary one, preferring a usable,
    # consistent member with the fewest primaries per limit.
    if remaining and not any(a.slot == 0 for a in remaining):
        chosen = min(
            remaining,
            key=lambda a: (
                (a.zone, a.suffix) not in usable,
                not consistent[a.key],
                _ratio(primaries[(a.zone, a.suffix)], limit((a.zone, a.suffix))),
                a.zone,
                a.suffix,
            ),
        )
        primaries[(chosen.zone, chosen.suffix)] += 1
        changes.append(Promote(chosen, item.mod_revision))
    return changes


def _route_value(route: pb.Route) -> bytes:
    """An assignment value: empty for a route that says nothing, as when first created."""
    if route.primary == -1 and not route.members and not route.endpoints:
        return b""
    return route.SerializeToString()


def change_txn(root: str, change: Change) -> tuple[list[Any], list[Any]]:
    """The guards and operations that apply `change` under `root`."""
    if isinstance(change, Add):
        key = assignment_key(root, change.journal, change.zone, change.suffix, change.slot)
        return (
            [
                compare_mod(change.member_key, change.member_mod_revision),
                compare_mod(item_key(root, change.journal), change.item_mod_revision),
                compare_create(key, 0),
            ],
            [put_op(key, b"", lease=change.lease)],
        )
    a = change.assignment
    if isinstance(change, Remove):
        return (
            [
                compare_mod(item_key(root, a.journal), change.item_mod_revision),
                compare_mod(a.key, a.mod_revision),
            ],
            [delete_op(a.key)],
        )
    if isinstance(change, Promote):
        key = assignment_key(root, a.journal, a.zone, a.suffix, 0)
        return (
            [
                compare_mod(item_key(root, a.journal), change.item_mod_revision),
                compare_mod(a.key, a.mod_revision),
                compare_create(key, 0),
            ],
            [delete_op(a.key), put_op(key, _route_value(a.route), lease=a.lease)],
        )
    return (
        [compare_create(item_key(root, a.journal), 0), compare_mod(a.key, a.mod_revision)],
        [delete_op(a.key)],
    )


def batch_txns(
    root: str, changes: Sequence[Change], leader: Member, max_ops: int = MAX_TXN_OPS
) -> list[tuple[list[Any], list[Any]]]:
    """Group changes into transactions of at most `max_ops` compares and ops, each guarded by the
    leader's member key being unchanged."""
    leader_guard = compare_mod(leader.key, leader.mod_revision)
    batches: list[tuple[list[Any], list[Any]]] = []
    compares: dict[bytes, Any] = {}
    ops: list[Any] = []

    def guard_id(c: Any) -> bytes:
        return bytes(c.SerializeToString(deterministic=True))

    def reset() -> None:
        compares.clear()
        compares[guard_id(leader_guard)] = leader_guard
        ops.clear()

    reset()
    for change in changes:
        guards, change_ops = change_txn(root, change)
        new = {guard_id(g): g for g in guards if guard_id(g) not in compares}
        if ops and (len(compares) + len(new) > max_ops or len(ops) + len(change_ops) > max_ops):
            batches.append((list(compares.values()), list(ops)))
            reset()
            new = {guard_id(g): g for g in guards if guard_id(g) not in compares}
        compares.update(new)
        ops.extend(change_ops)
    if ops:
        batches.append((list(compares.values()), list(ops)))
    return batches


def plan_keyspace(keyspace: KeySpace, max_replication: int = MAX_REPLICATION) -> list[Change]:
    """`plan` over the mirror's current contents."""
    assignments = {j: keyspace.assignments(j) for j in keyspace.assigned_journals()}
    return plan(keyspace.journals, keyspace.members, assignments, max_replication)


async def run_allocator(
    client: Any,
    keyspace: KeySpace,
    self_key: str,
    max_replication: int,
    stop: asyncio.Event,
    *,
    max_txn_ops: int = MAX_TXN_OPS,
    log: logging.Logger | None = None,
) -> None:
    """Converge assignments whenever this member leads, until `stop` is set or the mirror closes."""
    log = log or _log
    me = parse_member_key(keyspace.root, self_key)
    try:
        while not stop.is_set():
            generation = keyspace.generation
            leader = leader_of(keyspace.members)
            if leader is not None and (leader.zone, leader.suffix) == me:
                changes = plan_keyspace(keyspace, max_replication)
                if changes:
                    if not await _apply(client, keyspace, changes, leader, max_txn_ops, log):
                        await _wait(keyspace, generation, stop, RETRY_DELAY)
                    continue
            await _wait(keyspace, generation, stop, None)
    except KeySpaceClosedError:
        return


async def _apply(
    client: Any,
    keyspace: KeySpace,
    changes: Sequence[Change],
    leader: Member,
    max_txn_ops: int,
    log: logging.Logger,
) -> bool:
    """Apply planned changes batch by batch; False once a batch fails, so the caller re-plans."""
    for compares, ops in batch_txns(keyspace.root, changes, leader, max_txn_ops):
        try:
            ok, revision = await txn(client, compares, ops)
        except Exception as exc:
            log.warning("allocator transaction failed: %s", exc)
            return False
        if not ok:
            log.debug("allocator transaction lost a race; re-planning")
            return False
        log.debug("allocator applied %d ops at revision %d", len(ops), revision)
        try:
            await asyncio.wait_for(keyspace.wait_for_revision(revision), SETTLE_TIMEOUT)
        except TimeoutError:
            log.warning("keyspace mirror did not reach revision %d within %gs", revision, SETTLE_TIMEOUT)
            return False
    return True


async def _wait(keyspace: KeySpace, generation: int, stop: asyncio.Event, timeout: float | None) -> None:
    """Wait for a mirror change after `generation`, for `stop`, or for `timeout` seconds."""
    changed = asyncio.ensure_future(keyspace.wait_for_change(generation))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({changed, stopped}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (changed, stopped):
            task.cancel()
        for task in (changed, stopped):
            with contextlib.suppress(asyncio.CancelledError):
                await task
