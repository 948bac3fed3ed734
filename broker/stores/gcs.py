"""The `gs://bucket/prefix/` store, via google-cloud-storage (blocking calls run in threads).

As Gazette's gs:// store (`broker/stores/gcs/store.go` in gazette/core): objects are named
`<prefix><journal>/<fragment>`; the query arguments are `find` and `replace`; credentials are the
application default credentials, and signing a GET URL needs a service-account private key among
them (`GOOGLE_APPLICATION_CREDENTIALS` naming its JSON key file). Signed URLs are V4 (Gazette's Go
client signs V2 by default; a reader cannot tell, but V4 URLs live at most 7 days).

`STORAGE_EMULATOR_HOST` (google-cloud-storage's own variable, e.g. `http://127.0.0.1:4443`) points
the store at an emulator such as fake-gcs-server: requests then go there unauthenticated, and URLs
are signed for it (with a service-account key, if one is configured) at the same address.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import threading
from collections.abc import AsyncIterator, Callable
from typing import BinaryIO, TypeVar

import google.auth
import google.auth.credentials
import google.auth.exceptions
import requests
from google.api_core import exceptions as api_exceptions
from google.cloud import storage
from google.cloud.storage import exceptions as storage_exceptions
from google.cloud.storage.retry import DEFAULT_RETRY

from broker.stores.base import Prepended, StoreError, StoreObject, bucket_and_prefix, query_args, read_head, rewrite

ARGS = {"find", "replace"}
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
SCOPE = "https://www.googleapis.com/auth/devstorage.full_control"
READ_CHUNK = 4 << 20
"""Bytes per ranged GET when reading an object."""
SINGLE_PUT = 8 << 20
"""Content up to this size is uploaded in one request; longer content in resumable chunks of it."""
TIMEOUT = (5.0, 60.0)
"""Connect and read timeouts of each request."""
RETRY = DEFAULT_RETRY.with_delay(initial=0.2, maximum=1.0).with_timeout(2.0)
"""Transient failures are retried briefly (as the S3 store's one retry): the broker's persister and health
checks retry for longer, with their own backoff."""
MAX_SIGNED_TTL = 7 * 24 * 3600
"""The longest a V4 signed URL may live."""

_ERRORS = (
    api_exceptions.GoogleAPIError,
    google.auth.exceptions.GoogleAuthError,
    requests.exceptions.RequestException,
    storage_exceptions.InvalidResponse,
    storage_exceptions.DataCorruption,
    OSError,
)
T = TypeVar("T")


class GCSStore:
    def __init__(self, url: str) -> None:
        self.url = url
        self.bucket, self.prefix = bucket_and_prefix(url)
        self._args = query_args(url, ARGS)
        self._emulator = os.environ.get(EMULATOR_ENV, "")
        self._lock = threading.Lock()
        self._handle: storage.Bucket | None = None
        self._signer: google.auth.credentials.Signing | None = None
        self._signer_error = ""

    def _key(self, path: str) -> str:
        return self.prefix + rewrite(path, self._args)

    def _connect(self) -> storage.Bucket:
        """The bucket handle, made on first use (finding credentials may take network round trips)."""
        with self._lock:
            if self._handle is None:
                if self._emulator:
                    client = storage.Client()  # Anonymous, at the emulator's address.
                    key_file = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS", "")
                    # Signing keys only: no credential search, which would probe for a metadata server.
                    creds = google.auth.default()[0] if key_file else None
                else:
                    creds, project = google.auth.default(scopes=[SCOPE])
                    client = storage.Client(credentials=creds, project=project)
                if isinstance(creds, google.auth.credentials.Signing):
                    self._signer = creds
                else:
                    self._signer_error = (
                        "signing GCS URLs needs a service-account private key in the application default "
                        "credentials (GOOGLE_APPLICATION_CREDENTIALS naming its JSON key file)"
                    )
                self._handle = client.bucket(self.bucket)
            return self._handle

    async def _run(self, path: str, fn: Callable[[storage.Bucket], T]) -> T:
        """`fn(bucket)` in a thread; SDK errors become StoreError naming the store and `path`."""

        def call() -> T:
            return fn(self._connect())

        try:
            return await asyncio.to_thread(call)
        except _ERRORS as exc:
            raise StoreError(_message(exc), self.url, path) from exc
        except ValueError as exc:  # E.g. a signed URL's expiration out of range.
            raise StoreError(str(exc), self.url, path) from exc

    async def list(self, prefix: str) -> list[StoreObject]:
        top = self._key(prefix)

        def walk(bucket: storage.Bucket) -> list[StoreObject]:
            out = []
            for blob in bucket.client.list_blobs(bucket, prefix=top, retry=RETRY, timeout=TIMEOUT):
                name: str = blob.name
                if name.endswith("/"):
                    continue  # A directory placeholder.
                updated = blob.updated
                out.append(StoreObject(name[len(top):], int(updated.timestamp()) if updated else 0))
            return out

        return await self._run(prefix, walk)

    async def exists(self, path: str) -> bool:
        key = self._key(path)
        found: bool = await self._run(path, lambda b: b.blob(key).exists(retry=RETRY, timeout=TIMEOUT))
        return found

    async def put(self, path: str, source: BinaryIO, content_encoding: str = "") -> None:
        key = self._key(path)

        def upload(bucket: storage.Bucket) -> None:
            blob = bucket.blob(key, chunk_size=SINGLE_PUT)
            if content_encoding:
                blob.content_encoding = content_encoding
            head, ended = read_head(source, SINGLE_PUT)
            if ended:  # One request, which may be retried: the content is at hand.
                blob.upload_from_string(head, content_type="application/octet-stream", retry=RETRY, timeout=TIMEOUT)
            else:  # A resumable upload of read-once content: a failure fails the put, which the persister retries.
                blob.upload_from_file(
                    Prepended(head, source), content_type="application/octet-stream", retry=None, timeout=TIMEOUT
                )

        await self._run(path, upload)

    async def open(self, path: str) -> AsyncIterator[bytes]:
        key = self._key(path)
        pos = 0
        while True:

            def chunk(bucket: storage.Bucket, start: int = pos) -> bytes:
                try:
                    data: bytes = bucket.blob(key).download_as_bytes(
                        start=start, end=start + READ_CHUNK - 1, raw_download=True, checksum=None, retry=RETRY,
                        timeout=TIMEOUT,
                    )
                except api_exceptions.RequestRangeNotSatisfiable:
                    if start == 0:  # An empty object: none of its bytes is a range. Does it exist?
                        bucket.blob(key).reload(retry=RETRY, timeout=TIMEOUT)
                    return b""
                return data

            data = await self._run(path, chunk)
            if data:
                yield data
            if len(data) < READ_CHUNK:
                return
            pos += len(data)

    async def sign_get(self, path: str, ttl: float) -> str:
        key = self._key(path)
        seconds = max(1, int(ttl))
        if seconds > MAX_SIGNED_TTL:
            raise StoreError(f"a signed GCS URL lives at most 7 days ({MAX_SIGNED_TTL}s), not {seconds}s",
                             self.url, path)

        def sign(bucket: storage.Bucket) -> str:
            if self._signer is None:
                raise StoreError(self._signer_error, self.url, path)
            url: str = bucket.blob(key).generate_signed_url(
                version="v4", method="GET", expiration=datetime.timedelta(seconds=seconds), credentials=self._signer,
                api_access_endpoint=self._emulator or None,
            )
            return url

        return await self._run(path, sign)

    async def remove(self, path: str) -> None:
        key = self._key(path)
        await self._run(path, lambda b: b.blob(key).delete(retry=RETRY, timeout=TIMEOUT))


def _message(exc: BaseException) -> str:
    """An SDK error's text, on one line."""
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())
