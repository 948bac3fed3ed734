"""The consumer stores' errors, hung from the project's root `GazetteError`:

    GazetteError
    └── StoreError                  consumer.stores: a store could not restore or commit (shard ID)
        ├── FenceError              another process restored the shard: its checkpoint fence moved
        ├── StoreDependencyError    a commit's `wait_for` operation failed
        ├── StoreClosedError        the store was destroyed, or a transaction used after its commit
        └── ForeignStoreError       the recovery log holds another store's files (Gazette's RocksDB...)

(`broker.errors.StoreError` is the broker's fragment-store error; this one is the consumer's.)
Each keeps Gazette's wording in `reason`; `str()` is the reason followed by the shard ID.
A database error keeps the driver's exception as `__cause__`.
"""

from __future__ import annotations

from broker.errors import GazetteError


class StoreError(GazetteError):
    """A consumer store operation failed."""

    def __init__(self, reason: str, *, shard: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.shard = shard

    def __str__(self) -> str:
        return f"{self.reason} (shard {self.shard})" if self.shard else self.reason


class FenceError(StoreError):
    """The checkpoint fence was updated, by a new primary of the shard: this store may not commit."""


class StoreDependencyError(StoreError):
    """An operation a commit had to wait for failed, so the commit was rolled back."""


class StoreClosedError(StoreError):
    """The store was destroyed, or a transaction was used after its commit began."""


class ForeignStoreError(StoreError):
    """The recovery log holds another store's files (e.g. Gazette's RocksDB): opening them as this
    store would start it empty over them. `log` and `offset` name where they were recorded."""

    def __init__(self, reason: str, *, shard: str | None = None, log: str = "", offset: int | None = None) -> None:
        super().__init__(reason, shard=shard)
        self.log = log
        self.offset = offset
