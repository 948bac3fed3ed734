"""HTTP/1.1 framing of one server connection: a fast path for plain requests, h11 for the rest.

A server `Connection` (`cluster.server.http.connection`) reads requests and writes responses
through a codec. `PlainCodec` serves the requests well-behaved clients send: HTTP/1.1, a
well-formed head with one `Host`, a body by `Content-Length` or none, no `Transfer-Encoding`,
`Connection` or `Upgrade` header and no expectation but `100-continue`. httptools (llhttp) parses
its head; the codec frames its body and writes its response itself, at a few microseconds a
request where h11 takes about a hundred (a one-at-a-time 256-byte PUT is mostly fixed cost). Any
other request (malformed, HTTP/1.0, chunked, CONNECT, ...) is handed from its first byte to
`H11Codec`, which then serves the connection to its end: Go-compatible answers to odd and
hostile input stay h11's.

Both codecs speak in the same terms: `next_event()` gives a `Request`, body bytes, or a `Marker`;
the `send_*` methods give the bytes to write; `our_state` and `their_state` follow h11's states.
Malformed input raises h11.RemoteProtocolError (with its `error_status_hint`); a response that
breaks its own framing, h11.LocalProtocolError.
"""

from __future__ import annotations

import ast
import enum
import re
from collections import deque
from collections.abc import Sequence

import h11
import httptools

from broker.errors import GatewayError

MAX_HEADER_BYTES = 1 << 20
"""Largest request head accepted, as Go's net/http default."""


class State(enum.Enum):
    """Where one side of the connection is in the current request/response cycle (h11's states)."""

    IDLE = "IDLE"
    SEND_RESPONSE = "SEND_RESPONSE"
    SEND_BODY = "SEND_BODY"
    DONE = "DONE"
    MUST_CLOSE = "MUST_CLOSE"
    CLOSED = "CLOSED"
    ERROR = "ERROR"
    MIGHT_SWITCH_PROTOCOL = "MIGHT_SWITCH_PROTOCOL"
    SWITCHED_PROTOCOL = "SWITCHED_PROTOCOL"


class Marker(enum.Enum):
    """What `next_event()` gives besides a Request or body bytes."""

    NEED_DATA = "need data"
    """Nothing more can be parsed until more data arrives."""
    PAUSED = "paused"
    """The client's request is done; nothing more is read until the next cycle."""
    END = "end of message"
    """The request body is complete."""
    CLOSED = "connection closed"
    """The client closed its side between requests."""
    NOT_PLAIN = "not plain"
    """(PlainCodec only) The next request is not plain: hand the connection to `to_h11()`."""


class BodyError(h11.RemoteProtocolError, GatewayError):
    """A request body that is malformed or cut short; str() is the error Go's net/http gives a
    handler reading it (`unexpected EOF`, `invalid byte in chunk length`, ...)."""

    def __init__(self, text: str) -> None:
        super().__init__(text, 400)


MAX_CHUNK_LINE = 4096
"""Longest chunk-size line Go's net/http reads (`maxLineLength` of net/http/internal/chunked.go)."""
_ILLEGAL_CHUNK_HEADER = re.compile(r"illegal chunk header: bytearray\((b(?:'.*'|\".*\"))\)", re.S)


def go_body_error(h11_text: str) -> str:
    """h11's complaint about a request body in the words of Go's net/http (its chunked reader,
    net/http/internal/chunked.go, or io.ErrUnexpectedEOF for a body cut short)."""
    if h11_text.startswith("peer closed connection without sending complete message body"):
        return "unexpected EOF"
    match = _ILLEGAL_CHUNK_HEADER.fullmatch(h11_text)
    if match is not None:
        return go_chunk_line_error(ast.literal_eval(match.group(1)))
    return "malformed chunked encoding"


def go_chunk_line_error(line: bytes) -> str:
    """The error Go's chunked reader gives a chunk-size line (h11 refused it; `line` is what h11
    took as the line, through its CRLF): Go reads up to the first LF."""
    line = line[: line.index(b"\n") + 1] if b"\n" in line else line
    cr = line.find(b"\r")
    if cr == -1:
        return "chunked line ends with bare LF"
    if cr != len(line) - 2:
        return "invalid CR in chunked line"
    size = line[:-2]
    if len(size) >= MAX_CHUNK_LINE:
        return "header line too long"
    size = size.rstrip(b" \t").partition(b";")[0]
    if not size:
        return "empty hex number for chunk length"
    for i, b in enumerate(size):
        if b not in b"0123456789abcdefABCDEF":
            return "invalid byte in chunk length"
        if i == 16:
            return "http chunk length too large"
    return "malformed chunked encoding"


