"""Appending: `Appender`, one Append RPC as a writer, and `append`, one whole append.

The RPC framing is Gazette's (`broker/client/appender.go`): the request's parameters, content chunks, an
empty chunk asking to commit, then end-of-stream. Closing the stream without the empty chunk,
or cancelling it, rolls the append back: none of its bytes become visible.

Whether an append committed is known exactly except in one case: the transport failed after
the empty chunk was sent (`commit_requested`), which raises `AppendOutcomeUnknown`. Any
transport failure before that point, and any non-OK status reply, means nothing was committed:
the broker commits only on the end of a stream that carried the empty chunk, and a status
reply is only ever sent instead of a commit. So does a call that a stopping broker accepted but
never began (see broker.protocol.metadata).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Iterable
from types import TracebackType
from typing import Any, Self

import grpc

from broker.client.dial import JournalClient
from broker.client.errors import AppendOutcomeUnknown, ProtocolError, TransportError, status_error
from broker.client.http_append import NotHttp
from broker.protocol import pb
from broker.protocol.metadata import WANT_APPEND_BEGUN, never_begun
from broker.protocol.validation import validate_append_request

CHUNK_SIZE = 1 << 20
"""Largest content message: big chunks stream fastest, and stay well under brokers' 4 MiB receive limit."""


def append_request(
    journal: str | pb.AppendRequest,
    *,
    offset: int | None = None,
    check_registers: pb.LabelSelector | None = None,
    union_registers: pb.LabelSet | None = None,
    subtract_registers: pb.LabelSet | None = None,
    suspend: int | None = None,
    do_not_proxy: bool | None = None,
) -> pb.AppendRequest:
    """A validated first AppendRequest: a copy of `journal` if it is one, with the given fields set."""
    req = pb.AppendRequest()
    if isinstance(journal, pb.AppendRequest):
        req.CopyFrom(journal)
    else:
        req.journal = journal
    if offset is not None:
        req.offset = offset
    if check_registers is not None:
        req.check_registers.CopyFrom(check_registers)
    if union_registers is not None:
        req.union_registers.CopyFrom(union_registers)
    if subtract_registers is not None:
        req.subtract_registers.CopyFrom(subtract_registers)
    if suspend is not None:
        req.suspend = suspend  # type: ignore[assignment]
    if do_not_proxy is not None:
        req.do_not_proxy = do_not_proxy
    if not req.journal:
        raise ValueError("an AppendRequest needs a journal")
    validate_append_request(req)
    return req


