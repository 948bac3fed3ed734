"""Fuzzing of the HTTP gateway over raw sockets: generated requests, and what a broker must answer.

Inputs are generated with hypothesis: request lines (methods, targets with percent-escapes,
non-ASCII and huge numbers, versions), headers (sizes, duplicates, odd transfer-encodings,
`Authorization`, `Expect`, `Upgrade`), bodies (by length or chunked) and pipelines of several
requests, ending now and then in a request that is malformed or in bytes that are no HTTP at all.
Each input is sent on a connection of its own; the answer must be a sequence of well-formed
responses, one per request, each with a status below 500 (or one of the 5xx Gazette's gateway
gives: 501 for a transfer coding it does not implement, 503 `not ready`, 500 with the status of
a failed append), the connection closed only after an answer that says so; a quiet close, or an
answer cut short, only for a last request that is malformed or no HTTP at all, after which the
client ends its side. After each input the broker must answer `/debug/ready`, and its log must not
gain a traceback.

tests/broker/test_gateway_fuzz.py runs a few hundred inputs against the test suite's broker. A longer
run starts its own etcd and broker and prints what it found:

    python -m tests.fuzz.fuzz_http --minutes 10 [--timeout 10] [--seed N] [--dump DIR]
"""

from __future__ import annotations

import argparse
import random
import re
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from broker.gateway.read import read_params
from broker.protocol import pb
from cluster.server.http.request import BadRequest, BadTarget, parse_query, split_target

JOURNAL = "fuzz/journal"
"""A journal the fuzzing broker serves: reads and appends of it go all the way through."""

# What a request item asks of the broker's answer.
NORMAL = "normal"
"""A well-formed HTTP/1.1 request on a kept-alive connection: it must be answered."""
CLOSING = "closing"
"""A well-formed request after which the connection ends (HTTP/1.0, `Connection: close`)."""
HOSTILE = "hostile"
"""Malformed HTTP: answered with an error (or, with the input cut short, a quiet close)."""
RAW = "raw"
"""Bytes that may be no HTTP at all: an error answer or a quiet close."""


@dataclass
class Item:
    """One request of a pipeline, as bytes on the wire."""

    data: bytes
    kind: str
    method: str | None = None
    """The method the server will read (None: unknown), for the framing of its answer."""


@dataclass
class Wire:
    """One input: pipelined items, sent in `pieces`, then half-closed if `half_close`."""

    items: list[Item]
    cuts: list[int] = field(default_factory=list)
    half_close: bool = False

    @property
    def data(self) -> bytes:
        return b"".join(item.data for item in self.items)

    @property
    def pieces(self) -> list[bytes]:
        data, bounds = self.data, sorted({c for c in self.cuts if 0 < c < len(self.data)})
        return [data[a:b] for a, b in zip([0, *bounds], [*bounds, len(data)], strict=True)]

    def show(self, limit: int = 600) -> str:
        data = self.data
        shown = repr(data[:limit]) + (f"... ({len(data)} bytes)" if len(data) > limit else "")
        return f"{shown} kinds={[i.kind for i in self.items]} half_close={self.half_close}"


# Generation.

_TOKEN = "!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_PATH_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789-_.=+/;:@!$&'()*,~"
_HEX = "0123456789abcdefABCDEF"

tokens = st.text(_TOKEN, min_size=1, max_size=12)


def _escape(b: int) -> str:
    return f"%{b:02X}"


