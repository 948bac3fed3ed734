"""PUT of a journal: the request body relayed into an Append RPC, as Gazette's gateway does.

The query takes no parameters. The body goes to the broker as it arrives (in APPEND_CHUNK
messages of a gRPC Append; to a broker's own service, in-process, in pieces of LANDING_CHUNK or
more), and is committed only once all of it has; a 204 response then gives the commit's offsets
and SHA-1 sum (`X-Commit-*`), the write head and the route.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from broker.fragment.sums import sha1sum_hex
from broker.gateway.local import LocalJournalStub
from broker.gateway.request import Metadata, journal_of, multi_error
from broker.gateway.responses import (
    COMMIT_BEGIN_HEADER,
    COMMIT_END_HEADER,
    COMMIT_SUM_HEADER,
    REGISTERS_HEADER,
    WRITE_HEAD_HEADER,
    EndpointOf,
    registers_token,
    route_headers,
    rpc_error_status,
    rpc_error_text,
)
from broker.protocol import pb, pb_grpc
from broker.protocol.paths import go_quote
from broker.protocol.validation import ValidationError, validate_append_request, validate_append_response
from cluster.server.http.codec import BodyError
from cluster.server.http.connection import Connection
from cluster.server.http.request import BadRequest, parse_query

APPEND_CHUNK = 1 << 20
"""Request body bytes sent per AppendRequest: large, as grpc.aio is slow per message."""
LANDING_CHUNK = 256 << 10
"""Request body bytes an in-process append waits for before handing them on: few enough that a
large PUT is written and hashed while it arrives, enough that a replicated journal's peers get a
few large Replicate messages rather than one per socket read."""


async def serve_append(
    stub: pb_grpc.JournalStub | LocalJournalStub,
    conn: Connection,
    path: str,
    query: str,
    metadata: Metadata,
    endpoint_of: EndpointOf | None,
) -> None:
    """Answer a PUT to the journal at `path`: append the request body through `stub`'s Append."""
    req = pb.AppendRequest()
    try:
        append_params(query)
        req.journal = journal_of(path)
        validate_append_request(req)
    except (BadRequest, ValidationError) as err:
        await conn.error(400, str(err))
        return
    if not req.journal:
        # Validation passes an empty journal (that is a content message); Go's Appender then
        # refuses to start the RPC.
        await conn.error(500, "expected Request.Journal")
        return

    resp: pb.AppendResponse | None
    body = _Body(conn)
    if isinstance(stub, LocalJournalStub):
        try:
            resp = await stub.append(req, body.chunks(), metadata)
        except grpc.aio.AioRpcError as err:
            if body.error is not None:
                # As Gazette's gateway: the append is aborted, and the body's error is the answer.
                await conn.error(500, str(body.error))
            else:
                await conn.error(rpc_error_status(err), rpc_error_text(err))
            return
    else:
        call = stub.Append(metadata=metadata)
        try:
            resp = await _relay_append(conn, req, call, body)
        except BodyError as err:
            call.cancel()
            await conn.error(500, str(err))
            return
        finally:
            call.cancel()  # A no-op once the RPC has ended; otherwise the append rolls back.
    if resp is not None:
        await _answer(conn, path, resp, endpoint_of)


def append_params(query: str) -> None:
    """Check a PUT query: it takes no parameters at all."""
    errors = [f"schema: invalid path {go_quote(key)}" for key in parse_query(query)]
    if errors:
        raise BadRequest(multi_error(errors))


class _Body:
    """A PUT's request body, read for an append; `error` is why it could not be read to its end
    (malformed or cut short), once that happened."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.error: BodyError | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, in pieces of LANDING_CHUNK to APPEND_CHUNK bytes (the last may be
        smaller): the broker writes and hashes each while the next one arrives."""
        while (chunk := await self.read(APPEND_CHUNK, at_least=LANDING_CHUNK)) is not None:
            yield chunk

    async def read(self, size: int, at_least: int | None = None) -> bytes | None:
        try:
            return await self._conn.read_body(size, at_least=at_least)
        except BodyError as err:
            self.error = err
            raise


async def _relay_append(
    conn: Connection, req: pb.AppendRequest, call: grpc.aio.StreamUnaryCall, body: _Body
) -> pb.AppendResponse | None:
    """Relay the PUT into the Append RPC `call`; its checked response, or None having answered an error.
    Raises BodyError for a body that cannot be read to its end."""
    sending = await _send(call, req)
    while sending:
        chunk = await body.read(APPEND_CHUNK)
        if chunk is None:
            break
        sending = await _send(call, pb.AppendRequest(content=chunk))
    # An empty chunk commits; it is sent only once the whole body has arrived.
    if sending and await _send(call, pb.AppendRequest()):
        await call.done_writing()
    try:
        resp: pb.AppendResponse = await call
    except grpc.aio.AioRpcError as err:
        await conn.error(rpc_error_status(err), rpc_error_text(err))
        return None
    try:
        validate_append_response(resp)
    except ValidationError as err:
        await conn.error(500, f"validating broker response: {err}")
        return None
    return resp


async def _answer(conn: Connection, path: str, resp: pb.AppendResponse, endpoint_of: EndpointOf | None) -> None:
    """Answer the PUT with the Append's response: 204 with the commit, or the status as an error."""
    if resp.status == pb.FRAGMENT_STORE_UNHEALTHY and resp.store_health_error:
        await conn.error(500, f"{resp.store_health_error}: FRAGMENT_STORE_UNHEALTHY")
        return
    if resp.status != pb.OK:
        await conn.error(500, pb.Status.Name(resp.status))
        return

    headers = route_headers(resp.header.route, path, endpoint_of)
    if resp.HasField("commit"):
        commit = resp.commit
        headers += [
            (COMMIT_BEGIN_HEADER, str(commit.begin)),
            (COMMIT_END_HEADER, str(commit.end)),
            (WRITE_HEAD_HEADER, str(commit.end)),
            (COMMIT_SUM_HEADER, sha1sum_hex(commit.sum)),
        ]
    if resp.registers.labels:
        headers.append((REGISTERS_HEADER, registers_token(resp.registers)))
    await conn.start_response(204, headers)
    await conn.end_response()


async def _send(call: grpc.aio.StreamUnaryCall, req: pb.AppendRequest) -> bool:
    """Send `req` on the Append stream; False if the broker has already answered."""
    try:
        await call.write(req)
    except (asyncio.InvalidStateError, grpc.aio.AioRpcError):
        return False  # The RPC has ended; its answer is read from the call.
    return True
