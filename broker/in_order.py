"""Blocking calls run in worker threads one after another, in the order they were submitted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class InOrder:
    """A chain of worker-thread calls: each starts once the one submitted before it has ended.

    It lets the event loop queue a chunk's spool write or hashing and go on receiving the next
    chunk, while the writes themselves still land in order. A call whose predecessor failed
    fails with the same exception without running.
    """

    def __init__(self) -> None:
        self._last: asyncio.Future[Any] | None = None

    def submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run `fn(*args)` in a worker thread after every earlier submission."""
        previous = self._last

        async def run() -> T:
            if previous is not None:
                await previous
            return await asyncio.to_thread(fn, *args)

        future = asyncio.ensure_future(run())
        self._last = future
        return future

    async def settle(self) -> None:
        """Wait until every submitted call has ended, failed or not."""
        if self._last is not None:
            await asyncio.gather(self._last, return_exceptions=True)
