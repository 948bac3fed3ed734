"""The replication pipeline a journal's primary runs over its peer set.

Every ReplicateRequest is applied to the primary's own spool and scattered to one
Replicate stream per peer; acknowledged requests gather one reply from each peer. A commit is
applied to the primary's spool only once every peer acknowledged it (`commit`), so that what
the primary holds, serves and persists is what its whole peer set holds.

Every wait on a peer (a write its stream does not take, a reply that does not come) is bounded by
the pipeline's `timeout`: a peer cut off by a partition sends no FIN, and without a bound an append
(and every append queued behind it on the replica's lock) would wait until TCP or keepalive gave up,
minutes later. A pipeline that timed out is broken: its streams are cancelled, not drained.
"""

from __future__ import annotations

import asyncio
import logging

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
        self._sent_first = False
        self._local = InOrder()  # Spool writes of large content, in worker threads.
        self.broken: Exception | None = None

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
                async with asyncio.timeout(self.timeout):
                    await call.write(out)
            except TimeoutError:
                raise self._break(f"replicate to {_name(member)}: the peer took no write within {self.timeout:g}s"
                                  " (unreachable?)") from None
            except (grpc.RpcError, asyncio.InvalidStateError) as exc:
                # InvalidStateError: the peer's stream already ended (e.g. the peer restarted).
                raise self._break(f"replicate to {_name(member)} failed: {exc}") from exc
        if req.HasField("proposal") and req.acknowledge:
            self._sent_first = True

    async def gather(self) -> list[tuple[pb.ProcessSpec.ID, pb.ReplicateResponse]]:
        """One reply from each peer, in route order."""
        replies = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        for member, call in self._streams:
            try:
                async with asyncio.timeout_at(deadline):
                    resp = await call.read()
            except TimeoutError:
                raise self._break(f"replicate to {_name(member)}: no reply within {self.timeout:g}s"
                                  " (unreachable?)") from None
            except (grpc.RpcError, asyncio.InvalidStateError) as exc:
                # InvalidStateError: the peer's stream already ended (e.g. the peer restarted).
                raise self._break(f"replicate from {_name(member)} failed: {exc}") from exc
            if resp is grpc.aio.EOF:
                raise self._break(f"peer {_name(member)} closed its Replicate stream")
            replies.append((member, resp))
        return replies

    def break_off(self, reason: str) -> None:
        """Break the pipeline from outside (the broker's lease is lost): appends waiting on it fail."""
        self._break(reason)

    def _break(self, reason: str) -> PipelineError:
        """Mark the pipeline broken and cancel every stream (a peer that cannot be reached would
        never answer a drain); returns the error to raise."""
        error = PipelineError(reason, self.journal)
        if self.broken is None:
            self.broken = error
            log.warning("replication pipeline broken", extra={"journal": self.journal, "reason": reason})
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

    async def gather_ok(self) -> None:
        for member, resp in await self.gather():
            if resp.status != pb.OK:
                raise self._break(f"peer {_name(member)} replied {pb.Status.Name(resp.status)}")

    async def close(self) -> None:
        """Roll back local uncommitted content, half-close each stream and drain it."""
        await self._local.settle()  # Content still landing would otherwise land after the rollback.
        self.spool.apply(
            pb.ReplicateRequest(
                proposal=self.spool.fragment.spec, registers=self.spool.registers, acknowledge=True
            )
        )
        streams, self._streams = self._streams, []
        if self.broken is not None:
            for _member, call in streams:
                call.cancel()
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        for _member, call in streams:
            try:
                async with asyncio.timeout_at(deadline):
                    await call.done_writing()
                    while (await call.read()) is not grpc.aio.EOF:
                        pass
            except (grpc.RpcError, asyncio.InvalidStateError, TimeoutError):
                call.cancel()


def _name(member: pb.ProcessSpec.ID) -> str:
    return member.suffix
