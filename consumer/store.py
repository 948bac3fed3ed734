"""The `Store` protocol: where a shard keeps its state and its checkpoint, committed together.

A store commits a shard's `Checkpoint` (source offsets, producer states, ACK intents; see
`consumer.protocol`) atomically with the state the application wrote in the same transaction,
as Gazette's `consumer.Store` does (`consumer/interfaces.go`):

- `start_commit` must wait for every future of `wait_for` (the appends of messages the
  transaction published; their results are not used) and fail if any of them fails; it
  returns at once with a future that resolves when the commit is durable, or fails with the
  commit's error.
- The application may consume the next transaction's messages while a commit is in flight.
- A store backed by an external database fences: once another process has restored the
  shard's checkpoint, this store's commits fail. A store recorded to a recovery log relies on
  the log's register fence instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from consumer.protocol import pb as cpb
    from consumer.shard import Shard

OpFuture = asyncio.Future[None]
"""An operation in flight (an append, a commit): resolves with None, or fails with its error."""


@runtime_checkable
class Store(Protocol):
    """A shard's store: the state its application keeps, and its checkpoint."""

    async def restore_checkpoint(self, shard: Shard) -> cpb.Checkpoint:
        """The last committed checkpoint (an empty one for a new shard); fences older primaries."""
        ...

    def start_commit(
        self, shard: Shard, checkpoint: cpb.Checkpoint, wait_for: Sequence[asyncio.Future[Any]]
    ) -> OpFuture:
        """Begin committing the transaction's state with `checkpoint`, once `wait_for` resolved."""
        ...

    async def destroy(self) -> None:
        """Release the store's resources (roll back any transaction it has open)."""
        ...
