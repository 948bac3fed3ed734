"""The fragment store interface, its errors, and the query arguments every store accepts."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol, runtime_checkable
from urllib.parse import parse_qsl, urlparse

from broker.errors import GazetteError


class StoreError(GazetteError):
    """A fragment store operation failed; carries the store URL and the path."""

    def __init__(self, message: str, store: str = "", path: str = "") -> None:
        where = f"{path} in {store}" if path else store
        super().__init__(f"{where}: {message}" if where else message)
        self.store = store
        self.path = path


class StoreConfigError(StoreError):
    """A store URL or its query arguments are invalid."""


@dataclass(frozen=True)
class StoreObject:
    """A listed object: its path relative to the listed prefix, and its modification time."""

    path: str
    mod_time: int


class FragmentStore(Protocol):
    """What the broker needs of a BLOB store. Paths are relative to the store's prefix."""

    url: str

    async def list(self, prefix: str) -> list[StoreObject]: ...
    async def exists(self, path: str) -> bool: ...
    async def put(self, path: str, source: BinaryIO, content_encoding: str = "") -> None: ...
    def open(self, path: str) -> AsyncIterator[bytes]: ...
    async def sign_get(self, path: str, ttl: float) -> str: ...
    async def remove(self, path: str) -> None: ...


class LinkableFile(Protocol):
    """A local file whose content can be given a name without copying it (a spool file)."""

    def link(self, target: str, length: int) -> None: ...


@runtime_checkable
class AdoptingStore(Protocol):
    """A store that can take a local file as an object without copying it."""

    async def adopt(self, path: str, file: LinkableFile, length: int) -> bool:
        """Make `file`'s first `length` bytes the object at `path`; False if this file cannot be."""
        ...


def bucket_and_prefix(url: str) -> tuple[str, str]:
    """A bucket store URL's bucket (its host) and object prefix (its path, without the leading '/')."""
    parsed = urlparse(url)
    return parsed.hostname or "", parsed.path.lstrip("/")


def query_args(url: str, allowed: set[str]) -> dict[str, str]:
    """A store URL's query arguments, keyed case-insensitively; unknown keys are an error."""
    args: dict[str, str] = {}
    canonical = {a.lower(): a for a in allowed}
    for key, value in parse_qsl(urlparse(url).query, keep_blank_values=True):
        name = canonical.get(key.lower())
        if name is None:
            raise StoreConfigError(f"schema: invalid path \"{key}\" (allowed: {', '.join(sorted(allowed))})", url)
        args[name] = value
    return args


def rewrite(path: str, args: dict[str, str]) -> str:
    """Apply the `find`/`replace` arguments to a journal-relative path."""
    find = args.get("find", "")
    if find:
        return path.replace(find, args.get("replace", ""), 1)
    return path


def read_head(source: BinaryIO, limit: int) -> tuple[bytes, bool]:
    """Up to `limit` bytes from the start of `source` (blocking), and whether `source` ended within them.

    A store uploads content that fits in one request in one request, and streams the rest.
    """
    parts: list[bytes] = []
    size = 0
    while size < limit:
        data = source.read(limit - size)
        if not data:
            return b"".join(parts), True
        parts.append(data)
        size += len(data)
    return b"".join(parts), False


class Prepended(io.RawIOBase):
    """`head` followed by the rest of `source`: a read-once stream that knows its position (`tell`).

    A read returns as many bytes as asked for unless the content ends first (whatever `source` gives
    per read): an SDK uploading in parts takes a short part for the last one.
    """

    def __init__(self, head: bytes, source: BinaryIO) -> None:
        self._head = memoryview(head)
        self._source = source
        self._pos = 0
        self._ended = False

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = min(len(view), len(self._head))
        view[:n] = self._head[:n]
        self._head = self._head[n:]
        while n < len(view) and not self._ended:
            data = self._source.read(len(view) - n)
            if not data:
                self._ended = True
                break
            view[n:n + len(data)] = data
            n += len(data)
        self._pos += n
        return n
