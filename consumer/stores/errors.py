"""The consumer stores' errors (drawn in the whole tree of `broker/errors.py`): ConsumerStoreError
(a store could not restore or commit; the shard ID) and below it FenceError, StoreDependencyError,
StoreClosedError and ForeignStoreError. (`broker.stores.StoreError` is the broker's fragment-store
error.) Each keeps Gazette's wording in `reason`; `str()` is the reason followed by the shard ID.
A database error keeps the driver's exception as `__cause__`.
"""

from __future__ import annotations

from broker.errors import GazetteError


class ConsumerStoreError(GazetteError):
    """A consumer store operation failed."""

    def __init__(self, reason: str, *, shard: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.shard = shard

    def __str__(self) -> str:
        return f"{self.reason} (shard {self.shard})" if self.shard else self.reason


class FenceError(ConsumerStoreError):
    """The checkpoint fence was updated, by a new primary of the shard: this store may not commit."""


class StoreDependencyError(ConsumerStoreError):
    """An operation a commit had to wait for failed, so the commit was rolled back."""


class StoreClosedError(ConsumerStoreError):
    """The store was destroyed, or a transaction was used after its commit began."""


class ForeignStoreError(ConsumerStoreError):
    """The recovery log holds another store's files (e.g. Gazette's RocksDB): opening them as this
    store would start it empty over them. `log` and `offset` name where they were recorded."""

    def __init__(self, reason: str, *, shard: str | None = None, log: str = "", offset: int | None = None) -> None:
        super().__init__(reason, shard=shard)
        self.log = log
        self.offset = offset
