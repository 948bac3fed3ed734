"""stream-sum with summers whose store a shard label chooses, as Gazette's: `store: sqlite` (a
SQLiteStore recorded to the shard's recovery log) and `store: json` (a JSONFileStore recorded to
it), alternating over the 4 shards. Against the session's etcd and the module's broker: in-process
ConsumerServices stopped and crashed, and `gazette consume` processes SIGKILLed, while chunkers
run: no shard FAILS, every sum verifies, exactly once, and the recovery logs hold the stores.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.client import JournalClient
from consumer.protocol import pb as cpb
from examples.stream_sum import Summer, journal_specs, shard_specs
from examples.stream_sum.chunker import ChunkerStats
from examples.stream_sum.specs import apply, recovery_log_prefix
from examples.stream_sum.summer import STORE_LABEL, store_kind
from gazctl.heads import write_head
from tests.examples.test_stream_sum import (
    BROKER_LEASE,
    CHUNK_PARTITIONS,
    SUM_PARTITIONS,
    Deployment,
    SummerProcess,
    chunker,
    run_chunkers,
    two_brokers,
    until,
)
from tests.support.harness import BrokerCluster, BrokerProcess
from tests.support.journals import wait_for_primary

CHAOS_ROUNDS = 4
__all__ = ["two_brokers"]  # The fixture, shared with test_stream_sum.

KINDS = ("sqlite", "json")


class RecordedDeployment(Deployment):
    """A Deployment whose shards alternate `store: sqlite` and `store: json`."""

    async def create(self) -> None:
        journals, shards = await apply(self.client, self.etcd, self.root, self.prefix,
                                       chunk_partitions=CHUNK_PARTITIONS, sum_partitions=SUM_PARTITIONS,
                                       store_kinds=KINDS, hint_prefix=f"/test-hints/{uuid.uuid4().hex}")
        assert [s.id for s in shards] == self.shards
        assert [[lb.value for lb in s.labels.labels if lb.name == STORE_LABEL] for s in shards] == [
            ["sqlite"], ["json"], ["sqlite"], ["json"]]
        for spec in journals:
            await wait_for_primary(self.client, spec.name)
        await self.monitor.start()

    async def logs_written(self) -> dict[str, int]:
        """Each shard's recovery log write head."""
        prefix = recovery_log_prefix(self.prefix)
        return {s: await write_head(self.client, f"{prefix}/{s}") for s in self.shards}


@pytest.fixture
async def deployment(etcd_client: Any, etcd_prefix: str, client: JournalClient,
                     tmp_path: Path) -> AsyncIterator[RecordedDeployment]:
    # sqlite_dir is where a shard without a label would keep its SQLStore: none does here.
    summer = Summer(prefix=f"test/stream-sum/{uuid.uuid4().hex[:12]}/", sqlite_dir=tmp_path / "unused")
    d = RecordedDeployment(etcd_client, etcd_prefix, client, summer, lease_ttl=3.0)
    await d.create()
    try:
        yield d
    finally:
        await d.close()


def test_specs_and_store_label() -> None:
    shards = shard_specs("p/", 4, store_kinds=("sqlite", "json", "sql"), hint_prefix="/h")
    assert [(s.recovery_log_prefix, s.hint_prefix) for s in shards] == [
        ("p/recovery/logs", "/h"), ("p/recovery/logs", "/h"), ("", ""), ("p/recovery/logs", "/h")]
    names = [j.name for j in journal_specs("p/", 4, 2, store_kinds=("sqlite", "json", "sql"))]
    assert names[6:] == ["p/recovery/logs/stream-sum-summer-part-000", "p/recovery/logs/stream-sum-summer-part-001",
                         "p/recovery/logs/stream-sum-summer-part-003"]

    class FakeShard:
        def __init__(self, spec: cpb.ShardSpec) -> None:
            self.spec, self.id = spec, spec.id

    assert [store_kind(FakeShard(s)) for s in shards] == ["sqlite", "json", "sql", "sqlite"]  # type: ignore[arg-type]
    assert store_kind(FakeShard(shard_specs("p/", 1)[0])) == "sql"  # type: ignore[arg-type]
    bad = shard_specs("p/", 1, store_kinds=("rocksdb",))[0]
    with pytest.raises(ValueError, match=r"label store='rocksdb' is not one of sql, sqlite, json"):
        store_kind(FakeShard(bad))  # type: ignore[arg-type]
    unlogged = shard_specs("p/", 1, store_kinds=("json",))[0]
    unlogged.recovery_log_prefix = ""
    with pytest.raises(ValueError, match="has no recovery_log_prefix"):
        store_kind(FakeShard(unlogged))  # type: ignore[arg-type]


