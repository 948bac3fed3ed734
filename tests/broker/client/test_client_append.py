"""Appender and AppendService against a real broker: commit, abort, typed errors, batching, ordering."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from broker.client import (
    Appender,
    AppendService,
    DependencyFailed,
    JournalClient,
    JournalNotFound,
    RegisterMismatch,
    ServiceClosed,
    WrongAppendOffset,
    append,
)
from broker.client.sync import read_all
from broker.fragment import sha1sum_hex
from broker.protocol import labels, pb
from tests.support.harness import BrokerProcess
from tests.support.journals import append_rpcs, http_puts, new_journal, unique


async def content(broker: BrokerProcess, journal: str) -> bytes:
    return await asyncio.to_thread(read_all, broker.url, journal, timeout=30)


async def test_appender_commits_on_close(client: JournalClient, broker: BrokerProcess) -> None:
    journal = await new_journal(client)
    async with Appender(client, journal) as app:
        await app.write(b"hello, ")
        await app.write(b"")  # Empty writes are no-ops, not commit markers.
        await app.write(bytearray(b"world"))
    resp = app.response
    assert resp is not None and resp.status == pb.OK
    assert (resp.commit.begin, resp.commit.end) == (0, 12)
    assert sha1sum_hex(resp.commit.sum) == hashlib.sha1(b"hello, world").hexdigest()
    assert app.written == 12 and app.endpoint == broker.url
    assert await content(broker, journal) == b"hello, world"


async def test_appender_abort_makes_no_bytes_visible(client: JournalClient, broker: BrokerProcess) -> None:
    journal = await new_journal(client)
    await append(client, journal, b"kept;")
    with pytest.raises(RuntimeError, match="changed my mind"):
        async with Appender(client, journal) as app:
            await app.write(b"discarded" * 1000)
            raise RuntimeError("changed my mind")
    explicit = Appender(client, journal)
    await explicit.write(b"also discarded")
    await explicit.abort()
    resp = await append(client, journal, b"next")
    assert (resp.commit.begin, resp.commit.end) == (5, 9)
    assert await content(broker, journal) == b"kept;next"


async def test_large_append_streams_in_chunks(client: JournalClient, broker: BrokerProcess) -> None:
    journal = await new_journal(client, length=64 << 20)
    data = hashlib.sha256(b"seed").digest() * (100 << 10)  # 3.2 MiB: four content messages.
    resp = await append(client, journal, [data[: 1 << 20], data[1 << 20 :]])
    assert resp.commit.end == len(data)
    assert await content(broker, journal) == data


async def test_appender_errors_are_typed(client: JournalClient) -> None:
    missing = unique("client/missing")
    with pytest.raises(JournalNotFound) as info:
        await append(client, missing, b"x")
    assert info.value.journal == missing and str(info.value).startswith("JOURNAL_NOT_FOUND")
    # The broker replies before reading the content: writes then find the call over, and report its reply.
    with pytest.raises(JournalNotFound):
        await append(client, missing, [b"x" * (1 << 20)] * 8)

    journal = await new_journal(client)
    await append(client, journal, b"abc")
    with pytest.raises(WrongAppendOffset) as wrong:
        await append(client, journal, b"x", offset=1)
    assert wrong.value.offset == 1
    assert wrong.value.response is not None and wrong.value.response.status == pb.WRONG_APPEND_OFFSET
    assert (await append(client, journal, b"d", offset=3)).commit.end == 4

    await append(client, journal, b"e", union_registers=labels.label_set(("owner", "me")))
    check = pb.LabelSelector(include=labels.label_set(("owner", "you")))
    with pytest.raises(RegisterMismatch) as mismatch:
        await append(client, journal, b"f", check_registers=check)
    assert labels.value_of(mismatch.value.response.registers, "owner") == "me"


async def test_append_service_batches_small_appends_in_order(client: JournalClient, broker: BrokerProcess) -> None:
    journal = await new_journal(client)
    before = await asyncio.to_thread(append_rpcs, broker, journal)
    async with AppendService(client) as service:
        records = [f"record {i:04d}\n".encode() for i in range(500)]
        appends = [service.append(journal, r) for r in records]
        assert service.pending == 500
        responses = await asyncio.gather(*appends)
    # Queued within one turn of the event loop, all of them went out as one RPC.
    assert service.stats.rpcs == 1 and service.stats.retries == 0
    assert len({(r.commit.begin, r.commit.end) for r in responses}) == 1
    assert await asyncio.to_thread(append_rpcs, broker, journal) - before == 1
    data = await content(broker, journal)
    assert data == b"".join(records)
    for record, aa in zip(records, appends, strict=True):
        assert data[aa.begin : aa.end] == record


async def test_append_service_batches_appends_queued_during_an_rpc(
    client: JournalClient, broker: BrokerProcess
) -> None:
    journal = await new_journal(client)
    async with AppendService(client) as service:
        appends = []
        for i in range(200):
            appends.append(service.append(journal, f"{i},".encode()))
            if i % 20 == 0:
                await asyncio.sleep(0)  # Let the journal's task run an RPC while more queue up.
        await asyncio.gather(*appends)
    assert 2 <= service.stats.rpcs < 200
    assert await content(broker, journal) == b"".join(f"{i},".encode() for i in range(200))
    assert service.memory_bytes == 0 and service.pending == 0


async def test_append_service_waits_for_dependencies(client: JournalClient, broker: BrokerProcess) -> None:
    first, second = await new_journal(client), await new_journal(client)
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[None] = loop.create_future()
    async with AppendService(client) as service:
        gated = service.append(second, b"after the gate", dependencies=[gate])
        # Another journal's append completes while the gated one waits.
        await service.append(first, b"free")
        assert not gated.done()
        gate.set_result(None)
        await gated

        # Across journals: B's append starts only after A's committed.
        done_order: list[str] = []
        a = service.append(first, b"A")
        b = service.append(second, b"B", dependencies=[a])
        a.future.add_done_callback(lambda _f: done_order.append("A"))
        b.future.add_done_callback(lambda _f: done_order.append("B"))
        await b
        assert done_order == ["A", "B"]
        assert service.pending_except(first) == []

    assert await content(broker, second) == b"after the gateB"
    assert await content(broker, first) == b"freeA"


async def test_failed_dependency_fails_the_append(client: JournalClient, broker: BrokerProcess) -> None:
    journal = await new_journal(client)
    async with AppendService(client) as service:
        doomed = service.append(unique("client/missing"), b"lost")
        dependent = service.append(journal, b"never written", dependencies=[doomed])
        independent = service.append(journal, b"written")
        with pytest.raises(JournalNotFound):
            await doomed
        with pytest.raises(DependencyFailed) as info:
            await dependent
        assert isinstance(info.value.__cause__, JournalNotFound)
        await independent
        # A terminal status is not retried.
        with pytest.raises(WrongAppendOffset):
            await service.append(pb.AppendRequest(journal=journal, offset=999), b"x")
    assert service.stats.retries == 0
    assert await content(broker, journal) == b"written"


async def test_append_service_refuses_appends_once_closed(client: JournalClient) -> None:
    journal = await new_journal(client)
    service = AppendService(client)
    await service.append(journal, b"x")
    await service.close()
    with pytest.raises(ServiceClosed):
        service.append(journal, b"y")


async def test_append_service_linger_batches_spaced_appends_until_released(
    client: JournalClient, broker: BrokerProcess
) -> None:
    journal = await new_journal(client)
    async with AppendService(client, linger=30.0) as service:
        appends = []
        for i in range(50):
            appends.append(service.append(journal, f"{i},".encode()))
            await asyncio.sleep(0.002)  # Without a linger, each would go as its own RPC.
        assert service.stats.rpcs == 0 and not any(aa.done() for aa in appends)
        service.release()
        await asyncio.gather(*(aa.future for aa in appends))
        assert service.stats.rpcs == 1

        # Awaiting an append ends its linger: it does not wait out the 30 s.
        other = await new_journal(client)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await service.append(journal, b"awaited,")
        # So does depending on one (another journal's append must follow it).
        first = service.append(journal, b"depended-on,")
        await service.append(other, b"dependent", dependencies=[first])
        assert first.done()
        # A full batch goes without waiting (bytes queued beyond it would spill to disk): it is done without
        # being awaited (which would end its linger), however long its 8 MiB take to commit on a slow host.
        full = service.append(journal, b"x" * service.max_batch_bytes)
        while not full.done():
            assert loop.time() - started < 20, "the full batch waited for its linger"
            await asyncio.sleep(0.05)
        assert loop.time() - started < 20  # Far from the 30 s linger any of them could have waited out.
    assert service.stats.rpcs == 5  # The released batch, then one RPC each: awaited, depended-on, dependent, full.
    assert await content(broker, journal) == (
        b"".join(f"{i},".encode() for i in range(50)) + b"awaited,depended-on," + b"x" * service.max_batch_bytes
    )


async def test_append_service_linger_ends_by_itself(client: JournalClient, broker: BrokerProcess) -> None:
    journal = await new_journal(client)
    linger = 2.0
    async with AppendService(client, linger=linger) as service:
        loop = asyncio.get_running_loop()
        started = loop.time()
        first = service.append(journal, b"a")
        await asyncio.sleep(0.1)
        second = service.append(journal, b"b")  # Joins the lingering batch.
        # Polled, not awaited (awaiting an append ends its linger).
        while not (first.done() and second.done()):
            assert loop.time() - started < linger + 30, "the lingering batch was never sent"
            await asyncio.sleep(0.05)
        assert loop.time() - started >= linger * 0.9, "the batch went before its linger ended"
        assert (first.begin, second.begin) == (0, 1)
        assert service.stats.rpcs == 1
        with pytest.raises(ValueError, match="linger"):
            AppendService(client, linger=-1)


async def test_append_service_sends_plain_batches_as_puts(client: JournalClient, broker: BrokerProcess) -> None:
    # A batch of plain appends held in memory is one HTTP PUT (the cheaper round trip); one with
    # AppendRequest parameters, or whose content spilled to disk, is a gRPC Append.
    journal = await new_journal(client)
    puts = await asyncio.to_thread(http_puts, broker)
    async with AppendService(client) as service:
        plain = await asyncio.gather(*(service.append(journal, f"{i},".encode()) for i in range(100)))
        assert await asyncio.to_thread(http_puts, broker) == puts + 1 and service.stats.rpcs == 1
        assert {(r.commit.begin, r.commit.end) for r in plain} == {(0, 290)}

        registers = pb.LabelSet(labels=[pb.Label(name="owner", value="test")])
        await service.append(pb.AppendRequest(journal=journal, union_registers=registers), b"registered,")
        assert await asyncio.to_thread(http_puts, broker) == puts + 1
    async with AppendService(client, journal_memory_limit=1 << 10, spool_dir=None) as spilling:
        aa = spilling.append(journal, b"s" * (4 << 10))
        assert spilling.stats.spilled_bytes > 0
        await aa
    async with JournalClient(broker.url, http_appends=False) as grpc_only, AppendService(grpc_only) as service:
        await service.append(journal, b"no HTTP,")
    assert await asyncio.to_thread(http_puts, broker) == puts + 1
    assert await content(broker, journal) == (
        b"".join(f"{i},".encode() for i in range(100)) + b"registered," + b"s" * (4 << 10) + b"no HTTP,"
    )
