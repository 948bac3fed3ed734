"""One small append as an HTTP PUT: the cheapest correct path for `append()` without parameters.

A gRPC Append through grpc.aio costs three messages each way of per-message machinery on both
sides; the broker's HTTP gateway takes the same append as one PUT on a kept-alive connection and
runs it in-process (`broker.gateway.local`), at a fraction of the round trip. `append()` (and an
AppendService, for a batch held in memory) takes this path for a plain append (no AppendRequest
parameters) of at most `HTTP_APPEND_LIMIT` bytes to an `http://` endpoint; everything else is a
gRPC Append.

The outcome is known as exactly as over gRPC: the gateway commits only once the whole body has
arrived and answers 204 with the commit (`X-Commit-Begin`, `-End`, `-SHA1-Sum`, the route as
`X-Route-Token`, and the journal's registers as `X-Registers` if it has any), or an error
status. The request carries `Expect: 100-continue` (its body is sent at once all the same): a
server answers `100 Continue` when it begins reading the body, before anything can be committed,
as a broker sends `gazette-append-begun` before reading an Append. So a connection that fails
before `100 Continue` arrived raises TransportError (nothing was written: e.g. a stopping broker
closed the kept-alive connection as the request came), and one that fails after raises
AppendOutcomeUnknown; a 500 naming a status (e.g. `JOURNAL_NOT_FOUND`) raises that status's
error, as nothing was committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import dataclass

import grpc
from google.protobuf import text_format

from broker.client.errors import AppendOutcomeUnknown, ProtocolError, TransportError, status_error
from broker.client.http_conn import HttpConnections, NotHttp
from broker.fragment.sums import sha1sum_from_digest
from broker.protocol import pb
from broker.protocol.validation import validate_append_request

HTTP_APPEND_LIMIT = 64 << 20
"""Largest content `append()` sends as one PUT (larger ones stream as gRPC Append chunks). A PUT
was measured faster at every size up to 8 MiB (1 MiB: p50 2.0 ms against 4.1 ms)."""
SMALL_WRITE = 16 << 10
"""Content up to this size is joined with the request head into one write (one send)."""
MAX_HEAD = 64 << 10
"""Largest response head accepted."""

_STATUS_BODY = re.compile(r"(?:.*: )?([A-Z_]+)\n?")


class HttpAppends:
    """`append()`'s PUTs over the client's kept-alive HTTP connections."""

    def __init__(self, connections: HttpConnections) -> None:
        self.connections = connections
        self._validated: set[str] = set()

    def takes(self, endpoint: str, size: int) -> bool:
        """Whether an append of `size` bytes to `endpoint` goes as a PUT."""
        return size <= HTTP_APPEND_LIMIT and self.connections.takes(endpoint)

    async def append(
        self, endpoint: str, journal: str, content: bytes | bytearray | memoryview, authorization: str | None
    ) -> pb.AppendResponse:
        """PUT `content` to `journal` at `endpoint`; the OK reply (commit and route), or raise."""
        connections = self.connections
        if journal not in self._validated:
            validate_append_request(pb.AppendRequest(journal=journal))  # Once per journal.
            self._validated.add(journal)
        head = b"PUT /%s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\nExpect: 100-continue\r\n" % (
            connections.path(journal), connections.host_header(endpoint), len(content))
        if authorization:
            head += b"Authorization: " + authorization.encode("latin-1") + b"\r\n"
        conn = await connections.connect(endpoint, journal)
        progress = _Progress()
        try:
            if len(content) <= SMALL_WRITE:
                conn.writer.write(head + b"\r\n" + content)
            else:  # Not copied into one buffer: the transport sends what it can of each at once.
                conn.writer.writelines((head + b"\r\n", content))
            status, headers, body = await _read_response(conn.reader, progress)
        except NotHttp:
            conn.close()
            connections.not_http.add(endpoint)
            raise
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            conn.close()
            if not progress.begun:
                raise TransportError(
                    f"broker {endpoint}: UNAVAILABLE: the connection failed before the broker began the append"
                    f" ({exc!r})", code=grpc.StatusCode.UNAVAILABLE, journal=journal,
                ) from None
            raise AppendOutcomeUnknown(
                f"broker {endpoint}: UNAVAILABLE: the connection failed after the broker began the append ({exc!r})",
                code=grpc.StatusCode.UNAVAILABLE, journal=journal,
            ) from None
        except BaseException:
            conn.close()  # Cancelled mid-request: the connection's state is unknown.
            raise
        if headers.get(b"connection", b"").lower() == b"close":
            conn.close()
        else:
            connections.release(endpoint, conn)
        return self._response(endpoint, journal, status, headers, body)

    def _response(
        self, endpoint: str, journal: str, status: int, headers: dict[bytes, bytes], body: bytes
    ) -> pb.AppendResponse:
        if status == 204:
            try:
                begin, end = int(headers[b"x-commit-begin"]), int(headers[b"x-commit-end"])
                digest = bytes.fromhex(headers[b"x-commit-sha1-sum"].decode("ascii"))
                commit_sum = sha1sum_from_digest(digest)
            except (KeyError, ValueError) as exc:
                raise ProtocolError(f"broker {endpoint}: 204 to a PUT without its commit ({exc})",
                                    journal=journal) from None
            resp = pb.AppendResponse(status=pb.OK)
            commit = resp.commit
            commit.journal, commit.begin, commit.end = journal, begin, end
            commit.sum.CopyFrom(commit_sum)
            token = headers.get(b"x-route-token")
            if token:
                resp.header.route.CopyFrom(self.connections.route(journal, token))
            registers = headers.get(b"x-registers")
            if registers:
                with contextlib.suppress(text_format.ParseError, UnicodeDecodeError):  # Committed all the same.
                    text_format.Parse(registers.decode("utf-8"), resp.registers)
            return resp
        text = body.decode("utf-8", "replace").strip()
        match = _STATUS_BODY.fullmatch(text + "\n") if status == 500 else None
        if match is not None and match.group(1) in pb.Status.keys():
            # A status instead of a commit: nothing was written.
            reply = pb.Status.Value(match.group(1))
            raise status_error(reply, journal=journal, response=pb.AppendResponse(status=reply), detail=text)
        if status in (400, 401):
            # Refused before anything was appended: a name the gateway rejects, a token it does not take.
            code = grpc.StatusCode.UNAUTHENTICATED if status == 401 else grpc.StatusCode.INVALID_ARGUMENT
            raise TransportError(f"broker {endpoint}: {code.name}: {text}", code=code, journal=journal)
        # Anything else failed after the whole append was sent (a proxied primary vanished, ...).
        raise AppendOutcomeUnknown(f"broker {endpoint}: HTTP {status}: {text}", code=grpc.StatusCode.UNKNOWN,
                                   journal=journal)


@dataclass
class _Progress:
    begun: bool = False
    """Whether the server answered `100 Continue` (or more): it began reading the append's body."""