percent_escapes = st.one_of(
    st.integers(0, 255).map(_escape),  # Any byte, non-UTF-8 ones too.
    st.text(min_size=1, max_size=3).map(lambda s: "".join(_escape(b) for b in s.encode("utf-8", "surrogatepass"))),
    st.sampled_from(["%", "%z", "%zz", "%4", "%%", "%G0", "%2F", "%2f", "%00", "%0A", "%3B", "%3F", "%25"]),
)
path_text = st.lists(
    st.one_of(st.text(_PATH_CHARS, min_size=1, max_size=8), percent_escapes, st.sampled_from(["/", "//", "..", "."])),
    max_size=8,
).map("".join)
journal_paths = st.one_of(
    st.just("/" + JOURNAL),
    st.just("/" + JOURNAL),
    st.just("/" + JOURNAL),
    st.text("abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=20).map(lambda s: "/fuzz/" + s),
    st.sampled_from(["/", "//", "/fuzz/journal;meta", "/fuzz//journal", "/../fuzz/journal", "/a", "/fuzz/journal/"]),
    st.builds(lambda s: "/" + s, path_text),
    st.builds(lambda s: "/fuzz/" + s, path_text),
    st.integers(1, 2000).map(lambda n: "/" + "j" * n),  # Past the longest journal name (512).
)
debug_paths = st.sampled_from(["/debug/ready", "/debug/metrics", "/debug/ready?x=%zz", "/debug/pprof/", "/debug"])

big_numbers = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.integers(1, 6000).map(lambda n: "9" * n),
    st.integers(1, 6000).map(lambda n: "0" * n + "5"),
    st.integers(1, 6000).map(lambda n: "-" + "0" * n + "1"),
    st.sampled_from(["-1", "-2", "+3", "%2B3", "0x10", "1e3", "1_000", "%201", "1.5", "9223372036854775807",
                     "9223372036854775808", "-9223372036854775808", "-9223372036854775809", "%D9%A3", "--1"]),
)
query_values = st.one_of(
    big_numbers,
    st.sampled_from(["", "true", "false", "1", "0", "t", "F", "TRUE", "True", "maybe", "yes", "2"]),
    path_text,
)
query_keys = st.one_of(
    st.sampled_from(["offset", "OFFSET", "Offset", "block", "BLOCK", "extra", "", "offset[]", "of%66set"]),
    path_text,
)
queries = st.one_of(
    st.just(""),
    st.just(""),
    st.sampled_from(["?offset=0", "?offset=3", "?offset=-1", "?offset=99999999"]),
    st.lists(
        st.tuples(query_keys, st.sampled_from(["=", "", "=="]), query_values).map("".join),
        min_size=1, max_size=4,
    ).flatmap(lambda parts: st.sampled_from(["&", ";", "&&"]).map(lambda sep: "?" + sep.join(parts))),
    st.sampled_from(["?", "?&", "?%zz", "?offset=1&offset=2", "?offset=-1", "?block=false&offset=-1"]),
)


@st.composite
def targets(draw: st.DrawFn, method: str) -> bytes:
    """A request target; for the fuzzed journal, never a blocking read (which legitimately never ends)."""
    form = draw(st.sampled_from(["origin"] * 6 + ["debug", "absolute", "asterisk", "authority", "odd"]))
    if form == "debug":
        return draw(debug_paths).encode()
    if form == "asterisk":
        return b"*"
    if form == "authority":
        return b"broker:8080"
    if form == "odd":
        return draw(st.sampled_from([b"x", b"?offset=1", b"//fuzz/journal", b"http://", b"http:///x", b"%2F"]))
    target = draw(journal_paths) + draw(queries)
    if form == "absolute":
        target = draw(st.sampled_from(["http://broker", "https://h:1", "HTTP://x", "gazette://b"])) + target
    if method in ("GET", "HEAD") and _blocks(target):
        target = target.partition("?")[0]
    return target.encode("ascii")


def _blocks(target: str) -> bool:
    """Whether the gateway would serve `target` as a blocking read of the fuzzed journal."""
    try:
        path, query = split_target(target)
        parse_query(query)
        return path == "/" + JOURNAL and read_params(query)[1]
    except (BadTarget, BadRequest, ValueError):
        return False


methods = st.one_of(
    st.sampled_from(["GET"] * 4 + ["HEAD"] * 2 + ["PUT"] * 4 + ["POST", "DELETE", "OPTIONS", "CONNECT", "TRACE",
                                                                   "PATCH", "PRI", "get", "M-SEARCH"]),
    tokens,
)


def _chunked(body: bytes, cuts: list[int], upper: bool, extension: bool, trailers: bool) -> bytes:
    out = bytearray()
    bounds = sorted({c for c in cuts if 0 < c < len(body)})
    for a, b in zip([0, *bounds], [*bounds, len(body)], strict=True):
        if a == b:
            continue
        size = f"{b - a:X}" if upper else f"{b - a:x}"
        out += size.encode() + (b";ext=1" if extension else b"") + b"\r\n" + body[a:b] + b"\r\n"
    out += b"0\r\n" + (b"X-Trailer: yes\r\n" if trailers else b"") + b"\r\n"
    return bytes(out)


