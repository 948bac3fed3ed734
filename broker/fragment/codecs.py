"""Compression codecs of fragment files, as streaming compressors and decompressors.

GZIP writes one gzip member per flush and reads concatenated members; SNAPPY uses the
snappy framing (stream) format; ZSTANDARD the zstd stream format, reading across frames.
"""

from __future__ import annotations

import zlib
from typing import Protocol

import snappy
import zstandard

from broker.fragment.errors import FragmentError
from broker.protocol import pb


class CodecError(FragmentError, ValueError):
    """A fragment's codec is invalid or its content does not decode."""


class Compressor(Protocol):
    def compress(self, data: bytes) -> bytes: ...
    def finish(self) -> bytes: ...


class Decompressor(Protocol):
    def decompress(self, data: bytes) -> bytes: ...


class _Identity:
    def compress(self, data: bytes) -> bytes:
        return data

    def decompress(self, data: bytes) -> bytes:
        return data

    def finish(self) -> bytes:
        return b""


class _GzipCompressor:
    def __init__(self) -> None:
        self._z = zlib.compressobj(6, zlib.DEFLATED, 31)

    def compress(self, data: bytes) -> bytes:
        return self._z.compress(data)

    def finish(self) -> bytes:
        return self._z.flush()


class _GzipDecompressor:
    """Decodes a sequence of gzip members."""

    def __init__(self) -> None:
        self._z = zlib.decompressobj(31)

    def decompress(self, data: bytes) -> bytes:
        out = []
        while data:
            try:
                out.append(self._z.decompress(data))
            except zlib.error as exc:
                raise CodecError(f"gzip: {exc}") from exc
            if not self._z.eof:
                break
            data = self._z.unused_data
            self._z = zlib.decompressobj(31)
        return b"".join(out)


class _SnappyCompressor:
    def __init__(self) -> None:
        self._s = snappy.StreamCompressor()

    def compress(self, data: bytes) -> bytes:
        return bytes(self._s.add_chunk(data)) if data else b""

    def finish(self) -> bytes:
        return b""


class _SnappyDecompressor:
    def __init__(self) -> None:
        self._s = snappy.StreamDecompressor()

    def decompress(self, data: bytes) -> bytes:
        try:
            return bytes(self._s.decompress(data))
        except Exception as exc:  # python-snappy raises several types for corrupt input.
            raise CodecError(f"snappy: {exc}") from exc


class _ZstdCompressor:
    def __init__(self) -> None:
        self._z = zstandard.ZstdCompressor(level=1).compressobj()

    def compress(self, data: bytes) -> bytes:
        return self._z.compress(data)

    def finish(self) -> bytes:
        return self._z.flush()


class _ZstdDecompressor:
    def __init__(self) -> None:
        self._z = zstandard.ZstdDecompressor().decompressobj(read_across_frames=True)

    def decompress(self, data: bytes) -> bytes:
        try:
            return self._z.decompress(data)
        except zstandard.ZstdError as exc:
            raise CodecError(f"zstd: {exc}") from exc


def compressor(codec: int) -> Compressor:
    """A streaming compressor for `codec`."""
    if codec == pb.NONE:
        return _Identity()
    if codec in (pb.GZIP, pb.GZIP_OFFLOAD_DECOMPRESSION):
        return _GzipCompressor()
    if codec == pb.SNAPPY:
        return _SnappyCompressor()
    if codec == pb.ZSTANDARD:
        return _ZstdCompressor()
    raise CodecError(f"invalid compression codec {codec}")


def decompressor(codec: int) -> Decompressor:
    """A streaming decompressor for `codec`."""
    if codec == pb.NONE:
        return _Identity()
    if codec in (pb.GZIP, pb.GZIP_OFFLOAD_DECOMPRESSION):
        return _GzipDecompressor()
    if codec == pb.SNAPPY:
        return _SnappyDecompressor()
    if codec == pb.ZSTANDARD:
        return _ZstdDecompressor()
    raise CodecError(f"invalid compression codec {codec}")
