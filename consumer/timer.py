"""The one timer a transaction loop arms (Gazette's `txnTimer`): the protocol, and `LoopTimer`
on the asyncio event loop (tests drive timers of their own)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from consumer.channel import WatchedEvent


class TxnTimer(Protocol):
    """Gazette's txnTimer {C, Reset, Stop, Now}: the one timer a transaction loop arms.

    It fires once per `reset`, delivering the time it fired at ("tick") to one `poll()`.
    """

    def reset(self, duration_ns: int) -> None:
        """Arm the timer to fire `duration_ns` from now (discarding an unreceived tick)."""
        ...

    def stop(self) -> bool:
        """Disarm the timer and discard an unreceived tick; True if it was armed and had not fired."""
        ...

    def poll(self) -> int | None:
        """Receive the tick (its time, ns) if the timer fired; None otherwise. Never blocks."""
        ...

    def watch(self, fut: asyncio.Future[None] | None) -> None:
        """Resolve `fut` once `poll()` would return a tick (at once if it would now); None stops watching."""
        ...

    def now(self) -> int:
        """The current wall-clock time, in Unix nanoseconds."""
        ...


class LoopTimer:
    """A TxnTimer on the running event loop (`loop.call_later`); `now()` is `time.time_ns()`."""

    def __init__(self, now: Callable[[], int] = time.time_ns) -> None:
        self._now = now
        self._handle: asyncio.TimerHandle | None = None
        self._tick: int | None = None
        self._fired = WatchedEvent()

    def now(self) -> int:
        return self._now()

    def reset(self, duration_ns: int) -> None:
        self.stop()
        self._handle = asyncio.get_running_loop().call_later(max(duration_ns, 0) / 1e9, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._tick = self._now()
        self._fired.set()

    def stop(self) -> bool:
        armed = self._handle is not None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._tick = None
        self._fired.clear()
        return armed

    def poll(self) -> int | None:
        tick, self._tick = self._tick, None
        if tick is not None:
            self._fired.clear()
        return tick

    def watch(self, fut: asyncio.Future[None] | None) -> None:
        self._fired.watch(fut)


__all__ = ["LoopTimer", "TxnTimer"]