bodies = st.one_of(
    st.binary(max_size=64),
    st.binary(max_size=4096),
    st.integers(0, 300_000).map(lambda n: b"b" * n),
)
authorizations = st.one_of(
    st.text("abcdefghijklmnopqrstuvwxyz0123456789+/=-._~ ", max_size=64).map(lambda s: ("Bearer " + s).encode()),
    st.integers(0, 20_000).map(lambda n: b"Bearer " + b"t" * n),
    st.sampled_from([b"", b"caf\xc3\xa9", b"\xff\xfe", b"a\tb", b"Basic " + b"=" * 7200]),
)
_FRAMING_HEADERS = frozenset(["host", "content-length", "transfer-encoding", "connection", "expect", "upgrade"])
"""Headers that decide how a request is framed or answered: only ever chosen on purpose."""
ordinary_headers = st.one_of(
    st.tuples(tokens.filter(lambda name: name.lower() not in _FRAMING_HEADERS),
              st.text("abcdefghijklmnopqrstuvwxyz0123456789 -_.,;=/\"'()", max_size=40)).map(
        lambda kv: (kv[0].encode(), kv[1].strip().encode())
    ),
    st.sampled_from([
        (b"Expect", b"100-continue"), (b"Connection", b"keep-alive"), (b"Connection", b"Upgrade"),
        (b"Upgrade", b"h2c"), (b"Upgrade", b"websocket"), (b"HTTP2-Settings", b"AAMAAABkAARAAAAAAAIAAAAA"),
        (b"Content-Type", b"application/octet-stream"), (b"Accept-Encoding", b"gzip"), (b"TE", b"trailers"),
        (b"X-Forwarded-For", b"10.0.0.1"), (b"Cookie", b"a=b"), (b"Range", b"bytes=0-10"),
        (b"Trailer", b"X-Trailer"), (b"Content-Encoding", b"gzip"),
    ]),
    st.integers(0, 12_000).map(lambda n: (b"X-Big", b"v" * n)),
    st.binary(max_size=20).map(lambda v: (b"X-Bytes", bytes(b for b in v if b >= 0x80 or 0x20 <= b < 0x7F).strip())),
)
hostile_headers = st.one_of(
    st.sampled_from([
        b"Bad Header", b"Bad Header: x", b": empty name", b"X-Null: a\x00b", b"X-Fold: a\r\n folded",
        b"Host: a\r\nHost: b", b"Content-Length: 1\r\nContent-Length: 2", b"Content-Length: -1",
        b"Content-Length: 1e3", b"Content-Length: " + b"9" * 30, b"Content-Length: " + b"9" * 5000,
        b"Transfer-Encoding: chunked, chunked", b"Transfer-Encoding: gzip", b"Transfer-Encoding: gzip, chunked",
        b"Transfer-Encoding: identity", b"Transfer-Encoding: chunked\r\nContent-Length: 3",
        b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked", b"Transfer-Encoding: xchunked",
        b"X-Ctl: \x01", b"X-CR: a\rb", b"\xffName: v", b"Authorization: \x7f",
    ]),
    st.integers(1 << 20, (1 << 20) + 4096).map(lambda n: b"X-Huge: " + b"h" * n),  # Past the 1 MiB head limit.
    st.lists(st.just(b"X-Many: v"), min_size=1000, max_size=3000).map(b"\r\n".join),
)