class Appender:
    """One Append RPC as a writer: `write` content, then `commit` (or `abort`).

    As an async context manager it commits on a clean exit and aborts on an exception. The RPC
    goes to the journal's primary when the route is cached (brokers proxy otherwise). A non-OK
    reply raises the StatusError named after it (e.g. WrongAppendOffset); a transport failure
    raises TransportError, or AppendOutcomeUnknown once the commit was asked for.
    """

    def __init__(
        self,
        client: JournalClient,
        request: str | pb.AppendRequest,
        *,
        offset: int | None = None,
        check_registers: pb.LabelSelector | None = None,
        union_registers: pb.LabelSet | None = None,
        subtract_registers: pb.LabelSet | None = None,
        suspend: int | None = None,
        do_not_proxy: bool | None = None,
    ) -> None:
        self.client = client
        self.request = append_request(
            request, offset=offset, check_registers=check_registers, union_registers=union_registers,
            subtract_registers=subtract_registers, suspend=suspend, do_not_proxy=do_not_proxy,
        )
        self.response: pb.AppendResponse | None = None
        """The broker's reply, once the append finished (also set for non-OK statuses)."""
        self.endpoint = ""
        self.commit_requested = False
        """Whether the end of the stream, which makes the broker commit, was sent (or may have been)."""
        self.written = 0
        """Content bytes written so far."""
        self._call: Any = None  # grpc.aio.StreamUnaryCall, once started.
        self._done = False

    @property
    def journal(self) -> str:
        return self.request.journal

    def _error_offset(self) -> int | None:
        return self.request.offset or None

    async def _ensure_started(self) -> None:
        if self._done:
            raise RuntimeError("the append already finished")
        if self._call is None:
            self.endpoint = self.client.endpoint(self.journal, primary=True)
            first = self.request
            revision = self.client.route_revision(self.journal)
            if revision > first.min_etcd_revision:
                # The broker the route names may not have seen it yet: have it catch up first.
                first = pb.AppendRequest()
                first.CopyFrom(self.request)
                first.min_etcd_revision = revision
            self._call = self.client.stub(self.endpoint).Append(metadata=WANT_APPEND_BEGUN)
            await self._send(first)

    async def _send(self, req: pb.AppendRequest) -> None:
        try:
            await self._call.write(req)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            # The call already ended: the broker replied early (e.g. a status) or the transport failed.
            await self._settle_early(exc)

    async def _settle_early(self, cause: BaseException) -> None:
        """Raise the outcome of a call that ended before the commit was asked for."""
        self._done = True
        try:
            resp = await self._call
        except grpc.aio.AioRpcError as exc:
            self._transport_failed(exc)
            unknown = self.commit_requested and await self._may_have_begun(exc)
            error = AppendOutcomeUnknown if unknown else TransportError
            raise error.from_rpc_error(
                exc, endpoint=self.endpoint, journal=self.journal, offset=self._error_offset()
            ) from exc
        self._finish(resp)
        raise ProtocolError("broker replied OK to an uncommitted append", journal=self.journal) from cause

    async def _may_have_begun(self, exc: grpc.aio.AioRpcError) -> bool:
        """False when the broker certainly never began the call (see broker.protocol.metadata)."""
        return not never_begun(exc.code(), exc.details(), await self._call.initial_metadata())

    def _transport_failed(self, exc: grpc.aio.AioRpcError) -> None:
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            self.client.failed(self.journal, self.endpoint)

    def _finish(self, resp: pb.AppendResponse) -> pb.AppendResponse:
        self.response = resp
        self.client.update_route(self.journal, resp.header)
        if resp.status != pb.OK:
            raise status_error(resp.status, journal=self.journal, offset=self._error_offset(), response=resp)
        return resp

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Send `data` as content (in chunks of at most CHUNK_SIZE). Nothing is visible before commit."""
        try:
            await self._ensure_started()
            view = memoryview(data)
            for begin in range(0, len(view), CHUNK_SIZE):
                await self._send(pb.AppendRequest(content=bytes(view[begin : begin + CHUNK_SIZE])))
        except BaseException:
            await self.abort()
            raise
        self.written += len(view)

    async def commit(self) -> pb.AppendResponse:
        """Ask the broker to commit, and return its OK reply; raises for anything else."""
        try:
            await self._ensure_started()
            # From the empty chunk on, the broker may commit: a transport failure leaves the outcome
            # unknown. (It commits only at the end of the stream, which follows; counting from the
            # chunk is the conservative choice.)
            self.commit_requested = True
            await self._send(pb.AppendRequest())
        except BaseException:
            await self.abort()
            raise
        self._done = True
        try:
            await self._call.done_writing()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # The call ended; awaiting it says how.
        try:
            resp = await self._call
        except grpc.aio.AioRpcError as exc:
            self._transport_failed(exc)
            error = AppendOutcomeUnknown if await self._may_have_begun(exc) else TransportError
            raise error.from_rpc_error(
                exc, endpoint=self.endpoint, journal=self.journal, offset=self._error_offset()
            ) from exc
        except asyncio.CancelledError:
            self._call.cancel()
            raise
        return self._finish(resp)

    async def abort(self) -> None:
        """Roll the append back by cancelling the RPC; a no-op once it finished."""
        self._done = True
        if self._call is not None and not self._call.done():
            # Cancelling resets the stream: the broker never sees the commit, so it rolls back.
            self._call.cancel()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            await self.commit()
        else:
            await self.abort()


async def append(
    client: JournalClient,
    journal: str | pb.AppendRequest,
    content: bytes | Iterable[bytes] | AsyncIterable[bytes],
    **params: Any,
) -> pb.AppendResponse:
    """Append `content` (bytes, or an iterable of chunks) atomically in one RPC; return the OK reply.

    `params` are AppendRequest fields, as for Appender. Raises as Appender does. A plain append
    (no `params`) of bytes (up to 64 MiB) to an `http://` broker goes as one HTTP PUT
    on a kept-alive connection, the cheapest round trip (see broker.client.http_append); its reply
    has the commit, the route and the registers, not the header's process and etcd revision (pass
    `params` for a gRPC Append).
    """
    if not params and isinstance(journal, str) and isinstance(content, bytes | bytearray | memoryview):
        resp = await put_if_http(client, journal, content)
        if resp is not None:
            return resp
    app = Appender(client, journal, **params)
    try:
        if isinstance(content, bytes | bytearray | memoryview):
            await app.write(content)
        elif isinstance(content, AsyncIterable):
            async for chunk in content:
                await app.write(chunk)
        else:
            for chunk in content:
                await app.write(chunk)
    except BaseException:
        await app.abort()
        raise
    return await app.commit()


async def put_if_http(
    client: JournalClient, journal: str, content: bytes | bytearray | memoryview
) -> pb.AppendResponse | None:
    """A plain append of `content` to `journal` as one HTTP PUT, if the client's path to the
    journal's primary takes one (see broker.client.http_append): its OK reply, or it raises as an
    Appender would. None if not, having appended nothing: the caller makes a gRPC Append."""
    endpoint = client.endpoint(journal, primary=True)
    if client.http_appends is None or not client.http_appends.takes(endpoint, len(content)):
        return None
    try:
        resp = await client.http_appends.append(endpoint, journal, content, client.authorization())
    except NotHttp:
        return None  # A gRPC-only endpoint, which appended nothing.
    except TransportError as exc:
        if exc.code == grpc.StatusCode.UNAVAILABLE:
            client.failed(journal, endpoint)
        raise
    if resp.header.route.members:
        client.update_route(journal, resp.header)
    return resp
