"""A shard's progress: offsets read through and published at, as transactions complete (Gazette's
`progress` of shard.go), for Stat and for waiting on it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TypeAlias

# ---------------------------------------------------------------------------------------------
# Progress.

ProgressFunc: TypeAlias = Callable[[Mapping[str, int], Mapping[str, int]], None]
"""Called with updated read-through offsets (by source journal) and publish-at offsets (by
journal ACKed: the end of the ACK's append), when a transaction completes or an idle shard
reads a message that starts none."""


class ShardProgress:
    """A ProgressFunc that accumulates the shard's progress for Stat, and signals each update.

    `signal` is a future resolved at the next update (then replaced), as Gazette's
    `progress.signalCh` is closed and remade.
    """

    def __init__(self) -> None:
        self.read_through: dict[str, int] = {}
        self.publish_at: dict[str, int] = {}
        self.updates = 0
        self._signal: asyncio.Future[None] | None = None

    @property
    def signal(self) -> asyncio.Future[None]:
        """Resolves at the next update."""
        if self._signal is None:
            self._signal = asyncio.get_running_loop().create_future()
        return self._signal

    def __call__(self, read_through: Mapping[str, int], publish_at: Mapping[str, int]) -> None:
        self.read_through.update(read_through)
        self.publish_at.update(publish_at)
        self.updates += 1
        signal, self._signal = self._signal, None
        if signal is not None and not signal.done():
            signal.set_result(None)

    async def wait_for(self, read_through: Mapping[str, int]) -> None:
        """Wait until the shard has read through at least `read_through` (Stat's condition)."""
        while any(self.read_through.get(j, 0) < o for j, o in read_through.items()):
            await self.signal


__all__ = ["ProgressFunc", "ShardProgress"]
