"""Reading journals: `Reader` (one Read RPC as an async byte stream) and `RetryReader`.

`read()` follows Gazette's Reader contract (`broker/client/reader.go`): it raises `OffsetJump` when the
broker continues past the requested offset (for -1, or removed content) and the reader stays
usable; a non-OK status ends the read with its `StatusError`. Iterating (`async for chunk in
reader`) is the convenient form: it continues across offset jumps and ends, for non-blocking
reads, at the write head.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, Self

import grpc

from broker.client.dial import JournalClient
from broker.client.errors import (
    FragmentReadError,
    InsufficientJournalBrokers,
    JournalNotFound,
    NoJournalPrimaryBroker,
    NotAllowed,
    NotJournalBroker,
    NotJournalPrimaryBroker,
    OffsetJump,
    OffsetNotYetAvailable,
    ProtocolError,
    SeekRequiresNewReader,
    StatusError,
    Suspended,
    TransportError,
    UnexpectedEOF,
    WrongRoute,
    status_error,
)
from broker.client.fragments import FragmentReader, open_fragment_url
from broker.client.http_read import HttpRead, NotHttp, takes_request
from broker.client.retry import DEFAULT_MAX_BACKOFF, FATAL_CODES, backoff
from broker.protocol import pb
from broker.protocol.validation import ValidationError, validate_read_request, validate_read_response

log = logging.getLogger(__name__)

JOURNAL_NOT_FOUND_RETRIES = 3
"""How often a RetryReader retries JOURNAL_NOT_FOUND: a just-created journal may not yet be everywhere."""


def read_request(
    journal: str | pb.ReadRequest,
    *,
    offset: int | None = None,
    block: bool | None = None,
    do_not_proxy: bool | None = None,
    metadata_only: bool | None = None,
    end_offset: int | None = None,
    begin_mod_time: int | None = None,
) -> pb.ReadRequest:
    """A validated ReadRequest: a copy of `journal` if it is one, with the given fields set."""
    req = pb.ReadRequest()
    if isinstance(journal, pb.ReadRequest):
        req.CopyFrom(journal)
    else:
        req.journal = journal
    fields: dict[str, Any] = {
        "offset": offset, "block": block, "do_not_proxy": do_not_proxy, "metadata_only": metadata_only,
        "end_offset": end_offset, "begin_mod_time": begin_mod_time,
    }
    for name, value in fields.items():
        if value is not None:
            setattr(req, name, value)
    validate_read_request(req)
    return req


class Reader:
    """One Read RPC of a journal as an async byte stream.

    `request.offset` is always the offset of the next byte `read` returns. `response` is the
    latest metadata frame: its `fragment`, `write_head` and `fragment_url`. With `do_not_proxy`,
    a fragment which is persisted is not streamed by the broker: the Reader opens its
    `fragment_url` itself (under the client's `file_root` for `file://` URLs), decompresses it
    and skips to the offset; the read then ends at the fragment's end (RetryReader continues).

    The read ends (b"") when the broker closes the stream, at `end_offset`, or at the end of a
    directly read fragment. A Reader is spent after its first error, except OffsetJump.

    A plain read (no `do_not_proxy`, `metadata_only` or `begin_mod_time`) of an `http://` broker
    is an HTTP GET of the broker's gateway rather than a Read RPC, at a fraction of its cost (see
    broker.client.http_read; JournalClient(http_reads=False) turns that off). It reads the same
    bytes and raises the same errors, but `fragment` and `write_head` are those of the read's
    start, `fragment_url` is empty, `header` carries the route alone, and a chunk is what arrived
    (a Read RPC's end at fragment ends): a caller that follows fragments (e.g. to find append
    boundaries at their ends) asks for `fragment_metadata`.
    """

    def __init__(
        self,
        client: JournalClient,
        request: str | pb.ReadRequest,
        *,
        offset: int | None = None,
        block: bool | None = None,
        do_not_proxy: bool | None = None,
        metadata_only: bool | None = None,
        end_offset: int | None = None,
        begin_mod_time: int | None = None,
        fragment_metadata: bool = False,
    ) -> None:
        self.client = client
        self.fragment_metadata = fragment_metadata
        """Whether `fragment` and `write_head` follow the read across fragments (a Read RPC, never a GET)."""
        self.request = read_request(
            request, offset=offset, block=block, do_not_proxy=do_not_proxy, metadata_only=metadata_only,
            end_offset=end_offset, begin_mod_time=begin_mod_time,
        )
        self.response = pb.ReadResponse()
        """The latest metadata (non-content) frame of the stream."""
        self.header: pb.Header | None = None
        """The header of the stream's first frame: the serving broker and the journal's route."""
        self.endpoint = ""
        """The broker endpoint the RPC went to."""
        self._call: Any = None  # grpc.aio.UnaryStreamCall or HttpRead, once started.
        self._content = b""  # Unreturned content; it begins at request.offset.
        self._direct: FragmentReader | None = None
        self._last_was_metadata = False  # Whether the latest frame was `response` (not content).
        self._finished = False

    @property
    def journal(self) -> str:
        return self.request.journal

    @property
    def offset(self) -> int:
        """The journal offset of the next byte to be read (-1 until the broker resolves it)."""
        return self.request.offset

    @property
    def write_head(self) -> int:
        """The journal's write head as of the latest metadata frame (0 before the first)."""
        return self.response.write_head

    @property
    def fragment(self) -> pb.Fragment | None:
        """The fragment being read, per the latest metadata frame."""
        return self.response.fragment if self.response.HasField("fragment") else None

    @property
    def fragment_url(self) -> str:
        """The signed URL of the fragment being read, if the broker sent one."""
        return self.response.fragment_url

    async def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes (a whole received chunk if negative); b"" when the read has ended.

        Blocks while a blocking read waits for content. Raises OffsetJump (and stays usable),
        a StatusError for a non-OK status, TransportError, or FragmentReadError/UnexpectedEOF for a
        directly read fragment.
        """
        if size == 0:
            raise ValueError("read size must be positive, or negative for a whole chunk")
        try:
            while True:
                if self._direct is not None:
                    return await self._read_direct(size)
                if self._content:
                    return self._take(size)
                if self._finished:
                    return b""
                if self._call is None:
                    self._start()
                msg = await self._receive()
                if msg is None:
                    await self._on_stream_end()
                elif isinstance(msg, bytes):  # Content, over HTTP: it continues at the offset read so far.
                    self._content = msg
                    self._last_was_metadata = False
                else:
                    self._on_message(msg)
        except BaseException as exc:
            if not isinstance(exc, OffsetJump):
                await self._teardown()
            raise

    def _take(self, size: int) -> bytes:
        n = len(self._content) if size < 0 else min(size, len(self._content))
        out, self._content = self._content[:n], self._content[n:]
        self.request.offset += len(out)
        return out

    def _start(self) -> None:
        self.endpoint = self.client.endpoint(self.journal, primary=False)
        self.response = pb.ReadResponse()
        client = self.client
        if (not self.fragment_metadata and client.http_reads and client.http.takes(self.endpoint)
                and takes_request(self.request)):
            self._call = HttpRead(client.http, self.endpoint, self.request, client.authorization())
            return
        req = self.request
        revision = self.client.route_revision(self.journal)
        if revision > req.min_etcd_revision:
            # The broker the route names may not have seen it yet: have it catch up first.
            req = pb.ReadRequest()
            req.CopyFrom(self.request)
            req.min_etcd_revision = revision
        self._call = self.client.stub(self.endpoint).Read(req)

    async def _receive(self) -> pb.ReadResponse | bytes | None:
        """The next frame (content as bytes over HTTP), or None at the end of the stream."""
        if isinstance(self._call, HttpRead):
            return await self._receive_http(self._call)
        try:
            msg = await self._call.read()
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                self.client.failed(self.journal, self.endpoint)
            raise TransportError.from_rpc_error(
                exc, endpoint=self.endpoint, journal=self.journal, offset=self.offset
            ) from exc
        if msg is grpc.aio.EOF:
            return None
        assert isinstance(msg, pb.ReadResponse)
        return msg

    async def _receive_http(self, call: HttpRead) -> pb.ReadResponse | bytes | None:
        try:
            msg = await call.receive()
        except NotHttp:
            self._start()  # A gRPC-only endpoint, which did nothing with the GET: a Read RPC.
            return await self._receive()
        except TransportError as exc:
            if exc.code == grpc.StatusCode.UNAVAILABLE:
                self.client.failed(self.journal, self.endpoint)
            raise
        if call.header is not None and self.header is not call.header:
            self.header = call.header
            self.client.update_route(self.journal, call.header)
        return msg

    def _on_message(self, msg: pb.ReadResponse) -> None:
        try:
            validate_read_response(msg)
        except ValidationError as exc:
            raise ProtocolError(f"invalid ReadResponse: {exc}", journal=self.journal, offset=self.offset) from None
        if msg.status == pb.OK and msg.offset < self.request.offset:
            raise ProtocolError(
                f"invalid ReadResponse offset ({msg.offset}; expected >= {self.request.offset})",
                journal=self.journal, offset=self.offset,
            )
        if msg.HasField("header"):
            self.header = msg.header
            self.client.update_route(self.journal, msg.header)
        self._last_was_metadata = not msg.content
        if msg.content:
            self._content = msg.content
        else:
            self.response = msg
        if self.request.offset < msg.offset:
            requested, self.request.offset = self.request.offset, msg.offset
            raise OffsetJump(journal=self.journal, offset=requested, to=msg.offset)

    async def _on_stream_end(self) -> None:
        self._call = None
        resp = self.response
        # Only a stream that ends right after a fragment's metadata leaves the fragment to us; one
        # that ends amid content was cut short (e.g. the broker is stopping), and is read again.
        if (
            self._last_was_metadata
            and resp.status == pb.OK
            and resp.fragment_url
            and not self.request.metadata_only
            and resp.HasField("fragment")
            and resp.fragment.begin <= self.request.offset < resp.fragment.end
            and (self.request.end_offset == 0 or self.request.offset < self.request.end_offset)
        ):
            self._direct = await open_fragment_url(
                resp.fragment, resp.fragment_url, self.request.offset, file_root=self.client.file_root
            )
            return
        self._finished = True
        if resp.status != pb.OK:
            raise status_error(resp.status, journal=self.journal, offset=self.offset, response=resp)

    async def _read_direct(self, size: int) -> bytes:
        assert self._direct is not None
        end = self.request.end_offset
        if end != 0:
            remain = end - self.request.offset
            size = remain if size < 0 else min(size, remain)
        data = await self._direct.read(size) if size != 0 else b""
        if not data:
            await self._teardown()
            return b""
        self.request.offset += len(data)
        return data

    async def seek(self, offset: int) -> int:
        """Move forward to `offset` within the directly read fragment (a no-op at the current offset).

        Raises SeekRequiresNewReader otherwise: RetryReader.seek handles that by restarting.
        """
        if offset == self.request.offset:
            return offset
        direct = self._direct
        if direct is None or not self.request.offset < offset < direct.fragment.end:
            raise SeekRequiresNewReader("seek needs a new read", journal=self.journal, offset=offset)
        await direct.skip_to(offset)
        self.request.offset = offset
        return offset

    async def _teardown(self) -> None:
        self._finished = True
        self._content = b""
        if self._call is not None:
            call, self._call = self._call, None
            call.cancel()
        if self._direct is not None:
            direct, self._direct = self._direct, None
            await direct.close()

    async def close(self) -> None:
        """End the RPC (if any) and close a directly read fragment."""
        await self._teardown()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return _chunks(self)


async def _chunks(reader: Reader | RetryReader) -> AsyncIterator[bytes]:
    """Chunks of `reader` until it ends; continues across offset jumps; a non-blocking read ends at the head."""
    while True:
        try:
            data = await reader.read()
        except OffsetJump as jump:
            if jump.offset != -1:
                log.warning("offset jump", extra={"journal": jump.journal, "from": jump.offset, "to": jump.to})
            continue
        except OffsetNotYetAvailable:
            return
        if not data:
            return
        yield data


# Statuses a RetryReader waits out: the cluster is converging on new assignments.
_ROUTING_ERRORS = (NotJournalBroker, InsufficientJournalBrokers, NoJournalPrimaryBroker, NotJournalPrimaryBroker,
                   WrongRoute)


class RetryReader:
    """A Reader which restarts on transport errors, broker restarts and route changes.

    Each restart reads on from `offset`, so no byte is lost or repeated. `read` raises only
    OffsetJump (the reader stays usable), OffsetNotYetAvailable for a non-blocking read at the
    write head, JournalNotFound (after a few tries), NotAllowed, Suspended (non-blocking),
    ProtocolError, ConfigError, and cancellation; everything else is retried with backoff up to
    `max_backoff`.
    """

    def __init__(
        self,
        client: JournalClient,
        request: str | pb.ReadRequest,
        *,
        offset: int | None = None,
        block: bool | None = None,
        do_not_proxy: bool | None = None,
        metadata_only: bool | None = None,
        end_offset: int | None = None,
        begin_mod_time: int | None = None,
        fragment_metadata: bool = False,
        max_backoff: float = DEFAULT_MAX_BACKOFF,
    ) -> None:
        self.client = client
        self.max_backoff = max_backoff
        self.reader = Reader(
            client, request, offset=offset, block=block, do_not_proxy=do_not_proxy, metadata_only=metadata_only,
            end_offset=end_offset, begin_mod_time=begin_mod_time, fragment_metadata=fragment_metadata,
        )
        self.restarts = 0
        """How many times the underlying Reader was restarted (after errors or a closed stream)."""
        self._progress = False  # Whether the current Reader returned content.

    @property
    def journal(self) -> str:
        return self.reader.journal

    @property
    def offset(self) -> int:
        """The journal offset of the next byte to be read."""
        return self.reader.offset

    @property
    def write_head(self) -> int:
        return self.reader.write_head

    @property
    def fragment(self) -> pb.Fragment | None:
        return self.reader.fragment

    def _restart(self) -> None:
        self.reader = Reader(self.client, self.reader.request, fragment_metadata=self.reader.fragment_metadata)
        self.restarts += 1
        self._progress = False

    async def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes (a whole chunk if negative); b"" only at `end_offset` or after `metadata_only`."""
        if size == 0:
            raise ValueError("read size must be positive, or negative for a whole chunk")
        attempt = 0
        while True:
            req = self.reader.request
            try:
                data = await self.reader.read(size)
            except OffsetJump:
                raise
            except OffsetNotYetAvailable as exc:
                self._restart()
                if not req.block:
                    raise
                self._note(exc, attempt, squelch=True)
            except JournalNotFound as exc:
                self._restart()
                if attempt >= JOURNAL_NOT_FOUND_RETRIES:
                    raise
                self._note(exc, attempt)
            except Suspended as exc:
                self._restart()
                if not req.block:
                    raise
                self._note(exc, attempt)
            except (NotAllowed, ProtocolError):
                raise
            except _ROUTING_ERRORS as exc:
                self._restart()
                self._note(exc, attempt, squelch=attempt == 0)
            except (StatusError, TransportError, FragmentReadError, UnexpectedEOF) as exc:
                if isinstance(exc, TransportError) and exc.code in FATAL_CODES:
                    raise  # A refused token or request: retrying cannot help.
                self._restart()
                self._note(exc, attempt)
            else:
                if data:
                    self._progress = True
                    return data
                if req.metadata_only or (req.end_offset != 0 and req.offset >= req.end_offset):
                    return b""
                # The stream ended (broker shutting down, assignment moved, fragment read through):
                # restart at once after progress, else back off so a failing broker is not spun on.
                progressed = self._progress
                self._restart()
                if progressed:
                    attempt = 0
                    continue
            await asyncio.sleep(backoff(attempt, self.max_backoff))
            attempt += 1

    def _note(self, exc: BaseException, attempt: int, squelch: bool = False) -> None:
        level = logging.DEBUG if squelch else logging.WARNING
        log.log(level, "read failed; will retry",
                extra={"journal": self.journal, "offset": self.offset, "error": str(exc), "attempt": attempt})

    async def seek(self, offset: int) -> int:
        """Continue reading at `offset`: within the open fragment if possible, else with a new Read RPC."""
        try:
            return await self.reader.seek(offset)
        except SeekRequiresNewReader:
            await self.reader.close()
            req = pb.ReadRequest()
            req.CopyFrom(self.reader.request)
            req.offset = offset
            self.reader = Reader(self.client, req, fragment_metadata=self.reader.fragment_metadata)
            self._progress = False
            return offset

    async def close(self) -> None:
        """End the current Read RPC."""
        await self.reader.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return _chunks(self)
