"""Per-journal append rate limiting: a token bucket of `max_append_rate` bytes per second."""

from __future__ import annotations

import asyncio
import time

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
