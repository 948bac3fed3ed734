"""UNIT TEST of the HTTP gateway's translation between HTTP/1.1 and the Journal RPCs.

The broker behind the gateway is a throwaway in-test grpc.aio servicer (`FakeJournals`) that
answers Read and Append minimally, only so that each HTTP behaviour of reference section 6 can
be driven and observed. It is a development aid, not a broker: the gateway's behaviour against
the real broker is covered by the broker's integration tests.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import h11
import pytest

from broker.fragment.sums import sha1sum_from_digest
from broker.gateway import HttpGateway, route_token
from broker.protocol import pb, pb_grpc

CHUNK = 32736
MAX_INT64 = (1 << 63) - 1
ID = pb.ProcessSpec.ID(zone="a", suffix="broker")
HEADER = pb.Header(
    process_id=ID,
    route=pb.Route(members=[ID], primary=0, endpoints=["http://broker/path"]),
    etcd=pb.Header.Etcd(cluster_id=1, member_id=1, revision=1, raft_term=1),
)


@dataclass
class Journal:
    begin: int = 0
    data: bytearray = field(default_factory=bytearray)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def end(self) -> int:
        return self.begin + len(self.data)


class FakeJournals(pb_grpc.JournalServicer):
    """Read and Append over in-memory journals, shaped like the broker's streams (section 8.3)."""

    def __init__(self) -> None:
        self.journals = {"a/journal": Journal(), "holey/journal": Journal(100, bytearray(b"x" * 50))}
        self.reads: list[pb.ReadRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.appended_chunks: list[int] = []
        self.aborted_appends = 0
        self.read_cancelled = asyncio.Event()

    async def Read(self, req: pb.ReadRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ReadResponse]:
        self.reads.append(req)
        self.metadata.append({k: str(v) for k, v in context.invocation_metadata() or ()})
        if req.journal == "boom/journal":
            await context.abort(grpc.StatusCode.INTERNAL, "kaput")
        if req.journal == "jumpy/journal":
            frag = pb.Fragment(journal=req.journal, begin=0, end=10, compression_codec=pb.NONE)
            yield pb.ReadResponse(header=HEADER, offset=0, write_head=30, fragment=frag)
            yield pb.ReadResponse(offset=0, content=b"0123456789")
            frag = pb.Fragment(journal=req.journal, begin=20, end=30, compression_codec=pb.NONE)
            yield pb.ReadResponse(offset=20, write_head=30, fragment=frag)
            return
        journal = self.journals.get(req.journal)
        if journal is None:
            yield pb.ReadResponse(status=pb.JOURNAL_NOT_FOUND, header=HEADER)
            return

        offset, first = req.offset, True
        try:
            while True:
                header = HEADER if first else None
                if offset == -1:
                    offset = journal.end
                offset = max(offset, journal.begin)
                if offset >= journal.end:
                    if not req.block:
                        yield pb.ReadResponse(
                            status=pb.OFFSET_NOT_YET_AVAILABLE,
                            header=header,
                            offset=offset,
                            write_head=journal.end,
                        )
                        return
                    journal.changed.clear()
                    await journal.changed.wait()
                    continue
                frag = pb.Fragment(
                    journal=req.journal,
                    begin=journal.begin,
                    end=journal.end,
                    compression_codec=pb.NONE,
                    mod_time=12345678 if journal.begin else 0,
                )
                yield pb.ReadResponse(header=header, offset=offset, write_head=journal.end, fragment=frag)
                first = False
                if req.metadata_only:
                    return
                while offset < journal.end:
                    at = offset - journal.begin
                    content = bytes(journal.data[at : at + CHUNK])
                    yield pb.ReadResponse(offset=offset, content=content)
                    offset += len(content)
        except asyncio.CancelledError:
            self.read_cancelled.set()
            raise

    async def Append(
        self, requests: AsyncIterator[pb.AppendRequest], context: grpc.aio.ServicerContext
    ) -> pb.AppendResponse:
        self.metadata.append({k: str(v) for k, v in context.invocation_metadata() or ()})
        stream = aiter(requests)
        first = await anext(stream)
        journal = self.journals.get(first.journal)
        if journal is None:
            return pb.AppendResponse(status=pb.JOURNAL_NOT_FOUND, header=HEADER)  # Answers early.
        content = bytearray()
        committed = False
        async for req in stream:
            if not req.content:
                committed = True
                break
            self.appended_chunks.append(len(req.content))
            content += req.content
        if not committed:
            self.aborted_appends += 1
            await context.abort(grpc.StatusCode.ABORTED, "append aborted")
        begin = journal.end
        journal.data += content
        journal.changed.set()
        commit = pb.Fragment(
            journal=first.journal,
            begin=begin,
            end=journal.end,
            compression_codec=pb.NONE,
            sum=sha1sum_from_digest(hashlib.sha1(content).digest()),
        )
        return pb.AppendResponse(status=pb.OK, header=HEADER, commit=commit, registers=pb.LabelSet())


@dataclass
class Gateway:
    port: int
    fake: FakeJournals
    ready: list[bool]


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    tmp = tempfile.mkdtemp(prefix="gw-")  # Short: unix socket paths are limited to ~100 bytes.
    path = f"{tmp}/grpc.sock"
    fake = FakeJournals()
    server = grpc.aio.server()
    pb_grpc.add_JournalServicer_to_server(fake, server)
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    channel = grpc.aio.insecure_channel(f"unix:{path}")
    ready = [True]
    gw = HttpGateway(channel, ready=lambda: ready[0])

    class Handoff(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            gw(transport, b"")

    http = await asyncio.get_running_loop().create_server(Handoff, "127.0.0.1", 0)
    try:
        yield Gateway(http.sockets[0].getsockname()[1], fake, ready)
    finally:
        http.close()
        await gw.close()
        await channel.close()
        await server.stop(None)
        shutil.rmtree(tmp, ignore_errors=True)


# A minimal HTTP/1.1 client on h11, which (unlike http.client) shows trailers.


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    trailers: dict[str, str]


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, port: int) -> Client:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass

    async def next_event(self) -> object:
        while (event := self.conn.next_event()) is h11.NEED_DATA:
            self.conn.receive_data(await self.reader.read(1 << 16))
        return event

    async def send_head(self, method: str, target: str, headers: list[tuple[str, str]]) -> None:
        request = h11.Request(method=method, target=target, headers=[("Host", "test"), *headers])
        self.writer.write(self.conn.send(request))
        await self.writer.drain()

    async def send_body(self, body: bytes) -> None:
        if body:
            self.writer.write(self.conn.send(h11.Data(data=body)))
        self.writer.write(self.conn.send(h11.EndOfMessage()))
        await self.writer.drain()

    async def read_head(self) -> h11.Response:
        while not isinstance(event := await self.next_event(), h11.Response):
            assert isinstance(event, h11.InformationalResponse), event
        return event

    async def read_reply(self, head: h11.Response | None = None) -> Reply:
        head = head or await self.read_head()
        body = bytearray()
        while isinstance(event := await self.next_event(), h11.Data):
            body += event.data
        assert isinstance(event, h11.EndOfMessage), event
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        headers = {n.decode().lower(): v.decode() for n, v in head.headers}
        trailers = {n.decode().lower(): v.decode() for n, v in event.headers}
        return Reply(head.status_code, headers, bytes(body), trailers)

    async def request(
        self, method: str, target: str, headers: list[tuple[str, str]] | None = None, body: bytes = b""
    ) -> Reply:
        headers = list(headers or [])
        if method == "PUT" or body:
            headers.append(("Content-Length", str(len(body))))
        await self.send_head(method, target, headers)
        await self.send_body(body)
        return await self.read_reply()


async def fetch(
    port: int, method: str, target: str, headers: list[tuple[str, str]] | None = None, body: bytes = b""
) -> Reply:
    client = await Client.open(port)
    try:
        return await client.request(method, target, headers, body)
    finally:
        await client.close()


async def raw_exchange(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    out = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return out


def assert_error(reply: Reply, status: int, text: str) -> None:
    assert (reply.status, reply.body) == (status, text.encode() + b"\n")
    assert reply.headers["content-type"] == "text/plain; charset=utf-8"
    assert reply.headers["x-content-type-options"] == "nosniff"


# Tests.


def test_route_token_is_go_compact_text() -> None:
    assert route_token(HEADER.route) == 'members:<zone:"a" suffix:"broker" > endpoints:"http://broker/path" '
    route = pb.Route(members=[pb.ProcessSpec.ID(zone="a", suffix='q"\n\xe9'), pb.ProcessSpec.ID()], primary=-1)
    assert route_token(route) == 'members:<zone:"a" suffix:"q\\"\\n\\303\\251" > members:<> primary:-1 '


async def test_put_then_get_streams_content_with_headers_and_trailer(gateway: Gateway) -> None:
    data = b"hello, gazette\n" * 5000  # Several read chunks.
    put = await fetch(gateway.port, "PUT", "/a/journal", body=data)
    assert put.status == 204, put
    assert put.body == b""
    assert put.headers["x-commit-begin"] == "0"
    assert put.headers["x-commit-end"] == put.headers["x-write-head"] == str(len(data))
    assert put.headers["x-commit-sha1-sum"] == hashlib.sha1(data).hexdigest()
    # HTTP parsers strip the token's trailing space, from Go's gateway too.
    assert put.headers["x-route-token"] == route_token(HEADER.route).rstrip()
    assert put.headers["location"] == "http://broker/path/a/journal"

    get = await fetch(gateway.port, "GET", "/a/journal")
    assert get.status == 206
    assert get.body == data
    assert get.headers["trailer"] == "X-Close-Error"
    assert get.headers["transfer-encoding"] == "chunked"
    assert get.headers["content-range"] == f"bytes 0-{MAX_INT64}/{MAX_INT64}"
    assert get.headers["x-write-head"] == str(len(data))
    assert get.headers["x-fragment-name"] == f"{0:016x}-{len(data):016x}-{'0' * 40}.raw"
    assert get.headers["location"] == "http://broker/path/a/journal"
    assert "x-fragment-last-modified" not in get.headers
    # A non-blocking read ends at the write head.
    assert get.trailers == {"x-close-error": "OFFSET_NOT_YET_AVAILABLE"}


async def test_large_put_streams_in_large_chunks(gateway: Gateway) -> None:
    data = bytes(range(256)) * (12 * 1024)  # 3 MiB.
    put = await fetch(gateway.port, "PUT", "/a/journal", body=data)
    assert put.status == 204
    assert put.headers["x-commit-sha1-sum"] == hashlib.sha1(data).hexdigest()
    assert sum(gateway.fake.appended_chunks) == len(data)
    assert max(gateway.fake.appended_chunks) <= 1 << 20
    assert len(gateway.fake.appended_chunks) <= 8
    assert gateway.fake.journals["a/journal"].data == data


async def test_empty_put_is_a_zero_length_append(gateway: Gateway) -> None:
    put = await fetch(gateway.port, "PUT", "/a/journal")
    assert put.status == 204
    assert (put.headers["x-commit-begin"], put.headers["x-commit-end"]) == ("0", "0")
    assert put.headers["x-commit-sha1-sum"] == hashlib.sha1(b"").hexdigest()


async def test_head_is_metadata_only(gateway: Gateway) -> None:
    await fetch(gateway.port, "PUT", "/a/journal", body=b"0123456789")
    head = await fetch(gateway.port, "HEAD", "/a/journal?offset=3")
    assert head.status == 206
    assert head.body == b""
    assert "trailer" not in head.headers
    assert head.headers["content-range"] == f"bytes 3-{MAX_INT64}/{MAX_INT64}"
    assert head.headers["x-write-head"] == "10"
    assert gateway.fake.reads[-1].metadata_only
    assert gateway.fake.reads[-1].offset == 3


async def test_first_offset_jump_is_swallowed(gateway: Gateway) -> None:
    get = await fetch(gateway.port, "GET", "/holey/journal")
    assert get.status == 206
    assert get.headers["content-range"] == f"bytes 100-{MAX_INT64}/{MAX_INT64}"
    assert get.headers["x-fragment-last-modified"] == "Sat, 23 May 1970 21:21:18 GMT"
    assert get.body == b"x" * 50
    assert get.trailers == {"x-close-error": "OFFSET_NOT_YET_AVAILABLE"}


async def test_second_offset_jump_ends_the_response(gateway: Gateway) -> None:
    get = await fetch(gateway.port, "GET", "/jumpy/journal")
    assert get.status == 206
    assert get.body == b"0123456789"
    assert get.trailers == {"x-close-error": "offset jump"}


async def test_offset_minus_one_starts_at_the_write_head(gateway: Gateway) -> None:
    await fetch(gateway.port, "PUT", "/a/journal", body=b"old")
    reads = len(gateway.fake.reads)
    client = await Client.open(gateway.port)
    try:
        await client.send_head("GET", "/a/journal?offset=-1&block=true", [])
        await client.send_body(b"")
        # The read is blocked at the head once its Read RPC reached the fake (which resolves -1 as it
        # records the request).
        async with asyncio.timeout(30):
            while len(gateway.fake.reads) == reads:
                await asyncio.sleep(0.01)
        assert gateway.fake.reads[-1].offset == -1 and gateway.fake.reads[-1].block
        await fetch(gateway.port, "PUT", "/a/journal", body=b"new!")
        head = await client.read_head()
        assert head.status_code == 206
        assert dict(head.headers)[b"content-range"] == f"bytes 3-{MAX_INT64}/{MAX_INT64}".encode()
        event = await client.next_event()
        assert isinstance(event, h11.Data) and event.data == b"new!"
    finally:
        await client.close()


async def test_non_ok_read_statuses(gateway: Gateway) -> None:
    missing = await fetch(gateway.port, "GET", "/no/such/journal")
    assert_error(missing, 404, "JOURNAL_NOT_FOUND")
    assert missing.headers["x-route-token"] == route_token(HEADER.route).rstrip()

    await fetch(gateway.port, "PUT", "/a/journal", body=b"12345")
    at_head = await fetch(gateway.port, "GET", "/a/journal?offset=5")
    assert_error(at_head, 416, "OFFSET_NOT_YET_AVAILABLE")
    assert at_head.headers["x-write-head"] == "5"
    assert "trailer" not in at_head.headers

    boom = await fetch(gateway.port, "GET", "/boom/journal")
    assert_error(boom, 500, "rpc error: code = Internal desc = kaput")


async def test_query_parameters(gateway: Gateway) -> None:
    port = gateway.port
    ok = await fetch(port, "GET", "/a/journal?OFFSET=0&Block=false")
    assert ok.status == 416
    assert gateway.fake.reads[-1].offset == 0 and not gateway.fake.reads[-1].block

    assert_error(await fetch(port, "GET", "/a/journal?extra=1"), 400, 'schema: invalid path "extra"')
    assert_error(await fetch(port, "GET", "/a/journal?offset=abc"), 400, 'schema: error converting value for "offset"')
    assert_error(await fetch(port, "GET", "/a/journal?block=maybe"), 400, 'schema: error converting value for "block"')
    assert_error(
        await fetch(port, "GET", "/a/journal?offset=-2"),
        400,
        "invalid Offset (-2; expected -1 <= Offset <= MaxInt64)",
    )
    assert_error(await fetch(port, "GET", "/a/journal?offset=%zz"), 400, 'invalid URL escape "%zz"')
    assert_error(await fetch(port, "GET", "/a/journal?x=1&y=2"), 400, 'schema: invalid path "x" (and 1 other error)')
    assert_error(await fetch(port, "PUT", "/a/journal?offset=1"), 400, 'schema: invalid path "offset"')
    assert not gateway.fake.journals["a/journal"].data


async def test_journal_name_is_validated(gateway: Gateway) -> None:
    port = gateway.port
    # `/journal//name` is redirected by the mux (tests/broker/test_gateway_go_http.py); escaped, it reaches the
    # gateway, whose journal it names.
    assert_error(await fetch(port, "GET", "/journal%2F%2Fname"), 400, "Journal: must be a clean path (journal//name)")
    assert_error(await fetch(port, "PUT", "/journal%2F%2Fname"), 400, "Journal: must be a clean path (journal//name)")
    # The path is percent-decoded first.
    decoded = await fetch(port, "GET", "/a%2Fjournal")
    assert decoded.status == 206 or decoded.status == 416
    assert gateway.fake.reads[-1].journal == "a/journal"
    assert_error(await fetch(port, "PUT", "/"), 500, "expected Request.Journal")


async def test_failed_appends_are_500(gateway: Gateway) -> None:
    small = await fetch(gateway.port, "PUT", "/no/such/journal", body=b"data")
    assert_error(small, 500, "JOURNAL_NOT_FOUND")
    # The broker answers before the body has been sent.
    large = await fetch(gateway.port, "PUT", "/no/such/journal", body=b"z" * (8 << 20))
    assert_error(large, 500, "JOURNAL_NOT_FOUND")


async def test_unknown_method(gateway: Gateway) -> None:
    assert_error(await fetch(gateway.port, "DELETE", "/a/journal"), 400, "unknown method: DELETE")


async def test_authorization_is_passed_on(gateway: Gateway) -> None:
    await fetch(gateway.port, "GET", "/a/journal", [("Authorization", "Bearer abc")])
    await fetch(gateway.port, "PUT", "/a/journal", [("Authorization", "Bearer def")], b"x")
    assert gateway.fake.metadata[-2]["authorization"] == "Bearer abc"
    assert gateway.fake.metadata[-1]["authorization"] == "Bearer def"


async def test_keep_alive_and_expect_continue(gateway: Gateway) -> None:
    client = await Client.open(gateway.port)
    try:
        assert (await client.request("PUT", "/a/journal", body=b"one")).status == 204
        await client.send_head("PUT", "/a/journal", [("Content-Length", "3"), ("Expect", "100-continue")])
        interim = await client.next_event()
        assert isinstance(interim, h11.InformationalResponse) and interim.status_code == 100
        await client.send_body(b"two")
        assert (await client.read_reply()).status == 204
        get = await client.request("GET", "/a/journal")
        assert get.body == b"onetwo"
    finally:
        await client.close()


async def test_client_disconnect_cancels_the_read(gateway: Gateway) -> None:
    await fetch(gateway.port, "PUT", "/a/journal", body=b"abc")
    client = await Client.open(gateway.port)
    await client.send_head("GET", "/a/journal?block=true", [])
    await client.send_body(b"")
    assert (await client.read_head()).status_code == 206
    event = await client.next_event()
    assert isinstance(event, h11.Data) and event.data == b"abc"
    await client.close()
    await asyncio.wait_for(gateway.fake.read_cancelled.wait(), 5)
    # The gateway serves on.
    assert (await fetch(gateway.port, "GET", "/a/journal")).body == b"abc"


async def test_client_disconnect_mid_body_aborts_the_append(gateway: Gateway) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    writer.write(b"PUT /a/journal HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"y" * 5000)
    await writer.drain()
    await asyncio.sleep(0.2)
    writer.close()
    for _ in range(50):
        if gateway.fake.aborted_appends:
            break
        await asyncio.sleep(0.05)
    assert not gateway.fake.journals["a/journal"].data
    assert (await fetch(gateway.port, "GET", "/a/journal")).status == 416


async def test_malformed_http_is_400(gateway: Gateway) -> None:
    out = await raw_exchange(gateway.port, b"GET /a/journal HTTP/1.1\r\nBad Header\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert out.endswith(b"\r\n\r\n400 Bad Request")
    out = await raw_exchange(gateway.port, b"GET /a%zz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400 Bad Request\r\n")


async def test_http_1_0_read_is_close_delimited_without_trailer(gateway: Gateway) -> None:
    await fetch(gateway.port, "PUT", "/a/journal", body=b"old school")
    out = await raw_exchange(gateway.port, b"GET /a/journal HTTP/1.0\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 206 Partial Content\r\n")
    assert b"chunked" not in head.lower()
    assert body == b"old school"


async def test_debug_endpoints(gateway: Gateway) -> None:
    ready = await fetch(gateway.port, "GET", "/debug/ready")
    assert (ready.status, ready.body) == (200, b"ok")
    gateway.ready[0] = False
    assert (await fetch(gateway.port, "GET", "/debug/ready")).status == 503
    metrics = await fetch(gateway.port, "GET", "/debug/metrics")
    assert metrics.status == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    assert b'gazette_http_requests_total{code="200",method="GET"}' in metrics.body
