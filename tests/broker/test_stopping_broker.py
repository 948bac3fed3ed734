"""Requests in flight at a broker that stops: answered, or known unanswered.

An HTTP PUT whose body is still arriving when the broker is SIGTERMed is committed and answered
(saying `Connection: close`), while idle keep-alive connections are closed at once.

grpcio's server, as it stops, cancels the calls it accepted but never handed to a handler; their
clients see CANCELLED. A broker sends the APPEND_BEGUN marker before it reads an Append, so that
such an append is known unwritten (TransportError, which the AppendService retries) rather than
AppendOutcomeUnknown (see broker.protocol.metadata). Here writers flood a real `gazette serve`
with appends while it is SIGTERMed; it is restarted and the journal read back: every
acknowledged record is there once, every append reported unwritten is absent, and no append's
outcome is unknown (each one the broker began, it finished before exiting).
"""

from __future__ import annotations

import asyncio
import signal
import socket
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from broker.client import (
    AppendOutcomeUnknown,
    JournalClient,
    OffsetNotYetAvailable,
    RetryReader,
    StatusError,
    TransportError,
    append,
)
from broker.protocol import pb
from broker.protocol.metadata import APPEND_BEGUN_KEY, WANT_APPEND_BEGUN, never_begun
from tests.support.harness import BrokerProcess, apply_specs, journal_spec, wait_for_primary
from tests.support.inprocess import InProcessBroker, InProcessCluster

pytestmark = pytest.mark.timeout(180)

WRITERS = 48
JOURNAL = "stopping/appends"


def test_never_begun_needs_a_stop_and_no_marker() -> None:
    cancelled, unavailable = grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE
    goaway = "Stream removed (Socket closed (GOAWAY received; Error code: 0; Debug Text: Server shutdown))"
    marker = ((APPEND_BEGUN_KEY, "1"),)
    assert never_begun(cancelled, "CANCELLED", None)
    assert never_begun(cancelled, "", (("other", "x"),))
    assert never_begun(unavailable, goaway, ())
    assert not never_begun(cancelled, "CANCELLED", marker)
    assert not never_begun(unavailable, goaway, marker)
    # Other failures may have come after the broker began (a connection lost mid-commit).
    assert not never_begun(unavailable, "Socket closed", None)
    assert not never_begun(grpc.StatusCode.ABORTED, "", None)


async def test_the_marker_goes_to_appends_that_ask_for_it(tmp_path: Path, etcd_endpoint: str) -> None:
    """APPEND_BEGUN is initial metadata for a call with WANT_APPEND_BEGUN (this project's clients),
    and none for one without (Gazette's Go client): the broker spares those the extra send."""
    broker = BrokerProcess(tmp_path, etcd_endpoint, f"/test/{uuid.uuid4().hex}").wait_ready()
    channel, stub = broker.stub()
    with channel:
        apply_specs(stub, journal_spec("marker/j"))
        wait_for_primary(stub, "marker/j")
    async with grpc.aio.insecure_channel(broker.target) as aio_channel:
        append_rpc = aio_channel.stream_unary(
            "/protocol.Journal/Append", request_serializer=pb.AppendRequest.SerializeToString,
            response_deserializer=pb.AppendResponse.FromString,
        )
        for metadata, marked in ((WANT_APPEND_BEGUN, True), ((), False)):
            call = append_rpc(metadata=metadata)
            for req in (pb.AppendRequest(journal="marker/j"), pb.AppendRequest(content=b"x\n"), pb.AppendRequest()):
                await call.write(req)
            await call.done_writing()
            resp = await call
            assert resp.status == pb.OK
            initial = await call.initial_metadata()
            assert any(key == APPEND_BEGUN_KEY for key, _ in initial or ()) is marked, (metadata, initial)
    broker.stop()


async def read_all(url: str, journal: str) -> bytes:
    chunks = []
    async with JournalClient(url, route_cache=False) as client:
        reader = RetryReader(client, journal, offset=0, block=False)
        try:
            async with asyncio.timeout(30):
                while True:
                    try:
                        data = await reader.read()
                    except OffsetNotYetAvailable:
                        break
                    if not data:
                        break
                    chunks.append(data)
        finally:
            await reader.close()
    return b"".join(chunks)


