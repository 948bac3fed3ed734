"""Waiting in a test's event loop for what a real process will do, without a fixed sleep."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

WAIT = 60.0
"""How long `until` waits by default: long enough for a loaded 2-core host."""


async def until(
    probe: Callable[[], T | Awaitable[T]], check: Callable[[T], bool], what: str, timeout: float = WAIT
) -> T:
    """Poll `probe()` (awaited when it returns an awaitable) every 50 ms until `check` accepts its value,
    and return that value; fail the test, naming `what` and the last value, after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value: Any = probe()
        if asyncio.iscoroutine(value):
            value = await value
        if check(value):
            return value  # type: ignore[no-any-return]
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting for {what}; last: {value!r}")
        await asyncio.sleep(0.05)
