"""The `Shard` protocol: what an application's handlers and a store see of the shard they serve."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from broker.client import JournalClient
    from consumer.protocol import pb as cpb


@runtime_checkable
class Shard(Protocol):
    """A shard assigned to this consumer process (Gazette's `consumer.Shard`)."""

    @property
    def id(self) -> str:
        """The shard's ID."""
        ...

    @property
    def fqn(self) -> str:
        """The shard's fully qualified name: the application's etcd prefix and its ID, which names
        its rows in a shared store (`gazette_checkpoints.shard_fqn`)."""
        ...

    @property
    def spec(self) -> cpb.ShardSpec:
        """The shard's current spec."""
        ...

    @property
    def journal_client(self) -> JournalClient:
        """The client the shard reads and publishes with."""
        ...
