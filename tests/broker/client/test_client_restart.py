"""Brokers going away and coming back on the same port: RetryReader and AppendService carry on.

The last test relies on the broker persisting its spools to a file:// store when it exits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from broker.client import AppendService, JournalClient, OffsetJump, RetryReader
from broker.client.sync import read_all
from tests.support.harness import BrokerProcess, journal_spec
from tests.support.journals import create_journal, unique, wait_for_primary

StartBroker = Callable[..., Awaitable[BrokerProcess]]


async def stop(proc: BrokerProcess) -> None:
    assert await asyncio.to_thread(proc.stop) == 0, proc.logs()


async def read_exactly(reader: RetryReader, n: int) -> bytes:
    out = b""
    while len(out) < n:
        try:
            out += await reader.read(n - len(out))
        except OffsetJump:
            raise AssertionError("unexpected offset jump") from None
    return out


@pytest.mark.parametrize("route_cache", [True, False], ids=["routed", "default-address"])
async def test_retry_reader_survives_a_broker_restart(start_broker: StartBroker, route_cache: bool) -> None:
    first, second = await asyncio.gather(start_broker(), start_broker())
    # Replication 2: the other broker keeps every byte while one restarts (no store needed).
    spec = journal_spec(unique("client/restart"), replication=2)
    async with JournalClient(second.url) as writer, JournalClient(first.url, route_cache=route_cache) as client:
        await create_journal(writer, spec)
        async with asyncio.timeout(30):
            while len((await wait_for_primary(writer, spec.name)).members) != 2:
                await asyncio.sleep(0.05)  # Assignments change no spec: no watch reports them.

        reader = RetryReader(client, spec.name, block=True)
        async with AppendService(writer) as service:
            await service.append(spec.name, b"before restart;")
        assert await read_exactly(reader, 15) == b"before restart;"
        assert reader.reader.endpoint == first.url  # The default broker serves the first read.

        pending = asyncio.create_task(read_exactly(reader, 14))
        await stop(first)
        # A new ID, as `gazette serve` picks by default: the primary then builds a new pipeline rather
        # than finding its stream to the stopped broker broken midway through an append (whose
        # outcome would then be unknown to the client).
        restarted = await start_broker(port=first.port, broker_id=f"{first.broker_id}-restarted")
        # Appends need both replicas: wait for the restarted broker to be one.
        async with asyncio.timeout(30):
            while restarted.broker_id not in [m.suffix for m in (await wait_for_primary(writer, spec.name)).members]:
                await asyncio.sleep(0.05)
        async with AppendService(writer) as service:
            committed = service.append(spec.name, b"after restart!")
            await committed
        assert (committed.begin, committed.end) == (15, 29)
        assert await asyncio.wait_for(pending, 60) == b"after restart!"
        assert reader.offset == 29 and reader.restarts >= 1
        if route_cache:
            assert reader.reader.endpoint in (second.url, restarted.url)
        await reader.close()
    assert await asyncio.to_thread(read_all, second.url, spec.name, timeout=30) == b"before restart;after restart!"


async def test_append_service_spills_while_the_broker_is_away(start_broker: StartBroker, tmp_path: Path) -> None:
    broker = await start_broker()
    spec = journal_spec(unique("client/spill"))
    async with JournalClient(broker.url) as client:
        await create_journal(client, spec)
        await stop(broker)

        service = AppendService(client, journal_memory_limit=8 << 10, spool_dir=str(tmp_path))
        records = [f"{i:05d}".encode() * 200 for i in range(100)]  # 100 KiB in 1000-byte records.
        appends = [service.append(spec.name, r) for r in records]
        # Held in memory up to the limit, the rest in a temporary file.
        assert service.memory_bytes <= 8 << 10
        assert service.memory_bytes + service.stats.spilled_bytes == 100_000
        assert service.stats.spilled_bytes >= 90_000
        async with asyncio.timeout(30):
            while service.stats.retries < 2:  # The broker is unreachable: attempts fail, and are retried.
                await asyncio.sleep(0.05)
        assert not any(a.done() for a in appends)

        await start_broker(port=broker.port)
        await asyncio.wait_for(asyncio.gather(*appends), 60)
        await service.close()
        assert service.memory_bytes == 0 and service.stats.spilled_bytes == 0
        assert service.stats.rpcs == 1
        assert [(a.begin, a.end) for a in appends] == [(1000 * i, 1000 * (i + 1)) for i in range(100)]
    data = await asyncio.to_thread(read_all, broker.url, spec.name, timeout=30)
    assert data == b"".join(records)


async def test_retry_reader_survives_a_restart_of_the_only_broker(start_broker: StartBroker) -> None:
    broker = await start_broker()
    spec = journal_spec(unique("client/persisted"))
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.seconds = 1
    async with JournalClient(broker.url) as client:
        await create_journal(client, spec)
        reader = RetryReader(client, spec.name, block=True)
        async with AppendService(client) as service:
            await service.append(spec.name, b"persisted;")
        assert await read_exactly(reader, 10) == b"persisted;"

        pending = asyncio.create_task(read_exactly(reader, 9))
        await stop(broker)  # It persists its spool before it exits.
        await start_broker(port=broker.port)
        async with AppendService(client) as service:
            committed = service.append(spec.name, b"restarted")
            await committed
        assert (committed.begin, committed.end) == (10, 19)
        assert await asyncio.wait_for(pending, 60) == b"restarted"
        await reader.close()
    assert await asyncio.to_thread(read_all, broker.url, spec.name, timeout=30) == b"persisted;restarted"


async def test_large_chunks_replicate_to_the_peer_in_order(start_broker: StartBroker) -> None:
    first, second = await asyncio.gather(start_broker(), start_broker())
    spec = journal_spec(unique("client/large"), replication=2)
    # 1 MiB chunks land in the primary's spool in worker threads while the peer is sent them; the
    # commit proposal carries the spool's SHA-1, which the peer must match for the append to commit.
    content = b"".join(bytes([65 + i % 26]) * (1 << 20) for i in range(12))
    async with JournalClient(first.url) as client:
        await create_journal(client, spec)
        async with asyncio.timeout(30):
            while len((await wait_for_primary(client, spec.name)).members) != 2:
                await asyncio.sleep(0.05)
        async with AppendService(client) as service:
            committed = service.append(spec.name, content)
            await committed
        assert (committed.begin, committed.end) == (0, len(content))
        route = await wait_for_primary(client, spec.name)
    # The peer alone serves every byte once the primary is gone.
    primary = route.members[route.primary].suffix
    assert primary in (first.broker_id, second.broker_id)
    survivor, gone = (second, first) if primary == first.broker_id else (first, second)
    await stop(gone)
    assert await asyncio.to_thread(read_all, survivor.url, spec.name, timeout=60) == content
