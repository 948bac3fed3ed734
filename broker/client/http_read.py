"""A plain read as an HTTP GET: the cheaper transport for a Reader of an `http://` broker.

Measured tailing one journal at 1,000 appends/s: each message read by a gRPC Read costs the reader
154-170 us and the broker 171-185 us of CPU beyond appending it (grpc.aio's per-message machinery
on both sides); read by the gateway's chunked GET it costs them 23-55 us and 39-69 us. So a Reader
sends a read with no more than `journal`, `offset`, `block` and `end_offset` (no `do_not_proxy`,
`metadata_only` or `begin_mod_time`, which a GET cannot carry) to an `http://` endpoint as
`GET /<journal>?offset=&block=` on a kept-alive connection (broker.client.http_conn), unless its
JournalClient was made with `http_reads=False`.

`HttpRead.receive()` hands the Reader what a Read RPC would, from the gateway's answer (see
broker.gateway.read):
- the 206 head as the first ReadResponse: `offset` from `Content-Range` (beyond the requested
  offset for -1 or removed content: the Reader's OffsetJump), `write_head` from `X-Write-Head`, the
  fragment from `X-Fragment-Name` and `-Last-Modified`; and `header`, the route of
  `X-Route-Token` (a Header with no process ID or etcd revision);
- the chunked body as content (bytes), cut at `end_offset`, after which the read ends;
- the `X-Close-Error` trailer, saying why the broker's Read stopped: a status (e.g.
  `OFFSET_NOT_YET_AVAILABLE` at the head of a non-blocking read) as a ReadResponse of that status;
  a gRPC error as TransportError; the end of the Read, or a second offset jump (the gateway stops
  there: the next GET reports the jump), as the end of the stream (None);
- an error status (404, 416, 503, 500) naming a Status as a ReadResponse of it; anything else as
  TransportError.

The gateway sends the metadata of a read's first fragment only: over HTTP, the Reader's
`fragment` and `write_head` are those of the read's start, and its `fragment_url` is empty. A
connection that fails raises TransportError (UNAVAILABLE); a kept-alive one that the broker had
closed meanwhile is replaced once, as the GET did nothing. An endpoint that does not answer in
HTTP/1.1 raises NotHttp: the Reader makes a gRPC Read there, from then on.
"""

from __future__ import annotations

import collections
import contextlib
import email.utils
import re

import grpc
import httptools

from broker.client.errors import ProtocolError, TransportError
from broker.client.http_conn import HttpConnection, HttpConnections, NotHttp
from broker.fragment.errors import FragmentError
from broker.fragment.names import parse_fragment_from_relative_path
from broker.protocol import pb
from broker.protocol.rpc_errors import parse_rpc_error_text

READ_SIZE = 1 << 20
"""Bytes taken from the connection per receive: a whole content frame (or many small ones) at once."""
MAX_ERROR_BODY = 64 << 10
"""Largest error body read: the gateway's are a line of text."""

_CONTENT_RANGE = re.compile(rb"bytes (\d+)-")
_ENDS_STREAM = frozenset({"", "broker terminated RPC", "offset jump"})
"""X-Close-Error values that end the read without an error: the Reader (or RetryReader) goes on
from where it is with a new read, as after a Read RPC that ends."""

Frame = pb.ReadResponse | bytes | None
"""What `receive` returns: a metadata or status frame, content at the read's offset, or the end."""


def takes_request(request: pb.ReadRequest) -> bool:
    """Whether a GET can carry `request`: it asks for nothing but journal, offset, block, end_offset."""
    return not (request.do_not_proxy or request.metadata_only or request.begin_mod_time)


