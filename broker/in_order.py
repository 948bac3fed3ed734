"""Blocking calls run in a worker thread one after another, in the order they were submitted."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class InOrder:
    """A queue of calls that one worker thread at a time drains, in submission order.

    It lets the event loop queue a chunk's spool write or hashing and go on receiving the next
    chunk, while the writes themselves still land in order. The worker takes the next call as
    soon as one ends, without a round trip through the event loop. Once a call fails, the calls
    queued behind it fail with the same exception without running, until `settle()`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[tuple[Callable[..., Any], tuple[Any, ...], asyncio.Future[Any]]] = deque()
        self._draining = False
        self._failed: BaseException | None = None
        self._last: asyncio.Future[Any] | None = None

    def submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run `fn(*args)` in a worker thread after every earlier submission."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            self._queue.append((fn, args, future))
            start, self._draining = not self._draining, True
        if start:
            loop.run_in_executor(None, self._drain, loop)
        self._last = future
        return future

    async def settle(self) -> None:
        """Wait until every submitted call has ended, failed or not; then forget any failure."""
        last = self._last
        if last is not None:
            await asyncio.gather(last, return_exceptions=True)
            if self._last is last:
                self._last = None  # Settled: the next settle() has nothing to wait for.
        self._failed = None

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._draining = False
                    return
                fn, args, future = self._queue.popleft()
            if self._failed is not None:
                loop.call_soon_threadsafe(_resolve, future, None, self._failed)
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # Handed to the awaiting coroutine, like to_thread does.
                self._failed = exc
                loop.call_soon_threadsafe(_resolve, future, None, exc)
            else:
                loop.call_soon_threadsafe(_resolve, future, result, None)


def _resolve(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
