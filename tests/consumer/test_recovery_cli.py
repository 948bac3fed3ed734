"""Shards with a recovery log, across real `gazette consume` processes (a real `gazette serve` and
etcd): recovery from the log after a SIGKILL, hot standbys taking over, SIGTERM hand-off, and the
hints GetHints returns. The application is `tests.support.cli_apps:recorded_app`: it counts
messages by key into a JSON state recorded to the shard's recovery log, and mirrors each committed
state (and the state a primary recovered) to files the test reads.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from broker.client import AppendService, JournalClient, Reader
from broker.protocol import labels
from consumer.protocol import pb as cpb
from consumer.protocol import pb_grpc as cpb_grpc
from consumer.recoverylog import FSMHints
from tests.consumer.test_consume_cli import child_env, publish
from tests.support.apps import NDJSON
from tests.support.cli_apps import CACHE_PAGES_ENV, HOLD_KEY_ENV, STATE_DIR_ENV, STORE_ENV
from tests.support.harness import ROOT, BrokerProcess, free_port, journal_spec, run_gazctl, wait_http_ready
from tests.support.journals import create_journal, unique

APP = "tests.support.cli_apps:recorded_app"
LEASE = 3.0
"""The consumers' etcd lease TTL: a SIGKILLed member's shards move after it."""
WAIT = 30.0
Code = cpb.ReplicaStatus.Code


class Consumer:
    """One `python -m consumer consume` child running the recorded counting app."""

    def __init__(self, tmp: Path, broker: BrokerProcess, etcd: str, prefix: str, consumer_id: str,
                 store: str = "json", env: dict[str, str] | None = None) -> None:
        self.id = consumer_id
        self.port = free_port()
        self.log_path = tmp / f"consumer-{consumer_id}-{self.port}.log"
        args = [
            sys.executable, "-m", "consumer", "consume", APP,
            "--consumer.id", consumer_id, "--consumer.port", str(self.port), "--consumer.host", "127.0.0.1",
            "--consumer.bind", "127.0.0.1", "--broker.address", broker.url, "--etcd.address", etcd,
            "--etcd.prefix", prefix, "--etcd.lease", str(LEASE), "--log.level", "debug",
        ]
        self._log = open(self.log_path, "wb")
        environment = child_env(**{STATE_DIR_ENV: str(tmp), STORE_ENV: store, "TMPDIR": str(tmp), **(env or {})})
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=environment, cwd=ROOT)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = WAIT) -> None:
        wait_http_ready("consumer", f"http://127.0.0.1:{self.port}", self.proc, self.logs, timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = WAIT) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            self._log.close()


class Cluster:
    """A source journal, a shard with a recovery log, and the consumers serving it."""

    def __init__(self, tmp: Path, broker: BrokerProcess, etcd: str, client: JournalClient) -> None:
        self.tmp, self.broker, self.etcd, self.client = tmp, broker, etcd, client
        self.prefix = f"/test/{uuid.uuid4().hex}"
        self.shard = "counter-" + uuid.uuid4().hex[:8]
        self.source = unique("recovery-cli/src")
        self.log_prefix = unique("recovery-cli/logs")
        self.consumers: dict[str, Consumer] = {}
        self.store = "json"

    @property
    def recovery_log(self) -> str:
        return f"{self.log_prefix}/{self.shard}"

    async def create_journals(self) -> None:
        await create_journal(self.client, journal_spec(self.source, content_type=NDJSON))
        log_spec = journal_spec(self.recovery_log, content_type=labels.CONTENT_TYPE_RECOVERY_LOG)
        await create_journal(self.client, log_spec)

    async def start(self, *ids: str, env: dict[str, str] | None = None) -> None:
        """Start consumers `ids` (with `env` added to their environment) and wait until they serve."""
        started = [Consumer(self.tmp, self.broker, self.etcd, self.prefix, i, self.store, env) for i in ids]
        for c in started:
            self.consumers[c.id] = c
        await asyncio.gather(*(asyncio.to_thread(c.wait_ready) for c in started))

    def spec(self, hot_standbys: int) -> cpb.ShardSpec:
        spec = cpb.ShardSpec(
            id=self.shard, max_txn_duration=Duration(nanos=50_000_000), hot_standbys=hot_standbys,
            recovery_log_prefix=self.log_prefix, hint_prefix=f"/test-hints/{uuid.uuid4().hex}", hint_backups=2,
        )
        spec.sources.add(journal=self.source)
        return spec

    def stub(self, consumer_id: str) -> tuple[grpc.aio.Channel, cpb_grpc.ShardStub]:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.consumers[consumer_id].port}")
        return channel, cpb_grpc.ShardStub(channel)

    async def statuses(self, stub: cpb_grpc.ShardStub) -> dict[str, tuple[int, int]]:
        """Each member's (slot order, status code) of the shard, by consumer ID."""
        listed = await stub.List(cpb.ListRequest(), timeout=WAIT)
        out: dict[str, tuple[int, int]] = {}
        for shard in listed.shards:
            if shard.spec.id == self.shard:
                for i, (member, status) in enumerate(zip(shard.route.members, shard.status, strict=True)):
                    out[member.suffix] = (0 if i == shard.route.primary else 1, status.code)
        return out

    async def wait_statuses(
        self, stub: cpb_grpc.ShardStub, want: dict[int, int], primary: str | None = None
    ) -> dict[str, tuple[int, int]]:
        """Wait until the shard's replicas have the wanted count of each status code (and `primary`
        is the primary, if given)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while True:
            got = await self.statuses(stub)
            counts: dict[int, int] = {}
            for _, code in got.values():
                counts[code] = counts.get(code, 0) + 1
            if counts == want and (primary is None or got.get(primary) == (0, Code.PRIMARY)):
                return got
            if loop.time() > deadline:
                pytest.fail(f"shard statuses {got}, wanted counts {want}\n" + self.all_logs())
            await asyncio.sleep(0.05)

    async def wait_failed(self, stub: cpb_grpc.ShardStub) -> cpb.ReplicaStatus:
        """Wait until the shard's primary slot reports FAILED; its status."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while True:
            listed = await stub.List(cpb.ListRequest(), timeout=WAIT)
            status = [s for shard in listed.shards if shard.spec.id == self.shard for s in shard.status]
            if status and status[0].code == Code.FAILED:
                return status[0]
            assert loop.time() < deadline, f"{status}\n{self.all_logs()}"
            await asyncio.sleep(0.05)

    async def fail_on_start(self, member: str) -> str:
        """Start `member`, apply the shard (no standbys) and return the error of its FAILED primary."""
        await self.start(member)
        channel, stub = self.stub(member)
        async with channel:
            applied = await stub.Apply(cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(upsert=self.spec(0))]))
            assert applied.status == cpb.OK
            [error] = (await self.wait_failed(stub)).errors
        return error

    def primary_of(self, statuses: dict[str, tuple[int, int]]) -> str:
        [primary] = [cid for cid, (slot, code) in statuses.items() if slot == 0 and code == Code.PRIMARY]
        return primary

    def state(self, kind: str) -> dict[str, Any] | None:
        path = self.tmp / f"{self.shard}.{kind}.json"
        if not path.exists():
            return None
        doc: dict[str, Any] = json.loads(path.read_text())
        return doc

    async def wait_committed(self, expected: dict[str, int]) -> dict[str, Any]:
        """Wait until a committed state equals `expected`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while True:
            doc = self.state("committed")
            if doc is not None and doc["state"] == expected:
                return doc
            if loop.time() > deadline:
                pytest.fail(f"committed state {doc}, expected {expected}\n" + self.all_logs())
            await asyncio.sleep(0.05)

    async def stat_through(self, stub: cpb_grpc.ShardStub, offset: int) -> cpb.StatResponse:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while True:
            resp: cpb.StatResponse = await stub.Stat(
                cpb.StatRequest(shard=self.shard, read_through={self.source: offset}), timeout=WAIT
            )
            if resp.status == cpb.OK:
                return resp
            if loop.time() > deadline:
                pytest.fail(f"shard {self.shard} did not serve: {resp}\n" + self.all_logs())
            await asyncio.sleep(0.05)

    def all_logs(self) -> str:
        return "\n".join(f"--- {cid}:\n{c.logs()[-6000:]}" for cid, c in self.consumers.items())

    async def stop_all(self) -> None:
        await asyncio.gather(*(asyncio.to_thread(c.stop, signal.SIGKILL) for c in self.consumers.values()),
                             return_exceptions=True)


@pytest.fixture
async def cluster(
    tmp_path: Path, broker: BrokerProcess, etcd_endpoint: str, client: JournalClient
) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, broker, etcd_endpoint, client)
    await c.create_journals()
    try:
        yield c
    finally:
        await c.stop_all()


def counts(*keys: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in keys:
        out[k] = out.get(k, 0) + 1
    return out


async def get_hints(stub: cpb_grpc.ShardStub, shard: str) -> cpb.GetHintsResponse:
    resp: cpb.GetHintsResponse = await stub.GetHints(cpb.GetHintsRequest(shard=shard), timeout=WAIT)
    assert resp.status == cpb.OK, resp
    return resp


# -- tests ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("store", ["json", "sqlite"])
async def test_sigkilled_primary_recovers_on_another_member_from_its_log(
    cluster: Cluster, appender: AppendService, store: str
) -> None:
    cluster.store = store
    await cluster.start("rec-a", "rec-b")
    channel, stub = cluster.stub("rec-a")
    async with channel:
        applied = await stub.Apply(cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(upsert=cluster.spec(0))]))
        assert applied.status == cpb.OK
        first = await cluster.wait_statuses(stub, {Code.PRIMARY: 1})
        primary = cluster.primary_of(first)
        other = "rec-b" if primary == "rec-a" else "rec-a"

        keys = ["a", "b", "a", "c", "a", "b"]
        head = await publish(appender, cluster.source, *keys)
        await cluster.stat_through(stub, head)
        committed = await cluster.wait_committed(counts(*keys))
        assert committed["pid"] == cluster.consumers[primary].proc.pid

    await asyncio.to_thread(cluster.consumers[primary].stop, signal.SIGKILL)

    channel, stub = cluster.stub(other)
    async with channel:
        await cluster.wait_statuses(stub, {Code.PRIMARY: 1}, primary=other)
        recovered = cluster.state("recovered")
        assert recovered is not None and recovered["pid"] == cluster.consumers[other].proc.pid
        assert recovered["state"] == committed["state"], "the new primary recovered exactly the last commit"

        more = ["c", "d", "a"]
        head = await publish(appender, cluster.source, *more)
        await cluster.stat_through(stub, head)
        await cluster.wait_committed(counts(*keys, *more))  # Nothing counted twice, nothing lost.

        # Each recovery stored its hints as backup.0, rotating the older to backup.1.
        hints = await get_hints(stub, cluster.shard)
        assert not hints.primary_hints.HasField("hints"), "no clean stop stored recorded hints"
        [b0, b1] = hints.backup_hints
        assert b0.hints.log == b1.hints.log == cluster.recovery_log
        assert [n.fnode for n in b0.hints.live_nodes], "the recovered state.json is a live file"
        assert not b1.hints.live_nodes, "the first primary recovered an empty log"
    logs = cluster.consumers[other].logs()
    assert "completed recovery of shard" in logs and "played as a new primary" in logs, logs


async def test_hot_standby_takes_over_a_sigkilled_primary_without_replaying(
    cluster: Cluster, appender: AppendService
) -> None:
    await cluster.start("hot-a", "hot-b")
    channel, stub = cluster.stub("hot-a")
    async with channel:
        applied = await stub.Apply(cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(upsert=cluster.spec(1))]))
        assert applied.status == cpb.OK
        first = await cluster.wait_statuses(stub, {Code.PRIMARY: 1, Code.STANDBY: 1})
        primary = cluster.primary_of(first)
        standby = "hot-b" if primary == "hot-a" else "hot-a"

        keys = [f"k{i % 7}" for i in range(60)]
        head = await publish(appender, cluster.source, *keys)
        await cluster.stat_through(stub, head)
        committed = await cluster.wait_committed(counts(*keys))

    killed_at = time.monotonic()
    await asyncio.to_thread(cluster.consumers[primary].stop, signal.SIGKILL)

    channel, stub = cluster.stub(standby)
    async with channel:
        # Until the dead primary's lease expires, the shard is routed to it; then the standby serves.
        await cluster.wait_statuses(stub, {Code.PRIMARY: 1}, primary=standby)
        await cluster.stat_through(stub, head)
        took_over = time.monotonic() - killed_at
        recovered = cluster.state("recovered")
        assert recovered is not None and recovered["pid"] == cluster.consumers[standby].proc.pid
        assert recovered["state"] == committed["state"]

        more = ["k1", "z"]
        head = await publish(appender, cluster.source, *more)
        await cluster.stat_through(stub, head)
        await cluster.wait_committed(counts(*keys, *more))
        hints = await get_hints(stub, cluster.shard)
        assert hints.backup_hints[0].hints.live_nodes
    with urllib.request.urlopen(f"{cluster.consumers[standby].url}/debug/metrics", timeout=5) as resp:
        metrics = resp.read().decode()
    fqn = f"{cluster.prefix}/items/{cluster.shard}"
    assert f'gazette_shard_recoveries_total{{shard="{fqn}",standby="true"}} 1.0' in metrics, metrics
    assert f'gazette_shard_recoveries_total{{shard="{fqn}",standby="false"}}' not in metrics
    logs = cluster.consumers[standby].logs()
    assert "shard standby is tailing its recovery log" in logs, logs
    assert "promoted from a hot standby" in logs, "the standby did not replay the log from its start"
    # The standby serves once the dead primary's lease expires: well before any timeout of the consumer's
    # own (its hand-off timeout is 30 s). The margin over the lease is for a slow, loaded host, where the
    # allocator's round, the promotion and the List polls above take seconds.
    assert took_over < LEASE + 15.0, f"the standby took {took_over:.1f}s to serve"
    print(f"hot standby served {took_over:.2f}s after the primary's SIGKILL (lease TTL {LEASE:g}s)")


@pytest.mark.parametrize("hot_standbys", [1, 0])
async def test_sigterm_hands_primary_off_to_standby_without_failed_requests(
    cluster: Cluster, appender: AppendService, hot_standbys: int
) -> None:
    await cluster.start("term-a", "term-b")
    channel, stub = cluster.stub("term-a")
    async with channel:
        spec = cluster.spec(hot_standbys)
        applied = await stub.Apply(cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(upsert=spec)]))
        assert applied.status == cpb.OK
        want = {Code.PRIMARY: 1, Code.STANDBY: 1} if hot_standbys else {Code.PRIMARY: 1}
        first = await cluster.wait_statuses(stub, want)
        primary = cluster.primary_of(first)
    survivor = "term-b" if primary == "term-a" else "term-a"

    keys: list[str] = []
    failures: list[str] = []
    latencies: list[float] = []
    served = 0
    stop = asyncio.Event()

    async def requests() -> None:
        # Publish and read through continuously at the surviving member (proxied to the primary).
        nonlocal served
        ch, st = cluster.stub(survivor)
        async with ch:
            i = 0
            while not stop.is_set():
                key = f"t{i % 5}"
                i += 1
                keys.append(key)
                head = await publish(appender, cluster.source, key)
                began = time.monotonic()
                try:
                    resp = await st.Stat(cpb.StatRequest(shard=cluster.shard, read_through={cluster.source: head}),
                                         timeout=WAIT)
                except grpc.aio.AioRpcError as exc:
                    failures.append(f"{exc.code()}: {exc.details()}")
                    continue
                if resp.status != cpb.OK:
                    failures.append(cpb.Status.Name(resp.status))
                else:
                    served += 1
                    latencies.append(time.monotonic() - began)

    async def served_at_least(n: int, what: str) -> None:
        """Wait until `n` requests were served (or one failed, or the load stopped)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while served < n and not failures and not load.done():
            assert loop.time() < deadline, f"{served} requests served {what}\n{cluster.all_logs()}"
            await asyncio.sleep(0.05)

    load = asyncio.create_task(requests())
    try:
        # Requests are being served when the primary is SIGTERMed, and go on being served after it exited.
        await served_at_least(3, "before the hand-off")
        rc = await asyncio.to_thread(cluster.consumers[primary].stop, signal.SIGTERM)
        assert rc == 0, cluster.consumers[primary].logs()
        await served_at_least(served + 3, "after the hand-off")
    finally:
        stop.set()
        await load
    assert not failures, failures
    assert served > 5
    print(f"SIGTERM hand-off (hot_standbys {hot_standbys}): {served} Stat requests, none failed, slowest "
          f"{max(latencies) * 1000:.0f} ms")

    channel, stub = cluster.stub(survivor)
    async with channel:
        statuses = await cluster.statuses(stub)
        assert cluster.primary_of(statuses) == survivor
        await cluster.wait_committed(counts(*keys))
    logs = cluster.consumers[survivor].logs()
    assert "promoted from a hot standby" in logs, logs
    assert "Traceback" not in cluster.consumers[primary].logs()


