"""One HTTP/1.1 server connection: a codec parses and frames, a task answers its requests.

`Connection` is the asyncio protocol of a connection the listener hands over (or a port of its
own accepts). It runs the request loop (keep-alive, draining unread bodies, answering malformed
HTTP as Go's net/http does, closing without resetting a response still on its way), holds back
reading while a request body is not consumed, and writes responses for the routes. Its codec
(`cluster.server.http.codec`) is the fast PlainCodec until a request is not plain, then h11's.
Every response is counted in `gazette_http_requests_total`.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import cache, lru_cache
from http import HTTPStatus

import h11
from prometheus_client import Counter

from cluster.server.http.codec import Codec, Event, Marker, PlainCodec, Request, State

log = logging.getLogger(__name__)

HTTP_REQUESTS = Counter(
    "gazette_http_requests_total",
    "HTTP requests answered by the gateway, by method and status code.",
    ["method", "code"],
)


@lru_cache(maxsize=256)
def http_requests_counter(method: str, status: int) -> Counter:
    """HTTP_REQUESTS of one method and status code (remembered: `labels()` costs a lock and a
    lookup, and every response counts)."""
    return HTTP_REQUESTS.labels(method, str(status))


RECEIVE_HIGH_WATER = 1 << 20
"""Unparsed request bytes buffered before the connection stops reading."""
DRAIN_LIMIT = 256 << 10
"""Unread request body discarded before a response to keep the connection, as Go's net/http."""
DRAIN_TIMEOUT = 5.0
LINGER_TIMEOUT = 1.0
"""Seconds a closing connection waits for the client to stop sending; see Connection._close."""

TEXT_HEADERS = [("Content-Type", "text/plain; charset=utf-8"), ("X-Content-Type-Options", "nosniff")]
"""The headers of a plain-text response, as Go's http.Error sets them."""
_METHOD_LABELS = frozenset({"GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS", "PATCH", "CONNECT", "TRACE"})
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")

