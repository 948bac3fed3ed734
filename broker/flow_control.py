"""Append flow control: a per-journal token bucket of `max_append_rate` bytes per second, and
the minimum data rate an append client must sustain."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")

BANK_SECONDS = 10.0  # Unused credit is banked up to ten seconds' worth of rate.


class TokenBucket:
    """Admits appended bytes at `rate` bytes/second, with a one-second burst."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._tokens = float(rate)
        self._last = time.monotonic()

    async def take(self, n: int) -> bool:
        """Take `n` bytes of credit, sleeping while in debt. Returns whether the chunk was delayed."""
        if self.rate <= 0:
            return False
        now = time.monotonic()
        self._tokens = min(self.rate * BANK_SECONDS, self._tokens + (now - self._last) * self.rate)
        self._last = now
        self._tokens -= n
        if self._tokens >= 0:
            return False
        await asyncio.sleep(-self._tokens / self.rate)
        return True


def effective_rate(journal_rate: int, broker_rate: int) -> int:
    """The smaller of the journal's and the broker's limit, where 0 means unlimited."""
    rates = [r for r in (journal_rate, broker_rate) if r > 0]
    return min(rates) if rates else 0


class MinRateError(Exception):
    """An append client did not sustain the minimum data rate."""


class MinRateGuard:
    """Aborts an append stream whose client sends fewer than `rate` bytes in some one-second window.

    Only time spent waiting on the client counts, so broker-side throttling is never blamed on
    it. The first `grace` seconds carry no requirement.
    """

    def __init__(self, rate: int, grace: float = 1.0) -> None:
        self.rate = rate
        self._waited = 0.0  # Seconds spent waiting on the client.
        self._window_end = grace
        self._window_bytes = 0
        self._required = 0

    async def receive(self, receive: Awaitable[T]) -> T:
        """Await `receive` (the client's next message), aborting if the client falls behind.

        `receive` runs in the caller's task under one deadline: the end of the current window, or of
        the next one if this one is satisfied already (with nothing arriving meanwhile, that one
        cannot be). A message that is already there is taken without the event loop's help.
        """
        if self.rate <= 0:
            return await receive
        budget = self._window_end - self._waited
        if self._window_bytes >= self._required:
            budget += 1.0
        start = time.monotonic()
        deadline = asyncio.timeout(max(budget, 0.0))
        try:
            async with deadline:
                return await receive
        except TimeoutError:
            if not deadline.expired():
                raise  # The receive's own TimeoutError: not the client falling behind.
            raise MinRateError("client stream didn't sustain the minimum append data rate") from None
        finally:
            self._advance(time.monotonic() - start)

    def received(self, n: int) -> None:
        """Count `n` bytes received from the client."""
        self._window_bytes += n

    def _advance(self, waited: float) -> None:
        self._waited += waited
        while self._waited >= self._window_end:
            if self._window_bytes < self._required:
                return  # The caller reports the failed window.
            self._window_end += 1.0
            self._window_bytes = 0
            self._required = self.rate
