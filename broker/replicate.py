"""The replica side of the Replicate RPC: apply a primary's proposals and content to the local spool.

A replica applies content only inside a proposal it accepted, from a stream whose route is its
own and names another broker as primary: the journal's primary refuses Replicate streams, a
proposal for another journal ends the stream, and so does content after a proposal it refused.
Anything refused leaves the spool as the last accepted proposal left it. A stream that cannot have
the replica's spool within SPOOL_WAIT_TIMEOUT is refused too. (Authenticating the peer that sends the
stream comes with broker authentication.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from broker.errors import ReplicationError
from broker.pipeline import routes_equivalent, same_id
from broker.protocol import pb
from broker.protocol.auth import Claims
from broker.protocol.validation import ValidationError, validate_replicate_request
from broker.replica import ReplicateHold
from broker.state import BrokerState

SPOOL_WAIT_TIMEOUT = 5.0
"""Seconds a Replicate stream waits for the replica's spool before it is refused. A replica serves one
stream at a time, and a primary holds its own spool while it waits on its peers: without a bound, two
brokers that each hold a spool the other's stream waits for (a primary that has not yet seen it was
replaced, a pipeline being closed) would wait on each other for ever. Refused, the primary drops its
pipeline and tries again."""


async def serve_replicate(
    state: BrokerState, requests: AsyncIterator[pb.ReplicateRequest], claims: Claims | None = None
) -> AsyncIterator[pb.ReplicateResponse]:
    """Yield one response per acknowledged proposal; the first also carries our header."""
    try:
        first = await anext(requests)
    except StopAsyncIteration:
        return
    _check(first)
    if not first.HasField("header") or not first.HasField("proposal"):
        raise ReplicationError("expected first ReplicateRequest to have Header", first.deprecated_journal)
    journal = first.proposal.journal
    res = await state.resolver.resolve(
        journal, may_proxy=False, require_primary=False, proxy_header=first.header, claims=claims
    )
    if res.status != pb.OK:
        yield pb.ReplicateResponse(status=res.status, header=res.header)  # type: ignore[arg-type]
        return
    etcd = state.keyspace.etcd_header()
    if first.header.etcd.cluster_id != etcd.cluster_id:
        raise ReplicationError("proxied request Etcd ClusterId doesn't match our own", journal)
    if not same_id(first.header.process_id, state.resolver.local_id):
        raise ReplicationError("proxied request ProcessId doesn't match our own", journal)
    if not routes_equivalent(res.route, first.header.route):
        yield pb.ReplicateResponse(status=pb.WRONG_ROUTE, header=res.header)
        return
    if 0 <= res.route.primary < len(res.route.members) and same_id(
        res.route.members[res.route.primary], state.resolver.local_id
    ):
        raise ReplicationError("this broker is the journal's primary: it accepts no Replicate stream", journal)
    replica = res.replica
    assert replica is not None
    if state.lease_lost:
        raise ReplicationError("this broker's etcd lease is lost: it takes no Replicate stream", journal)
    wait = min(SPOOL_WAIT_TIMEOUT, state.peer_timeout / 2)
    try:
        async with asyncio.timeout(wait):
            await replica.acquire(res.route, patience=wait / 2, stream=True)
    except TimeoutError:
        raise ReplicationError(
            f"replica busy: its spool was not free within {wait:g}s (another primary's stream, or"
            " this broker's own append, holds it); retry once the route settles", journal,
        ) from None
    task = asyncio.current_task()
    assert task is not None
    hold = replica.replicating = ReplicateHold(res.route, task)
    try:
        # This broker is a replica: any pipeline it held as a former primary is void.
        if replica.pipeline is not None:
            pipeline, replica.pipeline = replica.pipeline, None
            await pipeline.close()
        spool = replica.spool
        header_sent = False
        accepted = False  # Whether the last proposal was accepted: content may follow it.
        req: pb.ReplicateRequest | None = first
        try:
            while req is not None:
                if req.HasField("proposal") and req.proposal.journal != journal:
                    raise ReplicationError(f"proposal for another journal ({req.proposal.journal})", journal)
                if not req.HasField("proposal") and not accepted:
                    raise ReplicationError("content without an accepted proposal", journal, spool.end + spool.delta)
                end = spool.end
                resp = spool.apply(req)
                if req.HasField("proposal"):
                    accepted = resp.status == pb.OK
                    if accepted and spool.end == end:
                        # Not a commit: the primary confirms (or rolls past) what this spool holds.
                        spool.acknowledge()
                    if req.acknowledge:
                        if not header_sent:
                            resp.header.CopyFrom(res.header)
                            header_sent = True
                        yield resp
                    elif resp.status != pb.OK:
                        raise ReplicationError(
                            f"unacknowledged proposal failed: {pb.Status.Name(resp.status)}", journal
                        )
                try:
                    req = await anext(requests)
                except StopAsyncIteration:
                    req = None
                else:
                    _check(req)
        except asyncio.CancelledError:
            if not hold.ended:
                raise
            task.uncancel()  # Ended by this broker, not by its caller: the stream fails, saying why.
            raise ReplicationError(f"Replicate stream ended: {hold.ended}", journal) from None
        finally:
            # The primary went away: discard whatever it did not commit.
            spool.apply(
                pb.ReplicateRequest(proposal=spool.fragment.spec, registers=spool.registers, acknowledge=True)
            )
    finally:
        if replica.replicating is hold:
            replica.replicating = None
        replica.lock.release()


def _check(req: pb.ReplicateRequest) -> None:
    try:
        validate_replicate_request(req)
    except ValidationError as exc:
        raise ReplicationError(str(exc), req.proposal.journal) from exc