async def test_recorded_summers_across_stops_and_crashes(deployment: RecordedDeployment) -> None:
    """SQLite and JSON summers, recorded to their logs: a graceful stop and a crash of the services
    move every shard (each new primary plays its log); every sum verifies, exactly once."""
    d = deployment
    await d.start_service("one")
    await d.start_service("two")
    await d.all_primary()
    chunkers = [chunker(d), chunker(d)]
    runs = asyncio.ensure_future(run_chunkers(d, chunkers))

    def verified() -> int:
        return sum(c.stats.verified for c in chunkers)

    async def progress(n: int = 4) -> None:
        target = verified() + n
        await until(lambda: (verified(), runs.done()), lambda v: v[0] >= target or v[1], f"{n} more sums")
        if runs.done():
            runs.result()
            pytest.fail("the chunkers stopped early")

    try:
        await progress()
        await d.services.pop("one").stop()  # SIGTERM's hand-off.
        await d.all_primary()
        await progress()
        await d.start_service("three")
        await d.all_primary()
        await progress()
        await d.crash("two", revoke=True)  # Shards recover from their logs on "three" and "four".
        await d.start_service("four")
        await d.all_primary()
        await progress()
    finally:
        for c in chunkers:
            c.stop()
    stats = await runs

    total = sum(s.streams for s in stats)
    assert [s.verified for s in stats] == [s.streams for s in stats]
    sums = await d.committed_sums()
    assert len(sums) == total and len({s.ID for s in sums}) == total, "each stream's sum, exactly once"
    assert not d.monitor.failed, d.monitor.failed
    logs = await d.logs_written()
    assert all(head > 0 for head in logs.values()), logs


async def test_recorded_summers_across_sigkilled_consume_processes(
    deployment: RecordedDeployment, etcd_endpoint: str, broker: BrokerProcess, tmp_path: Path
) -> None:
    """`gazette consume` summers with recorded stores, SIGKILLed and SIGTERMed while chunkers run."""
    d = deployment
    store = {"sqlite_dir": tmp_path / "unused"}
    procs: dict[str, SummerProcess] = {}

    def start(name: str) -> None:
        procs[name] = SummerProcess(d, store, etcd_endpoint, broker, name, tmp_path)

    chunkers = [chunker(d), chunker(d)]
    runs: asyncio.Future[Any] | None = None

    def verified() -> int:
        return sum(c.stats.verified for c in chunkers)

    async def progress(n: int = 4) -> None:
        running = runs
        assert running is not None
        target = verified() + n
        await until(lambda: (verified(), running.done()), lambda v: v[0] >= target or v[1], f"{n} more sums")
        if running.done():
            running.result()
            pytest.fail("the chunkers stopped early")

    try:
        start("rec-a")
        start("rec-b")
        await d.all_primary({"rec-a", "rec-b"})
        runs = asyncio.ensure_future(run_chunkers(d, chunkers))
        await progress()
        assert await procs.pop("rec-a").signal(signal.SIGKILL) == -signal.SIGKILL
        await d.all_primary({"rec-b"})  # Once rec-a's lease expired, from the logs.
        await progress()
        start("rec-c")
        await d.all_primary({"rec-b", "rec-c"})
        await progress()
        assert await procs.pop("rec-b").signal(signal.SIGTERM) == 0
        await d.all_primary({"rec-c"})
        await progress()
    except BaseException:
        for p in procs.values():
            print(f"--- {p.name} ---\n{p.logs()[-4000:]}")
        raise
    finally:
        for c in chunkers:
            c.stop()
        stats = await runs if runs is not None else []
        codes = {name: await procs.pop(name).signal(signal.SIGTERM) for name in list(procs)}
    assert codes == {"rec-c": 0}
    total = sum(s.streams for s in stats)
    assert [s.verified for s in stats] == [s.streams for s in stats]
    sums = await d.committed_sums()
    assert len(sums) == total and len({s.ID for s in sums}) == total, "each stream's sum, exactly once"
    assert not d.monitor.failed, d.monitor.failed


# -- consume processes and brokers SIGKILLed in turn, with recorded stores ------------------------


