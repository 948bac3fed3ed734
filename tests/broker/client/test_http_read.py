"""Reads as GETs of the broker's gateway (broker.client.http_read) against real brokers: which reads
take that path, tailing, end offsets, kept-alive connections, a restarted broker, a gRPC-only
endpoint. (test_client_reader runs the Reader's own tests over both transports.)"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from broker.client import JournalClient, Reader, RetryReader, TransportError, append
from broker.protocol import pb, pb_grpc
from tests.support.harness import BrokerProcess, free_port
from tests.support.journals import http_gets, new_journal, read_rpcs, wait_for_read_rpcs


async def read_to_head(reader: Reader | RetryReader) -> bytes:
    return b"".join([chunk async for chunk in reader])


async def test_plain_reads_are_gets_and_the_others_read_rpcs(broker: BrokerProcess, client: JournalClient) -> None:
    journal = await new_journal(client, "http-read")
    await append(client, journal, b"0123456789")
    gets, rpcs = http_gets(broker), read_rpcs(broker, journal)
    assert await read_to_head(Reader(client, journal)) == b"0123456789"
    assert await read_to_head(RetryReader(client, journal, offset=4, end_offset=8)) == b"4567"
    assert (http_gets(broker), read_rpcs(broker, journal)) == (gets + 2, rpcs + 2), "two GETs, run as Reads"

    # What a GET cannot ask for goes as a Read RPC.
    assert await read_to_head(Reader(client, journal, do_not_proxy=True)) == b"0123456789"
    meta = Reader(client, journal, metadata_only=True)
    assert await meta.read() == b"" and meta.write_head == 10
    assert await read_to_head(Reader(client, journal, begin_mod_time=1)) == b"0123456789"
    async with JournalClient(broker.url, http_reads=False) as grpc_only:
        assert await read_to_head(Reader(grpc_only, journal)) == b"0123456789"
    assert (http_gets(broker), read_rpcs(broker, journal)) == (gets + 2, rpcs + 6)


async def test_fragment_metadata_follows_the_read_across_fragments(
    broker: BrokerProcess, client: JournalClient
) -> None:
    journal = await new_journal(client, "http-read", length=1024)  # Each append rolls a new fragment.
    for part in (b"a" * 2000, b"b" * 2000, b"c" * 2000):
        await append(client, journal, part)

    async def fragments_seen(reader: Reader) -> list[tuple[int, int]]:
        seen: list[tuple[int, int]] = []
        async for _ in reader:
            assert reader.fragment is not None
            if (reader.fragment.begin, reader.fragment.end) not in seen:
                seen.append((reader.fragment.begin, reader.fragment.end))
        return seen

    gets = http_gets(broker)
    followed = await fragments_seen(Reader(client, journal, fragment_metadata=True))
    assert followed == [(0, 2000), (2000, 4000), (4000, 6000)]
    assert http_gets(broker) == gets, "a Read RPC"
    # A GET reports the metadata of the read's start only.
    assert await fragments_seen(Reader(client, journal)) == [(0, 2000)]
    assert http_gets(broker) == gets + 1


async def test_a_tailing_get_follows_appends_to_its_end_offset(broker: BrokerProcess, client: JournalClient) -> None:
    journal = await new_journal(client, "http-read")
    await append(client, journal, b"first;")  # [0, 6)
    rpcs = read_rpcs(broker, journal)
    # Ends within the third append: the GET would stream on, the reader stops at the offset.
    reader = RetryReader(client, journal, offset=2, block=True, end_offset=20)
    assert await reader.read() == b"rst;"
    pending = asyncio.create_task(read_to_head(reader))
    await append(client, journal, b"second;")  # [6, 13)
    await append(client, journal, b"third and more")  # [13, 27)
    assert await asyncio.wait_for(pending, 30) == b"second;third a"
    assert reader.offset == 20
    assert read_rpcs(broker, journal) == rpcs + 1, "one GET tailed the appends"
    # The connection, left amid its response, was closed: the next read takes another one.
    assert await read_to_head(Reader(client, journal, offset=20)) == b"nd more"


async def test_a_broker_restarted_between_reads(tmp_path: Path, etcd_endpoint: str) -> None:
    port = free_port()
    prefix = f"/test/{uuid.uuid4().hex}"
    (tmp_path / "fragments").mkdir()
    args = ("--broker.file-root", str(tmp_path / "fragments"))
    proc = BrokerProcess(tmp_path, etcd_endpoint, prefix, *args, port=port, broker_id="http-read-a")
    await asyncio.to_thread(proc.wait_ready)
    async with JournalClient(proc.url, file_root=str(tmp_path / "fragments")) as client:
        try:
            journal = await new_journal(client, "http-read", stores=["file:///"], refresh_interval=1)
            await append(client, journal, b"kept")
            assert await read_to_head(Reader(client, journal)) == b"kept"  # Its connection is kept alive.
        finally:
            assert await asyncio.to_thread(proc.stop) == 0, proc.logs()
        again = BrokerProcess(tmp_path, etcd_endpoint, prefix, *args, port=port, broker_id="http-read-a")
        try:
            await asyncio.to_thread(again.wait_ready)
            # The stopped broker persisted the fragment: wait (over gRPC) until the new one lists it.
            async with JournalClient(again.url, http_reads=False) as grpc_reads:
                async with asyncio.timeout(30):
                    while await read_to_head(RetryReader(grpc_reads, journal)) != b"kept":
                        await asyncio.sleep(0.1)
            # The kept-alive connection is gone with the broker that had it: a plain Reader (which
            # retries nothing) reads on a new one.
            assert await read_to_head(Reader(client, journal, offset=1)) == b"ept"
        finally:
            assert await asyncio.to_thread(again.stop) == 0, again.logs()
        with pytest.raises(TransportError) as gone:
            await Reader(client, journal).read()
        assert gone.value.code == grpc.StatusCode.UNAVAILABLE and gone.value.journal == journal


@pytest.fixture
async def grpc_only(broker: BrokerProcess) -> AsyncIterator[str]:
    """The endpoint of a gRPC-only proxy in front of the broker (as an HTTP/2-only load balancer)."""
    channel = grpc.aio.insecure_channel(broker.url.removeprefix("http://"))
    stub = pb_grpc.JournalStub(channel)

    async def read(request: pb.ReadRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ReadResponse]:
        async for resp in stub.Read(request):
            yield resp

    handler = grpc.method_handlers_generic_handler("protocol.Journal", {
        "Read": grpc.unary_stream_rpc_method_handler(
            read, request_deserializer=pb.ReadRequest.FromString,
            response_serializer=pb.ReadResponse.SerializeToString),
    })
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"http://127.0.0.1:{port}"
    await server.stop(None)
    await channel.close()


async def test_a_grpc_only_endpoint_is_read_by_rpcs(broker: BrokerProcess, grpc_only: str) -> None:
    async with JournalClient(broker.url) as writer:
        journal = await new_journal(writer, "http-read")
        await append(writer, journal, b"through a proxy")
    rpcs = read_rpcs(broker, journal)
    async with JournalClient(grpc_only, route_cache=False) as client:
        assert await read_to_head(Reader(client, journal)) == b"through a proxy"
        assert grpc_only in client.http.not_http, "remembered: later reads go straight to gRPC"
        assert await read_to_head(Reader(client, journal, offset=8)) == b"a proxy"
    await wait_for_read_rpcs(broker, journal, rpcs + 2)


async def test_a_broker_that_never_answers_the_connect_is_given_up_on() -> None:
    # A listener that never accepts, its queue full: further connects hang, as to a host that drops packets.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(0)
        port = silent.getsockname()[1]
        queued = [socket.socket() for _ in range(3)]
        for sock in queued:
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sock.connect(("127.0.0.1", port))
        try:
            async with JournalClient(f"http://127.0.0.1:{port}") as client:
                client.http.connect_timeout = 0.5
                with pytest.raises(TransportError) as info:
                    await Reader(client, "http-read/anything").read()
                assert info.value.code == grpc.StatusCode.UNAVAILABLE
                assert "no connection within 0.5 s" in str(info.value)
        finally:
            for sock in queued:
                sock.close()
