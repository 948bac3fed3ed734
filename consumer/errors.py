"""The consumer runtime's error family (the whole tree is drawn in `broker/errors.py`)."""

from __future__ import annotations

from broker.errors import GazetteError


class ConsumerError(GazetteError):
    """Base of the consumer runtime's errors: serving shards, their transactions, resolving and
    proxying shards, loading an application, starting `gazette consume`."""



class ReplicaError(ConsumerError):
    """Serving a shard failed; the message has Gazette's prefix (`completeRecovery: app.NewStore: ...`)."""


__all__ = ["ConsumerError", "ReplicaError"]
