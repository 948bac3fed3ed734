"""HTTP/1.1 gateway to the Journal service: GET and HEAD read a journal, PUT appends to it.

A port of Gazette's `http_gateway` on h11, serving the connections that OnePortListener hands
over. Requests become Read and Append RPCs on the broker's own gRPC service (over its internal
unix socket), so the broker routes and proxies them as it would a client's; responses carry the
same statuses, headers, bodies and `X-Close-Error` trailer as Gazette's. `/debug/ready` and
`/debug/metrics` are served here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import re
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import cast
from urllib.parse import quote, unquote_to_bytes

import grpc
import h11
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from broker.fragment.errors import FragmentError
from broker.fragment.names import content_name, go_join
from broker.fragment.sums import sha1sum_hex
from broker.metrics import HTTP_REQUESTS
from broker.protocol import pb, pb_grpc
from broker.protocol.paths import URLError, go_quote, parse_url
from broker.protocol.validation import (
    ValidationError,
    validate_append_request,
    validate_append_response,
    validate_read_request,
    validate_read_response,
)

log = logging.getLogger(__name__)

ROUTE_TOKEN_HEADER = "X-Route-Token"
FRAGMENT_NAME_HEADER = "X-Fragment-Name"
FRAGMENT_LAST_MODIFIED_HEADER = "X-Fragment-Last-Modified"
FRAGMENT_LOCATION_HEADER = "X-Fragment-Location"
WRITE_HEAD_HEADER = "X-Write-Head"
CLOSE_ERROR_HEADER = "X-Close-Error"
COMMIT_BEGIN_HEADER = "X-Commit-Begin"
COMMIT_END_HEADER = "X-Commit-End"
COMMIT_SUM_HEADER = "X-Commit-Sha1-Sum"  # Go's canonical spelling of X-Commit-SHA1-Sum.

MAX_INT64 = (1 << 63) - 1
APPEND_CHUNK = 1 << 20
"""Request body bytes sent per AppendRequest: large, as grpc.aio is slow per message."""
MAX_HEADER_BYTES = 1 << 20
"""Largest request head accepted, as Go's net/http default."""
RECEIVE_HIGH_WATER = 1 << 20
"""Unparsed request bytes buffered before the connection stops reading."""
DRAIN_LIMIT = 256 << 10
"""Unread request body discarded after a response to keep the connection, as Go's net/http."""
DRAIN_TIMEOUT = 5.0
LINGER_TIMEOUT = 1.0
"""Seconds a closing connection waits for the client to stop sending; see _Connection._close."""

_TEXT_HEADERS = [("Content-Type", "text/plain; charset=utf-8"), ("X-Content-Type-Options", "nosniff")]
_READ_STATUS_CODES = {
    pb.OK: 206,
    pb.JOURNAL_NOT_FOUND: 404,
    pb.INSUFFICIENT_JOURNAL_BROKERS: 503,
    pb.OFFSET_NOT_YET_AVAILABLE: 416,
}
_METHOD_LABELS = frozenset({"GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS", "PATCH", "CONNECT", "TRACE"})
_GO_BOOLS = {
    **dict.fromkeys(("1", "t", "T", "TRUE", "true", "True"), True),
    **dict.fromkeys(("0", "f", "F", "FALSE", "false", "False"), False),
}
_INT64 = re.compile(r"[+-]?[0-9]+")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")

Headers = list[tuple[str, str]]
EndpointOf = Callable[[pb.ProcessSpec.ID], str | None]
_Metadata = tuple[tuple[str, str], ...] | None


class _BadRequest(Exception):
    """A request the gateway answers with 400 and this error text."""


class _BadTarget(Exception):
    """A request target that Go's net/http rejects before any handler runs."""


