"""Moving fragments between spools and stores: persist, list into a CoverSet, open for reading."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any, BinaryIO, cast

from broker.fragment.codecs import CodecError, compressor, decompressor
from broker.fragment.cover_set import CoverSet
from broker.fragment.errors import FragmentError, FragmentNameError
from broker.fragment.fragment import Fragment
from broker.fragment.names import content_path, parse_fragment_from_relative_path
from broker.protocol import pb
from broker.stores import AdoptingStore, FragmentStore

log = logging.getLogger(__name__)

COPY_CHUNK = 1 << 20


def content_encoding(codec: int) -> str:
    """The Content-Encoding a fragment is uploaded with: only GZIP_OFFLOAD_DECOMPRESSION has one."""
    return "gzip" if codec == pb.GZIP_OFFLOAD_DECOMPRESSION else ""


class CompressedContent(io.RawIOBase):
    """A completed fragment's spool content, compressed by its codec as it is read.

    A store uploads it like a file, so persisting needs no staging copy. Blocking: read it in a
    thread.
    """

    def __init__(self, fragment: Fragment) -> None:
        assert fragment.file is not None, f"{fragment!r} has no spool file"
        self._fragment = fragment
        self._file = fragment.file
        self._compressor = compressor(fragment.spec.compression_codec)
        self._identity = fragment.spec.compression_codec == pb.NONE
        self._pos = 0
        self._pending = bytearray()
        self._finished = False
        self.written = 0
        """Compressed bytes read so far."""

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(COPY_CHUNK), b""))
        want = size
        if self._identity and not self._pending:
            out = self._next(want) if want else b""
        else:
            while len(self._pending) < want and not self._finished:
                data = self._next(COPY_CHUNK)
                if data:
                    self._pending += self._compressor.compress(data)
                else:
                    self._pending += self._compressor.finish()
                    self._finished = True
            out = bytes(self._pending[:want])
            del self._pending[:want]
        self.written += len(out)
        return out

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def _next(self, size: int) -> bytes:
        """Up to `size` bytes of spool content at the read position; b"" at the fragment's end."""
        remaining = self._fragment.content_length - self._pos
        if remaining <= 0:
            return b""
        data = self._file.read_at(self._pos, min(size, remaining))
        if not data:
            raise FragmentError(
                f"spool file of {self._fragment!r} ends early at {self._pos}", journal=self._fragment.spec.journal
            )
        self._pos += len(data)
        return data


async def persist(fragment: Fragment, store: FragmentStore) -> bool:
    """Upload a completed local fragment to `store` unless it is there already.

    Returns whether it uploaded. `fragment.spec.path_postfix` must already be set. Content is
    compressed as the store reads it; a NONE fragment is linked into a store that can adopt
    its spool file (a file store on the spool's filesystem) instead of being copied.
    """
    path = content_path(fragment.spec)
    if await store.exists(path):
        return False
    assert fragment.file is not None, f"{fragment!r} has no spool file"
    if fragment.spec.compression_codec == pb.NONE and isinstance(store, AdoptingStore):
        if await store.adopt(path, fragment.file, fragment.content_length):
            return True
    content = cast(BinaryIO, CompressedContent(fragment))
    await store.put(path, content, content_encoding(fragment.spec.compression_codec))
    return True


async def list_fragments(journal: str, stores: Sequence[tuple[str, FragmentStore]]) -> CoverSet:
    """List every fragment of `journal` in `stores` (pairs of spec URL and store) as one CoverSet.

    Objects whose names do not parse as fragments are logged and skipped. Raises StoreError if a
    store cannot be listed.
    """
    listing = CoverSet()
    for url, store in stores:
        for obj in await store.list(journal + "/"):
            try:
                spec = parse_fragment_from_relative_path(journal, obj.path)
            except FragmentNameError as exc:
                log.warning(
                    "skipping store object that is not a fragment",
                    extra={"journal": journal, "store": url, "path": obj.path, "error": str(exc)},
                )
                continue
            if spec.begin == spec.end:
                continue
            spec.backing_store = url
            spec.mod_time = obj.mod_time
            listing.add(Fragment(spec))
    return listing


async def open_fragment(store: FragmentStore, fragment: pb.Fragment, offset: int) -> AsyncIterator[bytes]:
    """Yield the decompressed content of a persisted fragment from `offset` to its end.

    Raises StoreError if the object cannot be read, and FragmentError if it does not decode to
    exactly the fragment's length.
    """
    path = content_path(fragment)
    decomp = decompressor(fragment.compression_codec)
    pos = fragment.begin
    async for raw in store.open(path):
        try:
            data = await asyncio.to_thread(decomp.decompress, raw)
        except CodecError as exc:
            raise FragmentError(f"{path}: {exc}", journal=fragment.journal, offset=pos) from exc
        if pos + len(data) > fragment.end:
            raise FragmentError(
                f"{path}: decodes past the fragment end {fragment.end}", journal=fragment.journal, offset=pos
            )
        if pos + len(data) > offset:
            yield data[max(0, offset - pos):]
        pos += len(data)
    if pos != fragment.end:
        raise FragmentError(
            f"{path}: unexpected EOF at {pos}, expected the fragment end {fragment.end}",
            journal=fragment.journal,
            offset=pos,
        )


__all__ = ["CompressedContent", "content_encoding", "list_fragments", "open_fragment", "persist"]