async def _read_response(reader: asyncio.StreamReader, progress: _Progress) -> tuple[int, dict[bytes, bytes], bytes]:
    """Status, headers (lower-case names) and body of one HTTP/1.1 response (after any 1xx, each
    noted in `progress`)."""
    first = await reader.read(7)
    while 0 < len(first) < 7 and b"HTTP/1.".startswith(first):
        more = await reader.read(7 - len(first))
        if not more:
            break
        first += more
    if not first:
        raise asyncio.IncompleteReadError(b"", None)
    progress.begun = True  # Whatever the answer, the server took the request in.
    if not first.startswith(b"HTTP/1."):
        if b"HTTP/1.".startswith(first):
            raise asyncio.IncompleteReadError(first, None)  # An answer cut short.
        raise NotHttp(f"not an HTTP/1.1 response: {first!r}")
    pending = first
    while True:
        head = pending + await reader.readuntil(b"\r\n\r\n")
        pending = b""
        if len(head) > MAX_HEAD:
            raise ValueError("response head too large")
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise ValueError(f"not an HTTP response: {lines[0][:80]!r}")
        status = int(parts[1])
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200:
            continue
        length = int(headers.get(b"content-length", b"0"))
        if headers.get(b"transfer-encoding"):
            raise ValueError("a chunked response to a PUT")
        body = await reader.readexactly(length) if length else b""
        return status, headers, body


__all__ = ["HTTP_APPEND_LIMIT", "HttpAppends", "NotHttp"]