async def test_sqlite_primary_sigkilled_mid_stream_loses_and_repeats_nothing(
    cluster: Cluster, appender: AppendService
) -> None:
    cluster.store = "sqlite"
    await cluster.start("mid-a", "mid-b")
    channel, stub = cluster.stub("mid-a")
    async with channel:
        applied = await stub.Apply(cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(upsert=cluster.spec(0))]))
        assert applied.status == cpb.OK
        primary = cluster.primary_of(await cluster.wait_statuses(stub, {Code.PRIMARY: 1}))
    other = "mid-b" if primary == "mid-a" else "mid-a"

    keys: list[str] = []
    stop = asyncio.Event()

    async def publishing() -> None:
        i = 0
        while not stop.is_set():
            batch = [f"m{(i + j) % 11}" for j in range(5)]
            i += 5
            await publish(appender, cluster.source, *batch)
            keys.extend(batch)
            await asyncio.sleep(0.005)

    load = asyncio.create_task(publishing())
    try:
        # Kill the primary while it is consuming (transactions of 50 ms at most, back to back): once it
        # committed some of what is being published.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while not ((committed_before := cluster.state("committed")) is not None and committed_before["state"]):
            assert loop.time() < deadline and not load.done(), "the primary committed nothing\n" + cluster.all_logs()
            await asyncio.sleep(0.05)
        await asyncio.to_thread(cluster.consumers[primary].stop, signal.SIGKILL)
        await asyncio.sleep(0.5)
    finally:
        stop.set()
        await load

    channel, stub = cluster.stub(other)
    async with channel:
        await cluster.wait_statuses(stub, {Code.PRIMARY: 1}, primary=other)
        head = await publish(appender, cluster.source, "last")
        keys.append("last")
        await cluster.stat_through(stub, head)
        await cluster.wait_committed(counts(*keys))  # Every message counted exactly once.
    recovered = cluster.state("recovered")
    assert recovered is not None and recovered["pid"] == cluster.consumers[other].proc.pid
    final = counts(*keys)
    assert all(n <= final[k] for k, n in recovered["state"].items()), recovered
    assert all(recovered["state"].get(k, 0) >= n for k, n in committed_before["state"].items()), (
        "the recovered state is at least the last commit the test saw"
    )


