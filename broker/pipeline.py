"""The replication pipeline a journal's primary runs over its peer set.

Every ReplicateRequest is applied to the primary's own spool and scattered to one
Replicate stream per peer; acknowledged requests gather one reply from each peer. A commit is
applied to the primary's spool only once every peer acknowledged it (`commit`), so that what
the primary holds, serves and persists is what its whole peer set holds; a confirmation (the
fragment proposed as it now is, unacknowledged) then tells the peers, which serve a commit to
readers only once confirmed (`Spool.acknowledged`).

Every wait on a peer (a write its stream does not take, a reply that does not come) is bounded by
the pipeline's `timeout`: a peer cut off by a partition sends no FIN, and without a bound an append
(and every append queued behind it on the replica's lock) would wait until TCP or keepalive gave up,
minutes later. A pipeline that timed out is broken: its streams are cancelled, not drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc

from broker.errors import PipelineError
from broker.fragment import Spool
from broker.in_order import InOrder
from broker.peers import PeerDialer
from broker.protocol import pb

log = logging.getLogger(__name__)

# Content chunks at least this long are applied to the spool in a worker thread.
THREADED_APPLY_MIN = 64 * 1024
PEER_TIMEOUT = 10.0
"""Seconds a pipeline waits on one peer (a write, or a reply) by default; `gazette serve` derives
its own from the etcd lease (`peer_timeout`)."""


DRAIN_TIMEOUT = 0.5
"""Seconds a closing pipeline waits for its peers to drain their streams (a healthy one takes a round
trip; the replica's lock is held meanwhile)."""


def peer_timeout(lease: float) -> float:
    """How long a broker with an etcd lease of `lease` seconds waits on a peer: half the lease
    (1 to 10 s), so that a pipeline to a peer that cannot be reached is torn down before the
    allocator, a lease later, would route around it."""
    return max(1.0, min(PEER_TIMEOUT, lease / 2))


def same_id(a: pb.ProcessSpec.ID, b: pb.ProcessSpec.ID) -> bool:
    return a.zone == b.zone and a.suffix == b.suffix


def routes_equivalent(a: pb.Route, b: pb.Route) -> bool:
    """Same members and primary; endpoints are ignored."""
    return (
        a.primary == b.primary
        and len(a.members) == len(b.members)
        and all(same_id(x, y) for x, y in zip(a.members, b.members, strict=True))
    )


class Pipeline:
    """Replicate streams to every non-primary member of `header.route`, plus the local spool."""

    def __init__(self, spool: Spool, header: pb.Header, dialer: PeerDialer, timeout: float = PEER_TIMEOUT) -> None:
        self.spool = spool
        self.timeout = timeout
        self.header = header
        self.route = header.route
        self._dialer = dialer
        self._streams: list[tuple[pb.ProcessSpec.ID, grpc.aio.StreamStreamCall]] = []
        self._endpoints: dict[str, str] = {}  # Peer suffix -> its endpoint.
        self._sent_first = False
        self._local = InOrder()  # Spool writes of large content, in worker threads.
        self.broken: PipelineError | None = None
        self._cancelled = False  # Whether the streams were cancelled (rather than to be closed in order).
        self._broken_off_event = asyncio.Event()  # Set with _cancelled: a drain in progress stops.
        self._waiting: asyncio.Task[Any] | None = None  # The task waiting on a peer's write or reply.
        self._interrupted = False  # Whether break_off cancelled `_waiting`.

    @property
    def journal(self) -> str:
        return self.spool.journal

    def open(self) -> None:
        """Open one Replicate stream per peer of the route."""
        local = self.header.process_id
        for i, member in enumerate(self.route.members):
            if same_id(member, local):
                continue
            endpoint = self.route.endpoints[i] if i < len(self.route.endpoints) else ""
            if not endpoint:
                raise PipelineError(f"peer {member.zone}/{member.suffix} has no endpoint", self.journal)
            call = self._dialer.stub(endpoint).Replicate()
            self._streams.append((member, call))
            self._endpoints[member.suffix] = endpoint

    @property
    def peers(self) -> int:
        return len(self._streams)

    @property
    def healthy(self) -> bool:
        """Whether the pipeline may serve another append: no failure seen, and every peer's stream
        still open (one that ended, e.g. because its broker restarted, would fail the append)."""
        return self.broken is None and not any(call.done() for _member, call in self._streams)

    async def scatter(self, req: pb.ReplicateRequest) -> pb.ReplicateResponse:
        """Send `req` to every peer and apply it to the local spool, on the event loop; returns the
        local response. For proposals and small content: large content goes by `scatter_content`."""
        await self._local.settle()  # Content applied in threads lands first.
        await self._send(req)
        return self.spool.apply(req)

    async def scatter_content(self, content: bytes | memoryview, delta: int) -> asyncio.Future[None]:
        """Send large content to every peer, and start applying it to the local spool in a worker
        thread after any earlier such content; the returned future is done once it has landed.

        Writing and hashing a chunk release the GIL: the event loop meanwhile receives the next
        one. Call `settle()` before acting on a failure, so that the spool is quiet.
        """
        local = self._local.submit(self.spool.apply_content, delta, content)
        if self._streams:
            try:
                await self._send(pb.ReplicateRequest(content=bytes(content), content_delta=delta))
            except BaseException:
                await self._local.settle()  # The spool settles before any rollback.
                raise
        return local

    async def scatter_small_content(self, content: bytes | memoryview, delta: int) -> None:
        """Send small content to every peer and apply it to the local spool, on the event loop (as
        `scatter` a content message, without building one when there is no peer)."""
        await self._local.settle()  # Content applied in threads lands first.
        if self._streams:
            await self._send(pb.ReplicateRequest(content=bytes(content), content_delta=delta))
        self.spool.apply_content(delta, content)

    async def settle(self) -> None:
        """Wait until content applied in worker threads has landed in the local spool."""
        await self._local.settle()

    async def _send(self, req: pb.ReplicateRequest) -> None:
        for member, call in self._streams:
            out = req
            if req.HasField("proposal") and req.acknowledge:
                out = pb.ReplicateRequest()
                out.CopyFrom(req)
                out.header.CopyFrom(self.header)
                out.header.process_id.CopyFrom(member)
                if not self._sent_first:
                    out.deprecated_journal = self.journal
            try:
                self._waiting = asyncio.current_task()
                async with asyncio.timeout(self.timeout):
                    await call.write(out)
            except asyncio.CancelledError:
                raise self._broken_off() from None
            except TimeoutError:
                raise self._unreachable(member, "took no write") from None
            except (grpc.RpcError, asyncio.InvalidStateError) as exc:
                # InvalidStateError: the peer's stream already ended (e.g. the peer restarted).
                raise self._break(f"replicate to {_name(member)} failed: {exc}") from exc
            finally:
                self._waiting = None
        if req.HasField("proposal") and req.acknowledge:
            self._sent_first = True

    async def gather(self) -> list[tuple[pb.ProcessSpec.ID, pb.ReplicateResponse]]:
        """One reply from each peer, in route order."""
        replies = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        for member, call in self._streams:
            try:
                self._waiting = asyncio.current_task()
                async with asyncio.timeout_at(deadline):
                    resp = await call.read()
            except asyncio.CancelledError:
                raise self._broken_off() from None
            except TimeoutError:
                raise self._unreachable(member, "sent no reply") from None
            except (grpc.RpcError, asyncio.InvalidStateError) as exc:
                # InvalidStateError: the peer's stream already ended (e.g. the peer restarted).
                raise self._break(f"replicate from {_name(member)} failed: {exc}") from exc
            finally:
                self._waiting = None
            if resp is grpc.aio.EOF:
                raise self._break(f"peer {_name(member)} closed its Replicate stream")
            replies.append((member, resp))
        return replies

    def break_off(self, reason: str) -> None:
        """Break the pipeline from outside (a peer's lease expired, or this broker's): an append
        waiting on a peer fails at once with `reason`."""
        self._break(reason, cancel=True)
        # A cancelled call does not wake a write waiting for the call to start (its connection
        # never made): the waiting task is interrupted instead.
        waiting = self._waiting
        if waiting is not None and not self._interrupted:
            self._interrupted = True
            waiting.cancel()

    def _broken_off(self) -> BaseException:
        """What to raise for a CancelledError out of a stream: the pipeline's error if `break_off`
        interrupted the wait or cancelled the call (or its channel closed), else the cancellation
        itself (the append's task was cancelled)."""
        task = asyncio.current_task()
        if self._interrupted and task is not None:
            self._interrupted = False
            task.uncancel()
            assert self.broken is not None
            return self.broken
        if task is not None and task.cancelling():
            return asyncio.CancelledError()
        return self.broken or self._break("a Replicate stream was cancelled (its channel closed)", cancel=True)

    def _unreachable(self, member: pb.ProcessSpec.ID, what: str) -> PipelineError:
        """Break the pipeline over a peer that `what` within the timeout, and drop the connection
        to it (see PeerDialer.forget)."""
        self._dialer.forget(self._endpoints[member.suffix])
        return self._break(
            f"replicate to {_name(member)}: the peer {what} within {self.timeout:g}s (unreachable?)", cancel=True
        )

    def _break(self, reason: str, *, cancel: bool = False) -> PipelineError:
        """Mark the pipeline broken, with `cancel` cancelling every stream (a peer that cannot be
        reached would never answer a drain; the others, closed in order, keep what they took);
        returns the error to raise."""
        error = PipelineError(reason, self.journal)
        if self.broken is None:
            self.broken = error
            log.warning("replication pipeline broken", extra={"journal": self.journal, "reason": reason})
        if cancel:
            self._cancelled = True
            self._broken_off_event.set()
            for _member, call in self._streams:
                call.cancel()
        return error

    async def commit(self, proposal: pb.Fragment, registers: pb.LabelSet) -> None:
        """Commit the spool's pending content as `proposal`: every peer first, then, once each has
        acknowledged it, the local spool. A commit a peer did not acknowledge never reaches the
        primary's spool, so the primary neither serves nor persists it: the peers that did take it
        hold it, and the next primary's sync rolls forward to them."""
        req = pb.ReplicateRequest(proposal=proposal, registers=registers, acknowledge=True)
        await self._local.settle()
        await self._send(req)
        await self.gather_ok()
        resp = self.spool.apply(req)
        if resp.status != pb.OK:
            raise self._break(f"local spool rejected the commit its peers took: {pb.Status.Name(resp.status)}")
        self.spool.acknowledge()
        if self._streams:
            # Tell the peers their commit is the peer set's: until then they hold it from readers.
            confirm = pb.ReplicateRequest(proposal=self.spool.fragment.spec, registers=registers, acknowledge=False)
            with contextlib.suppress(PipelineError):  # Committed all the same; the next append rebuilds.
                await self._send(confirm)

    async def gather_ok(self) -> None:
        for member, resp in await self.gather():
            if resp.status != pb.OK:
                raise self._break(f"peer {_name(member)} replied {pb.Status.Name(resp.status)}")

    async def close(self) -> None:
        """Roll back local uncommitted content, half-close each stream and drain it (all at once,
        for at most DRAIN_TIMEOUT: a drained peer applied all it was sent; one that does not drain in
        time, or once the pipeline is broken off, is cancelled, and may drop what it had not applied,
        none of it acknowledged)."""
        await self._local.settle()  # Content still landing would otherwise land after the rollback.
        self.spool.apply(
            pb.ReplicateRequest(
                proposal=self.spool.fragment.spec, registers=self.spool.registers, acknowledge=True
            )
        )
        streams = self._streams
        try:
            if self._cancelled or not streams:
                return
            drain: asyncio.Future[list[None]] = asyncio.gather(*(_drain(call) for _member, call in streams))
            broken_off: asyncio.Future[Any] = asyncio.ensure_future(self._broken_off_event.wait())
            waits: set[asyncio.Future[Any]] = {drain, broken_off}
            await asyncio.wait(waits, timeout=min(DRAIN_TIMEOUT, self.timeout), return_when=asyncio.FIRST_COMPLETED)
            broken_off.cancel()
            if not drain.done():
                drain.cancel()
                drain.add_done_callback(lambda done: done.cancelled() or done.exception())
                for _member, call in streams:
                    call.cancel()
        finally:
            self._streams = []


async def _drain(call: grpc.aio.StreamStreamCall) -> None:
    """Half-close a Replicate stream and read it to its end (or cancel it, if it failed)."""
    try:
        await call.done_writing()
        while (await call.read()) is not grpc.aio.EOF:
            pass
    except (grpc.RpcError, asyncio.InvalidStateError):
        call.cancel()


def _name(member: pb.ProcessSpec.ID) -> str:
    return member.suffix