class _Head:
    """httptools callbacks: one response's status, headers, body and trailers."""

    def __init__(self) -> None:
        self.headers: dict[bytes, bytes] = {}
        self.trailers: dict[bytes, bytes] = {}
        self.headers_complete = False
        self.complete = False
        self.body: list[bytes] = []

    def on_header(self, name: bytes, value: bytes) -> None:
        (self.trailers if self.headers_complete else self.headers)[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.headers_complete = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class HttpRead:
    """One GET of `request.journal` from `endpoint`, as the frames a Reader takes (`receive`)."""

    def __init__(
        self, connections: HttpConnections, endpoint: str, request: pb.ReadRequest, authorization: str | None
    ) -> None:
        self.connections = connections
        self.endpoint = endpoint
        self.journal = request.journal
        self.offset = request.offset
        """The journal offset of the next content byte received (resolved by the head)."""
        self.end_offset = request.end_offset
        self.header: pb.Header | None = None
        """The journal's route, once the head named it (`X-Route-Token`)."""
        query = b"offset=%d&block=%s" % (request.offset, b"true" if request.block else b"false")
        self._request = b"GET /%s?%s HTTP/1.1\r\nHost: %s\r\n" % (
            connections.path(request.journal), query, connections.host_header(endpoint))
        if authorization:
            self._request += b"Authorization: " + authorization.encode("latin-1") + b"\r\n"
        self._request += b"\r\n"
        self._conn: HttpConnection | None = None
        self._response = _Head()
        self._parser = httptools.HttpResponseParser(self._response)
        self._frames: collections.deque[Frame] = collections.deque()
        self._status = 0
        self._received = False  # Whether any byte of the response arrived.
        self._ended = False

    async def receive(self) -> Frame:
        """The next frame: the head's ReadResponse, content, a status ReadResponse, or None at the end."""
        try:
            while not self._frames:
                if self._ended:
                    return None
                if self._conn is None:
                    await self._send(fresh=False)
                    continue  # It may have found nothing to read.
                await self._receive_more()
            return self._frames.popleft()
        except BaseException:
            self.cancel()
            raise

    def cancel(self) -> None:
        """End the read: its connection is closed unless its response was read to the end."""
        self._ended = True
        self._frames.clear()
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()

    async def _send(self, *, fresh: bool) -> None:
        if self.end_offset and self.offset >= self.end_offset:
            self._ended = True  # Nothing to read: the Read RPC would end at once too.
            return
        conn = await self.connections.connect(self.endpoint, self.journal, fresh=fresh)
        self._conn = conn
        conn.writer.write(self._request)

    async def _receive_more(self) -> None:
        conn = self._conn
        assert conn is not None
        error: OSError | None = None
        try:
            data = await conn.reader.read(READ_SIZE)
        except OSError as exc:
            data, error = b"", exc
        if not data:
            if not self._received and conn.reused:
                # A kept-alive connection the broker had closed: the GET did nothing; once more anew.
                conn.close()
                self._conn = None
                await self._send(fresh=True)
                return
            raise self._unavailable(f"the connection closed amid the read ({error or 'EOF'})")
        if not self._received:
            self._received = True
            if not data.startswith(b"HTTP/1."[: len(data)]):
                self.connections.not_http.add(self.endpoint)
                raise NotHttp(f"not an HTTP/1.1 response: {data[:16]!r}")
        response = self._response
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise ProtocolError(f"broker {self.endpoint}: a malformed response to a read: {exc}",
                                journal=self.journal, offset=self.offset) from None
        if response.headers_complete and not self._status:
            self._on_head()
        if self._status == 206 and response.body:
            self._on_content(b"".join(response.body))
            response.body.clear()
        elif self._status != 206 and sum(map(len, response.body)) > MAX_ERROR_BODY:
            raise ProtocolError(f"broker {self.endpoint}: an error response of more than {MAX_ERROR_BODY} bytes",
                                journal=self.journal, offset=self.offset)
        if response.complete and not self._ended:
            self._on_complete()

    def _on_head(self) -> None:
        self._status = self._parser.get_status_code()
        headers = self._response.headers
        token = headers.get(b"x-route-token")
        if token:
            self.header = pb.Header(route=self.connections.route(self.journal, token))
        if self._status != 206:
            return  # Its body says what went wrong (_on_complete).
        first = pb.ReadResponse(status=pb.OK, write_head=self._write_head())
        match = _CONTENT_RANGE.match(headers.get(b"content-range", b""))
        name = headers.get(b"x-fragment-name")
        if match is not None and name is not None:
            self.offset = first.offset = int(match.group(1))
            try:
                fragment = parse_fragment_from_relative_path(self.journal, name.decode("utf-8"))
            except (FragmentError, UnicodeDecodeError) as exc:
                raise ProtocolError(f"broker {self.endpoint}: a read's X-Fragment-Name {name!r}: {exc}",
                                    journal=self.journal, offset=self.offset) from None
            modified = headers.get(b"x-fragment-last-modified")
            if modified:
                with contextlib.suppress(TypeError, ValueError, UnicodeDecodeError):
                    fragment.mod_time = int(email.utils.parsedate_to_datetime(modified.decode("latin-1")).timestamp())
            first.fragment.CopyFrom(fragment)
        elif self.offset < 0:
            raise ProtocolError(f"broker {self.endpoint}: a read of offset -1 answered without its Content-Range",
                                journal=self.journal, offset=self.offset)
        self._frames.append(first)

    def _write_head(self) -> int:
        try:
            return max(0, int(self._response.headers.get(b"x-write-head", b"0")))
        except ValueError:
            return 0

    def _on_content(self, content: bytes) -> None:
        if self.end_offset and self.offset + len(content) >= self.end_offset:
            content = content[: self.end_offset - self.offset]
            self._finish(release=False)  # The Read RPC would end here; the GET goes on.
        self.offset += len(content)
        if content:
            self._frames.append(content)

    def _on_complete(self) -> None:
        response = self._response
        if self._status == 206:
            reason = response.trailers.get(b"x-close-error", b"").decode("utf-8", "replace")
            self._finish(release=True)
            if reason in _ENDS_STREAM:
                return
            if reason in pb.Status.keys():
                self._frames.append(pb.ReadResponse(status=pb.Status.Value(reason)))
                return
            self._raise_for(reason, f"the read stopped: {reason}")
        text = b"".join(response.body).decode("utf-8", "replace").strip()
        self._finish(release=True)
        if self._status in (404, 416, 500, 503) and text in pb.Status.keys():
            frame = pb.ReadResponse(status=pb.Status.Value(text), write_head=self._write_head())
            if frame.status == pb.OFFSET_NOT_YET_AVAILABLE and self.offset == -1:
                frame.offset = self.offset = frame.write_head  # Where the broker resolved -1: the head.
            self._frames.append(frame)
            return
        if self._status == 500 and text == "EOF":
            return  # The broker's Read ended before its first frame: an empty stream.
        self._raise_for(text, f"HTTP {self._status}: {text}")

    def _raise_for(self, text: str, otherwise: str) -> None:
        """Raise the TransportError of a gateway's error text (a gRPC error in grpc-go's words)."""
        rpc_error = parse_rpc_error_text(text)
        if rpc_error is not None:
            code, details = rpc_error
            raise TransportError(f"broker {self.endpoint}: {code.name}: {details}", code=code,
                                 journal=self.journal, offset=self.offset)
        if self._status == 401:
            code = grpc.StatusCode.UNAUTHENTICATED
        elif self._status == 400:
            code = grpc.StatusCode.INVALID_ARGUMENT
        elif self._status == 206 or self._status >= 500:
            code = grpc.StatusCode.UNAVAILABLE if self._status in (502, 503, 504) else grpc.StatusCode.UNKNOWN
        else:
            raise ProtocolError(f"broker {self.endpoint}: {otherwise}", journal=self.journal, offset=self.offset)
        raise TransportError(f"broker {self.endpoint}: {code.name}: {otherwise}", code=code, journal=self.journal,
                             offset=self.offset)

    def _finish(self, *, release: bool) -> None:
        """The read ends: its connection is kept for another request if its response is complete."""
        self._ended = True
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if release and self._response.headers.get(b"connection", b"").lower() != b"close":
            self.connections.release(self.endpoint, conn)
        else:
            conn.close()

    def _unavailable(self, what: str) -> TransportError:
        return TransportError(f"broker {self.endpoint}: UNAVAILABLE: {what}", code=grpc.StatusCode.UNAVAILABLE,
                              journal=self.journal, offset=self.offset)


__all__ = ["HttpRead", "NotHttp", "takes_request"]