async def keys_through(client: JournalClient, journal: str, end: int) -> list[str]:
    """The Keys of the NDJSON messages of `journal` before offset `end` (a message boundary)."""
    content = b""
    if end:
        async with Reader(client, journal, offset=0, end_offset=end, block=False) as reader:
            async for chunk in reader:
                content += chunk
    assert len(content) == end and (end == 0 or content.endswith(b"\n")), (end, content[-200:])
    return [json.loads(line)["Key"] for line in content.splitlines()]


def files_of(directory: Path) -> dict[str, bytes]:
    """Each file under `directory` (by relative path), and its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def digests(files: dict[str, bytes]) -> dict[str, tuple[int, str]]:
    return {name: (len(data), hashlib.sha256(data).hexdigest()[:16]) for name, data in files.items()}


def play_log(cluster: Cluster, consumer: str, into: Path) -> dict[str, bytes]:
    """`gazctl shards recover` (a process of its own) plays the shard's log into `into`; its files' bytes."""
    done = run_gazctl(cluster.broker, "shards", "recover", "--id", cluster.shard, "--dir", str(into),
                      env={"CONSUMER_ADDRESS": cluster.consumers[consumer].url})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return files_of(into)


async def test_sqlite_primary_sigkilled_inside_an_open_transaction_recovers_its_last_commit_elsewhere(
    cluster: Cluster, client: JournalClient, appender: AppendService
) -> None:
    """A SQLiteStore primary is SIGKILLed while a transaction is open and has written to the store
    (its writes spilled from SQLite's page cache into the recorded database file, so the log holds
    them, and the rollback journal that undoes them); the shard restarts on another member, which
    plays the log: its store holds exactly the last commit, the counts of the source's messages up
    to the recovered checkpoint, and none of the open transaction's writes."""
    cluster.store = "sqlite"
    # Only the first member holds its transaction open at the "hold" message; it is the primary.
    await cluster.start("open-a", env={HOLD_KEY_ENV: "hold", CACHE_PAGES_ENV: "10"})
    channel, stub = cluster.stub("open-a")
    spec = cluster.spec(0)
    # A transaction stays open at least 2 s: each published batch is consumed in one transaction.
    spec.min_txn_duration.CopyFrom(Duration(seconds=2))
    spec.max_txn_duration.CopyFrom(Duration(seconds=60))
    async with channel:
        assert (await stub.Apply(cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(upsert=spec)]))).status == cpb.OK
        await cluster.wait_statuses(stub, {Code.PRIMARY: 1}, primary="open-a")
        committed_keys = [f"c{i % 7}" for i in range(40)]
        committed_head = await publish(appender, cluster.source, *committed_keys)
        committed = await cluster.wait_committed(counts(*committed_keys))
        assert committed["pid"] == cluster.consumers["open-a"].proc.pid
    await cluster.start("open-b")

    # The open transaction: 300 new keys of ~200 bytes (more pages than SQLite's 10-page cache), then
    # the message that holds it open.
    open_keys = [f"open-{i:03d}-" + "x" * 200 for i in range(300)] + ["c1", "hold"]
    await publish(appender, cluster.source, *open_keys)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while (holding := cluster.state("holding")) is None:
        assert loop.time() < deadline, "the primary never reached the hold message\n" + cluster.all_logs()
        await asyncio.sleep(0.05)
    assert holding == {"pid": cluster.consumers["open-a"].proc.pid, "state": counts(*committed_keys, *open_keys)}
    assert cluster.state("committed") == committed, "the open transaction has not committed"

    # The log holds the open transaction's writes: played as it stands, its rollback journal is hot
    # (SQLite spilled pages to the database file, journaling their committed content first).
    for attempt in range(10):  # Until the recorder has appended what it recorded.
        at_kill = cluster.tmp / f"played-before-the-kill-{attempt}"
        played = await asyncio.to_thread(play_log, cluster, "open-a", at_kill)
        if played.get("store.db-journal"):
            break
        await asyncio.sleep(0.2)
    assert len(played.get("store.db-journal", b"")) > 0, sorted((k, len(v)) for k, v in played.items())
    assert played["store.db"] != b"", played.keys()
    # SQLite itself rolls that journal back, to the last commit.
    conn = sqlite3.connect(at_kill / "store.db")
    try:
        offline = {str(k): int(n) for k, n in conn.execute("SELECT key, n FROM counts")}
    finally:
        conn.close()
    assert offline == counts(*committed_keys)

    await asyncio.to_thread(cluster.consumers["open-a"].stop, signal.SIGKILL)
    channel, stub = cluster.stub("open-b")
    async with channel:
        await cluster.wait_statuses(stub, {Code.PRIMARY: 1}, primary="open-b")
        recovered = cluster.state("recovered")
        assert recovered is not None and recovered["pid"] == cluster.consumers["open-b"].proc.pid
        # Exactly the last commit: its checkpoint, and the counts of the messages it read through.
        assert recovered["read_through"] == {cluster.source: committed_head}
        from_source = counts(*await keys_through(client, cluster.source, recovered["read_through"][cluster.source]))
        assert recovered["state"] == from_source == committed["state"]
        assert not [k for k in recovered["state"] if k.startswith("open-") or k == "hold"]

        # The new primary then counts the open transaction's messages, once.
        head = await publish(appender, cluster.source, "after")
        await cluster.stat_through(stub, head)
        await cluster.wait_committed(counts(*committed_keys, *open_keys, "after"))
    logs = cluster.consumers["open-b"].logs()
    assert "played as a new primary" in logs, logs


