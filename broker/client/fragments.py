"""Reading a persisted fragment directly from its store, given the URL a broker signed for it.

`file://` URLs are relative to the brokers' file root (`--broker.file-root`): the client maps
them onto its own `file_root`, as Gazette's InstallFileTransport does. `http(s)://` URLs
(presigned S3 GETs) are fetched with urllib3 over HTTP/1.1. Blocking I/O and decompression run
in a worker thread; content must end exactly at `fragment.end`.
"""

from __future__ import annotations

import asyncio
import posixpath
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Protocol
from urllib.parse import unquote, urlsplit

from broker.client.errors import FragmentReadError, UnexpectedEOF
from broker.errors import ConfigError
from broker.fragment.codecs import CodecError, Decompressor, decompressor
from broker.protocol import pb

if TYPE_CHECKING:
    import urllib3

READ_CHUNK = 1 << 20
"""Raw bytes read from the store per step."""

_pool: urllib3.PoolManager | None = None
_pool_lock = threading.Lock()


class RawSource(Protocol):
    """A blocking byte source: a file, or an HTTP response body."""

    def read(self, size: int) -> bytes: ...
    def close(self) -> None: ...


class _HttpBody:
    def __init__(self, resp: urllib3.BaseHTTPResponse) -> None:
        self._resp = resp

    def read(self, size: int) -> bytes:
        return self._resp.read(size, decode_content=False)

    def close(self) -> None:
        self._resp.release_conn()


def _http() -> urllib3.PoolManager:
    """The process's pool, made at the first http(s) fragment read (importing urllib3 then: it is
    40 ms of the start-up of every process that reads journals, and most never fetch a URL)."""
    import urllib3

    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = urllib3.PoolManager(num_pools=16, maxsize=8)
        return _pool


def redact(url: str) -> str:
    """`url` without its query string, which holds a presigned URL's signature."""
    parts = urlsplit(url)
    return parts._replace(query="", fragment="").geturl()


