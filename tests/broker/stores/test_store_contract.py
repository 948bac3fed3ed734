"""Every fragment store keeps one contract, checked against real servers: file://, s3:// on moto,
gs:// on fake-gcs-server and azure:// on Azurite (each started once for the module, a bucket per test).

What an emulator cannot show is said where it matters: fake-gcs-server serves signed URLs without
checking their signatures; Azurite checks SAS signatures (a tampered one is refused here).
"""

from __future__ import annotations

import asyncio
import gzip
import io
import os
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.stores import FragmentStore, StoreConfigError, StoreError, StoreRegistry
from broker.stores.azure import AzureStore, account_endpoint
from broker.stores.health import check_delete, check_store
from tests.support.store_emulators import EmulatorProcess

KINDS = ["file", "s3", "gs", "azure"]
EMULATOR_FIXTURES = {"s3": "moto", "gs": "fake_gcs", "azure": "azurite"}


@dataclass
class Bucket:
    """A fresh bucket (or file root) and its store URL."""

    kind: str
    url: str
    registry: StoreRegistry
    emulator: EmulatorProcess | None
    name: str

    @property
    def store(self) -> FragmentStore:
        return self.registry.get(self.url)

    def with_args(self, prefix: str, query: str = "") -> FragmentStore:
        url = self.url.split("?")[0] + prefix
        base_query = self.url.partition("?")[2]
        query = "&".join(q for q in (base_query, query) if q)
        return self.registry.get(f"{url}?{query}" if query else url)


@pytest.fixture(params=KINDS)
def bucket(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Bucket]:
    kind: str = request.param
    registry = StoreRegistry(str(tmp_path))
    if kind == "file":
        (tmp_path / "root").mkdir()
        yield Bucket(kind, "file:///root/", registry, None, "")
        return
    emulator: EmulatorProcess = request.getfixturevalue(EMULATOR_FIXTURES[kind])
    name = f"b-{uuid.uuid4().hex[:16]}"
    emulator.create_bucket(name)
    yield Bucket(kind, emulator.store_url(name, "some/prefix/"), registry, emulator, name)


async def _read(store: FragmentStore, path: str) -> bytes:
    return b"".join([chunk async for chunk in store.open(path)])


def _fetch(url: str, file_root: str, accept_encoding: str = "identity") -> tuple[bytes, str]:
    """GET a signed URL as a client does: the body as sent, and its Content-Encoding."""
    if url.startswith("file://"):
        return (Path(file_root) / url.removeprefix("file:///")).read_bytes(), ""
    req = urllib.request.Request(url, headers={"Accept-Encoding": accept_encoding})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.read(), resp.headers.get("Content-Encoding", "")


async def test_put_list_open_sign_and_remove(bucket: Bucket) -> None:
    store = bucket.store
    plain = b"".join(b"record %d\n" % i for i in range(1000))
    packed = gzip.compress(plain)
    await store.put("a/journal/0000-plain", io.BytesIO(plain))
    await store.put("a/journal/sub/0001-packed.gz", io.BytesIO(packed), content_encoding="gzip")
    await store.put("a/journalist/other", io.BytesIO(b"not listed under a/journal/"))

    assert await store.exists("a/journal/0000-plain")
    assert not await store.exists("a/journal/missing")
    listed = await store.list("a/journal/")
    assert sorted(o.path for o in listed) == ["0000-plain", "sub/0001-packed.gz"]
    assert all(abs(o.mod_time - time.time()) < 300 for o in listed)  # Seconds since the epoch.

    assert await _read(store, "a/journal/0000-plain") == plain
    assert await _read(store, "a/journal/sub/0001-packed.gz") == packed  # As stored: the codec decodes it.

    for path, body in (("a/journal/0000-plain", plain), ("a/journal/sub/0001-packed.gz", packed)):
        url = await store.sign_get(path, 60)
        fetched, encoding = await asyncio.to_thread(_fetch, url, bucket.registry.file_root)
        # A gzip-encoded object comes as stored, with its Content-Encoding (S3, Azure), or decoded by
        # a store that transcodes for a client accepting only identity (GCS); file:// has no encodings.
        decoded = gzip.decompress(fetched) if encoding == "gzip" else fetched
        assert decoded in ((plain, packed) if path.endswith(".gz") else (body,)), url

    await store.remove("a/journal/0000-plain")
    assert not await store.exists("a/journal/0000-plain")
    assert [o.path for o in await store.list("a/journal/")] == ["sub/0001-packed.gz"]
    with pytest.raises(StoreError) as err:
        await _read(store, "a/journal/0000-plain")
    assert err.value.store == bucket.url and err.value.path == "a/journal/0000-plain"


