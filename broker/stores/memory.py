"""The `memory://` store: fragments held in this process's memory. For tests and single-process use.

`memory://<bucket>/<prefix>/` names a prefix of a bucket that lives as long as the process: every
store of the same bucket, whichever `StoreRegistry` built it, sees the same objects (as brokers of
one cluster share a BLOB store). Nothing is ever written to disk, so nothing survives the process.
Like every store it takes the `find` and `replace` query arguments.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import urlparse

from broker.stores.base import StoreError, StoreObject, query_args, rewrite

READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class MemoryObject:
    """A stored object: its bytes, modification time (Unix seconds) and Content-Encoding."""

    content: bytes
    mod_time: int
    content_encoding: str = ""


_BUCKETS: dict[str, dict[str, MemoryObject]] = {}
"""Every bucket of the process, by name: object key (prefix and path) -> object."""


def bucket_objects(bucket: str) -> dict[str, MemoryObject]:
    """The live objects of `bucket` by key (the URL's prefix without its leading `/`, then the path)."""
    return _BUCKETS.setdefault(bucket, {})


def drop_bucket(bucket: str) -> None:
    """Forget `bucket` and its objects."""
    _BUCKETS.pop(bucket, None)


class MemoryStore:
    """Objects under `<prefix>` of a process-wide in-memory bucket."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._args = query_args(url, {"find", "replace"})
        parsed = urlparse(url)
        if not parsed.netloc:
            raise StoreError("memory:// stores need a bucket name (memory://<bucket>/<prefix>/)", url)
        self.bucket = parsed.netloc
        self.prefix = parsed.path.lstrip("/")  # "" or ends in "/".

    def _key(self, path: str) -> str:
        return self.prefix + rewrite(path, self._args)

    @property
    def _objects(self) -> dict[str, MemoryObject]:
        return bucket_objects(self.bucket)

    async def list(self, prefix: str) -> list[StoreObject]:
        """Objects under `prefix` (ending in `/`), with paths relative to it."""
        top = self._key(prefix)
        return [
            StoreObject(key[len(top):], obj.mod_time)
            for key, obj in sorted(self._objects.items())
            if key.startswith(top) and not key.endswith("/")
        ]

    async def exists(self, path: str) -> bool:
        return self._key(path) in self._objects

    async def put(self, path: str, source: BinaryIO, content_encoding: str = "") -> None:
        try:
            content = await asyncio.to_thread(source.read)  # The source may read a spool file.
        except OSError as exc:
            raise StoreError(str(exc), self.url, path) from exc
        self._objects[self._key(path)] = MemoryObject(bytes(content), int(time.time()), content_encoding)

    async def open(self, path: str) -> AsyncIterator[bytes]:
        obj = self._objects.get(self._key(path))
        if obj is None:
            raise StoreError("no such object", self.url, path)
        for i in range(0, len(obj.content), READ_CHUNK):
            yield obj.content[i : i + READ_CHUNK]

    async def sign_get(self, path: str, ttl: float) -> str:
        # Only this process can fetch it: readers of the URL must share the bucket.
        return f"memory://{self.bucket}/{self._key(path)}"

    async def remove(self, path: str) -> None:
        if self._objects.pop(self._key(path), None) is None:
            raise StoreError("no such object", self.url, path)