@st.composite
def requests(draw: st.DrawFn, terminal: bool) -> Item:
    """A request; `terminal` ones may end the connection (HTTP/1.0, Connection: close, malformed HTTP)."""
    method = draw(methods)
    target = draw(targets(method))
    version = b"HTTP/1.1"
    kind = NORMAL
    if terminal:
        kind = draw(st.sampled_from([CLOSING, HOSTILE, HOSTILE]))
    if kind == CLOSING:
        version = draw(st.sampled_from([b"HTTP/1.0", b"HTTP/1.1"]))
    elif kind == HOSTILE:
        version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.2", b"http/1.1",
                                        b"HTTP/1.1 x", b"HTTP/11", b""]))

    headers: list[bytes] = []
    if version != b"HTTP/1.0" or draw(st.booleans()):
        headers.append(b"Host: " + draw(st.sampled_from([b"broker", b"127.0.0.1:8080", b"x"])))
    if draw(st.booleans()):
        headers.append(b"Authorization: " + draw(authorizations))
    headers += [name + b": " + value for name, value in draw(st.lists(ordinary_headers, max_size=4))]
    if kind == CLOSING and version == b"HTTP/1.1":
        headers.append(b"Connection: close")

    body = draw(bodies) if method == "PUT" or draw(st.integers(0, 9)) == 0 else b""
    framing = draw(st.sampled_from(["length", "length", "chunked"])) if body or method == "PUT" else "none"
    if framing == "length":
        headers.append(b"Content-Length: %d" % len(body))
        payload = body
    elif framing == "chunked":
        headers.append(b"Transfer-Encoding: chunked")
        payload = _chunked(body, draw(st.lists(st.integers(0, len(body)), max_size=4)), draw(st.booleans()),
                           draw(st.booleans()), draw(st.booleans()))
    else:
        payload = b""

    line = method.encode() + b" " + target + b" " + version
    if kind == HOSTILE:
        damage = draw(st.sampled_from(["header", "header", "line", "body", "none"]))
        if damage == "header":
            headers.insert(draw(st.integers(0, len(headers))), draw(hostile_headers))
        elif damage == "line":
            line = draw(st.sampled_from([
                method.encode() + b"  " + target + b" " + version,
                method.encode() + b" " + target + b"\xc3\xa9 " + version,
                method.encode() + b" /a b " + version,
                method.encode() + b"\t" + target + b" " + version,
                b"G\x00T " + target + b" " + version,
                method.encode() + b" " + target,
                b" " + line,
                line + b"\x00",
            ]))
        elif damage == "body":
            payload = draw(st.sampled_from([
                payload + b"extra bytes",
                payload[: len(payload) // 2],
                b"zz\r\n" + payload,
                b"5\r\nabc\r\n0\r\n\r\n",
                b"1" + b"0" * 20 + b"\r\n",
                b"f" * 5000 + b"\r\n",
            ]))
            if framing == "none":
                headers.append(b"Content-Length: 3")
    data = line + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + payload
    return Item(data, kind, method)


raw_bytes = st.one_of(
    st.binary(min_size=1, max_size=200),
    st.sampled_from([
        b"X\r\n\r\n", b"\r\n", b"\r\n\r\n", b"\n\n", b"GET", b"GET / HTTP/1.1\r\nHo", b"GET / HTTP/1.1\r\nHost: x\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM", b"PRI * HTTP/1.1\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
        b"SSH-2.0-OpenSSH_9.6\r\n", b"\x00" * 64, b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 50,
        b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
    ]),
    st.text(min_size=1, max_size=40).map(lambda s: s.encode("utf-8", "surrogatepass") + b"\r\n\r\n"),
)


@st.composite
def wires(draw: st.DrawFn) -> Wire:
    """Zero or more kept-alive requests, then perhaps a terminal request or raw bytes."""
    items = draw(st.lists(requests(terminal=False), max_size=3))
    ending = draw(st.sampled_from(["none", "request", "raw"]) if items else st.sampled_from(["request", "raw"]))
    if ending == "request":
        items.append(draw(requests(terminal=True)))
    elif ending == "raw":
        items.append(Item(draw(raw_bytes), RAW))
    wire = Wire(items)
    size = len(wire.data)
    wire.cuts = draw(st.lists(st.integers(1, max(1, size - 1)), max_size=3)) if size > 1 else []
    # Input that may stop short (a malformed body, bytes that are no HTTP) is ended by the client.
    wire.half_close = items[-1].kind in (HOSTILE, RAW)
    return wire


# The exchange and its answers.


BODY_CAP = 4 << 20
"""Response body bytes read before the rest is left unread (a read of a journal grown large)."""


@dataclass
class Response:
    status: int
    headers: dict[bytes, list[bytes]]
    body: bytes
    truncated: bool = False
    """Only the first BODY_CAP bytes of the body were read."""

    def header(self, name: bytes) -> bytes:
        return b", ".join(self.headers.get(name, []))

    @property
    def closes(self) -> bool:
        return b"close" in self.header(b"connection").lower()


class Malformed(Exception):
    """Bytes from the server that are no HTTP/1.1 response."""


class CutShort(Malformed):
    """A response whose body the server ended the connection within."""


_STATUS_LINE = re.compile(rb"HTTP/1\.1 ([1-5][0-9][0-9]) ([^\r\n]*)\r\n")
_HEADER = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*([^\r\n]*?)[ \t]*")


def parse_response(buf: bytes, method: str | None, eof: bool) -> tuple[Response, int] | None:
    """The response at the start of `buf` and its length, None if incomplete; raises Malformed."""
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        if eof or len(buf) > 1 << 20:
            raise Malformed(f"incomplete response head: {buf[:200]!r}")
        return None
    head = buf[: head_end + 2]
    line = _STATUS_LINE.match(head)
    if line is None:
        raise Malformed(f"bad status line: {head[:200]!r}")
    status = int(line.group(1))
    headers: dict[bytes, list[bytes]] = {}
    for raw in head[line.end() :].split(b"\r\n")[:-1]:
        header = _HEADER.fullmatch(raw)
        if header is None:
            raise Malformed(f"bad header line: {raw[:200]!r}")
        headers.setdefault(header.group(1).lower(), []).append(header.group(2))
    response = Response(status, headers, b"")
    at = head_end + 4
    if status < 200 or status in (204, 304) or method == "HEAD":
        return response, at
    if method == "HEAD?":  # A malformed HEAD: its answer is the HEAD's, or the malformed request's.
        if buf[at:].startswith(b"HTTP/") or (eof and len(buf) == at):
            return response, at
        if not eof and len(buf) - at < len(b"HTTP/"):
            return None
    length = response.header(b"content-length")
    if not eof and len(buf) - at > BODY_CAP:
        response.body, response.truncated = buf[at:], True
        return response, len(buf)
    if b"chunked" in response.header(b"transfer-encoding").lower():
        body = bytearray()
        while True:
            line_end = buf.find(b"\r\n", at)
            if line_end < 0:
                _check_complete(eof, "chunked body")
                return None
            size = re.fullmatch(rb"([0-9a-fA-F]{1,16})(;[^\r\n]*)?", buf[at:line_end])
            if size is None:
                raise Malformed(f"bad chunk size line: {buf[at:line_end][:100]!r}")
            n = int(size.group(1), 16)
            at = line_end + 2
            if n == 0:
                break
            if len(buf) < at + n + 2:
                _check_complete(eof, "chunk")
                return None
            body += buf[at : at + n]
            if buf[at + n : at + n + 2] != b"\r\n":
                raise Malformed("chunk not followed by CRLF")
            at += n + 2
        while True:  # Trailers.
            line_end = buf.find(b"\r\n", at)
            if line_end < 0:
                _check_complete(eof, "trailers")
                return None
            trailer = buf[at:line_end]
            at = line_end + 2
            if not trailer:
                break
            if _HEADER.fullmatch(trailer) is None:
                raise Malformed(f"bad trailer: {trailer[:100]!r}")
        response.body = bytes(body)
        return response, at
    if length:
        if not length.isdigit():
            raise Malformed(f"bad Content-Length: {length!r}")
        n = int(length)
        if len(buf) < at + n:
            _check_complete(eof, "body")
            return None
        response.body = buf[at : at + n]
        return response, at + n
    if not eof:
        return None  # Delimited by the end of the connection.
    response.body = buf[at:]
    return response, len(buf)


def _check_complete(eof: bool, what: str) -> None:
    if eof:
        raise CutShort(f"connection ended within the {what}")


@dataclass
class Exchange:
    responses: list[Response] = field(default_factory=list)
    ending: str = ""
    """How the connection ended: `answered` (we closed it), `closed`, `reset` or `timeout`."""
    malformed: str | None = None
    cut_short: bool = False
    """The answer to the last request ended within its body, after the client ended its side: the
    gateway takes that as the client being gone (Go's net/http cancels the request then) and stops
    the response. Go's gateway would end the body with an `X-Close-Error` trailer instead."""
    leftover: bytes = b""


def exchange(port: int, wire: Wire, timeout: float) -> Exchange:
    """Send `wire` on a new connection and read the answers, until every item is answered, the
    server closes, or `timeout` seconds pass."""
    out = Exchange()
    methods = [f"{item.method}?" if item.kind == HOSTILE and item.method == "HEAD" else item.method
               for item in wire.items]
    deadline = time.monotonic() + timeout
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            for piece in wire.pieces:
                sock.sendall(piece)
            if wire.half_close:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # The server stopped reading (an answer to a head too large, say): read what it said.
        buf = b""
        eof = False
        while True:
            try:
                while buf:
                    method = methods[len(out.responses)] if len(out.responses) < len(methods) else None
                    parsed = parse_response(buf, method, eof)
                    if parsed is None:
                        break
                    response, n = parsed
                    buf = buf[n:]
                    if response.status >= 200:
                        out.responses.append(response)
                    if response.truncated:
                        break
            except CutShort as err:
                if wire.half_close and len(out.responses) >= len(wire.items) - 1:
                    out.cut_short = True
                else:
                    out.malformed = str(err)
                break
            except Malformed as err:
                out.malformed = str(err)
                out.ending = out.ending or "closed"
                break
            if eof:
                break
            if len(out.responses) >= len(wire.items) or (out.responses and out.responses[-1].truncated):
                out.ending = "answered"
                break
            left = deadline - time.monotonic()
            if left <= 0:
                out.ending = "timeout"
                break
            sock.settimeout(left)
            try:
                data = sock.recv(1 << 16)
            except TimeoutError:
                out.ending = "timeout"
                break
            except ConnectionResetError:
                out.ending = "reset"
                break
            if not data:
                out.ending = "closed"
                eof = True
            buf += data
        out.leftover = buf
    return out


STATUS_NAMES = frozenset(f"{name}\n".encode() for name in pb.Status.keys())
GO_BODY_ERRORS = frozenset(f"{text}\n".encode() for text in (
    "unexpected EOF", "malformed chunked encoding", "invalid byte in chunk length",
    "empty hex number for chunk length", "http chunk length too large", "chunked line ends with bare LF",
    "invalid CR in chunked line", "header line too long",
))


def problems(wire: Wire, ex: Exchange) -> list[str]:
    """What is wrong with the broker's answer `ex` to `wire`: (kind, detail) lines."""
    found: list[str] = []
    if ex.malformed:
        found.append(f"malformed: {ex.malformed}")
    for i, resp in enumerate(ex.responses):
        item = wire.items[i] if i < len(wire.items) else None
        if resp.status >= 500 and not _gazettes_5xx(resp, item):
            found.append(f"5xx: {resp.status} {resp.body[:200]!r}")
        if resp.closes and (i + 1 < len(ex.responses) or ex.ending == "timeout" or ex.leftover):
            found.append("not closed after Connection: close")
            break
    if ex.ending == "timeout":
        found.append(f"hang: {len(ex.responses)} of {len(wire.items)} answered within the timeout")
        return found
    if ex.responses and ex.responses[-1].truncated:
        return found  # We stopped reading there.
    # Every well-formed request is answered, unless an answer said that the connection closes.
    required = sum(item.kind in (NORMAL, CLOSING) for item in wire.items)
    answered = len(ex.responses)
    if answered < required and not any(r.closes for r in ex.responses):
        found.append(f"dropped: {answered} of {required} requests answered, then the connection was {ex.ending}")
    return found


def _gazettes_5xx(resp: Response, item: Item | None) -> bool:
    """Whether a 5xx answer is one Gazette's gateway gives too."""
    if resp.status == 501:
        return True  # A transfer coding net/http does not implement.
    if resp.status == 503:
        return resp.body in (b"not ready", b"INSUFFICIENT_JOURNAL_BROKERS\n")
    if resp.status == 500 and item is not None and item.method == "PUT":
        # Any failed append, or a body Go's net/http could not read (its error text is the answer).
        return resp.body in STATUS_NAMES or resp.body in GO_BODY_ERRORS or resp.body == b"expected Request.Journal\n"
    return False


def ready(port: int, timeout: float = 5.0) -> bool:
    """Whether the broker answers `/debug/ready` with 200."""
    wire = Wire([Item(b"GET /debug/ready HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n", CLOSING, "GET")])
    try:
        ex = exchange(port, wire, timeout)
    except OSError:
        return False
    return bool(ex.responses) and ex.responses[0].status == 200


class LogWatch:
    """New tracebacks in a broker's log since the last look."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def new_tracebacks(self) -> list[str]:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        text = data.decode("utf-8", "replace")
        return [chunk[:2000] for chunk in text.split("Traceback (most recent call last):")[1:]]


# The long run.


@dataclass
class Tally:
    inputs: int = 0
    crashes: int = 0
    hangs: int = 0
    fivexx: int = 0
    fivexx_gazette: int = 0
    tracebacks: int = 0
    dropped: int = 0
    malformed: int = 0
    cut_short: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    samples: dict[str, list[str]] = field(default_factory=dict)
    dump: Path | None = None
    """Where each input that found something is written whole (`<n>-<kind>.bin`), if anywhere."""

    def sample(self, kind: str, text: str, wire: Wire) -> None:
        kept = self.samples.setdefault(kind, [])
        if len(kept) < 3:
            kept.append(text)
        if self.dump is not None:
            self.dump.mkdir(parents=True, exist_ok=True)
            n = len(list(self.dump.iterdir()))
            (self.dump / f"{n}-{kind.replace(' ', '-')}.bin").write_bytes(wire.data)


def fuzz_once(port: int, logs: LogWatch, wire: Wire, tally: Tally, timeout: float, alive: Callable[[], bool]) -> None:
    """Send one input and count what went wrong."""
    tally.inputs += 1
    ex = exchange(port, wire, timeout)
    tally.cut_short += ex.cut_short
    for resp in ex.responses:
        tally.statuses[resp.status] += 1
        if resp.status >= 500:
            tally.fivexx_gazette += 1
    for problem in problems(wire, ex):
        kind = problem.split(":", 1)[0]
        if kind == "5xx":
            tally.fivexx += 1
            tally.fivexx_gazette -= 1
        elif kind == "hang":
            tally.hangs += 1
        elif kind == "dropped":
            tally.dropped += 1
        else:
            tally.malformed += 1
        tally.sample(kind, f"{problem}\n    input: {wire.show()}", wire)
    if not alive() or not ready(port):
        tally.crashes += 1
        tally.sample("crash", f"broker down after input: {wire.show()}", wire)
    for tb in logs.new_tracebacks():
        tally.tracebacks += 1
        tally.sample("traceback", f"{tb}\n    input: {wire.show()}", wire)


def run(minutes: float, timeout: float, base_seed: int | None, dump: Path | None = None) -> Tally:
    from tests.benchmarks.stack import etcd_and_broker, log
    from tests.support.harness import apply_specs, journal_spec, wait_for_primary

    tally = Tally(dump=dump)
    with tempfile.TemporaryDirectory(prefix="fuzz-http-") as tmp, etcd_and_broker(Path(tmp)) as broker:
        channel, stub = broker.stub()
        with channel:
            assert apply_specs(stub, journal_spec(JOURNAL)).status == pb.OK
            wait_for_primary(stub, JOURNAL)
        logs = LogWatch(broker.log_path)
        end = time.monotonic() + minutes * 60
        rng = random.Random(base_seed)
        log(f"fuzzing the HTTP gateway at {broker.url} for {minutes} minutes")

        def alive() -> bool:
            return broker.proc.poll() is None

        def fuzz(wire: Wire) -> None:
            if time.monotonic() < end and alive():
                fuzz_once(broker.port, logs, wire, tally, timeout, alive)

        while time.monotonic() < end and alive():
            # Batches of inputs, each from a seed of its own (drawn from --seed, if given).
            batch = settings(max_examples=500, deadline=None, database=None, phases=[Phase.generate],
                             suppress_health_check=list(HealthCheck))(given(wire=wires())(fuzz))
            if base_seed is not None:
                batch = seed(rng.getrandbits(64))(batch)
            batch()
            log(f"{tally.inputs} inputs, {tally.hangs} hangs, {tally.fivexx} 5xx, {tally.tracebacks} tracebacks")
    return tally


def report(tally: Tally, minutes: float) -> str:
    lines = [
        f"HTTP gateway fuzzing, {minutes:g} minutes",
        f"inputs tried:        {tally.inputs}",
        f"crashes:             {tally.crashes}",
        f"hangs:               {tally.hangs}",
        f"5xx answers:         {tally.fivexx} (besides {tally.fivexx_gazette} that Gazette gives too: 501, "
        "503 not ready, 500 failed append)",
        f"tracebacks logged:   {tally.tracebacks}",
        f"dropped connections: {tally.dropped}",
        f"malformed answers:   {tally.malformed}",
        f"cut short:           {tally.cut_short} (a streamed answer stopped because its client ended its side)",
        "statuses:            " + ", ".join(f"{s}: {n}" for s, n in sorted(tally.statuses.items())),
    ]
    for kind, samples in tally.samples.items():
        lines.append(f"\n{kind} (first {len(samples)}):")
        lines += [f"  {s}" for s in samples]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds an input's answers may take (a hang)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--dump", type=Path, default=None, help="directory to write each input that found something")
    args = parser.parse_args(argv)
    tally = run(args.minutes, args.timeout, args.seed, args.dump)
    print(report(tally, args.minutes))
    failed = tally.crashes + tally.hangs + tally.fivexx + tally.tracebacks + tally.dropped + tally.malformed
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
