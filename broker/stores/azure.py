"""Azure Blob Storage stores, via azure-storage-blob (blocking calls run in threads).

As Gazette's (`broker/stores/azure/` in gazette/core), two URL forms name a container and a prefix,
objects are named `<prefix><journal>/<fragment>`, and the query arguments are `find` and `replace`:

- `azure://<container>/<prefix>/`: Shared Key authentication; the storage account and its key come
  from `AZURE_ACCOUNT_NAME` and `AZURE_ACCOUNT_KEY`. GET URLs carry a service SAS signed with the key.
- `azure-ad://<tenant id>/<storage account>/<container>/<prefix>/`: Azure AD authentication as the
  application `AZURE_CLIENT_ID` with secret `AZURE_CLIENT_SECRET` in that tenant (azure-identity).
  GET URLs carry a user delegation SAS; the delegation key is fetched for 2 hours and renewed once
  half of that has passed.

The account's blob endpoint is `https://<account>.blob.core.windows.net`. `AZURE_STORAGE_BLOB_ENDPOINT`
replaces it, with `{account}` standing for the account name: an emulator's, e.g. Azurite's
`http://127.0.0.1:10000/{account}`. SAS URLs allow HTTPS only, as Gazette's, unless the endpoint is
plain HTTP (an emulator), where they allow both.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, BinaryIO, TypeVar
from urllib.parse import urlparse

from azure.core.exceptions import AzureError
from azure.storage.blob import (
    BlobSasPermissions,
    BlobServiceClient,
    ContainerClient,
    ContentSettings,
    LinearRetry,
    UserDelegationKey,
    generate_blob_sas,
)

from broker.stores.base import Prepended, StoreConfigError, StoreError, StoreObject, query_args, read_head, rewrite

ARGS = {"find", "replace"}
ENDPOINT_ENV = "AZURE_STORAGE_BLOB_ENDPOINT"
DEFAULT_ENDPOINT = "https://{account}.blob.core.windows.net"
READ_CHUNK = 4 << 20
"""Bytes per ranged GET when reading a blob."""
SINGLE_PUT = 8 << 20
"""Content up to this size is uploaded in one request; longer content in blocks of it."""
DELEGATION_KEY_LIFETIME = datetime.timedelta(hours=2)
CLIENT_OPTIONS: dict[str, Any] = {
    "connection_timeout": 5,
    "read_timeout": 60,
    # Transient failures are retried once (as the S3 store's): the broker's persister and health checks
    # retry for longer, with their own backoff.
    "retry_policy": LinearRetry(backoff=1, retry_total=1, random_jitter_range=0),
    "max_single_put_size": SINGLE_PUT,
    "max_block_size": SINGLE_PUT,
    "max_single_get_size": READ_CHUNK,
    "max_chunk_get_size": READ_CHUNK,
}
T = TypeVar("T")


def account_endpoint(account: str) -> str:
    """The blob service endpoint of storage `account`."""
    return (os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT).replace("{account}", account).rstrip("/")


class AzureStore:
    """An `azure://` (Shared Key) or `azure-ad://` (Azure AD) store."""

    def __init__(self, url: str) -> None:
        self.url = url
        parsed = urlparse(url)
        self._args = query_args(url, ARGS)
        self._ad = parsed.scheme == "azure-ad"
        if self._ad:
            parts = parsed.path[1:].split("/")
            if len(parts) < 2 or not parts[0] or not parts[1]:
                raise StoreConfigError(
                    "azure-ad:// URL must include storage account and container: "
                    "azure-ad://tenant-id/storage-account/container/prefix/", url,
                )
            self.tenant = parsed.hostname or ""
            self.account, self.container, self.prefix = parts[0], parts[1], "/".join(parts[2:])
            self._client_id = os.environ.get("AZURE_CLIENT_ID", "")
            self._client_secret = os.environ.get("AZURE_CLIENT_SECRET", "")
            if not self._client_id or not self._client_secret:
                raise StoreConfigError("AZURE_CLIENT_ID and AZURE_CLIENT_SECRET must be set for azure-ad:// URLs", url)
            self._key = ""
        else:
            self.tenant = ""
            self.container, self.prefix = parsed.hostname or "", parsed.path[1:]
            self.account = os.environ.get("AZURE_ACCOUNT_NAME", "")
            self._key = os.environ.get("AZURE_ACCOUNT_KEY", "")
            if not self.account or not self._key:
                raise StoreConfigError("AZURE_ACCOUNT_NAME and AZURE_ACCOUNT_KEY must be set for azure:// URLs", url)
        self.endpoint = account_endpoint(self.account)
        self._protocol = "https" if self.endpoint.startswith("https:") else "https,http"
        self._lock = threading.Lock()
        self._service: BlobServiceClient | None = None
        self._container: ContainerClient | None = None
        self._delegation: tuple[datetime.datetime, UserDelegationKey] | None = None

    def _name(self, path: str) -> str:
        return self.prefix + rewrite(path, self._args)

    def _connect(self) -> ContainerClient:
        """The container client, made on first use."""
        with self._lock:
            if self._container is None:
                credential: Any
                if self._ad:
                    from azure.identity import ClientSecretCredential  # Only azure-ad:// stores need it.

                    credential = ClientSecretCredential(
                        self.tenant, self._client_id, self._client_secret, disable_instance_discovery=True
                    )
                else:
                    credential = {"account_name": self.account, "account_key": self._key}
                self._service = BlobServiceClient(self.endpoint, credential=credential, **CLIENT_OPTIONS)
                self._container = self._service.get_container_client(self.container)
            return self._container

    async def _run(self, path: str, fn: Callable[[ContainerClient], T]) -> T:
        """`fn(container)` in a thread; SDK errors become StoreError naming the store and `path`."""
        try:
            return await asyncio.to_thread(lambda: fn(self._connect()))
        except (AzureError, OSError, ValueError) as exc:
            raise StoreError(_message(exc), self.url, path) from exc

    async def list(self, prefix: str) -> list[StoreObject]:
        top = self._name(prefix)

        def walk(container: ContainerClient) -> list[StoreObject]:
            out = []
            for blob in container.list_blobs(name_starts_with=top):
                if blob.name.endswith("/"):
                    continue  # A directory placeholder.
                modified = blob.last_modified
                out.append(StoreObject(blob.name[len(top):], int(modified.timestamp()) if modified else 0))
            return out

        return await self._run(prefix, walk)

    async def exists(self, path: str) -> bool:
        name = self._name(path)
        found: bool = await self._run(path, lambda c: c.get_blob_client(name).exists())
        return found

    async def put(self, path: str, source: BinaryIO, content_encoding: str = "") -> None:
        name = self._name(path)
        settings = ContentSettings(content_type="application/octet-stream", content_encoding=content_encoding or None)

        def upload(container: ContainerClient) -> None:
            head, ended = read_head(source, SINGLE_PUT)
            # What fits is one Put Blob; the rest is staged in blocks as it is read, and committed.
            data: bytes | Prepended = head if ended else Prepended(head, source)
            container.get_blob_client(name).upload_blob(
                data, overwrite=True, content_settings=settings, max_concurrency=1
            )

        await self._run(path, upload)

    async def open(self, path: str) -> AsyncIterator[bytes]:
        name = self._name(path)

        def start(container: ContainerClient) -> Iterator[bytes]:
            # The stored bytes: a gzip-encoded blob is decoded by the fragment's codec, not the SDK.
            return container.get_blob_client(name).download_blob(decompress=False, max_concurrency=1).chunks()

        chunks = await self._run(path, start)
        while chunk := await self._run(path, lambda _: next(chunks, b"")):
            yield chunk

    async def sign_get(self, path: str, ttl: float) -> str:
        name = self._name(path)

        def sign(container: ContainerClient) -> str:
            expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=max(1, ttl))
            blob = container.get_blob_client(name)
            if self._ad:
                sas = generate_blob_sas(
                    self.account, self.container, name, user_delegation_key=self._delegation_key(),
                    permission=BlobSasPermissions(read=True), expiry=expiry, protocol=self._protocol,
                )
            else:
                sas = generate_blob_sas(
                    self.account, self.container, name, account_key=self._key,
                    permission=BlobSasPermissions(read=True), expiry=expiry, protocol=self._protocol,
                )
            return f"{blob.url}?{sas}"

        return await self._run(path, sign)

    def _delegation_key(self) -> UserDelegationKey:
        """The user delegation key signing azure-ad:// URLs, renewed once half its lifetime has passed."""
        now = datetime.datetime.now(datetime.UTC)
        with self._lock:
            if self._delegation is not None and self._delegation[0] > now + DELEGATION_KEY_LIFETIME / 2:
                return self._delegation[1]
        assert self._service is not None
        expiry = now + DELEGATION_KEY_LIFETIME
        key = self._service.get_user_delegation_key(now, expiry)
        with self._lock:
            self._delegation = (expiry, key)
        return key

    async def remove(self, path: str) -> None:
        name = self._name(path)
        await self._run(path, lambda c: c.get_blob_client(name).delete_blob())


def _message(exc: BaseException) -> str:
    """An SDK error's text: its first line (Azure's add the request ID, time and XML error body)."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
