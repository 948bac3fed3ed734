"""Direct reads of persisted fragments (`do_not_proxy`), against a real broker with a file:// store.

These need the broker to persist fragments to its stores (file:// under --broker.file-root).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.client import (
    JournalClient,
    OffsetJump,
    Reader,
    RetryReader,
    append,
    fragments_request,
    list_all_fragments,
)
from broker.client.fragments import file_url_path
from broker.fragment.names import content_path
from broker.protocol import pb
from tests.support.harness import BrokerProcess
from tests.support.journals import metric, new_journal

RECORD = 1500  # Longer than the journal's 1024-byte fragments: every append rolls a new fragment.


def record(i: int) -> bytes:
    return (f"record {i:03d} ".encode() * 200)[:RECORD]


async def persisted_journal(client: JournalClient, codec: int, appends: int) -> tuple[str, list[pb.Fragment]]:
    """A journal of `appends` records whose fragments, all but the last, are persisted and listed."""
    journal = await new_journal(
        client, "client/direct", length=1024, compression_codec=codec, stores=["file:///"], refresh_interval=1
    )
    for i in range(appends):
        await append(client, journal, record(i))
    # Each append rolls the previous fragment, which the broker then persists: wait for the listing.
    async with asyncio.timeout(30):
        while True:
            listed = await list_all_fragments(client, fragments_request(journal))
            persisted = [f.spec for f in listed.fragments if f.spec.backing_store]
            if len(persisted) >= appends - 1:
                return journal, persisted
            await asyncio.sleep(0.1)


async def read_to_head(reader: Reader | RetryReader) -> bytes:
    return b"".join([chunk async for chunk in reader])


@pytest.mark.parametrize(
    # GZIP_OFFLOAD_DECOMPRESSION needs an HTTP store (file:// ones refuse it): see test_client_fragments.
    "codec", [pb.NONE, pb.GZIP, pb.SNAPPY, pb.ZSTANDARD],
    ids=lambda c: pb.CompressionCodec.Name(c),
)
async def test_do_not_proxy_reads_persisted_fragments_from_the_store(
    client: JournalClient, broker: BrokerProcess, file_root: Path, codec: int
) -> None:
    journal, persisted = await persisted_journal(client, codec, 4)
    assert all(f.backing_store == "file:///" and f.compression_codec == codec for f in persisted)
    before = await asyncio.to_thread(metric, broker, "gazette_read_bytes_total", journal)

    # A Reader opens the persisted fragment itself and ends at its end.
    reader = Reader(client, journal, offset=100, do_not_proxy=True)
    assert await reader.read(50) == record(0)[100:150]
    assert reader.fragment_url == "file:///" + content_path(reader.response.fragment)
    assert file_url_path(reader.fragment_url, str(file_root)).is_file()
    assert await reader.seek(1000) == 1000  # Forward, within the fragment: read and discarded.
    rest = await read_to_head(reader)
    assert rest == record(0)[1000:] and reader.offset == RECORD

    # A RetryReader goes on fragment by fragment; only the unpersisted last one comes through the broker.
    retry = RetryReader(client, journal, do_not_proxy=True)
    assert await read_to_head(retry) == b"".join(record(i) for i in range(4))
    served = await asyncio.to_thread(metric, broker, "gazette_read_bytes_total", journal) - before
    # At most the fragments not persisted when listed (more may have been since).
    assert served <= 4 * RECORD - sum(f.end - f.begin for f in persisted)
    await retry.close()


async def test_offset_jump_over_removed_fragment(client: JournalClient, file_root: Path) -> None:
    journal, persisted = await persisted_journal(client, pb.NONE, 3)
    first = min(persisted, key=lambda f: f.begin)
    (file_root / content_path(first)).unlink()
    # The next listing (refresh_interval 1s) no longer covers [0, first.end).
    async with asyncio.timeout(30):
        while any(f.spec.begin == 0 for f in (await list_all_fragments(client, fragments_request(journal))).fragments):
            await asyncio.sleep(0.1)

    reader = Reader(client, journal, offset=0)
    with pytest.raises(OffsetJump) as info:
        await reader.read()
    assert (info.value.offset, info.value.to) == (0, first.end)
    # The broker proxies the persisted fragments (no do_not_proxy), then serves the spool. (Whether
    # one read() returns a fragment or more is the transport's: a Read RPC's chunks end at
    # fragment ends, a GET's are what arrived.)
    assert await read_to_head(reader) == record(1) + record(2)
    # Iterating continues across the jump.
    assert await read_to_head(RetryReader(client, journal, do_not_proxy=True)) == record(1) + record(2)