async def test_long_content_streams_and_reads_back_whole(bucket: Bucket) -> None:
    """Content longer than one request's worth (8 MiB) is streamed up in parts, read once, of unknown length."""
    content = os.urandom(1 << 20) * 19  # 19 MiB: two whole parts of 8 MiB and a short one.

    class ReadOnce(io.RawIOBase):
        def __init__(self) -> None:
            self._src = io.BytesIO(content)

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
            data = self._src.read(min(len(buffer), 300_000))  # Short reads, as a compressor gives.
            buffer[: len(data)] = data
            return len(data)

    await bucket.store.put("big/object", ReadOnce())  # type: ignore[arg-type]
    assert await _read(bucket.store, "big/object") == content


async def test_find_and_replace_rewrite_object_names(bucket: Bucket) -> None:
    rewritten = bucket.with_args("", "find=old%2F&replace=new%2F")
    await rewritten.put("j/old/fragment", io.BytesIO(b"x"))
    assert await bucket.store.exists("j/new/fragment")
    assert not await bucket.store.exists("j/old/fragment")
    assert [o.path for o in await rewritten.list("j/old/")] == ["fragment"]


async def test_health_checks_pass_and_a_missing_bucket_fails_naming_the_store(bucket: Bucket) -> None:
    await check_store(bucket.store)
    await check_delete(bucket.store, "probe/")
    assert not await bucket.store.exists("probe/.gazette-delete-probe")
    if bucket.emulator is None:
        missing = "file:///no-such-dir/"
    else:
        missing = bucket.emulator.store_url(f"missing-{uuid.uuid4().hex[:8]}", "p/")
    with pytest.raises(StoreError) as err:
        await check_store(bucket.registry.get(missing))
    assert missing in str(err.value)


async def test_azurite_refuses_a_tampered_sas(azurite: EmulatorProcess) -> None:
    name = f"b-{uuid.uuid4().hex[:16]}"
    azurite.create_bucket(name)
    store = StoreRegistry().get(azurite.store_url(name))
    await store.put("obj", io.BytesIO(b"signed"))
    url = await store.sign_get("obj", 60)
    assert "sig=" in url and "sp=r" in url and url.startswith(f"{azurite.endpoint}/devstoreaccount1/{name}/obj?")
    assert (await asyncio.to_thread(_fetch, url, ""))[0] == b"signed"
    with pytest.raises(urllib.error.HTTPError, match="403"):
        await asyncio.to_thread(_fetch, url.replace("sig=", "sig=AAAA"), "")


# --- Pure unit tests: URL forms and configuration, no I/O. ---------------------------------------


def test_azure_urls_name_container_account_and_prefix_as_gazette(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AZURE_STORAGE_BLOB_ENDPOINT", raising=False)
    monkeypatch.setenv("AZURE_ACCOUNT_NAME", "acct")
    monkeypatch.setenv("AZURE_ACCOUNT_KEY", "a2V5")
    shared = AzureStore("azure://container/a/prefix/?find=x&replace=y")
    assert (shared.account, shared.container, shared.prefix) == ("acct", "container", "a/prefix/")
    assert shared.endpoint == "https://acct.blob.core.windows.net"

    monkeypatch.setenv("AZURE_CLIENT_ID", "client")
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "secret")
    ad = AzureStore("azure-ad://tenant-id/account/container/pre/fix/")
    assert (ad.tenant, ad.account, ad.container, ad.prefix) == ("tenant-id", "account", "container", "pre/fix/")
    assert ad.endpoint == "https://account.blob.core.windows.net"

    monkeypatch.setenv("AZURE_STORAGE_BLOB_ENDPOINT", "http://127.0.0.1:10000/{account}/")
    assert account_endpoint("other") == "http://127.0.0.1:10000/other"


def test_azure_configuration_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AZURE_ACCOUNT_NAME", "AZURE_ACCOUNT_KEY", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(StoreConfigError, match="AZURE_ACCOUNT_NAME and AZURE_ACCOUNT_KEY must be set"):
        AzureStore("azure://container/")
    with pytest.raises(StoreConfigError, match="AZURE_CLIENT_ID and AZURE_CLIENT_SECRET must be set"):
        AzureStore("azure-ad://tenant/account/container/")
    with pytest.raises(StoreConfigError, match="must include storage account and container"):
        AzureStore("azure-ad://tenant/account/")
    with pytest.raises(StoreConfigError, match='invalid path "endpoint"'):
        StoreRegistry().get("gs://bucket/?endpoint=http://x")