class HttpGateway:
    """Serves HTTP/1.1 connections on behalf of the Journal service reached through `channel`.

    `ready` says whether `/debug/ready` answers 200. `endpoint_of` gives the endpoint of a route
    member, for the `Location` header of routes that carry no endpoints.
    An instance is the `http_handler` of OnePortListener.
    """

    def __init__(
        self, channel: grpc.aio.Channel, ready: Callable[[], bool], endpoint_of: EndpointOf | None = None
    ) -> None:
        self._stub = pb_grpc.JournalStub(channel)
        self._ready = ready
        self._endpoint_of = endpoint_of
        self._connections: set[_Connection] = set()

    def __call__(self, transport: asyncio.Transport, initial: bytes) -> None:
        """Take over `transport`, whose first bytes `initial` were already read from it."""
        connection = _Connection(self)
        transport.set_protocol(connection)
        connection.connection_made(transport)
        if initial:
            connection.data_received(initial)

    async def close(self) -> None:
        """Abort every connection and wait until their requests have ended."""
        tasks = [c.abort() for c in list(self._connections)]
        await asyncio.gather(*[t for t in tasks if t is not None], return_exceptions=True)

    async def handle(self, conn: _Connection, request: h11.Request) -> None:
        """Answer one request on `conn`."""
        method = request.method.decode("ascii")
        try:
            path, query = _split_target(request.target.decode("ascii"))
        except _BadTarget:
            conn.must_close = True
            await conn.respond(400, [*_TEXT_HEADERS, ("Connection", "close")], b"400 Bad Request")
            return

        if path == "/debug/ready":
            if self._ready():
                await conn.respond(200, _TEXT_HEADERS, b"ok")
            else:
                await conn.respond(503, _TEXT_HEADERS, b"not ready")
            return
        if path == "/debug/metrics":
            await conn.respond(200, [("Content-Type", CONTENT_TYPE_LATEST)], generate_latest())
            return

        metadata = None
        for name, value in request.headers:
            if name == b"authorization":
                metadata = (("authorization", value.decode("latin-1")),)
                break
        if method in ("GET", "HEAD"):
            await self._serve_read(conn, method, path, query, metadata)
        elif method == "PUT":
            await self._serve_write(conn, path, query, metadata)
        else:
            await conn.error(400, f"unknown method: {method}")

    async def _serve_read(self, conn: _Connection, method: str, path: str, query: str, metadata: _Metadata) -> None:
        req = pb.ReadRequest(journal=path[1:], metadata_only=method == "HEAD")
        try:
            req.offset, req.block = _read_params(query)
            validate_read_request(req)
        except (_BadRequest, ValidationError) as err:
            await conn.error(400, str(err))
            return

        call = self._stub.Read(req, metadata=metadata)
        try:
            await self._relay_read(conn, method, path, req.offset, call)
        finally:
            call.cancel()  # A no-op once the RPC has ended; otherwise the broker stops reading.

    async def _relay_read(
        self, conn: _Connection, method: str, path: str, offset: int, call: grpc.aio.UnaryStreamCall
    ) -> None:
        try:
            first = await call.read()
        except grpc.aio.AioRpcError as err:
            await conn.error(500, _rpc_error_text(err))
            return
        if first is grpc.aio.EOF:
            await conn.error(500, "EOF")
            return

        problem = _frame_problem(first, offset)
        if first.status != pb.OK:
            # The status is the answer, as in Go, even from a frame that fails validation.
            headers = self._read_headers(first, path)
            await conn.error(_READ_STATUS_CODES.get(first.status, 500), pb.Status.Name(first.status), headers)
            return
        if problem is not None:
            await conn.error(500, problem)
            return

        # A first frame beyond the requested offset is not an error: this is how offset -1 and
        # deleted ranges resolve, and Content-Range tells the client where the content starts.
        headers = self._read_headers(first, path)
        if method == "HEAD":
            conn.start_response(206, headers)
            await conn.end_response()
            return
        conn.start_response(206, [*headers, ("Trailer", CLOSE_ERROR_HEADER)])
        offset = first.offset
        if first.content:
            await conn.send_data(first.content)
            offset += len(first.content)
        reason = await self._copy_content(conn, call, offset)
        await conn.end_response([(CLOSE_ERROR_HEADER, reason)])

    async def _copy_content(self, conn: _Connection, call: grpc.aio.UnaryStreamCall, offset: int) -> str:
        """Send content frames to the client until the stream ends; return why it ended."""
        while True:
            try:
                resp = await call.read()
            except grpc.aio.AioRpcError as err:
                return _rpc_error_text(err)
            if resp is grpc.aio.EOF:
                return "broker terminated RPC"
            problem = _frame_problem(resp, offset)
            if problem is not None:
                return problem
            if resp.status != pb.OK:
                return str(pb.Status.Name(resp.status))
            if resp.offset > offset:
                return "offset jump"  # A second jump: the client must re-request from the new offset.
            if resp.content:
                await conn.send_data(resp.content)
                offset += len(resp.content)

    def _read_headers(self, resp: pb.ReadResponse, path: str) -> Headers:
        headers = self._route_headers(resp.header.route, path) if resp.HasField("header") else []
        if resp.HasField("fragment"):
            fragment = resp.fragment
            with contextlib.suppress(FragmentError):
                headers.append((FRAGMENT_NAME_HEADER, content_name(fragment)))
            if fragment.mod_time:
                with contextlib.suppress(ValueError, OverflowError, OSError):
                    modified = email.utils.formatdate(fragment.mod_time, usegmt=True)
                    headers.append((FRAGMENT_LAST_MODIFIED_HEADER, modified))
            if resp.fragment_url:
                headers.append((FRAGMENT_LOCATION_HEADER, resp.fragment_url))
            headers.append(("Content-Range", f"bytes {resp.offset}-{MAX_INT64}/{MAX_INT64}"))
        if resp.write_head:
            headers.append((WRITE_HEAD_HEADER, str(resp.write_head)))
        return headers

    async def _serve_write(self, conn: _Connection, path: str, query: str, metadata: _Metadata) -> None:
        req = pb.AppendRequest(journal=path[1:])
        try:
            _append_params(query)
            validate_append_request(req)
        except (_BadRequest, ValidationError) as err:
            await conn.error(400, str(err))
            return
        if not req.journal:
            # Validation passes an empty journal (that is a content message); Go's Appender then
            # refuses to start the RPC.
            await conn.error(500, "expected Request.Journal")
            return

        call = self._stub.Append(metadata=metadata)
        try:
            await self._relay_append(conn, path, req, call)
        finally:
            call.cancel()  # A no-op once the RPC has ended; otherwise the append rolls back.

    async def _relay_append(
        self, conn: _Connection, path: str, req: pb.AppendRequest, call: grpc.aio.StreamUnaryCall
    ) -> None:
        sending = await _send(call, req)
        while sending:
            chunk = await conn.read_body(APPEND_CHUNK)
            if chunk is None:
                break
            sending = await _send(call, pb.AppendRequest(content=chunk))
        # An empty chunk commits; it is sent only once the whole body has arrived.
        if sending and await _send(call, pb.AppendRequest()):
            await call.done_writing()
        try:
            resp: pb.AppendResponse = await call
        except grpc.aio.AioRpcError as err:
            await conn.error(500, _rpc_error_text(err))
            return

        try:
            validate_append_response(resp)
        except ValidationError as err:
            await conn.error(500, f"validating broker response: {err}")
            return
        if resp.status == pb.FRAGMENT_STORE_UNHEALTHY and resp.store_health_error:
            await conn.error(500, f"{resp.store_health_error}: FRAGMENT_STORE_UNHEALTHY")
            return
        if resp.status != pb.OK:
            await conn.error(500, pb.Status.Name(resp.status))
            return

        headers = self._route_headers(resp.header.route, path)
        if resp.HasField("commit"):
            commit = resp.commit
            headers += [
                (COMMIT_BEGIN_HEADER, str(commit.begin)),
                (COMMIT_END_HEADER, str(commit.end)),
                (WRITE_HEAD_HEADER, str(commit.end)),
                (COMMIT_SUM_HEADER, sha1sum_hex(commit.sum)),
            ]
        conn.start_response(204, headers)
        await conn.end_response()

    def _route_headers(self, route: pb.Route, path: str) -> Headers:
        """X-Route-Token, and Location (the primary's endpoint joined with `path`)."""
        if not route.members:
            return []
        headers = [(ROUTE_TOKEN_HEADER, route_token(route))]
        if 0 <= route.primary < len(route.members):
            endpoint: str | None = None
            if route.primary < len(route.endpoints):
                endpoint = route.endpoints[route.primary]
            elif self._endpoint_of is not None:
                endpoint = self._endpoint_of(route.members[route.primary])
            location = _location(endpoint, path) if endpoint else None
            if location is not None:
                headers.append(("Location", location))
        return headers


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: h11 parses and frames, a task answers its requests in turn."""

    def __init__(self, gateway: HttpGateway) -> None:
        self._gateway = gateway
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        self._transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._received = 0  # Bytes given to h11 since it last asked for more.
        self._reading_paused = False
        self._eof = False
        self._lost = False
        self._discarding = False
        self._body_rest = b""  # Body bytes received beyond what read_body returned.
        self._reading_body = False
        self._method = ""
        self.must_close = False

    # asyncio.Protocol callbacks.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._task = asyncio.get_running_loop().create_task(self._serve())
        self._gateway._connections.add(self)
        self._task.add_done_callback(lambda _: self._gateway._connections.discard(self))

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        self._h11.receive_data(data)
        self._received += len(data)
        if self._received > RECEIVE_HIGH_WATER and self._transport is not None:
            # Stop reading until h11 has used what it holds: the request body's backpressure.
            self._transport.pause_reading()
            self._reading_paused = True
        self._readable.set()

    def eof_received(self) -> bool:
        self._eof = True
        if not self._discarding:
            self._h11.receive_data(b"")
        self._readable.set()
        responding = self._h11.our_state in (h11.SEND_RESPONSE, h11.SEND_BODY)
        if responding and not self._reading_body and self._task is not None:
            # As in Go's net/http, a client that ends its side while its response is due has gone
            # away: stop its RPC (a blocking read would otherwise wait on forever).
            self._task.cancel()
        return True  # Keep the transport, to close it in order.

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._readable.set()
        self._writable.set()
        if self._task is not None and not self._task.done():
            self._task.cancel()  # The client is gone: stop its RPC.

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def abort(self) -> asyncio.Task[None] | None:
        """Drop the connection now; return its task, which ends soon after."""
        if self._transport is not None:
            self._transport.abort()
        return self._task

    # Responding, for the gateway.

    def start_response(self, status: int, headers: Sequence[tuple[str, str]]) -> None:
        """Send the status line and `headers` of the response."""
        all_headers = [("Date", email.utils.formatdate(usegmt=True)), *headers]
        self._send(
            h11.Response(
                status_code=status,
                headers=[(name.encode("ascii"), _header_value(value)) for name, value in all_headers],
                reason=HTTPStatus(status).phrase.encode("ascii"),
            )
        )
        method = self._method if self._method in _METHOD_LABELS else "OTHER"
        HTTP_REQUESTS.labels(method, str(status)).inc()

    async def send_data(self, data: bytes) -> None:
        """Send part of the body now, waiting while the client is slow to take it."""
        self._send(h11.Data(data=data))
        await self._drain()

    async def end_response(self, trailers: Sequence[tuple[str, str]] = ()) -> None:
        """End the body, with `trailers` if the response is chunked."""
        chunked = self._h11.their_http_version == b"1.1" and self._method != "HEAD"
        headers = [(name.encode("ascii"), _header_value(value)) for name, value in trailers] if chunked else []
        self._send(h11.EndOfMessage(headers=headers))
        await self._drain()

    async def respond(self, status: int, headers: Sequence[tuple[str, str]], body: bytes) -> None:
        """Send a whole response with a body of known length."""
        self.start_response(status, [*headers, ("Content-Length", str(len(body)))])
        if body and self._method != "HEAD":
            self._send(h11.Data(data=body))
        await self.end_response()

    async def error(self, status: int, text: str, headers: Sequence[tuple[str, str]] = ()) -> None:
        """Answer as Go's http.Error: the text and a newline, as plain text."""
        await self.respond(status, [*headers, *_TEXT_HEADERS], (text + "\n").encode("utf-8", "surrogateescape"))

    async def read_body(self, size: int) -> bytes | None:
        """Return up to `size` more bytes of the request body, or None once it has all been read."""
        if self._h11.they_are_waiting_for_100_continue:
            self._send(h11.InformationalResponse(status_code=100, headers=[]))
        chunks = [self._body_rest] if self._body_rest else []
        n = len(self._body_rest)
        self._reading_body = True
        try:
            while n < size and self._h11.their_state is h11.SEND_BODY:
                event = await self._next_event()
                if isinstance(event, h11.Data):
                    chunks.append(event.data)
                    n += len(event.data)
        finally:
            self._reading_body = False
        body = b"".join(chunks)
        body, self._body_rest = body[:size], body[size:]
        return body or None

    # Internals.

    async def _serve(self) -> None:
        try:
            await self._serve_requests()
            await self._close()
        except asyncio.CancelledError:
            self.abort()
            raise
        except Exception:
            log.exception("HTTP gateway connection failed")
            self.abort()

    async def _serve_requests(self) -> None:
        while True:
            try:
                event = await self._next_event()
                if not isinstance(event, h11.Request):
                    return  # ConnectionClosed (or nothing left to serve).
                self._method = event.method.decode("ascii")
                await self._gateway.handle(self, event)
            except h11.RemoteProtocolError as err:
                await self._protocol_error(err)
                return
            if not await self._next_cycle():
                return

    async def _protocol_error(self, err: h11.RemoteProtocolError) -> None:
        # Malformed HTTP is answered as Go's net/http does, when a response can still be sent.
        if self._h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        code = err.error_status_hint
        body = f"{code} {HTTPStatus(code).phrase}".encode("ascii")
        await self.respond(code, [*_TEXT_HEADERS, ("Connection", "close")], body)

    async def _next_cycle(self) -> bool:
        """Ready the connection for its next request, or return False if it must close."""
        h = self._h11
        if (
            h.our_state is h11.DONE
            and h.their_state is h11.SEND_BODY
            and not h.they_are_waiting_for_100_continue
            and not self.must_close
        ):
            with contextlib.suppress(TimeoutError, h11.RemoteProtocolError):
                async with asyncio.timeout(DRAIN_TIMEOUT):
                    await self.read_body(DRAIN_LIMIT)
        if self.must_close or h.our_state is not h11.DONE or h.their_state is not h11.DONE:
            return False
        h.start_next_cycle()
        self._body_rest = b""
        return True

    async def _next_event(self) -> h11.Event | type[h11.PAUSED]:
        while True:
            event = self._h11.next_event()
            if event is not h11.NEED_DATA:
                return cast("h11.Event | type[h11.PAUSED]", event)
            self._received = 0
            if self._reading_paused and self._transport is not None:
                self._transport.resume_reading()
                self._reading_paused = False
            self._readable.clear()
            await self._readable.wait()

    def _send(self, event: h11.Event) -> None:
        data = self._h11.send(event)
        if data and not self._lost and self._transport is not None:
            self._transport.write(data)

    async def _drain(self) -> None:
        await self._writable.wait()

    async def _close(self) -> None:
        transport = self._transport
        if transport is None or self._lost:
            return
        unread = self._h11.their_state not in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED) or self._reading_paused
        if unread and not self._eof:
            # Closing a socket with unread input resets it, and a reset can destroy the response
            # still on its way to the client: half-close, let the client finish, then close.
            self._discarding = True
            transport.resume_reading()
            if transport.can_write_eof():
                transport.write_eof()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LINGER_TIMEOUT):
                    while not (self._eof or self._lost):
                        self._readable.clear()
                        await self._readable.wait()
        transport.close()