class Request:
    """A request's head: method, target and version as sent; headers with lower-cased names."""

    __slots__ = ("headers", "http_version", "method", "target")

    def __init__(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], http_version: bytes) -> None:
        self.method = method
        self.target = target
        self.headers = headers
        self.http_version = http_version

    def __repr__(self) -> str:
        return f"Request({self.method!r}, {self.target!r}, http_version={self.http_version!r})"


Event = Request | bytes | bytearray | Marker

_H11_STATES = {getattr(h11, state.value): state for state in State}


class H11Codec:
    """h11's server side, for any request."""

    def __init__(self, data: bytes = b"", eof: bool = False) -> None:
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        if data:
            self._h11.receive_data(data)
        if eof:
            self._h11.receive_data(b"")

    @property
    def our_state(self) -> State:
        return _H11_STATES[self._h11.our_state]

    @property
    def their_state(self) -> State:
        return _H11_STATES[self._h11.their_state]

    @property
    def waiting_for_100_continue(self) -> bool:
        return self._h11.they_are_waiting_for_100_continue

    @property
    def their_http_version(self) -> bytes | None:
        return self._h11.their_http_version

    @property
    def trailing_data(self) -> tuple[bytes, bool]:
        """Bytes received and not yet parsed, and whether the client has closed its side."""
        data, eof = self._h11.trailing_data
        return bytes(data), eof

    def receive_data(self, data: bytes) -> None:
        """Take bytes received; empty at the client's end of stream."""
        self._h11.receive_data(data)

    def next_event(self) -> Event:
        reading_body = self._h11.their_state is h11.SEND_BODY
        try:
            event = self._h11.next_event()
        except h11.RemoteProtocolError as err:
            if reading_body:
                raise BodyError(go_body_error(str(err))) from None
            raise
        kind = type(event)
        if kind is h11.Data:
            return event.data  # type: ignore[union-attr]
        if kind is h11.EndOfMessage:
            return Marker.END
        if kind is h11.Request:
            req: h11.Request = event  # type: ignore[assignment]
            return Request(req.method, req.target, list(req.headers), req.http_version)
        if event is h11.NEED_DATA:
            return Marker.NEED_DATA
        if event is h11.PAUSED:
            return Marker.PAUSED
        return Marker.CLOSED  # h11.ConnectionClosed: a client sends nothing else.

    def send_continue(self) -> bytes:
        return self._h11.send(h11.InformationalResponse(status_code=100, headers=[])) or b""

    def send_response(self, status: int, reason: bytes, headers: Sequence[tuple[bytes, bytes]]) -> bytes:
        return self._h11.send(h11.Response(status_code=status, headers=list(headers), reason=reason)) or b""

    def send_data(self, data: bytes) -> bytes:
        return self._h11.send(h11.Data(data=data)) or b""

    def send_end(self, trailers: Sequence[tuple[bytes, bytes]] = ()) -> bytes:
        return self._h11.send(h11.EndOfMessage(headers=list(trailers))) or b""

    def start_next_cycle(self) -> None:
        self._h11.start_next_cycle()


PLAIN_METHODS = frozenset({b"GET", b"HEAD", b"PUT", b"POST", b"DELETE", b"OPTIONS", b"PATCH"})
"""Methods a plain request may have (CONNECT, and methods outside llhttp's table, go to h11)."""
_TARGET = re.compile(rb"[\x21-\x7e]+")  # h11's request-target: visible ASCII.
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # Control bytes but HT, CR and LF.
_NOT_PLAIN_HEADERS = frozenset({b"transfer-encoding", b"connection", b"upgrade"})
_CONTINUE = b"HTTP/1.1 100 \r\n\r\n"  # As h11 writes it.


class _Head:
    """Collects the headers httptools parses from one request head."""

    __slots__ = ("complete", "headers")

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value.strip(b" \t")))

    def on_headers_complete(self) -> None:
        self.complete = True


