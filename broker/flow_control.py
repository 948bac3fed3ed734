"""Append flow control: a per-journal token bucket of `max_append_rate` bytes per second, and
the minimum data rate an append client must sustain."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Generator
from typing import Any, Generic, TypeVar, cast

from broker.errors import BrokerError

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


class MinRateError(BrokerError):
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

    def receive(self, receive: Awaitable[T]) -> Awaitable[T]:
        """Await `receive` (the client's next message), aborting if the client falls behind.

        `receive` runs in the caller's task under one deadline: the end of the current window, or of
        the next one if this one is satisfied already (with nothing arriving meanwhile, that one
        cannot be). A message that is already there is taken without arming the deadline.
        """
        if self.rate <= 0:
            return receive
        return _Guarded(self, receive)

    def _budget(self) -> float:
        """Seconds of waiting on the client left before the deadline."""
        budget = self._window_end - self._waited
        if self._window_bytes >= self._required:
            budget += 1.0
        return max(budget, 0.0)

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


class _Guarded(Generic[T]):
    """MinRateGuard.receive's awaitable. It steps `receive` once by hand: a message already there
    costs no timer. Only if `receive` suspends is the deadline armed (a timer that cancels the
    task, as asyncio.timeout's does), and the rest of `receive` awaited as `yield from` would."""

    __slots__ = ("_guard", "_receive")

    def __init__(self, guard: MinRateGuard, receive: Awaitable[T]) -> None:
        self._guard = guard
        self._receive = receive

    def __await__(self) -> Generator[Any, None, T]:
        guard = self._guard
        steps = self._receive.__await__()
        start = time.monotonic()
        try:
            try:
                waiting_on = steps.send(None)
            except StopIteration as done:
                return cast(T, done.value)
            task = asyncio.current_task()
            assert task is not None
            cancelling = task.cancelling()
            expired = False

            def expire() -> None:
                nonlocal expired
                expired = True
                task.cancel()

            deadline = asyncio.get_running_loop().call_later(guard._budget(), expire)
            try:
                while True:
                    try:
                        yield waiting_on
                    except GeneratorExit:
                        steps.close()
                        raise
                    except BaseException as exc:  # Thrown into the task (its cancellation): pass it on.
                        waiting_on = steps.throw(exc)
                    else:
                        waiting_on = steps.send(None)
            except StopIteration as done:
                return cast(T, done.value)
            except asyncio.CancelledError:
                if expired:
                    expired = False  # Its cancellation is taken back here.
                    if task.uncancel() <= cancelling:
                        raise MinRateError("client stream didn't sustain the minimum append data rate") from None
                raise
            finally:
                deadline.cancel()
                if expired:
                    task.uncancel()  # `receive` ended otherwise, though the deadline cancelled the task.
        finally:
            guard._advance(time.monotonic() - start)
