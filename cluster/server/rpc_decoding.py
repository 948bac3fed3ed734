"""Requests that do not decode: their RPC ends with INTERNAL, as grpc-go answers ("grpc: error
unmarshalling request: ..."), instead of grpcio's UNKNOWN and a traceback in the broker's log.

grpcio runs a method's request deserializer where an exception is "unexpected": before a unary
handler is called, or inside a streaming handler's request iterator. `tolerant` wraps a method
handler so that its deserializer returns an `Undecodable` instead of raising, and its behaviour
aborts the RPC when it meets one.

`tolerant` also caps the details of the statuses a handler ends its RPC with (`MAX_DETAILS`): they
echo what the client sent (a 100,000-character store URL that is not absolute, say), and a grpcio
client refuses response metadata past 8 KiB, so such a status reached it as RESOURCE_EXHAUSTED
("received metadata size exceeds soft limit") instead of the INVALID_ARGUMENT it was.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import grpc

MAX_DETAILS = 2048
"""Bytes (UTF-8) of a status's details kept; percent-encoded, at most three times as many are sent."""


def capped(details: str) -> str:
    """`details`, cut at MAX_DETAILS bytes (on a character boundary) with a note of how much was cut."""
    data = details.encode("utf-8", "replace")
    if len(data) <= MAX_DETAILS:
        return details
    kept = data[:MAX_DETAILS].decode("utf-8", "ignore")
    return f"{kept}... ({len(data) - len(kept.encode())} more bytes)"


class _CappedContext:
    """A handler's context whose abort and set_details cap the status details; all else is the context's."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> NoReturn:
        await self._context.abort(code, capped(details), trailing_metadata)
        raise AssertionError("unreachable")

    def set_details(self, details: str) -> None:
        self._context.set_details(capped(details))


class Undecodable:
    """A request message that did not decode, and why."""

    def __init__(self, error: Exception) -> None:
        self.error = error


async def _abort(context: grpc.aio.ServicerContext, undecodable: Undecodable) -> NoReturn:
    await context.abort(grpc.StatusCode.INTERNAL, f"grpc: error unmarshalling request: {undecodable.error}")
    raise AssertionError("unreachable")


def _deserializer(parse: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        if parse is None:
            return data
        try:
            return parse(data)
        except Exception as exc:  # DecodeError, or a hand parser's ValueError: the bytes are the client's.
            return Undecodable(exc)

    return deserialize


class _Requests:
    """A streaming handler's requests, read with `context.read()`, ending the RPC with INTERNAL at a
    request that does not decode.

    grpc's own request iterator is an async generator over the same `read()`; reading directly
    spares that layer (and a generator of ours on top) on every message.
    """

    __slots__ = ("_context", "_ended")

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context
        self._ended = False

    def __aiter__(self) -> _Requests:
        return self

    async def __anext__(self) -> Any:
        if self._ended:
            raise StopAsyncIteration
        request = await self._context.read()
        if request is grpc.aio.EOF:
            self._ended = True
            raise StopAsyncIteration
        if isinstance(request, Undecodable):
            await _abort(self._context, request)
        return request


def tolerant(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """`handler`, ending its RPC with INTERNAL when a request message does not decode, and with
    status details capped at MAX_DETAILS bytes."""
    parse = _deserializer(handler.request_deserializer)
    serialize = handler.response_serializer
    if handler.unary_unary is not None:
        unary_unary = handler.unary_unary

        async def uu(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, Undecodable):
                await _abort(context, request)
            return await unary_unary(request, _CappedContext(context))

        return grpc.unary_unary_rpc_method_handler(uu, parse, serialize)
    if handler.unary_stream is not None:
        unary_stream = handler.unary_stream

        async def us(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                await _abort(context, request)
            async for response in unary_stream(request, _CappedContext(context)):
                yield response

        return grpc.unary_stream_rpc_method_handler(us, parse, serialize)
    if handler.stream_unary is not None:
        stream_unary = handler.stream_unary

        async def su(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            return await stream_unary(_Requests(context), _CappedContext(context))

        return grpc.stream_unary_rpc_method_handler(su, parse, serialize)
    stream_stream = handler.stream_stream

    async def ss(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for response in stream_stream(_Requests(context), _CappedContext(context)):
            yield response

    return grpc.stream_stream_rpc_method_handler(ss, parse, serialize)