class PlainCodec:
    """Plain HTTP/1.1 requests, kept alive; `Marker.NOT_PLAIN` (from `next_event()` between
    requests) for any other, whose bytes `to_h11()` hands on."""

    their_http_version = b"1.1"

    def __init__(self) -> None:
        self._buffer = bytearray()
        # Body bytes received as they came (not copied into the buffer), all before the buffer's.
        self._body_chunks: deque[bytes] = deque()
        self._body_queued = 0
        self._eof = False
        self._scanned = 0  # Bytes of the buffer known to hold no head's end.
        self._body_left = 0  # Of the request body, bytes not yet given out.
        self._method = b""
        self._out_left: int | None = 0  # Of the response body, bytes still to send; None: chunked.
        self._keep_alive = True
        self.our_state = State.IDLE
        self.their_state = State.IDLE
        self.waiting_for_100_continue = False

    @property
    def trailing_data(self) -> tuple[bytes, bool]:
        return b"".join(self._body_chunks) + self._buffer, self._eof

    def to_h11(self) -> H11Codec:
        """An H11Codec that goes on from here, between requests, with the bytes received."""
        assert self.our_state is State.IDLE and self.their_state is State.IDLE
        return H11Codec(bytes(self._buffer), self._eof)

    def receive_data(self, data: bytes) -> None:
        if not data:
            self._eof = True
        elif (
            self.their_state is State.SEND_BODY
            and not self._buffer
            and self._body_queued + len(data) <= self._body_left
        ):
            # Body only: kept as received, to be given out whole.
            self._body_chunks.append(data)
            self._body_queued += len(data)
        else:
            self._buffer += data

    # Reading.

    def next_event(self) -> Event:
        if self.their_state is State.SEND_BODY:
            left = self._body_left
            if not left:
                self.their_state = State.DONE
                self.waiting_for_100_continue = False
                return Marker.END
            if self._body_chunks:
                data = self._body_chunks.popleft()
                self._body_queued -= len(data)
                self._body_left = left - len(data)
                self.waiting_for_100_continue = False
                return data
            buffer = self._buffer
            if buffer:
                if len(buffer) <= left:
                    data = bytes(buffer)
                    buffer.clear()
                else:
                    data = bytes(buffer[:left])
                    del buffer[:left]
                self._body_left = left - len(data)
                self.waiting_for_100_continue = False
                return data
            if self._eof:
                self.their_state = State.ERROR
                raise BodyError("unexpected EOF")  # Go's io.ErrUnexpectedEOF.
            return Marker.NEED_DATA
        if self.their_state is State.IDLE:
            return self._next_request()
        if self.their_state is State.DONE:
            if self._buffer:
                return Marker.PAUSED
            return Marker.CLOSED if self._eof else Marker.NEED_DATA
        if self.their_state is State.CLOSED:
            return Marker.CLOSED
        raise h11.RemoteProtocolError(f"cannot read a request in state {self.their_state.name}")

    def _next_request(self) -> Request | Marker:
        buffer = self._buffer
        if not buffer:
            if self._eof:
                self.their_state = State.CLOSED
                return Marker.CLOSED
            return Marker.NEED_DATA
        end = buffer.find(b"\r\n\r\n", max(0, self._scanned - 3))
        if end < 0:
            if self._eof or len(buffer) > MAX_HEADER_BYTES or b"\n\n" in buffer:
                return Marker.NOT_PLAIN  # Cut short, too large, or bare line feeds: h11's to answer.
            self._scanned = len(buffer)
            return Marker.NEED_DATA
        self._scanned = 0
        if end + 4 > MAX_HEADER_BYTES:
            return Marker.NOT_PLAIN
        head = bytes(buffer[: end + 4])
        request = self._parse(head)
        if request is None:
            return Marker.NOT_PLAIN
        del buffer[: end + 4]
        return request

    def _parse(self, head: bytes) -> Request | None:
        """The request of a complete `head`, or None if it is not plain."""
        crlf = head.count(b"\r\n")
        if (
            head[0] in b"\r\n"  # An empty line before the request line.
            or head.count(b"\r") != crlf
            or head.count(b"\n") != crlf
            or b"\n " in head
            or b"\n\t" in head  # A folded header line.
            or _CONTROL.search(head)
        ):
            return None
        parts = head[: head.index(b"\r\n")].split(b" ")
        if len(parts) != 3 or parts[2] != b"HTTP/1.1" or parts[0] not in PLAIN_METHODS:
            return None
        method, target = parts[0], parts[1]
        if not _TARGET.fullmatch(target):
            return None
        sink = _Head()
        try:
            httptools.HttpRequestParser(sink).feed_data(head)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            return None
        if not sink.complete:
            return None
        length = -1
        hosts = 0
        expect = False
        for name, value in sink.headers:
            if name == b"content-length":
                if length != -1 or not value.isdigit() or len(value) > 18:
                    return None
                length = int(value)
            elif name == b"host":
                hosts += 1
            elif name in _NOT_PLAIN_HEADERS:
                return None
            elif name == b"expect":
                if expect or value.lower() != b"100-continue":
                    return None
                expect = True
        if hosts != 1:
            return None
        self._method = method
        self._body_left = max(length, 0)
        self.waiting_for_100_continue = expect
        self.their_state = State.SEND_BODY
        self.our_state = State.SEND_RESPONSE
        return Request(method, target, sink.headers, b"1.1")

    # Writing, framed as h11 frames a response to an HTTP/1.1 request.

    def send_continue(self) -> bytes:
        if self.our_state is not State.SEND_RESPONSE:
            raise h11.LocalProtocolError(f"cannot send 100 Continue in state {self.our_state.name}")
        self.waiting_for_100_continue = False
        return _CONTINUE

    def send_response(self, status: int, reason: bytes, headers: Sequence[tuple[bytes, bytes]]) -> bytes:
        if self.our_state is not State.SEND_RESPONSE:
            raise h11.LocalProtocolError(f"cannot send a response in state {self.our_state.name}")
        length: int | None = None
        chunked = False
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, reason)]
        for name, value in headers:
            lower = name.lower()
            if lower == b"content-length":
                length = int(value)
            elif lower == b"transfer-encoding":
                chunked = True
            elif lower == b"connection" and b"close" in (v.strip().lower() for v in value.split(b",")):
                self._keep_alive = False
            lines.append(b"%s: %s\r\n" % (name, value))
        if status in (204, 304):
            length = 0
        elif chunked or length is None:
            # A body of unknown length (or chunked already): as h11, chunked, without a length.
            lines = [line for line in lines if not line.lower().startswith(b"content-length:")]
            if not chunked:
                lines.append(b"Transfer-Encoding: chunked\r\n")
            length = None
        lines.append(b"\r\n")
        self._out_left = 0 if self._method == b"HEAD" else length
        self.our_state = State.SEND_BODY
        self.waiting_for_100_continue = False
        return b"".join(lines)

    def send_data(self, data: bytes) -> bytes:
        if self.our_state is not State.SEND_BODY:
            raise h11.LocalProtocolError(f"cannot send data in state {self.our_state.name}")
        left = self._out_left
        if left is None:
            return b"%x\r\n%s\r\n" % (len(data), data) if data else b""
        if len(data) > left:
            raise h11.LocalProtocolError("Too much data for declared Content-Length")
        self._out_left = left - len(data)
        return data

    def send_end(self, trailers: Sequence[tuple[bytes, bytes]] = ()) -> bytes:
        if self.our_state is not State.SEND_BODY:
            raise h11.LocalProtocolError(f"cannot end a response in state {self.our_state.name}")
        if self._out_left is None:
            out = b"0\r\n" + b"".join(b"%s: %s\r\n" % (name, value) for name, value in trailers) + b"\r\n"
        elif self._out_left:
            raise h11.LocalProtocolError("Too little data for declared Content-Length")
        elif trailers:
            raise h11.LocalProtocolError("Content-Length and trailers don't mix")
        else:
            out = b""
        self.our_state = State.DONE if self._keep_alive else State.MUST_CLOSE
        if not self._keep_alive and self.their_state is State.DONE:
            self.their_state = State.MUST_CLOSE
        return out

    def start_next_cycle(self) -> None:
        if self.our_state is not State.DONE or self.their_state is not State.DONE:
            raise h11.LocalProtocolError("not in a reusable state")
        self.our_state = self.their_state = State.IDLE
        self._method = b""


Codec = PlainCodec | H11Codec

__all__ = ["MAX_HEADER_BYTES", "Codec", "Event", "H11Codec", "Marker", "PlainCodec", "Request", "State"]
