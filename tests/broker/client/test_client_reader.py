"""Reader and RetryReader against a real broker: content, metadata, offset jumps, the write head,
errors; each over both transports, a GET of the gateway and a Read RPC."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.client import (
    JournalClient,
    JournalNotFound,
    NotAllowed,
    OffsetJump,
    OffsetNotYetAvailable,
    Reader,
    RetryReader,
    append,
)
from broker.protocol import pb
from tests.support.harness import BrokerProcess, journal_spec
from tests.support.journals import create_journal, http_gets, new_journal, unique, wait_for_read_rpcs


@pytest.fixture(params=[True, False], ids=["http-reads", "grpc-reads"])
async def client(
    request: pytest.FixtureRequest, broker: BrokerProcess, file_root: Path
) -> AsyncIterator[JournalClient]:
    """A client whose plain reads are GETs, or Read RPCs; each test's reads went the way asked."""
    gets = await asyncio.to_thread(http_gets, broker)
    async with JournalClient(broker.url, file_root=str(file_root), http_reads=request.param) as c:
        yield c
    assert (await asyncio.to_thread(http_gets, broker) > gets) == request.param


async def read_to_head(reader: Reader | RetryReader) -> bytes:
    """Everything a non-blocking reader returns before the write head."""
    return b"".join([chunk async for chunk in reader])


async def read_exactly(reader: Reader | RetryReader, n: int) -> bytes:
    out = b""
    while len(out) < n:
        out += await reader.read(n - len(out))
    return out


async def test_reader_returns_committed_bytes_and_fragment_metadata(
    client: JournalClient, broker: BrokerProcess
) -> None:
    journal = await new_journal(client)
    resp = await append(client, journal, b"hello, world")
    assert (resp.commit.begin, resp.commit.end) == (0, 12)

    reader = Reader(client, journal)
    assert await reader.read(5) == b"hello"
    assert reader.offset == 5
    assert reader.write_head == 12
    fragment = reader.fragment
    assert fragment is not None
    assert (fragment.journal, fragment.begin, fragment.end) == (journal, 0, 12)
    assert reader.header is not None and reader.header.route.primary == 0
    assert reader.endpoint == broker.url
    # Not yet persisted: served from the broker's spool, without a URL.
    assert reader.fragment_url == "" and fragment.backing_store == ""
    assert await reader.read() == b", world"
    assert reader.offset == 12
    # A non-blocking read ends at the write head with OFFSET_NOT_YET_AVAILABLE.
    with pytest.raises(OffsetNotYetAvailable) as info:
        await reader.read()
    assert info.value.journal == journal and info.value.offset == 12
    assert str(info.value).startswith("OFFSET_NOT_YET_AVAILABLE")
    assert await reader.read() == b""  # Spent.

    # The route was learned from the response header.
    assert client.routes is not None
    route = client.routes.get(journal)
    assert route is not None and list(route.endpoints) == [broker.url]


async def test_reader_iteration_end_offset_and_metadata_only(client: JournalClient) -> None:
    journal = await new_journal(client)
    await append(client, journal, b"0123456789")
    await append(client, journal, b"abcdef")
    assert await read_to_head(Reader(client, journal)) == b"0123456789abcdef"
    assert await read_to_head(Reader(client, journal, offset=8)) == b"89abcdef"

    bounded = Reader(client, journal, offset=3, end_offset=12)
    assert await read_to_head(bounded) == b"3456789ab"
    assert bounded.offset == 12
    empty = Reader(client, journal, offset=5, end_offset=5)
    assert await empty.read() == b"" and empty.offset == 5

    meta = Reader(client, journal, offset=11, metadata_only=True)
    assert await meta.read() == b""
    assert meta.fragment is not None and meta.fragment.begin == 10 and meta.fragment.end == 16
    assert meta.write_head == 16 and meta.offset == 11


async def test_offset_jump_from_minus_one_reports_the_write_head(client: JournalClient) -> None:
    journal = await new_journal(client)
    await append(client, journal, b"abc")
    reader = Reader(client, journal, offset=-1)
    with pytest.raises(OffsetJump) as info:
        await reader.read()
    assert (info.value.offset, info.value.to, info.value.journal) == (-1, 3, journal)
    assert reader.offset == 3 and reader.write_head == 3
    # The reader stays usable after a jump: here it is at the head of a non-blocking read.
    with pytest.raises(OffsetNotYetAvailable):
        await reader.read()


async def test_blocking_read_at_minus_one_receives_later_appends(
    client: JournalClient, broker: BrokerProcess
) -> None:
    journal = await new_journal(client)
    await append(client, journal, b"before")
    reader = RetryReader(client, journal, offset=-1, block=True)

    async def first_chunks() -> tuple[OffsetJump, bytes]:
        with pytest.raises(OffsetJump) as info:
            await reader.read()
        return info.value, await read_exactly(reader, 11)

    pending = asyncio.create_task(first_chunks())
    # The broker resolves -1 to the head when the read arrives, and sends nothing until content does.
    await wait_for_read_rpcs(broker, journal, 1)
    await append(client, journal, b"after again")
    jump, data = await asyncio.wait_for(pending, 30)
    assert (jump.offset, jump.to) == (-1, 6)
    assert data == b"after again"
    assert reader.offset == 17 and reader.write_head == 17
    await reader.close()


async def test_retry_reader_seek(client: JournalClient) -> None:
    journal = await new_journal(client)
    await append(client, journal, b"0123456789")
    reader = RetryReader(client, journal)
    assert await reader.read(2) == b"01"
    assert await reader.seek(7) == 7
    assert await read_exactly(reader, 3) == b"789"
    assert await reader.seek(1) == 1  # Backwards: a new Read RPC.
    assert await read_exactly(reader, 2) == b"12"
    await reader.close()


async def test_status_errors_are_typed(client: JournalClient) -> None:
    missing = unique("client/missing")
    with pytest.raises(JournalNotFound) as info:
        await Reader(client, missing).read()
    assert info.value.journal == missing
    assert str(info.value).startswith("JOURNAL_NOT_FOUND")

    # A RetryReader gives up on a journal which stays unknown after a few tries.
    with pytest.raises(JournalNotFound):
        await asyncio.wait_for(RetryReader(client, missing).read(), 30)

    spec = journal_spec(unique("client/wronly"))
    spec.flags = pb.JournalSpec.O_WRONLY
    await create_journal(client, spec)
    with pytest.raises(NotAllowed):
        await Reader(client, spec.name).read()
    with pytest.raises(NotAllowed):
        await RetryReader(client, spec.name).read()


async def test_non_blocking_retry_reader_iterates_to_the_head(client: JournalClient) -> None:
    journal = await new_journal(client)
    big = bytes(range(256)) * 1000  # Several content frames (each <= 32736 bytes).
    await append(client, journal, big)
    reader = RetryReader(client, journal)
    assert await read_to_head(reader) == big
    assert reader.offset == len(big)
    # Iterating again continues from the head: nothing new, so nothing is returned.
    assert await read_to_head(reader) == b""