Handler = Callable[["Connection", Request], Awaitable[None]]
"""Answers one request on a connection."""


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: its codec parses and frames, a task answers its requests in turn.

    `handle` answers each request; the connection is in `connections` while its task runs.
    """

    def __init__(self, handle: Handler, connections: set[Connection]) -> None:
        self._handle = handle
        self._connections = connections
        self._codec: Codec = PlainCodec()
        self._transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._received = 0  # Bytes given to the codec since it last asked for more.
        self._reading_paused = False
        self._eof = False
        self._lost = False
        self._discarding = False
        self._body_rest = b""  # Body bytes received beyond what read_body returned.
        self._reading_body = False
        self._method = ""
        self.must_close = False
        self.extra_headers: list[tuple[str, str]] = []
        """Headers every response to the current request carries (CORS's), set by its route."""

    # asyncio.Protocol callbacks.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._task = asyncio.get_running_loop().create_task(self._serve())
        self._connections.add(self)
        self._task.add_done_callback(lambda _: self._connections.discard(self))

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        self._codec.receive_data(data)
        self._received += len(data)
        if self._received > RECEIVE_HIGH_WATER and self._transport is not None:
            # Stop reading until the codec has used what it holds: the request body's backpressure.
            self._transport.pause_reading()
            self._reading_paused = True
        self._readable.set()

    def eof_received(self) -> bool:
        self._eof = True
        if not self._discarding:
            self._codec.receive_data(b"")
        self._readable.set()
        responding = self._codec.our_state in (State.SEND_RESPONSE, State.SEND_BODY)
        pipelined = bool(self._codec.trailing_data[0])
        if responding and not self._reading_body and not pipelined and self._task is not None:
            # As in Go's net/http, a client that ends its side while its response is due has gone
            # away: stop its RPC (a blocking read would otherwise wait on forever). Go does not
            # look for the end while requests it has not served yet are buffered, nor do we.
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

    def shut_down(self) -> asyncio.Task[None] | None:
        """Serve no request after the one in progress, whose response then says `Connection: close`;
        close at once if there is none. Returns the connection's task, which ends once it closed."""
        self.must_close = True
        c = self._codec
        idle = c.our_state is State.IDLE and c.their_state is State.IDLE and not c.trailing_data[0]
        if idle and self._transport is not None:
            self._transport.close()
        return self._task

    def abort(self) -> asyncio.Task[None] | None:
        """Drop the connection now; return its task, which ends soon after."""
        if self._transport is not None:
            self._transport.abort()
        return self._task

    # Responding, for the routes.

    async def start_response(self, status: int, headers: Sequence[tuple[str, str]]) -> None:
        """Send the status line and `headers` of the response.

        As Go's net/http, what is left of a request body the handler did not read is read first
        (up to DRAIN_LIMIT), so that the connection can serve the next request; if more is left, or
        the client still waits for `100 Continue`, the response says that the connection closes.
        """
        await self._discard_body()
        if self.must_close and not any(name.lower() == "connection" for name, _ in headers):
            headers = [*headers, ("Connection", "close")]
        all_headers = [("Date", _http_date()), *self.extra_headers, *headers]
        encoded = [(name.encode("ascii"), _header_value(value)) for name, value in all_headers]
        self._write(self._codec.send_response(status, _reason(status), encoded))
        method = self._method if self._method in _METHOD_LABELS else "OTHER"
        http_requests_counter(method, status).inc()

    async def send_data(self, data: bytes) -> None:
        """Send part of the body now, waiting while the client is slow to take it."""
        self._write(self._codec.send_data(data))
        await self._drain()

    async def end_response(self, trailers: Sequence[tuple[str, str]] = ()) -> None:
        """End the body, with `trailers` if the response is chunked."""
        chunked = self._codec.their_http_version == b"1.1" and self._method != "HEAD"
        headers = [(name.encode("ascii"), _header_value(value)) for name, value in trailers] if chunked else []
        self._write(self._codec.send_end(headers))
        await self._drain()

    async def respond(self, status: int, headers: Sequence[tuple[str, str]], body: bytes) -> None:
        """Send a whole response with a body of known length."""
        await self.start_response(status, [*headers, ("Content-Length", str(len(body)))])
        if body and self._method != "HEAD":
            self._write(self._codec.send_data(body))
        await self.end_response()

    async def error(self, status: int, text: str, headers: Sequence[tuple[str, str]] = ()) -> None:
        """Answer as Go's http.Error: the text and a newline, as plain text."""
        await self.respond(status, [*headers, *TEXT_HEADERS], (text + "\n").encode("utf-8", "surrogateescape"))

    async def read_body(self, size: int, at_least: int | None = None) -> bytes | None:
        """Return up to `size` more bytes of the request body, or None once it has all been read.

        Waits for `size` bytes (or the body's end); with `at_least`, only for that many, taking
        what else has arrived by then up to `size`."""
        if self._codec.waiting_for_100_continue:
            self._write(self._codec.send_continue())
        chunks: list[bytes | bytearray] = [self._body_rest] if self._body_rest else []
        n = len(self._body_rest)
        enough = size if at_least is None else min(at_least, size)
        self._reading_body = True
        try:
            while n < size and self._codec.their_state is State.SEND_BODY:
                if n < enough:
                    event = await self._next_event()
                else:
                    event = self._codec.next_event()  # Only what has arrived already.
                    if event is Marker.NEED_DATA:
                        break
                if isinstance(event, bytes | bytearray):
                    chunks.append(event)
                    n += len(event)
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
            self._method = ""  # Until a request is parsed: an error reply answers no HEAD.
            self.extra_headers = []
            try:
                event = await self._next_event()
                if not isinstance(event, Request):
                    return  # Closed (or nothing left to serve).
                self._method = event.method.decode("ascii")
                await self._handle(self, event)
            except h11.RemoteProtocolError as err:
                await self._protocol_error(err)
                return
            if not self._next_cycle():
                return

    async def _protocol_error(self, err: h11.RemoteProtocolError) -> None:
        # Malformed HTTP is answered as Go's net/http does, when a response can still be sent.
        if self._codec.our_state not in (State.IDLE, State.SEND_RESPONSE):
            return
        code = err.error_status_hint
        body = f"{code} {HTTPStatus(code).phrase}".encode("ascii")
        self.must_close = True
        await self.respond(code, TEXT_HEADERS, body)

    async def _discard_body(self) -> None:
        """Read what is left of the request body, unless the response will close the connection."""
        c = self._codec
        if c.their_state is State.ERROR:
            self.must_close = True  # A body that was malformed or cut short: nothing more is read.
        if c.their_state is not State.SEND_BODY or self.must_close:
            return
        if not c.waiting_for_100_continue:
            with contextlib.suppress(TimeoutError, h11.RemoteProtocolError):
                async with asyncio.timeout(DRAIN_TIMEOUT):
                    await self.read_body(DRAIN_LIMIT)
        if c.their_state is State.SEND_BODY or c.their_state is State.ERROR:
            self.must_close = True  # A body left unread, or a malformed one.

    def _next_cycle(self) -> bool:
        """Ready the connection for its next request, or return False if it must close."""
        c = self._codec
        if self.must_close or c.our_state is not State.DONE or c.their_state is not State.DONE:
            return False
        c.start_next_cycle()
        self._body_rest = b""
        return True

    async def _next_event(self) -> Event:
        while True:
            event = self._codec.next_event()
            if event is Marker.NOT_PLAIN:
                assert isinstance(self._codec, PlainCodec)
                self._codec = self._codec.to_h11()  # h11 serves the rest of the connection.
                continue
            if event is not Marker.NEED_DATA:
                return event
            self._received = 0
            if self._reading_paused and self._transport is not None:
                self._transport.resume_reading()
                self._reading_paused = False
            self._readable.clear()
            await self._readable.wait()

    def _write(self, data: bytes) -> None:
        if data and not self._lost and self._transport is not None:
            self._transport.write(data)

    async def _drain(self) -> None:
        await self._writable.wait()

    async def _close(self) -> None:
        transport = self._transport
        if transport is None or self._lost:
            return
        unread = self._codec.their_state not in (State.DONE, State.MUST_CLOSE, State.CLOSED) or self._reading_paused
        if unread and not self._eof:
            # Closing a socket with unread input resets it, and a reset can destroy the response
            # still on its way to the client: half-close, let the client finish, then close.
            self._discarding = True
            transport.resume_reading()
            if transport.can_write_eof():
                try:
                    transport.write_eof()
                except OSError:
                    # The client reset the connection already (ENOTCONN): nothing is left to deliver.
                    transport.abort()
                    return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LINGER_TIMEOUT):
                    while not (self._eof or self._lost):
                        self._readable.clear()
                        await self._readable.wait()
        transport.close()


def _header_value(value: str) -> bytes:
    # Like Go, turn line breaks (which would end the header) into spaces; h11 refuses the rest of
    # the control characters and surrounding whitespace, so those go too.
    if value.isprintable() and value[:1] != " " and value[-1:] != " ":
        return value.encode()  # Nothing to replace (the usual value).
    return _CONTROL.sub(" ", value).strip(" \t").encode("utf-8", "surrogateescape")


@cache
def _reason(status: int) -> bytes:
    return HTTPStatus(status).phrase.encode("ascii")


_date_cache: tuple[int, str] = (0, "")


def _http_date() -> str:
    """The `Date` header's value, formatted once per second."""
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, email.utils.formatdate(now, usegmt=True))
    return _date_cache[1]
