"""The broker's append state machine (Gazette's append FSM).

An append resolves its journal's primary, acquires the replica's pipeline,
synchronizes the peers' spools, checks its preconditions (registers, offsets,
suspension), streams content through the pipeline and commits it; peers
acknowledge before the client is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Sequence
from typing import Any

from broker.errors import AppendError, PipelineError
from broker.fragment import sha1sum_from_digest, spec_equal
from broker.in_order import InOrder
from broker.pipeline import THREADED_APPLY_MIN, Pipeline, routes_equivalent, same_id
from broker.protocol import labels, pb
from broker.protocol.auth import Claims
from broker.replica import Replica, maybe_roll_fragment
from broker.resolver import Resolution
from broker.state import BrokerState
from cluster.keyspace import compare_mod, put_op, txn, write_suspend

log = logging.getLogger(__name__)

AS = pb.AppendRequest
LEVEL = pb.JournalSpec.Suspend
# How long an append waits for etcd to reflect a change it made (resume, assignment update).
SETTLE_TIMEOUT = 10.0
LANDING_BYTES = 8 << 20
"""Content of one append that may still be landing (written to the spool, hashed) while more of
it is received: enough to keep the spool's worker thread busy, little enough to buffer."""
DAY = 86400
STORE_HEALTH_CHECKS = 5
"""Checks of a journal's first store an append waits through while every store is unhealthy
(Gazette's storeHealthCheckRetries)."""
STORE_HEALTH_WAIT = 10.0
"""Seconds an append waits at most for one of them to pass."""