async def _send(call: grpc.aio.StreamUnaryCall, req: pb.AppendRequest) -> bool:
    """Send `req` on the Append stream; False if the broker has already answered."""
    try:
        await call.write(req)
    except (asyncio.InvalidStateError, grpc.aio.AioRpcError):
        return False  # The RPC has ended; its answer is read from the call.
    return True


def _frame_problem(resp: pb.ReadResponse, offset: int) -> str | None:
    """The error a Go Reader reports for this frame when read at `offset`, if any."""
    try:
        validate_read_response(resp)
    except ValidationError as err:
        return str(err.with_context("ReadResponse"))
    if resp.status == pb.OK and resp.offset < offset:
        return f"invalid ReadResponse offset ({resp.offset}; expected >= {offset})"
    return None


def _rpc_error_text(err: grpc.aio.AioRpcError) -> str:
    """The text of a gRPC error as Go's grpc-go formats it."""
    code = err.code()
    if code is grpc.StatusCode.OK:
        name = "OK"
    elif code is grpc.StatusCode.CANCELLED:
        name = "Canceled"
    else:
        name = "".join(part.capitalize() for part in code.name.split("_"))
    return f"rpc error: code = {name} desc = {err.details() or ''}"


def route_token(route: pb.Route) -> str:
    """The Route in protobuf compact text form, as Go's `proto.CompactTextString`."""
    parts: list[str] = []
    for member in route.members:
        fields = ""
        if member.zone:
            fields += f"zone:{_text_string(member.zone)} "
        if member.suffix:
            fields += f"suffix:{_text_string(member.suffix)} "
        parts.append(f"members:<{fields}> ")
    if route.primary:
        parts.append(f"primary:{route.primary} ")
    for endpoint in route.endpoints:
        parts.append(f"endpoints:{_text_string(endpoint)} ")
    return "".join(parts)


