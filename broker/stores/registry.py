"""Store registry: one FragmentStore (and its health checker) per store URL, built on first use."""

from __future__ import annotations

import asyncio
from urllib.parse import urlparse

from broker.stores.base import FragmentStore, StoreConfigError
from broker.stores.file import FileStore
from broker.stores.health import StoreHealth
from broker.stores.memory import MemoryStore

SCHEMES = ("file", "s3", "gs", "azure", "azure-ad", "memory")
FILE_ONLY_SCHEMES = ("azure", "azure-ad", "file", "gs", "s3")
"""The stores `--broker.file-only` puts under the file root: those Gazette's broker has providers of."""


class StoreRegistry:
    """Builds stores from URLs (`file://` rooted at `file_root`, `s3://`, `gs://`, `azure://`, `azure-ad://`,
    and `memory://` for tests and single-process use) and caches them."""

    def __init__(self, file_root: str = "", file_only: bool = False) -> None:
        self.file_root = file_root
        self.file_only = file_only
        """`--broker.file-only`: every store URL Gazette has a provider for (azure, azure-ad, file, gs,
        s3) is the `file:///` store under `file_root`, its bucket and prefix ignored, as in Gazette's
        cmd/gazette/main.go."""
        self._stores: dict[str, FragmentStore] = {}
        self._health: dict[str, StoreHealth] = {}

    def get(self, url: str) -> FragmentStore:
        """The store of `url`; raises StoreConfigError for an unsupported scheme or bad arguments."""
        store = self._stores.get(url)
        if store is None:
            store = self._stores[url] = self._build(url)
        return store

    def _build(self, url: str) -> FragmentStore:
        scheme = urlparse(url).scheme
        if self.file_only and scheme in FILE_ONLY_SCHEMES:
            store = FileStore("file:///", self.file_root)
            store.url = url  # Fragments still name the journal's store as their backing store.
            return store
        if scheme == "file":
            return FileStore(url, self.file_root)
        if scheme == "s3":
            # boto3 takes ~60 ms to import: only processes that use an s3:// store pay it (gazctl starts faster).
            from broker.stores.s3 import S3Store

            return S3Store(url)
        if scheme == "gs":
            from broker.stores.gcs import GCSStore  # As boto3: imported by the processes that use it.

            return GCSStore(url)
        if scheme in ("azure", "azure-ad"):
            from broker.stores.azure import AzureStore

            return AzureStore(url)
        if scheme == "memory":
            return MemoryStore(url)
        raise StoreConfigError(
            f"unsupported fragment store scheme {scheme!r} (this broker supports {', '.join(SCHEMES)})", url
        )

    def health(self, url: str) -> StoreHealth:
        """The (started) health checker of `url`'s store."""
        health = self._health.get(url)
        if health is None:
            health = self._health[url] = StoreHealth(self.get(url))
            health.start()
        return health

    def is_healthy(self, url: str) -> bool | None:
        """Whether `url`'s last health check passed; None if it was never checked."""
        health = self._health.get(url)
        return None if health is None or health.error is None else health.error == ""

    async def close(self) -> None:
        """Stop every health checker."""
        await asyncio.gather(*(h.close() for h in self._health.values()), return_exceptions=True)
