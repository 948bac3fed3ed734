"""Recovery logs whose fragments persist to object stores (gs:// on fake-gcs-server, azure:// on
Azurite; s3:// is left out for time, its store being the one other tests exercise most).

A real `gazette consume` primary records its store (JSONFileStore or SQLiteStore) to a log in the
store and is SIGKILLed; the broker is then restarted (a SIGTERM persists every spool, and the new
process has none), so every byte of the log exists only in the store; a new consumer takes the
shard and plays the log back to exactly the last commit.

The Player reads the log with plain reads (no `do_not_proxy`) through the broker's gateway: the
broker opens the persisted fragments from the store and proxies their content, which its
`gazette_read_bytes_total` of the log counts (a direct read through a signed URL would not).
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from broker.client import AppendService, JournalClient, fragments_request, list_all_fragments
from broker.fragment.names import parse_fragment_from_relative_path
from broker.protocol import labels, pb
from consumer.protocol import pb as cpb
from tests.consumer.test_consume_cli import publish
from tests.consumer.test_recovery_cli import Cluster, Code, counts
from tests.support.apps import NDJSON
from tests.support.harness import BrokerProcess, journal_spec
from tests.support.journals import create_journal, metric, wait_for_primary
from tests.support.store_emulators import EmulatorProcess, emulator_of


class RestartableBroker:
    """The module's broker (started after the emulators, so it reaches their stores), which a test
    restarts on the same port and keyspace root: its clients and consumers find it again."""

    def __init__(self, tmp: Path, etcd: str) -> None:
        self.tmp, self.etcd, self.prefix = tmp, etcd, f"/test/{uuid.uuid4().hex}"
        self.proc = BrokerProcess(tmp, etcd, self.prefix).wait_ready()

    def restart(self) -> BrokerProcess:
        """SIGTERM the broker (it rolls and persists every spool first) and start another in its place."""
        rc = self.proc.stop()
        assert rc == 0, self.proc.logs()[-6000:]
        self.proc = BrokerProcess(self.tmp, self.etcd, self.prefix, port=self.proc.port).wait_ready()
        return self.proc


@pytest.fixture(scope="module")
def restartable(
    emulators: dict[str, EmulatorProcess | str], etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RestartableBroker]:
    broker = RestartableBroker(tmp_path_factory.mktemp("recovery-store-broker"), etcd_endpoint)
    try:
        yield broker
    finally:
        rc = broker.proc.stop()
        assert rc == 0, broker.proc.logs()[-6000:]


@pytest.fixture
async def client(restartable: RestartableBroker) -> AsyncIterator[JournalClient]:
    async with JournalClient(restartable.proc.url) as c:
        yield c


class StoreCluster(Cluster):
    """A Cluster whose source journal and recovery log persist to `store`, the log in small GZIP fragments."""

    def __init__(self, tmp: Path, broker: BrokerProcess, etcd: str, client: JournalClient, store: str) -> None:
        super().__init__(tmp, broker, etcd, client)
        self.store_url = store

    async def create_journals(self) -> None:
        source = journal_spec(self.source, content_type=NDJSON)
        log = journal_spec(self.recovery_log, content_type=labels.CONTENT_TYPE_RECOVERY_LOG)
        log.fragment.length = 1024
        log.fragment.compression_codec = pb.GZIP
        for spec in (source, log):
            spec.fragment.stores.append(self.store_url)
            spec.fragment.refresh_interval.seconds = 1
            await create_journal(self.client, spec)


def persisted(emulator: EmulatorProcess, bucket: str, journal: str) -> list[tuple[int, int]]:
    """The (begin, end) of each fragment object of `journal` in `bucket`, in order."""
    base = f"{journal}/"
    spans = [parse_fragment_from_relative_path(journal, key[len(base):])
             for key in emulator.snapshot(bucket) if key.startswith(base)]
    return sorted((f.begin, f.end) for f in spans)


@pytest.mark.parametrize("store", ["json", "sqlite"])
@pytest.mark.parametrize("scheme", ["gs", "azure"])
async def test_sigkilled_primary_recovers_from_a_log_persisted_only_in_the_store(
    restartable: RestartableBroker, emulators: dict[str, EmulatorProcess | str], etcd_endpoint: str,
    client: JournalClient, tmp_path: Path, scheme: str, store: str,
) -> None:
    emulator = emulator_of(emulators, scheme)
    bucket = f"rec-{uuid.uuid4().hex[:12]}"
    await asyncio.to_thread(emulator.create_bucket, bucket)
    cluster = StoreCluster(tmp_path, restartable.proc, etcd_endpoint, client, emulator.store_url(bucket))
    cluster.store = store
    await cluster.create_journals()
    try:
        async with AppendService(client) as appender:
            await cluster.start("store-a")
            channel, stub = cluster.stub("store-a")
            async with channel:
                applied = await stub.Apply(
                    cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(upsert=cluster.spec(0))])
                )
                assert applied.status == cpb.OK
                await cluster.wait_statuses(stub, {Code.PRIMARY: 1}, primary="store-a")
                # Transactions of varied keys: a log of several 1 KiB fragments.
                keys: list[str] = []
                for batch in range(5):
                    keys += [f"{scheme}-{batch}-{i % 6}-" + "v" * (i * 13 % 90) for i in range(25)]
                    head = await publish(appender, cluster.source, *keys[-25:])
                    await cluster.stat_through(stub, head)
                committed = await cluster.wait_committed(counts(*keys))
                assert committed["pid"] == cluster.consumers["store-a"].proc.pid
            await asyncio.to_thread(cluster.consumers["store-a"].stop, signal.SIGKILL)

        # Every byte of the log is now in the store alone: the broker persisted its spools as it stopped,
        # and the new one has none.
        log_head = (await list_all_fragments(client, fragments_request(cluster.recovery_log))).fragments[-1].spec.end
        broker = await asyncio.to_thread(restartable.restart)
        for journal in (cluster.source, cluster.recovery_log):
            await wait_for_primary(client, journal)
        spans = await asyncio.to_thread(persisted, emulator, bucket, cluster.recovery_log)
        assert len(spans) >= 3 and spans[0][0] == 0 and spans[-1][1] == log_head, spans
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), f"gap or overlap: {spans}"
        listed = (await list_all_fragments(client, fragments_request(cluster.recovery_log))).fragments
        assert [(f.spec.begin, f.spec.end) for f in listed] == spans
        assert all(f.spec.backing_store == emulator.store_url(bucket) for f in listed), listed
        read_before = await asyncio.to_thread(metric, broker, "gazette_read_bytes_total", cluster.recovery_log)
        assert read_before == 0

        cluster.broker = broker
        async with AppendService(client) as appender:
            await cluster.start("store-b")
            channel, stub = cluster.stub("store-b")
            async with channel:
                await cluster.wait_statuses(stub, {Code.PRIMARY: 1}, primary="store-b")
                recovered = cluster.state("recovered")
                assert recovered is not None and recovered["pid"] == cluster.consumers["store-b"].proc.pid
                assert recovered["state"] == committed["state"], "the new primary recovered exactly the last commit"
                # Played from the log's start (the only hints are the first primary's, of an empty log)
                # through the broker, which read the persisted fragments from the store.
                proxied = await asyncio.to_thread(metric, broker, "gazette_read_bytes_total", cluster.recovery_log)
                assert proxied >= log_head, (proxied, spans)

                more = ["after", keys[0]]
                head = await publish(appender, cluster.source, *more)
                await cluster.stat_through(stub, head)
                await cluster.wait_committed(counts(*keys, *more))  # Nothing counted twice, nothing lost.
        logs = cluster.consumers["store-b"].logs()
        assert "played as a new primary" in logs, logs[-6000:]
        print(f"{scheme}/{store}: log of {log_head} bytes in {len(spans)} fragments, {proxied} read via the broker")
    finally:
        await cluster.stop_all()