def _text_string(s: str) -> str:
    # Byte-wise, as Go's text marshaler: printable ASCII as is, a few C escapes, octal otherwise.
    out = ['"']
    for b in s.encode("utf-8", "surrogateescape"):
        if b in _TEXT_ESCAPES:
            out.append(_TEXT_ESCAPES[b])
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        else:
            out.append(f"\\{b:03o}")
    out.append('"')
    return "".join(out)


_TEXT_ESCAPES = {0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t", 0x22: '\\"', 0x5C: "\\\\"}


def _location(endpoint: str, path: str) -> str | None:
    """The endpoint URL with `path` joined onto its path, as Go's `path.Join` and `URL.String`."""
    try:
        url = parse_url(endpoint)
    except URLError:
        return None
    _, sep, rest = endpoint.partition("://")
    if not sep or not url.scheme:
        return None
    authority = re.match(r"[^/?#]*", rest)
    assert authority is not None
    suffix = re.search(r"[?#].*", rest[authority.end() :])
    joined = go_join(url.path, path)
    escaped = quote(joined.encode("utf-8", "surrogateescape"), safe="/$&+,:;=@")
    return f"{url.scheme}://{authority.group(0)}{escaped}{suffix.group(0) if suffix else ''}"


def _split_target(target: str) -> tuple[str, str]:
    """Split a request target into its percent-decoded path and its raw query."""
    if target.startswith("/"):
        raw_path, _, query = target.partition("?")
        try:
            return _unescape(raw_path, plus_is_space=False), query
        except _BadRequest:
            raise _BadTarget(target) from None
    try:
        url = parse_url(target)  # The absolute form, as sent to proxies.
    except URLError:
        raise _BadTarget(target) from None
    if not url.scheme or not url.host:
        raise _BadTarget(target)
    return url.path or "/", url.raw_query


def _parse_query(raw: str) -> dict[str, list[str]]:
    """Values by key of a raw query, as Go's `url.ParseQuery` (raising its first error)."""
    values: dict[str, list[str]] = {}
    error: str | None = None
    for part in raw.split("&"):
        if ";" in part:
            error = "invalid semicolon separator in query"
            continue
        if not part:
            continue
        raw_key, _, raw_value = part.partition("=")
        try:
            key = _unescape(raw_key, plus_is_space=True)
            value = _unescape(raw_value, plus_is_space=True)
        except _BadRequest as err:
            error = error or str(err)
            continue
        values.setdefault(key, []).append(value)
    if error is not None:
        raise _BadRequest(error)
    return values


def _read_params(query: str) -> tuple[int, bool]:
    """`offset` and `block` of a GET or HEAD query, decoded as Go's gorilla/schema does."""
    offset, block = 0, False
    errors: list[str] = []
    for key, values in _parse_query(query).items():
        field = key.casefold()  # Field names match case-insensitively.
        if field not in ("offset", "block"):
            errors.append(f"schema: invalid path {go_quote(key)}")
            continue
        value = values[-1]
        if value == "":
            continue  # An empty value leaves the field as it was.
        if field == "offset":
            if _INT64.fullmatch(value) and -MAX_INT64 - 1 <= int(value) <= MAX_INT64:
                offset = int(value)
                continue
        elif value in _GO_BOOLS:
            block = _GO_BOOLS[value]
            continue
        errors.append(f"schema: error converting value for {go_quote(key)}")
    if errors:
        raise _BadRequest(_multi_error(errors))
    return offset, block


def _append_params(query: str) -> None:
    """Check a PUT query: it takes no parameters at all."""
    errors = [f"schema: invalid path {go_quote(key)}" for key in _parse_query(query)]
    if errors:
        raise _BadRequest(_multi_error(errors))


def _multi_error(errors: list[str]) -> str:
    # gorilla/schema's MultiError text; Go picks the shown error at random, we the first.
    if len(errors) == 1:
        return errors[0]
    if len(errors) == 2:
        return f"{errors[0]} (and 1 other error)"
    return f"{errors[0]} (and {len(errors) - 1} other errors)"


def _unescape(s: str, plus_is_space: bool) -> str:
    bad = _BAD_ESCAPE.search(s)
    if bad is not None:
        raise _BadRequest(f"invalid URL escape {go_quote(s[bad.start() : bad.start() + 3])}")
    if plus_is_space:
        s = s.replace("+", " ")
    return unquote_to_bytes(s).decode("utf-8", "surrogateescape")


def _header_value(value: str) -> bytes:
    # Like Go, turn line breaks (which would end the header) into spaces; h11 refuses the rest of
    # the control characters and surrounding whitespace, so those go too.
    return _CONTROL.sub(" ", value).strip(" \t").encode("utf-8", "surrogateescape")
