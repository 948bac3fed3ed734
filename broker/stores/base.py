"""The fragment store interface, its errors, and the query arguments every store accepts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import BinaryIO, Protocol, runtime_checkable
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
