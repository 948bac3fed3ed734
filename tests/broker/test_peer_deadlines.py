"""Waits on peers are bounded, and a replaced primary's stream does not hold a replica's spool.

A peer cut off by a partition sends no FIN: its Replicate stream neither answers nor ends. Brokers
are in-process (`inprocess.py`); `a` is the journal's primary and `b` its replica. The network
itself is cut in tests/broker/test_network_faults.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from broker import replicate
from broker.errors import PipelineError
from broker.pipeline import peer_timeout
from broker.protocol import pb
from tests.broker.test_replicate_refusals import header_for, journal_state, two_replicas
from tests.support.inprocess import InProcessBroker, InProcessCluster, append

J = "replicate/journal"
Pair = tuple[InProcessBroker, InProcessBroker]


def test_peer_timeout_is_half_the_lease_within_bounds() -> None:
    assert peer_timeout(5) == 2.5
    assert peer_timeout(20) == 10.0
    assert peer_timeout(60) == 10.0
    assert peer_timeout(1) == 1.0


async def test_a_peer_that_never_replies_fails_the_append_within_the_peer_timeout(
    inproc_cluster: InProcessCluster, inproc_pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replica's spool is held and it would wait for it far longer than the primary waits for a
    reply (as a peer behind a partition never replies): the append fails after the primary's
    peer timeout, naming the peer, and leaves the primary's replica free for the next append."""
    a, b = inproc_pair
    await two_replicas(inproc_cluster, a, b)
    a.state.peer_timeout = 0.5
    monkeypatch.setattr(replicate, "SPOOL_WAIT_TIMEOUT", 30.0)
    b.state.peer_timeout = 60.0
    before = journal_state(b)
    async with b.replica(J).lock:
        started = time.monotonic()
        with pytest.raises(PipelineError, match=r"replicate to broker-b: the peer sent no reply within 0\.5s"):
            await append(a, J, b"unanswered\n")
        waited = time.monotonic() - started
        assert waited < 5.0, f"the append waited {waited:.1f}s on a peer that never replied"
        assert not a.replica(J).lock.locked()
        assert a.replica(J).pipeline is None, "the broken pipeline is dropped"
    await asyncio.sleep(0)
    assert journal_state(b) == before
    assert (await append(a, J, b"next\n")).status == pb.OK
    assert await b.read(J) == b"committed\nnext\n"


async def test_the_stream_of_a_replaced_primary_is_ended_when_the_route_changes(
    inproc_cluster: InProcessCluster, inproc_pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`a` opens a Replicate stream to `b` and goes silent (a partition: no FIN, no more messages).
    Once etcd names `b` the primary, `b`'s append takes the spool from that stream after a quarter
    of its peer timeout (a primary handing off would have finished its append by then), rather
    than wait for a stream that never ends."""
    a, b = inproc_pair
    await two_replicas(inproc_cluster, a, b)
    monkeypatch.setattr(replicate, "SPOOL_WAIT_TIMEOUT", 30.0)
    b.state.peer_timeout = 2.0
    call = b.stub().Replicate(silent_stream(a, b))
    first = await call.read()
    assert first.status == pb.OK
    assert b.replica(J).lock.locked(), "the silent primary's stream holds the replica's spool"

    await inproc_cluster.assign(J, b, a)  # `b` is the primary now; `a` its replica.
    started = time.monotonic()
    resp = await append(b, J, b"after\n")
    waited = time.monotonic() - started
    assert resp.status == pb.OK
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await call.read()
    assert ended.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "its primary was replaced" in str(ended.value.details())
    assert waited < 5.0, f"the new primary's append waited {waited:.1f}s for the replaced primary's stream"
    assert await b.read(J) == b"committed\nafter\n"
    assert await a.read(J) == b"committed\nafter\n"


async def test_the_stream_of_a_primary_whose_lease_expired_is_ended_at_once(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    """`a`'s stream to `b` goes silent, then `a`'s lease is gone (etcd expired it: here, revoked):
    `b` ends the stream as soon as its mirror shows it, with no append needing the spool."""
    a, b = inproc_pair
    await two_replicas(inproc_cluster, a, b)
    call = b.stub().Replicate(silent_stream(a, b))
    assert (await call.read()).status == pb.OK
    assert b.replica(J).lock.locked()
    await inproc_cluster.client.revoke_lease(a.lease)
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        async with asyncio.timeout(5):
            await call.read()
    assert ended.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert not b.replica(J).lock.locked()


async def silent_stream(primary: InProcessBroker, replica: InProcessBroker) -> AsyncIterator[pb.ReplicateRequest]:
    """`primary`'s Replicate stream to `replica`: one proposal of the replica's fragment as it is,
    then silence, as from a primary cut off by a partition (no FIN, no more messages)."""
    spool = replica.replica(J).spool
    yield pb.ReplicateRequest(
        header=header_for(replica, primary), proposal=spool.fragment.spec, registers=spool.registers,
        acknowledge=True,
    )
    await asyncio.Event().wait()