async def uninterrupted(work: Coroutine[Any, Any, None]) -> None:
    """Await `work` to its end even if the caller is cancelled meanwhile; the cancellation is raised
    once `work` has ended (else `work`'s own error, if it failed)."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                break
            cancelled = True
    if cancelled:
        if not task.cancelled():
            task.exception()  # Retrieved: the cancellation is what the caller sees.
        raise asyncio.CancelledError
    task.result()


class _RouteChanged(Exception):
    """A peer reported a newer route: re-resolve at `revision`."""

    def __init__(self, revision: int) -> None:
        super().__init__(f"route changed at revision {revision}")
        self.revision = revision


def writable(spec: pb.JournalSpec) -> bool:
    return spec.flags in (pb.JournalSpec.NOT_SPECIFIED, pb.JournalSpec.O_RDWR, pb.JournalSpec.O_WRONLY)


def readable(spec: pb.JournalSpec) -> bool:
    return spec.flags in (pb.JournalSpec.NOT_SPECIFIED, pb.JournalSpec.O_RDWR, pb.JournalSpec.O_RDONLY)


class Append:
    """One Append RPC on the primary. Use `prepare()`, then `stream()` when `ready`."""

    def __init__(self, state: BrokerState, req: pb.AppendRequest, claims: Claims | None = None) -> None:
        self.state = state
        self.req = req
        self.claims = claims  # The caller's verified claims (None: no authorization configured).
        self.resolution: Resolution | None = None
        self.replica: Replica | None = None
        self.pipeline: Pipeline | None = None
        self.response: pb.AppendResponse | None = None  # Set when the append ends early with a status.
        self.proxy: Resolution | None = None  # Set when another broker is the primary.
        self.roll_to = 0
        self._min_revision = req.min_etcd_revision

    @property
    def journal(self) -> str:
        return self.req.journal

    # --- Resolve through ValidatePreconditions ---------------------------------------------

    async def prepare(self) -> None:
        """Run the FSM up to streaming content, or to a final status or a proxy decision."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while True:
            if self.state.lease_lost:
                raise AppendError("this broker's etcd lease is lost: its assignments are void", self.journal)
            res = await self.state.resolver.resolve(
                self.journal,
                may_proxy=not self.req.do_not_proxy,
                require_primary=True,
                min_etcd_revision=self._min_revision,
                proxy_header=self.req.header if self.req.HasField("header") else None,
                claims=self.claims,
            )
            self.resolution = res
            if res.status == pb.SUSPENDED and self.req.suspend == AS.SUSPEND_RESUME:
                assert res.spec is not None
                await self._write_suspend(res, LEVEL.NONE, res.spec.suspend.offset)
                continue
            if (
                res.status == pb.NO_JOURNAL_PRIMARY_BROKER
                and time.monotonic() < deadline
                and not self.state.stopping.is_set()
            ):
                # A resumed or new journal awaits the allocator: give it a moment (unless this
                # broker is about to cut its RPCs off: then the status is the answer).
                await self.state.keyspace.wait_for_change_within(deadline - time.monotonic())
                continue
            if res.status != pb.OK:
                self._finish(res.status, res.header)
                return
            if not same_id(res.header.process_id, self.state.resolver.local_id):
                # AwaitDesiredReplicas comes before the proxy decision too (Gazette 7.2.1).
                awaited = await self._await_desired_replicas(res)
                if awaited is None:
                    self.proxy = res
                if not awaited:
                    return
                continue
            assert res.replica is not None and res.spec is not None
            replica = res.replica
            await replica.acquire(res.route, patience=self.state.peer_timeout / 4)
            try:
                retry = await self._with_pipeline(res, replica)
            except BaseException:
                # A pipeline whose sync failed (peers disagree, or are gone) must not serve the next
                # append: Gazette shuts it down too.
                try:
                    await self._drop_pipeline(replica)
                finally:
                    replica.lock.release()
                raise
            if retry:
                replica.lock.release()
                continue
            if self.response is not None:
                replica.lock.release()
            return

    async def _with_pipeline(self, res: Resolution, replica: Replica) -> bool:
        """Acquire and sync the pipeline, then check preconditions. Returns whether to re-resolve."""
        assert res.spec is not None
        pipeline = replica.pipeline
        if pipeline is None or not pipeline.healthy or not routes_equivalent(pipeline.route, res.route):
            replica.pipeline = None
            if pipeline is not None:
                await pipeline.close()
            pipeline = Pipeline(replica.spool, res.header, self.state.dialer, self.state.peer_timeout)
            pipeline.open()
            replica.pipeline = pipeline
            try:
                await self._sync(pipeline, replica)
            except _RouteChanged as exc:
                await self._drop_pipeline(replica)
                self._min_revision = exc.revision
                return True

        self.pipeline = pipeline
        self.replica = replica

        if await self._update_assignments(res):
            return True
        awaited = await self._await_desired_replicas(res)
        if awaited is not None:
            return awaited
        return await self._validate_preconditions(res, replica, pipeline)

    async def _await_desired_replicas(self, res: Resolution) -> bool | None:
        """None if the route has the journal's desired replication; else True to re-resolve once it
        changes (too many members: the allocator is shrinking it), or False having answered
        INSUFFICIENT_JOURNAL_BROKERS (too few)."""
        assert res.spec is not None
        desired = self.state.desired_replication(res.spec)
        members = len(res.route.members)
        if members > desired:
            # The allocator is shrinking the route: resolve again past this resolution's revision
            # (Gazette's rule), waiting in the resolver rather than here under the replica's lock. The
            # mirror's own revision may already include the shrink: no later one need ever come.
            self._min_revision = max(self._min_revision, res.header.etcd.revision + 1)
            return True
        if members < desired:
            self._finish(pb.INSUFFICIENT_JOURNAL_BROKERS, res.header)
            return False
        return None

    async def _sync(self, pipeline: Pipeline, replica: Replica) -> None:
        """Bring every peer's spool to agreement with ours, rolling forward to the furthest peer."""
        registers = replica.spool.registers
        while True:
            proposal = maybe_roll_fragment(replica.spool, self.roll_to, replica.spec.fragment)
            local = await pipeline.scatter(
                pb.ReplicateRequest(proposal=proposal, registers=registers, acknowledge=True)
            )
            if local.status != pb.OK:
                raise PipelineError(f"local spool rejected proposal: {local}", self.journal)
            ours = replica.spool.fragment.end
            roll_to = 0
            for member, reply in await pipeline.gather():
                if reply.status == pb.OK:
                    continue
                if reply.status == pb.PROPOSAL_MISMATCH and reply.fragment.end > ours:
                    if reply.fragment.end > roll_to:
                        roll_to, registers = reply.fragment.end, reply.registers
                elif (
                    reply.status == pb.PROPOSAL_MISMATCH
                    and reply.fragment.end == ours
                    and reply.fragment.begin == reply.fragment.end
                ):
                    roll_to = max(roll_to, ours)
                elif reply.status == pb.WRONG_ROUTE and reply.header.etcd.revision > self._header_revision():
                    raise _RouteChanged(reply.header.etcd.revision)
                else:
                    raise PipelineError(
                        f"peer {member.suffix} replied {pb.Status.Name(reply.status)} to sync", self.journal
                    )
            if roll_to == 0:
                replica.spool.acknowledge()  # Every peer agreed to our fragment.
                return
            self.roll_to = roll_to

    def _header_revision(self) -> int:
        return self.resolution.header.etcd.revision if self.resolution else 0

    async def _drop_pipeline(self, replica: Replica) -> None:
        pipeline, replica.pipeline = replica.pipeline, None
        if pipeline is not None:
            await pipeline.close()

    async def _update_assignments(self, res: Resolution) -> bool:
        """Advertise the route in every assignment value (so the allocator may move on)."""
        keyspace = self.state.keyspace
        route = pb.Route(members=res.route.members, primary=res.route.primary)
        assignments = keyspace.assignments(self.journal)
        stale = [a for a in assignments if a.route != route]
        if not stale:
            return False
        value = route.SerializeToString()
        seen = keyspace.revision
        ok, revision = await txn(
            self.state.etcd,
            [compare_mod(a.key, a.mod_revision) for a in assignments],
            [put_op(a.key, value, ignore_lease=True) for a in stale],
            [],
        )
        await self._await_txn(ok, revision, seen)
        return True

    async def _await_txn(self, ok: bool, revision: int, seen: int) -> None:
        """Wait until the mirror reflects a guarded write: its own revision if it applied, else the
        newer change under the root that made it fail. (A failed txn's header revision may be one
        the mirror never reaches: etcd's revision also moves with writes outside the root.)"""
        keyspace = self.state.keyspace
        target = revision if ok else seen + 1
        try:
            async with asyncio.timeout(SETTLE_TIMEOUT):
                await keyspace.wait_for_revision(target)
        except TimeoutError:
            raise AppendError(
                f"etcd did not reflect the journal's update at revision {target} within {SETTLE_TIMEOUT:g}s",
                self.journal,
            ) from None

    async def _await_healthy_store(self, res: Resolution, stores: Sequence[str]) -> bool:
        """Whether a store can take the journal's fragments: else FRAGMENT_STORE_UNHEALTHY, with why.

        Gazette's FSM waits for `stores[0]`'s health (`broker/append_fsm.go`, onValidatePreconditions)
        and fails the append after storeHealthCheckRetries failed checks. Fragments go to the first
        healthy store here, so an append waits only while every store is known to be unhealthy (a
        persist or a check failed), for at most STORE_HEALTH_CHECKS checks of the first, asked for
        now (at most one a second), and STORE_HEALTH_WAIT seconds.
        """
        registry = self.state.stores
        if registry is None or not stores or any(registry.is_healthy(url) is not False for url in stores):
            return True
        health = registry.health(stores[0])
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STORE_HEALTH_WAIT):
                for _ in range(STORE_HEALTH_CHECKS):
                    health.request_check()
                    if not await health.next_check():
                        return True
        self._finish(pb.FRAGMENT_STORE_UNHEALTHY, res.header)
        assert self.response is not None
        self.response.store_health_error = f"fragment store {stores[0]} unhealthy: {health.error}"
        return False

    async def _write_suspend(self, res: Resolution, level: int, offset: int) -> None:
        """Write the journal's suspension state, guarded by the spec's and assignments' revisions."""
        assert res.spec is not None
        keyspace = self.state.keyspace
        assignments = [compare_mod(a.key, a.mod_revision) for a in keyspace.assignments(self.journal)]
        seen = keyspace.revision
        ok, revision = await write_suspend(
            self.state.etcd, self.state.root, res.spec, res.mod_revision, level, offset, assignments
        )
        # Whether or not we won the race, re-resolve once the mirror has caught up.
        await self._await_txn(ok, revision, seen)
        self._min_revision = max(self._min_revision, keyspace.revision)

    async def _validate_preconditions(self, res: Resolution, replica: Replica, pipeline: Pipeline) -> bool:
        assert res.spec is not None
        spec = res.spec
        await replica.index.first_refresh.wait()
        if not await self._await_healthy_store(res, spec.fragment.stores):
            return False
        spool = replica.spool
        _, index_end, last_mod_time = replica.index.summary()
        max_offset = max(spool.fragment.end, index_end)
        flush = spec.fragment.flush_interval.seconds or DAY
        index_dirty = last_mod_time == 0 or last_mod_time > time.time() - flush

        req = self.req
        if (
            req.HasField("check_registers")
            and len(spool.registers.labels) != 0
            and not labels.matches(req.check_registers, spool.registers)
        ):
            self._finish(pb.REGISTER_MISMATCH, res.header)
            assert self.response is not None
            self.response.registers.CopyFrom(spool.registers)
            return False
        if spool.fragment.end < spec.suspend.offset:
            self.roll_to = spec.suspend.offset
            await self._sync(pipeline, replica)
            return await self._validate_preconditions(res, replica, pipeline)
        if spool.fragment.end != max_offset and req.offset == 0 and writable(spec):
            self._finish(pb.INDEX_HAS_GREATER_OFFSET, res.header)
            return False
        if req.offset != 0 and req.offset != max_offset:
            self._finish(pb.WRONG_APPEND_OFFSET, res.header)
            return False
        if req.offset != 0 and spool.fragment.end != max_offset:
            self.roll_to = max_offset
            await self._sync(pipeline, replica)
            return await self._validate_preconditions(res, replica, pipeline)

        level = spec.suspend.level
        end = spool.fragment.end
        index_begin, index_end2, _ = replica.index.summary()
        if req.suspend == AS.SUSPEND_RESUME and level != LEVEL.NONE:
            await self._write_suspend(res, LEVEL.NONE, end)
            return True
        if req.suspend == AS.SUSPEND_NO_RESUME and level != LEVEL.NONE:
            self._finish(pb.SUSPENDED, res.header)
            return False
        if req.suspend in (AS.SUSPEND_IF_FLUSHED, AS.SUSPEND_NOW):
            if level != LEVEL.FULL and index_begin == max(index_end2, end):
                await self._write_suspend(res, LEVEL.FULL, end)
                return True
            if level == LEVEL.NONE and (not index_dirty or req.suspend == AS.SUSPEND_NOW):
                self.roll_to = end
                await self._sync(pipeline, replica)
                await self._write_suspend(res, LEVEL.PARTIAL, end)
                return True
            if level == LEVEL.PARTIAL:
                self._finish(pb.SUSPENDED, res.header)
                return False

        # The journal's very first fragment is closed at once so that it persists promptly.
        if spool.fragment.begin == index_begin:
            self.roll_to = spool.fragment.end
        return False

    # --- StreamContent and ReadAcknowledgements ---------------------------------------------

    async def stream(self, chunks: AsyncIterator[bytes | memoryview]) -> pb.AppendResponse:
        """Stream the client's content through the pipeline and commit it. Releases the pipeline."""
        assert self.replica is not None and self.pipeline is not None and self.resolution is not None
        replica, pipeline, res = self.replica, self.pipeline, self.resolution
        assert res.spec is not None
        spool = replica.spool
        req = self.req
        total = total_chunks = delayed_chunks = 0
        digest = hashlib.sha1()
        begin = spool.fragment.end
        committed = False
        # Large chunks still being written to the spool and hashed while the next ones arrive.
        landing: deque[tuple[asyncio.Future[Any], int]] = deque()
        landing_bytes = 0
        digesting = InOrder()  # The commit's SHA-1 over large chunks, in a worker thread.

        async def land(limit: int) -> None:
            """Wait for landing chunks, oldest first, until at most `limit` bytes are still landing."""
            nonlocal landing_bytes
            while landing and landing_bytes > limit:
                done, size = landing[0]
                await done
                landing.popleft()
                landing_bytes -= size

        try:
            roll = maybe_roll_fragment(spool, self.roll_to, replica.spec.fragment)
            if not spec_equal(roll, spool.fragment.spec):
                await pipeline.scatter(
                    pb.ReplicateRequest(proposal=roll, registers=spool.registers, acknowledge=False)
                )
                begin = spool.fragment.end
            bucket = self.state.bucket(res.spec)
            async for content in chunks:
                if not writable(res.spec) or req.suspend in (
                    AS.SUSPEND_IF_FLUSHED, AS.SUSPEND_NOW, AS.SUSPEND_KEEP
                ):
                    await land(0)
                    await self._rollback()
                    committed = True  # Rolled back already.
                    self._finish(pb.NOT_ALLOWED, res.header)
                    assert self.response is not None
                    return self.response
                total_chunks += 1
                if await bucket.take(len(content)):
                    delayed_chunks += 1
                if len(content) >= THREADED_APPLY_MIN:
                    await land(LANDING_BYTES - len(content))
                    local = await pipeline.scatter_content(content, total)
                    landing.append((asyncio.gather(local, digesting.submit(digest.update, content)), len(content)))
                    landing_bytes += len(content)
                else:
                    if landing:
                        await land(0)
                    await pipeline.scatter_small_content(content, total)
                    digest.update(content)
                total += len(content)
            if landing:
                await land(0)

            modifies = bool(req.union_registers.labels or req.subtract_registers.labels)
            if modifies and total == 0:
                raise AppendError("register modification requires non-empty Append", self.journal)
            registers = spool.registers
            if modifies:
                registers = labels.union(
                    req.union_registers, labels.subtract(spool.registers, req.subtract_registers)
                )
            await pipeline.commit(spool.next(), registers)
            committed = True
            if self.state.lease_lost:
                # Committed by the peer set, but past this broker's lease: not for it to acknowledge.
                raise AppendError("this broker's etcd lease is lost: its assignments are void", self.journal)
        except BaseException:

            async def abandon() -> None:
                # Let landing chunks land before rolling them back: the spool applies in order.
                await asyncio.gather(*(done for done, _ in landing), return_exceptions=True)
                if not committed:
                    await self._rollback()

            # Not to be cut short by a cancellation (the client's RPC ending meanwhile): the replica's
            # lock is released next, and the next append would find this one's content in the spool.
            await uninterrupted(abandon())
            raise
        finally:
            replica.lock.release()

        commit = pb.Fragment(
            journal=self.journal,
            begin=begin,
            end=begin + total,
            sum=sha1sum_from_digest(digest.digest()),
            compression_codec=spool.fragment.spec.compression_codec,
        )
        return pb.AppendResponse(
            status=pb.OK,
            header=res.header,
            commit=commit,
            registers=spool.registers,
            total_chunks=total_chunks,
            delayed_chunks=delayed_chunks,
        )

    async def _rollback(self) -> None:
        """Discard uncommitted content everywhere; a broken pipeline is torn down instead."""
        replica, pipeline = self.replica, self.pipeline
        assert replica is not None and pipeline is not None
        if pipeline.broken is None:
            try:
                await pipeline.scatter(
                    pb.ReplicateRequest(
                        proposal=replica.spool.fragment.spec, registers=replica.spool.registers,
                        acknowledge=True,
                    )
                )
                await pipeline.gather_ok()
                return
            except PipelineError:
                pass
        if replica.pipeline is pipeline:
            replica.pipeline = None
        await pipeline.close()

    def _finish(self, status: int, header: pb.Header) -> None:
        self.response = pb.AppendResponse(status=status, header=header)  # type: ignore[arg-type]
