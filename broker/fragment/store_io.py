"""Moving fragments between spools and stores: persist, list into a CoverSet, open for reading."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import AsyncIterator, Sequence
from typing import BinaryIO

from broker.fragment.codecs import CodecError, compressor, decompressor
from broker.fragment.cover_set import CoverSet
from broker.fragment.errors import FragmentError, FragmentNameError
from broker.fragment.fragment import Fragment
from broker.fragment.names import content_path, parse_fragment_from_relative_path
from broker.protocol import pb
from broker.stores import FragmentStore

log = logging.getLogger(__name__)

COPY_CHUNK = 1 << 20


def content_encoding(codec: int) -> str:
    """The Content-Encoding a fragment is uploaded with: only GZIP_OFFLOAD_DECOMPRESSION has one."""
    return "gzip" if codec == pb.GZIP_OFFLOAD_DECOMPRESSION else ""


def write_compressed(fragment: Fragment, out: BinaryIO) -> int:
    """Write `fragment`'s spool content to `out`, compressed by its codec; return the bytes written.

    Blocking: run it in a thread.
    """
    assert fragment.file is not None, f"{fragment!r} has no spool file"
    comp = compressor(fragment.spec.compression_codec)
    written = 0
    for pos in range(0, fragment.content_length, COPY_CHUNK):
        data = fragment.file.read_at(pos, min(COPY_CHUNK, fragment.content_length - pos))
        if len(data) == 0:
            raise FragmentError(f"spool file of {fragment!r} ends early at {pos}", journal=fragment.spec.journal)
        written += out.write(comp.compress(data))
    written += out.write(comp.finish())
    return written


async def persist(fragment: Fragment, store: FragmentStore, spool_dir: str | None = None) -> bool:
    """Upload a completed local fragment to `store` unless it is there already.

    Returns whether it uploaded. `fragment.spec.path_postfix` must already be set.
    """
    path = content_path(fragment.spec)
    if await store.exists(path):
        return False
    with tempfile.TemporaryFile(dir=spool_dir) as staged:
        await asyncio.to_thread(write_compressed, fragment, staged)
        staged.seek(0)
        await store.put(path, staged, content_encoding(fragment.spec.compression_codec))
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


__all__ = ["content_encoding", "list_fragments", "open_fragment", "persist", "write_compressed"]