class FragmentReader:
    """The decompressed content of one fragment, from `offset` to exactly `fragment.end`."""

    def __init__(self, raw: RawSource, fragment: pb.Fragment, codec: int | None = None) -> None:
        self.fragment = fragment
        self.offset = fragment.begin
        """The journal offset of the next byte `read` returns."""
        self._raw = raw
        self._decomp: Decompressor = decompressor(fragment.compression_codec if codec is None else codec)
        self._decoded_to = fragment.begin  # Journal offset through which content was decoded.
        self._pending = b""  # Decoded, not yet returned; it begins at self.offset.
        self._eof = False
        self._closed = False

    def _pull(self) -> bytes | None:
        """Read and decode one raw chunk (blocking); None at the end of the raw content."""
        raw = self._raw.read(READ_CHUNK)
        if not raw:
            return None
        try:
            return self._decomp.decompress(raw)
        except CodecError as exc:
            raise FragmentReadError(str(exc), journal=self.fragment.journal, offset=self._decoded_to) from exc

    async def _fill(self) -> bool:
        """Decode more content into the pending buffer; False at the fragment's end."""
        while not self._pending:
            if self._eof:
                return False
            data = await asyncio.to_thread(self._pull)
            if data is None:
                self._eof = True
                if self._decoded_to != self.fragment.end:
                    raise UnexpectedEOF(
                        f"fragment content ended before its end {self.fragment.end}",
                        journal=self.fragment.journal,
                        offset=self._decoded_to,
                    )
                return False
            self._decoded_to += len(data)
            if self._decoded_to > self.fragment.end:
                raise FragmentReadError(
                    f"did not read EOF at expected Fragment.End {self.fragment.end}",
                    journal=self.fragment.journal,
                    offset=self._decoded_to,
                )
            self._pending = data
        return True

    async def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes (any amount if negative); b"" once `fragment.end` is reached."""
        if not await self._fill():
            return b""
        n = len(self._pending) if size < 0 else min(size, len(self._pending))
        out, self._pending = self._pending[:n], self._pending[n:]
        self.offset += len(out)
        return out

    async def skip_to(self, offset: int) -> None:
        """Discard content up to journal `offset` (which must be in [self.offset, fragment.end])."""
        if not self.offset <= offset <= self.fragment.end:
            raise ValueError(f"cannot skip from {self.offset} to {offset} in [{self.fragment.begin}, "
                             f"{self.fragment.end})")
        while self.offset < offset:
            if not await self._fill():
                break
            n = min(offset - self.offset, len(self._pending))
            self._pending = self._pending[n:]
            self.offset += n

    async def close(self) -> None:
        """Release the underlying file or connection."""
        if not self._closed:
            self._closed = True
            await asyncio.to_thread(self._raw.close)


def file_url_path(url: str, file_root: str | None) -> Path:
    """The local path of a `file:///path` fragment URL under `file_root`."""
    path = unquote(urlsplit(url).path)
    if file_root is None:
        # A configuration problem, not a fragment's: RetryReader must not retry it.
        raise ConfigError(
            f"fragment URL {url} is relative to the brokers' file root: pass file_root "
            "(their --broker.file-root) to read it directly, or read without do_not_proxy"
        )
    clean = posixpath.normpath("/" + path).lstrip("/")
    return Path(file_root) / clean


def _open_http(url: str, fragment: pb.Fragment) -> tuple[RawSource, int]:
    """GET `url` (blocking); returns the body and the codec to decode it with."""
    codec: int = fragment.compression_codec
    headers = {}
    if codec == pb.GZIP_OFFLOAD_DECOMPRESSION:
        # Ask the store to decompress; it may still send gzip, which we then decode ourselves.
        headers["Accept-Encoding"] = "identity"
    elif codec == pb.GZIP:
        headers["Accept-Encoding"] = "gzip"
    import urllib3

    try:
        resp = _http().request(
            "GET", url, headers=headers, preload_content=False, decode_content=False,
            timeout=urllib3.Timeout(connect=10.0, read=60.0), retries=urllib3.Retry(total=2, redirect=2),
        )
    except urllib3.exceptions.HTTPError as exc:
        raise FragmentReadError(f"fetching {redact(url)}: {exc}", journal=fragment.journal) from exc
    if resp.status != 200:
        resp.drain_conn()
        resp.release_conn()
        raise FragmentReadError(f"!OK fetching ({resp.status} {resp.reason}, {redact(url)})", journal=fragment.journal)
    if codec == pb.GZIP_OFFLOAD_DECOMPRESSION:
        gzipped = resp.headers.get("Content-Encoding", "").lower() == "gzip"
        codec = pb.GZIP if gzipped else pb.NONE
    return _HttpBody(resp), codec


async def open_fragment_url(
    fragment: pb.Fragment, url: str, offset: int, *, file_root: str | None = None
) -> FragmentReader:
    """Open `fragment` at `url` and skip to journal `offset` (in [fragment.begin, fragment.end))."""
    scheme = urlsplit(url).scheme.lower()
    raw: RawSource
    codec: int
    if scheme == "file":
        path = file_url_path(url, file_root)
        try:
            raw = await asyncio.to_thread(open, path, "rb")
        except OSError as exc:
            raise FragmentReadError(f"opening {path}: {exc.strerror}", journal=fragment.journal) from exc
        codec = fragment.compression_codec
    elif scheme in ("http", "https"):
        raw, codec = await asyncio.to_thread(_open_http, url, fragment)
    else:
        raise FragmentReadError(f"unsupported fragment URL scheme {scheme!r} ({redact(url)})", journal=fragment.journal)
    reader = FragmentReader(raw, fragment, codec)
    try:
        await reader.skip_to(offset)
    except BaseException:
        await reader.close()
        raise
    return reader
