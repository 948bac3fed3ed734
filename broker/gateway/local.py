"""The broker's own Journal service called in-process, in the shape of a grpc.aio stub.

The HTTP gateway answers GET, HEAD and PUT through Read and Append calls. In Gazette it calls the
broker's gRPC loopback; a gRPC round trip through grpc.aio costs more than the append it carries,
so a broker's gateway calls its `JournalService` directly: `LocalJournalStub(service)` offers
`Read(request, metadata=...)` with grpc.aio's call semantics (`read()` to `grpc.aio.EOF`,
`cancel()`), and `append(request, content, metadata)`, which runs the whole Append in the caller's
task (a PUT pays no task, queue or hand-off per request). A handler's `context.abort(code,
details)` (or an unexpected exception, as INTERNAL) is raised as `grpc.aio.AioRpcError`. The
request's metadata (its `authorization`) is the handler's `invocation_metadata()`, so
authorization is checked as for any gRPC caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import grpc

from broker.append_requests import ContentChunk
from broker.protocol import pb

if TYPE_CHECKING:
    from broker.service import JournalService

log = logging.getLogger(__name__)

Metadata = Sequence[tuple[str, str]]


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class LocalContext:
    """The part of `grpc.aio.ServicerContext` the Journal handlers use."""

    def __init__(self, metadata: Metadata | None) -> None:
        self._metadata = tuple(metadata or ())

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    async def send_initial_metadata(self, _metadata: Any) -> None:
        pass

    async def abort(self, code: grpc.StatusCode, details: str = "", _trailing: Any = None) -> NoReturn:
        raise _Aborted(code, details)


def _rpc_error(exc: BaseException, method: str) -> grpc.aio.AioRpcError:
    """The AioRpcError a gRPC client would have seen for a handler's exception."""
    empty = grpc.aio.Metadata()
    if isinstance(exc, _Aborted):
        return grpc.aio.AioRpcError(exc.code, empty, empty, exc.details)
    log.warning("in-process %s failed: %s: %s", method, type(exc).__name__, exc)
    log.debug("in-process %s failure", method, exc_info=exc)
    return grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, empty, empty, f"{type(exc).__name__}: {exc}")


class LocalReadCall:
    """A Read in progress: `await read()` gives each ReadResponse, then `grpc.aio.EOF`."""

    def __init__(self, responses: AsyncIterator[pb.ReadResponse]) -> None:
        self._responses = responses
        self._done = False

    async def read(self) -> Any:
        if self._done:
            return grpc.aio.EOF
        try:
            return await anext(self._responses)
        except StopAsyncIteration:
            self._done = True
            return grpc.aio.EOF
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._done = True
            raise _rpc_error(exc, "Read") from None

    def cancel(self) -> bool:
        """Stop the read (its generator is closed in the background)."""
        if self._done:
            return False
        self._done = True
        closing = asyncio.ensure_future(_close(self._responses))
        closing.add_done_callback(_ignore)
        return True


async def _close(responses: AsyncIterator[pb.ReadResponse]) -> None:
    aclose = getattr(responses, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


def _ignore(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


class LocalJournalStub:
    """`Read` and `Append` of a JournalService, called in-process (see the module's doc)."""

    def __init__(self, service: JournalService) -> None:
        self._service = service

    def Read(self, request: pb.ReadRequest, metadata: Metadata | None = None) -> LocalReadCall:
        return LocalReadCall(self._service.Read(request, LocalContext(metadata)))

    async def append(
        self, request: pb.AppendRequest, content: AsyncIterator[bytes], metadata: Metadata | None = None
    ) -> pb.AppendResponse:
        """Append `request` (its journal and options) with each chunk of `content`, then commit; run
        in the caller's task, whose cancellation rolls the append back unless it committed."""
        try:
            return await self._service.Append(_append_requests(request, content), LocalContext(metadata))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise _rpc_error(exc, "Append") from None


async def _append_requests(
    first: pb.AppendRequest, content: AsyncIterator[bytes]
) -> AsyncIterator[pb.AppendRequest | ContentChunk]:
    """An Append's request stream: `first`, the content's non-empty chunks, the commit's empty request."""
    yield first
    async for chunk in content:
        if chunk:
            yield ContentChunk(memoryview(chunk))
    yield pb.AppendRequest()


__all__ = ["LocalJournalStub"]
