"""Persisting, listing and opening fragments against a real file:// store in a temporary directory."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import tempfile
from pathlib import Path

import pytest

from broker.fragment import Fragment, FragmentError, SpoolFile, sha1sum_from_digest
from broker.fragment.codecs import decompressor
from broker.fragment.names import content_path
from broker.fragment.persister import Persister, PersistJob
from broker.fragment.store_io import CompressedContent, list_fragments, open_fragment, persist
from broker.protocol import pb
from broker.stores import StoreConfigError, StoreError, StoreRegistry
from broker.stores.file import FileStore
from broker.stores.health import check_store

CODECS = [pb.NONE, pb.GZIP, pb.SNAPPY, pb.ZSTANDARD, pb.GZIP_OFFLOAD_DECOMPRESSION]


def _local(journal: str, begin: int, content: bytes, codec: int, tmp: Path) -> Fragment:
    file = SpoolFile(str(tmp))
    file.write_at(0, content)
    spec = pb.Fragment(
        journal=journal, begin=begin, end=begin + len(content), compression_codec=codec,  # type: ignore[arg-type]
        sum=sha1sum_from_digest(hashlib.sha1(content).digest()),
    )
    return Fragment(spec, file)


@pytest.mark.parametrize("codec", CODECS)
async def test_persist_list_and_open_round_trip(tmp_path: Path, codec: int) -> None:
    (tmp_path / "root").mkdir()
    store = FileStore("file:///", str(tmp_path / "root"))
    content = b"".join(b"record %d\n" % i for i in range(5000))
    fragment = _local("a/journal", 1000, content, codec, tmp_path)

    assert await persist(fragment, store) is True
    assert await persist(fragment, store) is False  # Already there: not uploaded again.
    assert (tmp_path / "root" / content_path(fragment.spec)).is_file()

    [listed] = await list_fragments("a/journal", [("file:///", store)])
    assert (listed.begin, listed.end, listed.spec.backing_store) == (1000, 1000 + len(content), "file:///")
    assert listed.mod_time > 0 and listed.file is None
    assert listed.spec.sum == fragment.spec.sum

    whole = b"".join([chunk async for chunk in open_fragment(store, listed.spec, 1000)])
    assert whole == content
    tail = b"".join([chunk async for chunk in open_fragment(store, listed.spec, 1000 + 12345)])
    assert tail == content[12345:]


async def test_listing_skips_objects_that_are_not_fragments(tmp_path: Path) -> None:
    journal_dir = tmp_path / "a/journal"
    journal_dir.mkdir(parents=True)
    (journal_dir / "notes.txt").write_text("not a fragment")
    store = FileStore("file:///", str(tmp_path))
    fragment = _local("a/journal", 0, b"abc", pb.NONE, tmp_path)
    await persist(fragment, store)
    assert [f.end for f in await list_fragments("a/journal", [("file:///", store)])] == [3]


async def test_truncated_object_is_an_error_naming_the_path(tmp_path: Path) -> None:
    store = FileStore("file:///", str(tmp_path))
    fragment = _local("j", 0, b"0123456789", pb.NONE, tmp_path)
    await persist(fragment, store)
    path = tmp_path / content_path(fragment.spec)
    path.write_bytes(b"01234")
    with pytest.raises(FragmentError, match="unexpected EOF at 5, expected the fragment end 10"):
        _ = [chunk async for chunk in open_fragment(store, fragment.spec, 0)]


async def test_persister_retries_until_the_store_is_back(tmp_path: Path) -> None:
    root = tmp_path / "root"
    registry = StoreRegistry(str(root))  # The root does not exist yet: the store is "down".
    landed: list[tuple[PersistJob, str, bool]] = []
    persister = Persister(registry, lambda job, url, up: landed.append((job, url, up)))
    fragment = _local("j", 0, b"payload", pb.SNAPPY, tmp_path)
    persister.submit(fragment, ["file:///"])
    # Retried (after 0.1 s, then 0.2 s, ...): watched for, as a loaded host's attempts take their time.
    async with asyncio.timeout(30):
        while not (persister.pending and persister.pending[0].attempts >= 2):
            await asyncio.sleep(0.01)
    [job] = persister.pending
    assert job.attempts >= 2 and "does not exist" in job.last_error
    assert registry.is_healthy("file:///") is False

    root.mkdir()
    await asyncio.wait_for(persister.wait_idle(), 15)
    assert [(url, up) for _, url, up in landed] == [("file:///", True)]
    assert (root / content_path(fragment.spec)).is_file()
    await persister.close()
    await registry.close()


async def test_persister_prefers_the_first_healthy_store(tmp_path: Path) -> None:
    (tmp_path / "good").mkdir()
    registry = StoreRegistry(str(tmp_path))
    registry.health("file:///missing/").mark_failed("down for the test")
    landed: list[str] = []
    persister = Persister(registry, lambda job, url, up: landed.append(url))
    persister.submit(_local("j", 0, b"x", pb.NONE, tmp_path), ["file:///missing/", "file:///good/"])
    await asyncio.wait_for(persister.wait_idle(), 10)
    assert landed == ["file:///good/"]
    await registry.close()


async def test_health_check_and_registry_errors(tmp_path: Path) -> None:
    await check_store(FileStore("file:///", str(tmp_path)))
    assert (tmp_path / ".test" / "health-check").read_bytes() == b"health-check\n"
    with pytest.raises(StoreError, match="does not exist"):
        await check_store(FileStore("file:///nowhere/", str(tmp_path)))
    registry = StoreRegistry("")
    with pytest.raises(StoreConfigError, match="unsupported fragment store scheme 'ftp'"):
        registry.get("ftp://bucket/")
    with pytest.raises(StoreError, match=r"--broker\.file-root"):
        registry.get("file:///")
    with pytest.raises(StoreConfigError, match='invalid path "bogus"'):
        StoreRegistry("/tmp").get("file:///?bogus=1")


async def test_file_store_put_is_atomic_and_listing_ignores_partials(tmp_path: Path) -> None:
    store = FileStore("file:///", str(tmp_path))
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / ".partial-0000").write_bytes(b"half")
    await store.put("j/obj", io.BytesIO(b"whole"))
    assert [o.path for o in await store.list("j/")] == ["obj"]


async def test_none_fragment_is_linked_into_a_file_store_on_the_spool_filesystem(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    store = FileStore("file:///", str(tmp_path / "root"))
    fragment = _local("a/journal", 0, b"committed\n", pb.NONE, tmp_path)
    assert fragment.file is not None
    fragment.file.write_at(10, b"rolled back\n")  # Bytes past the fragment's end, as a rollback leaves them.

    assert await persist(fragment, store) is True
    stored = tmp_path / "root" / content_path(fragment.spec)
    assert stored.stat().st_ino == os.fstat(fragment.file.fileno()).st_ino  # The spool file itself: no copy.
    assert stored.read_bytes() == b"committed\n"
    assert fragment.file.read_at(0, 100) == b"committed\n"  # The spool still serves reads.
    assert [p.name for p in stored.parent.iterdir()] == [stored.name]  # No partial file left behind.


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs a second filesystem at /dev/shm")
@pytest.mark.parametrize("codec", [pb.NONE, pb.SNAPPY])
async def test_fragment_on_another_filesystem_is_copied(tmp_path: Path, codec: int) -> None:
    with tempfile.TemporaryDirectory(dir="/dev/shm") as other:
        if os.stat(other).st_dev == os.stat(tmp_path).st_dev:
            pytest.skip("/dev/shm is on the spool's filesystem here")
        store = FileStore("file:///", other)
        content = b"".join(b"record %d\n" % i for i in range(50_000))
        fragment = _local("a/journal", 0, content, codec, tmp_path)
        assert await persist(fragment, store) is True
        stored = Path(other) / content_path(fragment.spec)
        assert fragment.file is not None
        assert stored.stat().st_ino != os.fstat(fragment.file.fileno()).st_ino
        assert b"".join([chunk async for chunk in open_fragment(store, fragment.spec, 0)]) == content


@pytest.mark.parametrize("codec", CODECS)
def test_compressed_content_reads_whole_or_in_pieces_alike(tmp_path: Path, codec: int) -> None:
    content = b"".join(b"record %d\n" % i for i in range(100_000))
    whole = CompressedContent(_local("j", 0, content, codec, tmp_path)).read()
    pieces = CompressedContent(_local("j", 0, content, codec, tmp_path))
    assert b"".join(iter(lambda: pieces.read(1000), b"")) == whole
    assert pieces.written == len(whole)
    assert decompressor(codec).decompress(whole) == content
