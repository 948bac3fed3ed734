"""The message Clock: a monotonic 64-bit value from which producers build UUIDs.

A clock value is `(100 ns ticks since 1582-10-15) << 4 | counter`, where the counter is 4 bits.
`Clock.tick` advances by one microsecond (160), so one producer can mint a million ordered
UUIDs per second before running ahead of wall-clock time; `Clock.update` moves the clock
forward to a wall-clock time and never backward. Times are integer nanoseconds since the Unix
epoch (as `time.time_ns()` returns) because Python's datetime cannot hold 100 ns precision.
"""

from __future__ import annotations

import functools
import threading
import time

from consumer.message.uuid import CLOCK_MASK, G1582NS100

TICK = 160
"""One Tick: 1 microsecond, i.e. 10 units of 100 ns, shifted past the 4-bit counter."""


def clock_at(unix_ns: int) -> int:
    """The clock value of a wall-clock time, with a zero counter (100 ns precision)."""
    # Go's integer division truncates toward zero; Python's // floors.
    ticks = abs(unix_ns) // 100
    ticks = ticks if unix_ns >= 0 else -ticks
    return ((ticks + G1582NS100) << 4) & CLOCK_MASK


def clock_unix_ns(clock: int) -> int:
    """The wall-clock time of a clock value in Unix nanoseconds; the counter is dropped."""
    return ((clock >> 4) - G1582NS100) * 100


@functools.total_ordering
class Clock:
    """A mutable, thread-safe clock. Compare it with another Clock or with an int value."""

    __slots__ = ("_lock", "_value")
    __hash__ = None  # type: ignore[assignment]  # Mutable, so unhashable.

    def __init__(self, value: int = 0) -> None:
        if not 0 <= value <= CLOCK_MASK:
            raise ValueError(f"clock must be an unsigned 64-bit value (got {value})")
        self._value = value
        self._lock = threading.Lock()

    @classmethod
    def at(cls, unix_ns: int) -> Clock:
        """A clock set to a wall-clock time: Gazette's `NewClock`."""
        out = cls()
        out.update(unix_ns)
        return out

    @property
    def value(self) -> int:
        """The current clock value."""
        return self._value

    def tick(self) -> int:
        """Advance by one microsecond (160) and return the new value."""
        with self._lock:
            self._value = (self._value + TICK) & CLOCK_MASK
            return self._value

    def update(self, unix_ns: int | None = None) -> None:
        """Move forward to a wall-clock time (default: now), resetting the counter.

        An earlier time is ignored, so the clock never goes backward.
        """
        target = clock_at(time.time_ns() if unix_ns is None else unix_ns)
        with self._lock:
            if target > self._value:
                self._value = target

    def as_unix_ns(self) -> int:
        """The clock's wall-clock time in Unix nanoseconds (100 ns precision)."""
        return clock_unix_ns(self._value)

    def __int__(self) -> int:
        return self._value

    def __index__(self) -> int:
        return self._value

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Clock):
            return self._value == other._value
        if isinstance(other, int):
            return self._value == other
        return NotImplemented

    def __lt__(self, other: object) -> bool:
        if isinstance(other, Clock):
            return self._value < other._value
        if isinstance(other, int):
            return self._value < other
        return NotImplemented

    def __repr__(self) -> str:
        return f"Clock({self._value})"