@pytest.mark.timeout(240)
async def test_recorded_summers_while_consumers_and_brokers_are_sigkilled(
    etcd_client: Any, etcd_prefix: str, etcd_endpoint: str, two_brokers: BrokerCluster, tmp_path: Path
) -> None:
    """Issue 16's crash test: SQLite and JSON summers (recorded to replication-2 recovery logs) in 2
    `gazette consume` processes and 2 brokers; in turn a summer process, then a broker, is SIGKILLed
    and restarted while 2 chunkers run, four rounds (each summer and each broker killed once). No
    shard FAILS, every sum verifies, exactly once. (test_stream_sum's SQL-store variant runs six.)"""
    cluster = two_brokers
    store: dict[str, Any] = {"sqlite_dir": tmp_path / "unused"}
    summer = Summer(prefix=f"test/stream-sum/{uuid.uuid4().hex[:12]}/", **store)
    procs: dict[str, SummerProcess] = {}
    events: list[str] = []
    async with JournalClient(cluster.urls[0]) as client:
        d = RecordedDeployment(etcd_client, etcd_prefix, client, summer, lease_ttl=3.0)
        journals, _ = await apply(client, etcd_client, etcd_prefix, d.prefix, chunk_partitions=CHUNK_PARTITIONS,
                                  sum_partitions=SUM_PARTITIONS, replication=2, stores=["file:///"],
                                  store_kinds=KINDS, hint_prefix=f"/test-hints/{uuid.uuid4().hex}")
        names = [j.name for j in journals]
        await asyncio.to_thread(cluster.wait_routed, names, 2)
        await d.monitor.start()
        events.append(f"{time.monotonic():.1f} journals routed")

        def start(name: str, broker: int) -> None:
            procs[name] = SummerProcess(d, store, etcd_endpoint, cluster.slots[broker].proc, name, tmp_path)
            events.append(f"{time.monotonic():.1f} started {name} (via broker {broker})")

        chunkers = [chunker(d), chunker(d)]
        runs: asyncio.Future[list[ChunkerStats]] | None = None

        def verified() -> int:
            return sum(c.stats.verified for c in chunkers)

        async def progress(n: int = 4) -> None:
            running = runs
            assert running is not None
            target = verified() + n
            await until(lambda: (verified(), running.done()), lambda v: v[0] >= target or v[1], f"{n} more sums")
            if running.done():
                running.result()
                pytest.fail("the chunkers stopped early")
            events.append(f"{time.monotonic():.1f} verified {verified()}")

        summers = ["summer-a", "summer-b"]
        stats: list[ChunkerStats] = []
        codes: dict[str, int] = {}
        try:
            start("summer-a", 0)
            start("summer-b", 1)
            await d.all_primary(set(summers))
            runs = asyncio.ensure_future(run_chunkers(d, chunkers))
            await progress()
            for round in range(CHAOS_ROUNDS):
                index = (round // 2) % 2
                if round % 2 == 0:
                    name = summers[index]
                    assert await procs.pop(name).signal(signal.SIGKILL) == -signal.SIGKILL
                    events.append(f"SIGKILLed {name}")
                    start(name, index)
                    await d.all_primary(set(summers))
                else:
                    old = cluster.slots[index].proc
                    assert await asyncio.to_thread(cluster.kill, index) == -signal.SIGKILL
                    events.append(f"SIGKILLed {old.broker_id}")
                    new = cluster.restart(index, same_id=True)
                    await asyncio.to_thread(new.wait_ready, BROKER_LEASE + 30.0)
                    await asyncio.to_thread(cluster.wait_routed, names, 2)
                    events.append(f"restarted {new.broker_id}; journals routed")
                await progress()
        except BaseException:
            print("events:", *events, sep="\n  ")
            for p in procs.values():
                print(f"--- {p.name} ---\n{p.logs()[-6000:]}")
            print("broker warnings and errors:", *cluster.log_lines()[-40:], sep="\n")
            raise
        finally:
            for c in chunkers:
                c.stop()
            if runs is not None:
                stats = await runs
            events.append(f"{time.monotonic():.1f} chunkers done")
            # The first hands its shards to the last, which is SIGKILLed (a lone member keeps its
            # shards until its exit timeout).
            names_left = list(procs)
            codes = {name: await procs.pop(name).signal(signal.SIGTERM) for name in names_left[:-1]}
            events.append(f"{time.monotonic():.1f} {names_left[:-1]} stopped")
            codes.update({name: await procs.pop(name).signal(signal.SIGKILL) for name in names_left[-1:]})
            await d.monitor.close()
        assert sorted(codes.values()) == [-signal.SIGKILL, 0], codes
        total = sum(s.streams for s in stats)
        assert [s.verified for s in stats] == [s.streams for s in stats]
        sums = await d.committed_sums()
        assert len(sums) == total and len({s.ID for s in sums}) == total, "each stream's sum, exactly once"
        assert not d.monitor.failed, d.monitor.failed