@pytest.mark.parametrize("store", ["json", "sqlite"])
async def test_a_log_one_member_wrote_replays_byte_identical_in_other_processes(
    cluster: Cluster, appender: AppendService, store: str
) -> None:
    """The files a primary (a `gazette consume` process) keeps in its recorded directory, once its
    transactions are quiet, are byte for byte those its recovery log plays into elsewhere: by
    `gazctl shards recover` (a process of its own), and by the other member, a hot standby that
    played the log as it was written and serves from it after a SIGTERM hand-off."""
    cluster.store = store
    await cluster.start("bytes-a", "bytes-b")
    channel, stub = cluster.stub("bytes-a")
    async with channel:
        applied = await stub.Apply(cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(upsert=cluster.spec(1))]))
        assert applied.status == cpb.OK
        first = await cluster.wait_statuses(stub, {Code.PRIMARY: 1, Code.STANDBY: 1})
        writer = cluster.primary_of(first)
        standby = "bytes-b" if writer == "bytes-a" else "bytes-a"
        # Several transactions, of keys of varied lengths (a multi-page database, rewritten state.json).
        keys: list[str] = []
        for batch in range(6):
            keys.extend(f"k{batch}-{i % 9}-" + "v" * (i * 7 % 150) for i in range(40))
            head = await publish(appender, cluster.source, *keys[-40:])
            await cluster.stat_through(stub, head)
            await cluster.wait_committed(counts(*keys))
        recovered = cluster.state("recovered")
        assert recovered is not None and recovered["pid"] == cluster.consumers[writer].proc.pid
    live = files_of(Path(recovered["dir"]))
    main_file = "store.db" if store == "sqlite" else "state.json"
    assert len(live.get(main_file, b"")) > 4096, digests(live)

    played = await asyncio.to_thread(play_log, cluster, writer, cluster.tmp / "played")
    assert played.keys() == live.keys(), (digests(played), digests(live))
    assert [n for n in live if played[n] != live[n]] == [], (digests(played), digests(live))

    assert await asyncio.to_thread(cluster.consumers[writer].stop, signal.SIGTERM) == 0
    channel, stub = cluster.stub(standby)
    async with channel:
        await cluster.wait_statuses(stub, {Code.PRIMARY: 1}, primary=standby)
    promoted = cluster.state("recovered")
    assert promoted is not None and promoted["pid"] == cluster.consumers[standby].proc.pid
    assert promoted["state"] == counts(*keys)
    replayed = files_of(Path(promoted["dir"]))
    assert replayed.keys() == live.keys(), (digests(replayed), digests(live))
    assert [n for n in live if replayed[n] != live[n]] == [], (digests(replayed), digests(live))
    assert "promoted from a hot standby" in cluster.consumers[standby].logs()
    print(f"{store}: byte-identical in 3 processes: {digests(live)}")


async def test_hints_past_the_logs_end_fail_the_shard_naming_the_offset(cluster: Cluster) -> None:
    """Hints of a segment beyond the recovery log's write head (its content lost, or hints of another
    cluster's log): the shard FAILS naming the log, the offset and the possible data loss, rather than
    serving a store missing those files."""
    await cluster.start("lost-a")
    channel, stub = cluster.stub("lost-a")
    async with channel:
        hints = FSMHints(log=cluster.recovery_log)
        hints.live_nodes.add(fnode=1).segments.add(
            author=7, first_seq_no=1, last_seq_no=2, first_offset=1 << 20, last_offset=(1 << 20) + 100
        )
        change = cpb.ApplyRequest.Change(upsert=cluster.spec(0), primary_hints=hints)
        assert (await stub.Apply(cpb.ApplyRequest(changes=[change]))).status == cpb.OK
        [error] = (await cluster.wait_failed(stub)).errors
        assert cluster.recovery_log in error and "1048576" in error and "possible data loss" in error, error
        assert cluster.state("recovered") is None, "no store was built from the log"
