"""The message channel between a shard's source readers and its transactions (Gazette's
`msgCh`): a bounded queue of envelopes (or a reader's error), closed once reading stops, whose
one consumer polls it, takes runs of it, and watches it with one future among others.
"""

from __future__ import annotations

import asyncio
import collections
import enum
from collections.abc import Sequence
from typing import Any, Final, TypeAlias

from consumer.errors import ConsumerError
from consumer.message import Envelope

DEFAULT_READ_CHANNEL_SIZE: Final = 256
"""Capacity of a shard's MessageChannel when its spec's `read_channel_size` is 0. Gazette's is 8192,
for goroutines decoding in parallel; here readers and transactions share one thread, and envelopes
decoded far ahead are cold when consumed: bench_consumer ran 79k msg/s at 8192, 89k at 256."""


class Marker(enum.Enum):
    EMPTY = "empty"
    CLOSED = "closed"


EMPTY: Final = Marker.EMPTY
"""`MessageChannel.poll()`: nothing to receive now."""
CLOSED: Final = Marker.CLOSED
"""`MessageChannel.poll()`: the channel is closed and drained; nothing will ever come."""

EnvelopeOrError: TypeAlias = "Envelope[Any] | Exception"
"""An item of a MessageChannel: a read-uncommitted envelope, or the error that ended a reader."""


class ChannelClosed(ConsumerError):
    """Sending to a closed MessageChannel."""


class WatchedEvent(asyncio.Event):
    """An asyncio.Event that also resolves the one future watching it (`watch`) when it is set: the
    transaction loop waits for the first of its timer, its channel and the prior barrier on one
    future, where a task per Event and asyncio.wait cost it 37 us a wait against 11. (A TxnTimer's
    `watch` can be this Event's.)"""

    _watcher: asyncio.Future[None] | None = None

    def set(self) -> None:
        super().set()
        resolve_watcher(self._watcher)

    def watch(self, fut: asyncio.Future[None] | None) -> None:
        """Resolve `fut` when set (at once if set already); None stops watching."""
        self._watcher = fut
        if self.is_set():
            resolve_watcher(fut)


def resolve_watcher(fut: asyncio.Future[Any] | None, _done: object = None) -> None:
    if fut is not None and not fut.done():
        fut.set_result(None)


class MessageChannel:
    """A bounded FIFO of envelopes (or reader errors) from readers to the transaction loop, which can close.

    `poll()` never blocks: it returns the next item, `EMPTY`, or `CLOSED` once the channel is
    closed and drained. `wait()` waits until `poll()` would not return `EMPTY`. Senders `send`
    one item or `send_all` a list (a reader's decoded chunk: one hand-off for many envelopes),
    waiting while the channel is full, and `close`. A list is queued whole once there is room,
    so it may fill the channel past its capacity by the list's length less one.
    """

    def __init__(self, capacity: int = DEFAULT_READ_CHANNEL_SIZE) -> None:
        self.capacity = max(capacity, 1)
        # Lists as senders queued them; poll() takes items from the first, from _pos.
        self._lists: collections.deque[Sequence[Envelope[Any] | Exception]] = collections.deque()
        self._pos = 0
        self._len = 0
        self._closed = False
        self._readable = WatchedEvent()
        self._writable = asyncio.Event()
        self._writable.set()

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return self._len

    def send_nowait(self, item: Envelope[Any] | Exception) -> None:
        """Queue `item`; raises ChannelClosed if closed, asyncio.QueueFull if full."""
        if self._closed:
            raise ChannelClosed("send on a closed MessageChannel")
        if self._len >= self.capacity:
            raise asyncio.QueueFull
        self._queue([item])

    async def send(self, item: Envelope[Any] | Exception) -> None:
        """Queue `item`, waiting while the channel is full; raises ChannelClosed if it is (or becomes) closed."""
        await self.send_all([item])

    async def send_all(self, items: Sequence[Envelope[Any] | Exception]) -> None:
        """Queue `items` (which the channel then owns), waiting while it is full; raises ChannelClosed
        if it is (or becomes) closed."""
        while not self._closed and self._len >= self.capacity:
            await self._writable.wait()
        if self._closed:
            raise ChannelClosed("send on a closed MessageChannel")
        if items:
            self._queue(items)

    def _queue(self, items: Sequence[Envelope[Any] | Exception]) -> None:
        self._lists.append(items)
        self._len += len(items)
        self._readable.set()
        if self._len >= self.capacity:
            self._writable.clear()

    def close(self) -> None:
        """No more items: once the queued ones are received, `poll()` returns CLOSED."""
        self._closed = True
        self._readable.set()
        self._writable.set()

    def take(self, limit: int) -> list[Envelope[Any] | Exception]:
        """Up to `limit` of the next items, without waiting (fewer when the first queued list has
        fewer; none when empty). `put_back` returns those left unprocessed to the front."""
        lists = self._lists
        if not lists or limit < 1:
            return []
        first, pos = lists[0], self._pos
        if pos == 0 and len(first) <= limit and type(first) is list:
            items = first  # The channel owns a list sent to it: handed on whole, not copied.
        else:
            items = list(first[pos : pos + limit])
        if pos + len(items) == len(first):
            lists.popleft()
            self._pos = 0
        else:
            self._pos = pos + len(items)
        self._on_taken(len(items))
        return items

    def put_back(self, items: list[Envelope[Any] | Exception]) -> None:
        """Return the last items the last `take` gave, unprocessed, to the front of the channel
        (with no take or poll between)."""
        if not items:
            return
        if self._pos >= len(items):
            self._pos -= len(items)  # They are still in the first list, just before _pos.
        else:
            self._lists.appendleft(items)
            self._pos = 0
        self._len += len(items)
        self._readable.set()
        if self._len >= self.capacity:
            self._writable.clear()

    def _on_taken(self, count: int) -> None:
        # Only the events this can change.
        size = self._len = self._len - count
        if size == 0 and not self._closed:
            self._readable.clear()
        if size < self.capacity <= size + count:
            self._writable.set()

    def poll(self) -> Envelope[Any] | Exception | Marker:
        """The next item, EMPTY if none is queued, or CLOSED if none ever will be."""
        lists = self._lists
        if lists:
            first = lists[0]
            pos = self._pos
            item = first[pos]
            if pos + 1 == len(first):
                lists.popleft()
                self._pos = 0
            else:
                self._pos = pos + 1
            self._on_taken(1)
            return item
        return CLOSED if self._closed else EMPTY

    async def wait(self) -> None:
        """Wait until `poll()` would return an item or CLOSED."""
        await self._readable.wait()

    def watch(self, fut: asyncio.Future[None] | None) -> None:
        """Resolve `fut` once `poll()` would return an item or CLOSED (at once if it would now);
        None stops watching."""
        self._readable.watch(fut)


__all__ = [
    "CLOSED",
    "DEFAULT_READ_CHANNEL_SIZE",
    "EMPTY",
    "ChannelClosed",
    "EnvelopeOrError",
    "Marker",
    "MessageChannel",
    "WatchedEvent",
    "resolve_watcher",
]
