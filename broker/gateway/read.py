"""GET and HEAD of a journal: a Read RPC relayed as a 206 response, as Gazette's gateway does.

The query takes `offset` and `block`. The first ReadResponse decides the status and headers
(`Content-Range`, the fragment's name, modification time and location, the write head, the
route); GET then streams the content chunked and ends it with the `X-Close-Error` trailer,
saying why the read stopped. HEAD asks for metadata only.
"""

from __future__ import annotations

import contextlib
import email.utils
import re

import grpc

from broker.fragment.errors import FragmentError
from broker.fragment.names import content_name
from broker.gateway.request import Metadata, journal_of, multi_error
from broker.gateway.responses import (
    CLOSE_ERROR_HEADER,
    FRAGMENT_LAST_MODIFIED_HEADER,
    FRAGMENT_LOCATION_HEADER,
    FRAGMENT_NAME_HEADER,
    WRITE_HEAD_HEADER,
    EndpointOf,
    Headers,
    route_headers,
    rpc_error_status,
    rpc_error_text,
)
from broker.protocol import pb, pb_grpc
from broker.protocol.paths import go_quote
from broker.protocol.validation import ValidationError, validate_read_request, validate_read_response
from cluster.server.http.connection import Connection
from cluster.server.http.request import BadRequest, parse_query
from cluster.server.http.sniff import detect_content_type

MAX_INT64 = (1 << 63) - 1

_READ_STATUS_CODES = {
    pb.OK: 206,
    pb.JOURNAL_NOT_FOUND: 404,
    pb.INSUFFICIENT_JOURNAL_BROKERS: 503,
    pb.OFFSET_NOT_YET_AVAILABLE: 416,
}
_GO_BOOLS = {
    **dict.fromkeys(("1", "t", "T", "TRUE", "true", "True"), True),
    **dict.fromkeys(("0", "f", "F", "FALSE", "false", "False"), False),
}
_INT64 = re.compile(r"[+-]?[0-9]+")
_INT64_DIGITS = 19
"""Significant digits of the longest int64; int() of a longer string may exceed Python's limit."""


async def serve_read(
    stub: pb_grpc.JournalStub,
    conn: Connection,
    method: str,
    path: str,
    query: str,
    metadata: Metadata,
    endpoint_of: EndpointOf | None,
) -> None:
    """Answer a GET or HEAD (`method`) of the journal at `path` through `stub`'s Read."""
    req = pb.ReadRequest(metadata_only=method == "HEAD")
    try:
        req.offset, req.block = read_params(query)
        req.journal = journal_of(path)
        validate_read_request(req)
    except (BadRequest, ValidationError) as err:
        await conn.error(400, str(err))
        return

    call = stub.Read(req, metadata=metadata)
    try:
        await _relay_read(conn, method, path, req.offset, call, endpoint_of)
    finally:
        call.cancel()  # A no-op once the RPC has ended; otherwise the broker stops reading.


def read_params(query: str) -> tuple[int, bool]:
    """`offset` and `block` of a GET or HEAD query, decoded as Go's gorilla/schema does."""
    offset, block = 0, False
    errors: list[str] = []
    for key, values in parse_query(query).items():
        field = key.casefold()  # Field names match case-insensitively.
        if field not in ("offset", "block"):
            errors.append(f"schema: invalid path {go_quote(key)}")
            continue
        value = values[-1]
        if value == "":
            continue  # An empty value leaves the field as it was.
        if field == "offset":
            parsed = _parse_int64(value)
            if parsed is not None:
                offset = parsed
                continue
        elif value in _GO_BOOLS:
            block = _GO_BOOLS[value]
            continue
        errors.append(f"schema: error converting value for {go_quote(key)}")
    if errors:
        raise BadRequest(multi_error(errors))
    return offset, block


def _parse_int64(value: str) -> int | None:
    """`value` as Go's strconv.ParseInt(value, 10, 64) reads it (leading zeros and all), or None."""
    if not _INT64.fullmatch(value):
        return None
    digits = value.lstrip("+-").lstrip("0") or "0"
    if len(digits) > _INT64_DIGITS:  # Out of range, and int() may refuse that many digits.
        return None
    parsed = -int(digits) if value.startswith("-") else int(digits)
    return parsed if -MAX_INT64 - 1 <= parsed <= MAX_INT64 else None


async def _relay_read(
    conn: Connection,
    method: str,
    path: str,
    offset: int,
    call: grpc.aio.UnaryStreamCall,
    endpoint_of: EndpointOf | None,
) -> None:
    try:
        first = await call.read()
    except grpc.aio.AioRpcError as err:
        await conn.error(rpc_error_status(err), rpc_error_text(err))
        return
    if first is grpc.aio.EOF:
        await conn.error(500, "EOF")
        return

    problem = _frame_problem(first, offset)
    if first.status != pb.OK:
        # The status is the answer, as in Go, even from a frame that fails validation.
        headers = _read_headers(first, path, endpoint_of)
        await conn.error(_READ_STATUS_CODES.get(first.status, 500), pb.Status.Name(first.status), headers)
        return
    if problem is not None:
        await conn.error(500, problem)
        return

    # A first frame beyond the requested offset is not an error: this is how offset -1 and
    # deleted ranges resolve, and Content-Range tells the client where the content starts.
    headers = _read_headers(first, path, endpoint_of)
    if method == "HEAD":
        await conn.start_response(206, headers)
        await conn.end_response()
        return
    head = _Head([*headers, ("Trailer", CLOSE_ERROR_HEADER)])
    offset = first.offset
    if first.content:
        await head.send(conn, first.content)
        offset += len(first.content)
    reason = await _copy_content(conn, head, call, offset)
    await head.send(conn, b"")
    await conn.end_response([(CLOSE_ERROR_HEADER, reason)])


class _Head:
    """A GET's 206 head, sent as Go's net/http sends it: with the first content (whose type then
    goes in `Content-Type`, as `detect_content_type` sniffs it), or at the read's end, typeless, if
    it ends with none. Until then the client has nothing, as from Gazette's gateway."""

    def __init__(self, headers: Headers) -> None:
        self.headers: Headers | None = headers

    async def send(self, conn: Connection, content: bytes) -> None:
        """Send `content` (none: only the head, if still due), after the head if it is due."""
        if self.headers is not None:
            headers, self.headers = self.headers, None
            if content:
                headers.append(("Content-Type", detect_content_type(content)))
            await conn.start_response(206, headers)
        if content:
            await conn.send_data(content)


async def _copy_content(conn: Connection, head: _Head, call: grpc.aio.UnaryStreamCall, offset: int) -> str:
    """Send content frames to the client until the stream ends; return why it ended."""
    while True:
        try:
            resp = await call.read()
        except grpc.aio.AioRpcError as err:
            return rpc_error_text(err)
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
            await head.send(conn, resp.content)
            offset += len(resp.content)


def _read_headers(resp: pb.ReadResponse, path: str, endpoint_of: EndpointOf | None) -> Headers:
    headers = route_headers(resp.header.route, path, endpoint_of) if resp.HasField("header") else []
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


def _frame_problem(resp: pb.ReadResponse, offset: int) -> str | None:
    """The error a Go Reader reports for this frame when read at `offset`, if any."""
    try:
        validate_read_response(resp)
    except ValidationError as err:
        return str(err.with_context("ReadResponse"))
    if resp.status == pb.OK and resp.offset < offset:
        return f"invalid ReadResponse offset ({resp.offset}; expected >= {offset})"
    return None
