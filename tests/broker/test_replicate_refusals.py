"""Replicate streams a replica must refuse, sent over the raw gRPC API as any client could build
them: each is refused and leaves the journal as it was.

Brokers are in-process (`inprocess.py`); `a` is the journal's primary and `b` its replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib

import grpc
import pytest

from broker import replicate
from broker.errors import PipelineError
from broker.fragment import sha1sum_from_digest
from broker.protocol import pb
from tests.support.harness import journal_spec
from tests.support.inprocess import InProcessBroker, InProcessCluster, append

J = "replicate/journal"
Pair = tuple[InProcessBroker, InProcessBroker]


async def two_replicas(cluster: InProcessCluster, a: InProcessBroker, b: InProcessBroker) -> None:
    """`J` on `a` (primary) and `b`, holding one committed append. `a`'s pipeline is then torn down,
    so that `b` is free to take another stream (a replica serves one at a time)."""
    await cluster.put_spec(journal_spec(J, replication=2))
    await cluster.assign(J, a, b)
    assert (await append(a, J, b"committed\n")).status == pb.OK
    replica = a.replica(J)
    async with replica.lock:
        pipeline, replica.pipeline = replica.pipeline, None
        assert pipeline is not None
        await pipeline.close()


def header_for(target: InProcessBroker, route_of: InProcessBroker) -> pb.Header:
    """The header a primary puts on a stream to `target`: its own route, as `route_of` resolves it."""
    route = route_of.keyspace.route(J, endpoints=False)
    return pb.Header(process_id=target.local_id, route=route, etcd=target.keyspace.etcd_header())


def forged(header: pb.Header, at: pb.Fragment, data: bytes, journal: str = J) -> list[pb.ReplicateRequest]:
    """The forgery of the issue: a proposal at the write head, content, then a proposal covering it."""
    covering = pb.Fragment()
    covering.CopyFrom(at)
    covering.journal = journal
    covering.end = at.end + len(data)
    covering.sum.CopyFrom(sha1sum_from_digest(hashlib.sha1(data).digest()))
    return [
        pb.ReplicateRequest(header=header, proposal=at, registers=pb.LabelSet(), acknowledge=True),
        pb.ReplicateRequest(content=data, content_delta=0),
        pb.ReplicateRequest(proposal=covering, registers=pb.LabelSet(), acknowledge=True),
    ]


async def send(
    target: InProcessBroker, requests: list[pb.ReplicateRequest]
) -> tuple[list[pb.ReplicateResponse], grpc.aio.AioRpcError | None]:
    """Send `requests` on one Replicate stream to `target`, reading the reply to each acknowledged
    proposal before going on (the last request is the one the broker must refuse, so no write races
    its refusal); the responses, and the error the stream ended with."""
    call = target.stub().Replicate()
    responses: list[pb.ReplicateResponse] = []
    try:
        for req in requests:
            await call.write(req)
            if req.HasField("proposal") and req.acknowledge:
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    break
                responses.append(resp)
        with contextlib.suppress(asyncio.InvalidStateError):
            await call.done_writing()
        while (resp := await call.read()) is not grpc.aio.EOF:
            responses.append(resp)
    except grpc.aio.AioRpcError as err:
        return responses, err
    return responses, None


def journal_state(*brokers: InProcessBroker) -> list[tuple[pb.Fragment, int]]:
    return [(b.replica(J).spool.fragment.spec, b.replica(J).spool.delta) for b in brokers]


async def test_the_primary_refuses_a_forged_stream(inproc_cluster: InProcessCluster, inproc_pair: Pair) -> None:
    a, b = inproc_pair
    await two_replicas(inproc_cluster, a, b)
    before = journal_state(a, b)
    head = a.replica(J).spool.fragment.spec
    responses, err = await send(a, forged(header_for(a, a), head, b"FORGED\n")[:1])
    assert err is not None and err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "journal's primary: it accepts no Replicate stream" in (err.details() or "")
    assert responses == []
    assert journal_state(a, b) == before
    assert await a.read(J) == b"committed\n"
    # The primary's own pipeline was left alone: the next append commits on both brokers.
    assert (await append(a, J, b"next\n")).status == pb.OK
    assert await b.read(J) == b"committed\nnext\n"


async def test_content_after_a_refused_proposal_ends_the_stream(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, b = inproc_pair
    await two_replicas(inproc_cluster, a, b)
    before = journal_state(b)
    stale = pb.Fragment(journal=J, begin=0, end=3, sum=pb.SHA1Sum(part1=1), compression_codec=pb.NONE)
    requests = forged(header_for(b, b), stale, b"FORGED\n")[:2]  # The proposal b refuses, then content.
    responses, err = await send(b, requests)
    assert [r.status for r in responses] == [pb.PROPOSAL_MISMATCH]
    assert err is not None and err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "content without an accepted proposal" in (err.details() or "")
    assert journal_state(b) == before


async def test_a_proposal_for_another_journal_ends_the_stream(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, b = inproc_pair
    await two_replicas(inproc_cluster, a, b)
    before = journal_state(b)
    head = b.replica(J).spool.fragment.spec
    ahead = pb.Fragment(journal="replicate/other", begin=1000, end=1000, sum=pb.SHA1Sum(), compression_codec=pb.NONE)
    requests = [
        pb.ReplicateRequest(header=header_for(b, b), proposal=head, registers=pb.LabelSet(), acknowledge=True),
        pb.ReplicateRequest(proposal=ahead, registers=pb.LabelSet(), acknowledge=True),
    ]
    responses, err = await send(b, requests)
    assert [r.status for r in responses] == [pb.OK]
    assert err is not None and "proposal for another journal (replicate/other)" in (err.details() or "")
    assert journal_state(b) == before


async def test_content_out_of_order_ends_the_stream(inproc_cluster: InProcessCluster, inproc_pair: Pair) -> None:
    a, b = inproc_pair
    await two_replicas(inproc_cluster, a, b)
    before = journal_state(b)
    head = b.replica(J).spool.fragment.spec
    requests = [
        pb.ReplicateRequest(header=header_for(b, b), proposal=head, registers=pb.LabelSet(), acknowledge=True),
        pb.ReplicateRequest(content=b"skipped ahead", content_delta=5),
    ]
    responses, err = await send(b, requests)
    assert [r.status for r in responses] == [pb.OK]
    assert err is not None and "invalid ContentDelta (5; expected 0)" in (err.details() or "")
    assert journal_state(b) == before


@pytest.mark.parametrize("route", ["other members", "other primary"])
async def test_a_stream_for_another_route_is_refused(
    inproc_cluster: InProcessCluster, inproc_pair: Pair, route: str
) -> None:
    a, b = inproc_pair
    await two_replicas(inproc_cluster, a, b)
    before = journal_state(b)
    header = header_for(b, b)
    if route == "other members":
        del header.route.members[:]
        header.route.members.append(a.local_id)
        header.route.primary = 0
    else:
        header.route.primary = 1 - header.route.primary
    head = b.replica(J).spool.fragment.spec
    responses, err = await send(b, forged(header, head, b"FORGED\n")[:1])
    assert err is None
    assert [r.status for r in responses] == [pb.WRONG_ROUTE]
    assert journal_state(b) == before
    assert await b.read(J) == b"committed\n"


async def test_a_stream_that_cannot_have_the_spool_in_time_is_refused(
    inproc_cluster: InProcessCluster, inproc_pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica's spool held for long (as by the stream of a primary that has not yet seen it was
    replaced) refuses a new stream after SPOOL_WAIT_TIMEOUT rather than hold its primary for ever."""
    monkeypatch.setattr(replicate, "SPOOL_WAIT_TIMEOUT", 0.2)
    a, b = inproc_pair
    await two_replicas(inproc_cluster, a, b)
    before = journal_state(b)
    async with b.replica(J).lock:
        with pytest.raises(PipelineError, match="replica busy"):
            await append(a, J, b"blocked\n")
        assert journal_state(b) == before
    # Once the spool is free, the primary's next append builds a new pipeline and commits on both.
    assert (await append(a, J, b"next\n")).status == pb.OK
    assert await b.read(J) == b"committed\nnext\n"
