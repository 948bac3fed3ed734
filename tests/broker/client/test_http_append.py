"""`append()`'s HTTP path (broker.client.http_append) against real brokers: which appends take it,
what they return, and how failures are reported."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from pathlib import Path

import pytest

from broker.client import (
    AppendOutcomeUnknown,
    JournalClient,
    JournalNotFound,
    TransportError,
    append,
)
from broker.fragment.sums import sha1sum_from_digest
from broker.protocol import pb
from broker.protocol.validation import ValidationError
from tests.support.harness import BrokerProcess, free_port
from tests.support.journals import append_rpcs, http_puts, new_journal


async def test_a_small_plain_append_is_one_put_with_its_commit_and_route(
    broker: BrokerProcess, client: JournalClient
) -> None:
    journal = await new_journal(client, "http-append")
    puts, rpcs = http_puts(broker), append_rpcs(broker, journal)
    first = await append(client, journal, b"hello, ")
    second = await append(client, journal, bytearray(b"world\n"))
    assert (first.status, first.commit.journal, first.commit.begin, first.commit.end) == (pb.OK, journal, 0, 7)
    assert (second.commit.begin, second.commit.end) == (7, 13)
    assert second.commit.sum == sha1sum_from_digest(hashlib.sha1(b"world\n").digest())
    assert list(second.header.route.endpoints) == [broker.url] and second.header.route.primary == 0
    assert http_puts(broker) == puts + 2 and append_rpcs(broker, journal) == rpcs + 2
    assert client.endpoint(journal, primary=True) == broker.url, "the route was learned from X-Route-Token"


async def test_appends_with_parameters_or_iterables_are_grpc_appends(
    broker: BrokerProcess, client: JournalClient
) -> None:
    journal = await new_journal(client, "http-append")
    puts = http_puts(broker)
    await append(client, journal, b"x" * (64 << 10 | 1))
    puts += 1  # Large content is a PUT too (up to HTTP_APPEND_LIMIT).
    resp = await append(client, journal, b"at the head\n", offset=(64 << 10) + 1)
    await append(client, journal, [b"an ", b"iterable\n"])
    async with JournalClient(broker.url, http_appends=False) as grpc_only:
        await append(grpc_only, journal, b"no HTTP\n")
    assert http_puts(broker) == puts
    assert resp.header.process_id.suffix, "a gRPC reply names the broker that served it"


async def test_statuses_and_refusals_of_the_http_path(broker: BrokerProcess, client: JournalClient) -> None:
    with pytest.raises(JournalNotFound) as info:
        await append(client, f"http-append/missing-{uuid.uuid4().hex[:6]}", b"x")
    assert info.value.response is not None and info.value.response.status == pb.JOURNAL_NOT_FOUND
    with pytest.raises(ValidationError):
        await append(client, "bad//name", b"x")  # Checked before anything is sent.


async def test_a_broker_that_is_gone_or_restarted(tmp_path: Path, etcd_endpoint: str) -> None:
    port = free_port()
    async with JournalClient(f"http://127.0.0.1:{port}") as client:
        with pytest.raises(TransportError) as refused:
            await append(client, "http-append/anything", b"x")
        assert not isinstance(refused.value, AppendOutcomeUnknown), "nothing was sent"
        assert "UNAVAILABLE" in str(refused.value)

        prefix = f"/test/{uuid.uuid4().hex}"
        proc = BrokerProcess(tmp_path, etcd_endpoint, prefix, port=port, broker_id="http-append-a")
        await asyncio.to_thread(proc.wait_ready)
        journal = await new_journal(client, "http-append")
        assert (await append(client, journal, b"before\n")).commit.end == 7
        assert await asyncio.to_thread(proc.stop) == 0, proc.logs()

        # Restarted on the same port: the kept-alive connection the stop closed is not reused.
        again = BrokerProcess(tmp_path, etcd_endpoint, prefix, port=port, broker_id="http-append-a")
        try:
            await asyncio.to_thread(again.wait_ready)
            for _ in range(100):
                try:
                    resp = await append(client, journal, b"after\n")
                    break
                except TransportError as exc:  # Not yet primary of the journal again.
                    assert not isinstance(exc, AppendOutcomeUnknown), exc
                except JournalNotFound:
                    pass
                await asyncio.sleep(0.1)
            assert resp.commit.begin >= 7
        finally:
            assert await asyncio.to_thread(again.stop) == 0, again.logs()


async def test_a_put_reports_the_journals_registers(broker: BrokerProcess, client: JournalClient) -> None:
    journal = await new_journal(client, "http-append")
    assert not (await append(client, journal, b"before\n")).registers.labels
    registers = pb.LabelSet(labels=[pb.Label(name="author", value="me"), pb.Label(name="fence", value="v1.2-3_x")])
    await append(client, journal, b"registered\n", union_registers=registers)  # A gRPC Append: parameters.
    puts = http_puts(broker)
    resp = await append(client, journal, b"after\n")
    assert http_puts(broker) == puts + 1
    assert resp.registers == registers