async def test_appends_cut_off_by_a_stop_are_known_unwritten(tmp_path: Path, etcd_endpoint: str) -> None:
    root = tmp_path / "fragments"
    root.mkdir()
    prefix = f"/test/{uuid.uuid4().hex}"
    extra = ("--broker.file-root", str(root))
    broker = BrokerProcess(tmp_path, etcd_endpoint, prefix, *extra).wait_ready()
    channel, stub = broker.stub()
    spec = journal_spec(JOURNAL)
    spec.fragment.stores.append("file:///")
    with channel:
        apply_specs(stub, spec)
        wait_for_primary(stub, JOURNAL)

    acked: dict[bytes, tuple[int, int]] = {}
    unwritten: set[bytes] = set()
    unknown: list[str] = []
    errors: Counter[str] = Counter()
    stop = asyncio.Event()

    async def writer(n: int, client: JournalClient) -> None:
        seq = 0
        while not stop.is_set():
            rec = f"w{n:02d} {seq:08d}\n".encode()
            seq += 1
            try:
                resp = await append(client, JOURNAL, rec)
            except AppendOutcomeUnknown as exc:
                unknown.append(str(exc))
            except (TransportError, StatusError) as exc:
                unwritten.add(rec)
                errors[f"{type(exc).__name__} {getattr(exc, 'code', '')}"] += 1
                if isinstance(exc, TransportError) and exc.code == grpc.StatusCode.UNAVAILABLE:
                    return  # The broker is gone.
            else:
                acked[rec] = (resp.commit.begin, resp.commit.end)

    async with JournalClient(broker.url, route_cache=False) as client:
        tasks = [asyncio.create_task(writer(n, client)) for n in range(WRITERS)]
        await asyncio.sleep(1.5)
        # The broker is stopped mid-flood: once appends are being acknowledged (on a slow host the first may
        # take longer than the pause above).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not acked:
            stopped = all(task.done() for task in tasks)
            assert loop.time() < deadline and not stopped, f"no append was acknowledged: {dict(errors)} {unknown[:3]}"
            await asyncio.sleep(0.05)
        assert await asyncio.to_thread(broker.stop, signal.SIGTERM) == 0, broker.logs()
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)

    restarted = BrokerProcess(tmp_path, etcd_endpoint, prefix, *extra, broker_id=broker.broker_id, port=broker.port)
    try:
        content = await read_all(restarted.wait_ready().url, JOURNAL)
    finally:
        assert restarted.stop() == 0, restarted.logs()

    assert acked, "no append was acknowledged"
    assert not unknown, f"{len(unknown)} appends of unknown outcome, e.g. {unknown[0]}"
    offsets: dict[bytes, list[int]] = {}
    at = 0
    for line in content.splitlines(keepends=True):
        offsets.setdefault(line, []).append(at)
        at += len(line)
    for rec, (begin, _end) in acked.items():
        assert offsets.get(rec) == [begin], f"acknowledged {rec!r} at {begin}, found at {offsets.get(rec)}"
    written_anyway = sorted(rec for rec in unwritten if rec in offsets)
    assert not written_anyway, f"appends reported unwritten are in the journal: {written_anyway[:5]}"
    assert len(offsets) == len(acked), "records in the journal that no writer saw acknowledged"
    print(f"acknowledged {len(acked)}, unwritten {len(unwritten)}: {dict(errors)}")


def test_http_request_in_flight_is_answered_and_idle_connections_closed(tmp_path: Path, etcd_endpoint: str) -> None:
    root = tmp_path / "fragments"
    root.mkdir()
    prefix = f"/test/{uuid.uuid4().hex}"
    broker = BrokerProcess(tmp_path, etcd_endpoint, prefix, "--broker.file-root", str(root)).wait_ready()
    spec = journal_spec(JOURNAL)
    spec.fragment.stores.append("file:///")
    channel, stub = broker.stub()
    with channel:
        apply_specs(stub, spec)
        wait_for_primary(stub, JOURNAL)
    body = b"in flight\n"
    with socket.create_connection(("127.0.0.1", broker.port)) as idle, \
            socket.create_connection(("127.0.0.1", broker.port)) as busy:
        idle.sendall(b"GET /debug/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        ready = b""
        while not ready.endswith(b"\r\n\r\nok"):
            ready += idle.recv(4096)
        assert ready.startswith(b"HTTP/1.1 200")  # Now idle, kept alive.
        busy.sendall(f"PUT /{JOURNAL} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        busy.sendall(body[:3])
        time.sleep(0.3)  # The PUT's Append RPC has begun.
        broker.proc.send_signal(signal.SIGTERM)
        idle.settimeout(5)
        assert idle.recv(4096) == b"", "an idle connection of a stopping broker is closed"
        busy.sendall(body[3:])
        busy.settimeout(10)
        reply = b""
        while chunk := busy.recv(4096):
            reply += chunk
    head = reply.decode("latin-1")
    assert head.startswith("HTTP/1.1 204"), head
    assert "Connection: close" in head, head
    assert f"X-Commit-End: {len(body)}\r\n" in head, head
    assert broker.stop() == 0, broker.logs()


async def test_a_stopping_broker_answers_an_append_it_cannot_proxy(
    inproc_cluster: InProcessCluster, inproc_pair: tuple[InProcessBroker, InProcessBroker]
) -> None:
    """Once a stopping broker has handed its journals off, an append it proxies to an unreachable
    primary is answered NOT_JOURNAL_PRIMARY_BROKER (nothing written, retry at the primary), not held
    until the broker cuts it off with its outcome unknown."""
    a, b = inproc_pair
    await inproc_cluster.put_spec(journal_spec(JOURNAL, replication=1))
    await inproc_cluster.assign(JOURNAL, a)
    await a.kill()  # The primary stops answering; its assignment stays until its lease expires.
    b.state.stopping.set()

    async def requests() -> AsyncIterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=JOURNAL)
        yield pb.AppendRequest(content=b"x\n")
        yield pb.AppendRequest()

    resp = await asyncio.wait_for(b.stub().Append(requests()), 5)
    assert resp.status == pb.NOT_JOURNAL_PRIMARY_BROKER
    assert resp.header.process_id == b.local_id
    assert resp.header.route.members[resp.header.route.primary] == a.local_id
