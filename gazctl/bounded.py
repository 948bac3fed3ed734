"""Running one async job per journal, a bounded number at a time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_LIMIT = 16
"""Jobs in flight at once: enough to hide round trips, few enough not to flood a broker."""


async def map_bounded(
    items: Sequence[T],
    work: Callable[[T], Awaitable[R]],
    *,
    limit: int = DEFAULT_LIMIT,
    done: Callable[[], None] | None = None,
) -> list[R]:
    """Return `work(item)` of every item, in order, running at most `limit` at once; `done()` after each.

    The first failure cancels the jobs still running and is raised itself (not as an ExceptionGroup),
    so callers report it as any other error.
    """
    gate = asyncio.Semaphore(limit)

    async def one(item: T) -> R:
        async with gate:
            result = await work(item)
        if done is not None:
            done()
        return result

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(item)) for item in items]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [task.result() for task in tasks]
