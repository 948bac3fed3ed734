"""Applying the allocator's plans (Gazette's `allocator/allocator.go` Allocate): the guarded etcd
transactions of a plan's changes, batched under etcd's limits, and `run_allocator`, the loop every
member runs (only the leader writes): plan from the mirror, apply, wait for the mirror to catch
up, and plan again until there is nothing to change. The planner is `cluster.keyspace.allocator`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from cluster.keyspace.allocator import (
    MAX_REPLICATION,
    Add,
    AddPrimary,
    Change,
    Handoff,
    Promote,
    Remove,
    leader_of,
    plan,
)
from cluster.keyspace.errors import KeySpaceClosedError
from cluster.keyspace.keyspace import (
    BROKER_SCHEMA,
    Assignment,
    KeySpace,
    KeySpaceSchema,
    Member,
    assignment_key,
    compare_create,
    compare_mod,
    delete_op,
    item_key,
    parse_member_key,
    put_op,
    txn,
)

MAX_TXN_OPS = 128
"""etcd's default --max-txn-ops: the cap on both compares and operations of one transaction."""
SETTLE_TIMEOUT = 10.0
"""Seconds to wait for the mirror to reach the revision of an applied transaction."""
RETRY_DELAY = 1.0

_log = logging.getLogger(__name__)


def _rekey(root: str, a: Assignment, slot: int, schema: KeySpaceSchema) -> tuple[list[Any], list[Any]]:
    """Guards and operations that move assignment `a` to `slot`, keeping its value and lease."""
    key = assignment_key(root, a.item_id, a.zone, a.suffix, slot)
    return (
        [compare_mod(a.key, a.mod_revision), compare_create(key, 0)],
        [delete_op(a.key), put_op(key, schema.encode_assignment(a.value), lease=a.lease)],
    )


def change_txn(root: str, change: Change, schema: KeySpaceSchema = BROKER_SCHEMA) -> tuple[list[Any], list[Any]]:
    """The guards and operations that apply `change` under `root`."""
    if isinstance(change, Add):
        key = assignment_key(root, change.item_id, change.zone, change.suffix, change.slot)
        return (
            [
                compare_mod(change.member_key, change.member_mod_revision),
                compare_mod(item_key(root, change.item_id), change.item_mod_revision),
                compare_create(key, 0),
            ],
            [put_op(key, schema.new_assignment, lease=change.lease)],
        )
    if isinstance(change, AddPrimary):
        add_guards, add_ops = change_txn(root, change.add, schema)
        guards, ops = _rekey(root, change.primary, change.slot, schema)
        return add_guards + guards, ops + add_ops
    if isinstance(change, Handoff):
        old_guards, old_ops = _rekey(root, change.primary, change.slot, schema)
        new_guards, new_ops = _rekey(root, change.replica, 0, schema)
        return (
            [compare_mod(item_key(root, change.item_id), change.item_mod_revision), *old_guards, *new_guards],
            old_ops + new_ops,
        )
    a = change.assignment
    if isinstance(change, Remove):
        return (
            [
                compare_mod(item_key(root, a.item_id), change.item_mod_revision),
                compare_mod(a.key, a.mod_revision),
            ],
            [delete_op(a.key)],
        )
    if isinstance(change, Promote):
        guards, ops = _rekey(root, a, 0, schema)
        return [compare_mod(item_key(root, a.item_id), change.item_mod_revision), *guards], ops
    return (
        [compare_create(item_key(root, a.item_id), 0), compare_mod(a.key, a.mod_revision)],
        [delete_op(a.key)],
    )


def batch_txns(
    root: str,
    changes: Sequence[Change],
    leader: Member,
    max_ops: int = MAX_TXN_OPS,
    schema: KeySpaceSchema = BROKER_SCHEMA,
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
        guards, change_ops = change_txn(root, change, schema)
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


def plan_keyspace(
    keyspace: KeySpace, max_replication: int = MAX_REPLICATION, *, in_place_handoff: bool | None = None
) -> list[Change]:
    """`plan` over the mirror's current contents, with its schema."""
    assignments = {name: keyspace.assignments(name) for name in keyspace.assigned_items()}
    return plan(
        keyspace.items,
        keyspace.members,
        assignments,
        max_replication,
        schema=keyspace.schema,
        in_place_handoff=in_place_handoff,
    )


async def run_allocator(
    client: Any,
    keyspace: KeySpace,
    self_key: str,
    max_replication: int,
    stop: asyncio.Event,
    *,
    max_txn_ops: int = MAX_TXN_OPS,
    log: logging.Logger | None = None,
    in_place_handoff: bool | None = None,
) -> None:
    """Converge assignments whenever this member leads, until `stop` is set or the mirror closes.
    The mirror's schema says what its items and members are; `in_place_handoff` defaults to it."""
    log = log or _log
    me = parse_member_key(keyspace.root, self_key)
    try:
        while not stop.is_set():
            generation = keyspace.generation
            leader = leader_of(keyspace.members)
            if leader is not None and (leader.zone, leader.suffix) == me:
                changes = plan_keyspace(keyspace, max_replication, in_place_handoff=in_place_handoff)
                if changes:
                    _log_moves(changes, log, keyspace.schema.kind)
                    if not await _apply(client, keyspace, changes, leader, max_txn_ops, log):
                        await _wait(keyspace, generation, stop, RETRY_DELAY)
                    continue
            await _wait(keyspace, generation, stop, None)
    except KeySpaceClosedError:
        return


def _log_moves(changes: Sequence[Change], log: logging.Logger, kind: str) -> None:
    """Say where primaries move, so that operators can follow a rebalance; `kind` names an item."""
    for change in changes:
        if isinstance(change, AddPrimary):
            log.info(
                "allocator moves a primary to a new member",
                extra={kind: change.item_id, "from": change.primary.suffix, "to": change.add.suffix},
            )
        elif isinstance(change, Handoff):
            log.info(
                "allocator hands a primary to a replica",
                extra={kind: change.item_id, "from": change.primary.suffix, "to": change.replica.suffix},
            )


async def _apply(
    client: Any,
    keyspace: KeySpace,
    changes: Sequence[Change],
    leader: Member,
    max_txn_ops: int,
    log: logging.Logger,
) -> bool:
    """Apply planned changes batch by batch; False once a batch fails, so the caller re-plans."""
    for compares, ops in batch_txns(keyspace.root, changes, leader, max_txn_ops, keyspace.schema):
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
            async with asyncio.timeout(SETTLE_TIMEOUT):
                await keyspace.wait_for_revision(revision)
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
