"""stream-sum (examples/stream_sum), Gazette's exactly-once crash test, against real parts: the
session's etcd, a `gazette serve` broker, and in-process ConsumerServices running the Summer on
SQLite files, then on a real PostgreSQL database.

Exactly-once violations surface as failures on either side: a summer that reads a chunk out of
sequence FAILS its shard (recorded here by a keyspace monitor), and a chunker raises
`ChunkerError` on a wrong, missing or duplicated sum. The tests assert on counts and statuses.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

from broker.client import JournalClient
from cluster.keyspace import KeySpace
from consumer.keyspace import CONSUMER_SCHEMA
from consumer.message import JSON_FRAMING, Flags, build_uuid, get_flags, read_committed
from consumer.protocol import pb as cpb
from consumer.service import ConsumerService
from examples.stream_sum import (
    Chunk,
    Chunker,
    ChunkerError,
    ChunkerStats,
    OutOfSequence,
    Sum,
    Summer,
    crc64,
    journal_specs,
    shard_specs,
)
from examples.stream_sum.specs import apply, sum_journals
from examples.stream_sum.summer import (
    ENV_DSN,
    ENV_PREFIX,
    ENV_SQLITE_DIR,
    SumCache,
    sqlite_path,
    to_signed,
    to_unsigned,
)
from tests.support.harness import ROOT, BrokerCluster, BrokerProcess, free_port, wait_http_ready
from tests.support.journals import wait_for_primary
from tests.support.waiting import until

Code = cpb.ReplicaStatus.Code
T = TypeVar("T")
WAIT = 60.0
CHUNK_PARTITIONS = 4
SUM_PARTITIONS = 2


# -- units ----------------------------------------------------------------------------------------


def test_crc64_is_gos_ecma_table() -> None:
    assert crc64.checksum(b"123456789") == 0x995DC9BBDF1939FA  # CRC-64/XZ's check value.
    # Gazette's TestUpdateSumCases: whole, and folded chunk by chunk.
    assert crc64.checksum(b"battery horse") == 0xAE763109C1192ED6
    assert crc64.update(crc64.update(0, b"battery"), b" horse") == 0xAE763109C1192ED6
    assert crc64.update(0, b"") == 0
    assert crc64.ECMA_REFLECTED == int(f"{crc64.ECMA_POLY:064b}"[::-1], 2)


def test_messages_are_gos_json() -> None:
    u = build_uuid(bytes.fromhex("010203040506"), 160, Flags.CONTINUE_TXN)
    chunk = Chunk(UUID=u, ID=bytes(range(16)), SeqNo=3, Data=b"battery")
    line = JSON_FRAMING.marshal(chunk)
    assert json.loads(line) == {
        "UUID": "0000000a-0000-1000-8001-010203040506", "ID": list(range(16)), "SeqNo": 3,
        "Data": base64.b64encode(b"battery").decode(),
    }
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert JSON_FRAMING.unmarshal(line, Chunk()) == chunk
    final = JSON_FRAMING.unmarshal(JSON_FRAMING.marshal(Chunk(ID=bytes(16), SeqNo=4)), Chunk())
    assert final.final and json.loads(JSON_FRAMING.marshal(final))["Data"] is None

    total = Sum(UUID=u, ID=bytes(range(16)), SeqNo=4, Value=0xAE763109C1192ED6)
    assert json.loads(JSON_FRAMING.marshal(total))["Value"] == 0xAE763109C1192ED6
    assert JSON_FRAMING.unmarshal(JSON_FRAMING.marshal(total), Sum()) == total
    # An ACK is the zero message with a UUID; Go's zero Chunk decodes too.
    ack = Chunk().new_acknowledgement("j")
    assert JSON_FRAMING.unmarshal(b'{"UUID":"0000000a-0000-1000-8001-010203040506","ID":[0,0,0,0,0,0,0,0,0,0,0,0,0,'
                                  b'0,0,0],"SeqNo":0,"Data":null}\n', ack).SeqNo == 0
    with pytest.raises(Exception, match="ID must be an array of 16"):
        JSON_FRAMING.unmarshal(b'{"ID":[1,2]}\n', Chunk())


def test_out_of_sequence_names_stream_and_numbers() -> None:
    assert str(OutOfSequence("ab12", 3, 4)) == (
        "invalid chunk: chunk SeqNo 3 of stream ab12 is out of sequence (expected 4: a duplicate)"
    )
    assert str(OutOfSequence("ab12", 6, 4)) == (
        "invalid chunk: chunk SeqNo 6 of stream ab12 is out of sequence (expected 4: chunks were skipped)"
    )
    assert "already finished" in str(OutOfSequence("ab12", 5, 0, finished=True))
    for value in (0, 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1):
        assert to_unsigned(to_signed(value)) == value and -(1 << 63) <= to_signed(value) < 1 << 63
    cache = SumCache()
    cache.finish("x")
    assert cache.streams == {"x": None} and cache.dirty == {"x"}
    assert sqlite_path(Path("/d"), "a/b c").name == "a%2Fb%20c.db"


# -- against etcd, a broker, and SQLite or PostgreSQL ---------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """The Summer's store settings: SQLite files under tmp_path, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return {"sqlite_dir": tmp_path / "sums"}
    return {"dsn": request.getfixturevalue("postgres_dsn")}


def consumer_spec(suffix: str) -> cpb.ConsumerSpec:
    spec = cpb.ConsumerSpec(shard_limit=100)
    spec.process_spec.id.zone, spec.process_spec.id.suffix = "local", suffix
    spec.process_spec.endpoint = f"http://{suffix}.test:8080"
    return spec


class Monitor:
    """A keyspace mirror of the application that records every FAILED status it ever sees."""

    def __init__(self, etcd: Any, root: str) -> None:
        self.keyspace = KeySpace(etcd, root, schema=CONSUMER_SCHEMA, watch_delay=0.01)
        self.failed: dict[str, list[str]] = {}
        self.failed_event = asyncio.Event()

    async def start(self) -> Monitor:
        await self.keyspace.load()
        self.keyspace.watch()
        self.keyspace.add_observer(self._observe)
        self._observe()
        return self

    def _observe(self) -> None:
        for a in self.keyspace.all_assignments():
            if a.value.code == Code.FAILED:
                self.failed.setdefault(a.item_id, list(a.value.errors))
                self.failed_event.set()

    def primaries(self) -> dict[str, str]:
        """Shard -> member suffix, for each shard whose only assignment is a PRIMARY at slot 0."""
        by_shard: dict[str, list[Any]] = {}
        for a in self.keyspace.all_assignments():
            by_shard.setdefault(a.item_id, []).append(a)
        return {
            shard: found[0].suffix
            for shard, found in by_shard.items()
            if len(found) == 1 and found[0].slot == 0 and found[0].value.code == Code.PRIMARY
        }

    async def close(self) -> None:
        await self.keyspace.close()


class Deployment:
    """stream-sum's journals and shards under unique names, and the services that run the Summer."""

    def __init__(self, etcd: Any, root: str, client: JournalClient, summer: Summer, lease_ttl: float) -> None:
        self.etcd, self.root, self.client, self.summer, self.lease_ttl = etcd, root, client, summer, lease_ttl
        self.prefix = summer.prefix
        self.shards = [s.id for s in shard_specs(self.prefix, CHUNK_PARTITIONS)]
        self.services: dict[str, ConsumerService] = {}
        self.monitor = Monitor(etcd, root)
        self._serial = 0

    async def create(self) -> None:
        journals, shards = await apply(self.client, self.etcd, self.root, self.prefix,
                                       chunk_partitions=CHUNK_PARTITIONS, sum_partitions=SUM_PARTITIONS)
        assert [j.name for j in journals] == [j.name for j in journal_specs(self.prefix, 4, 2)]
        assert [s.id for s in shards] == self.shards
        for spec in journals:
            await wait_for_primary(self.client, spec.name)
        await self.monitor.start()

    async def start_service(self, name: str) -> ConsumerService:
        self._serial += 1
        svc = ConsumerService(
            self.etcd, self.root, consumer_spec(f"{name}-{self._serial}"), self.client, self.summer,
            lease_ttl=self.lease_ttl, watch_delay=0.01, exit_timeout=30.0, handoff_timeout=30.0,
        )
        self.services[name] = svc
        await svc.start()
        return svc

    async def all_primary(self, members: set[str] | None = None) -> dict[str, str]:
        """Wait until every shard has one PRIMARY, and the primaries are exactly on `members`
        (default: the live in-process services)."""
        if members is None:
            members = {svc.spec.process_spec.id.suffix for svc in self.services.values()}

        def ok(p: dict[str, str]) -> bool:
            return sorted(p) == self.shards and set(p.values()) == members

        return await until(self.monitor.primaries, ok, f"every shard PRIMARY on {sorted(members)}")

    async def crash(self, name: str, *, revoke: bool) -> None:
        """The in-process stand-in for SIGKILL (`ConsumerService.abort`): no exiting, no hand-off, no
        status update; its lease is revoked, or left to expire."""
        svc = self.services.pop(name)
        await svc.abort(revoke_lease=revoke)
        # Nothing was released: the member key is there, not exiting, until its lease is revoked (or expires).
        member = await self.etcd.get(svc.announcement.key.encode())
        if revoke:
            assert member is None
        else:
            assert member is not None
            assert not CONSUMER_SCHEMA.member_exiting(CONSUMER_SCHEMA.decode_member(member.value))

    async def close(self) -> None:
        for svc in self.services.values():
            await svc.stop()
        await self.monitor.close()

    async def committed_sums(self) -> list[Sum]:
        """Every committed Sum of the sum partitions (ACKs skipped)."""
        out = []
        for journal in sum_journals(self.prefix, SUM_PARTITIONS):
            async for env in read_committed(self.client, journal, 0, lambda _s: Sum(), block=False):
                if get_flags(env.uuid) != Flags.ACK_TXN:
                    out.append(env.message)
        return out

    def fences(self, store: dict[str, Any]) -> dict[str, int]:
        """Each shard's checkpoint fence: how many times a primary restored it."""
        if "dsn" in store:
            with psycopg.connect(store["dsn"]) as conn:
                rows = conn.execute("SELECT shard_fqn, fence FROM gazette_checkpoints").fetchall()
        else:
            rows = []
            for shard in self.shards:
                conn = sqlite3.connect(sqlite_path(store["sqlite_dir"], shard), timeout=30.0)
                try:
                    rows += conn.execute("SELECT shard_fqn, fence FROM gazette_checkpoints").fetchall()
                finally:
                    conn.close()
        return {fqn.rsplit("/", 1)[-1]: int(fence) for fqn, fence in rows}

    def open_streams(self, store: dict[str, Any]) -> int:
        """Rows of unfinished streams left in the stores."""
        if "dsn" in store:
            with psycopg.connect(store["dsn"]) as conn:
                row = conn.execute("SELECT COUNT(*) FROM stream_sums").fetchone()
                return int(row[0]) if row else 0
        n = 0
        for shard in self.shards:
            conn = sqlite3.connect(sqlite_path(store["sqlite_dir"], shard), timeout=30.0)
            try:
                n += int(conn.execute("SELECT COUNT(*) FROM stream_sums").fetchone()[0])
            finally:
                conn.close()
        return n


@pytest.fixture
async def deployment(
    etcd_client: Any, etcd_prefix: str, client: JournalClient, store: dict[str, Any]
) -> AsyncIterator[Deployment]:
    summer = Summer(prefix=f"test/stream-sum/{uuid.uuid4().hex[:12]}/", **store)
    d = Deployment(etcd_client, etcd_prefix, client, summer, lease_ttl=3.0)
    await d.create()
    try:
        yield d
    finally:
        await d.close()


async def run_chunkers(d: Deployment, chunkers: list[Chunker]) -> list[ChunkerStats]:
    """Run the chunkers to completion; fail at once if a shard FAILS meanwhile."""
    runs = [asyncio.ensure_future(c.run()) for c in chunkers]
    failed = asyncio.ensure_future(d.monitor.failed_event.wait())
    try:
        await asyncio.wait([failed, asyncio.gather(*runs)], return_when=asyncio.FIRST_COMPLETED)
        assert not d.monitor.failed, f"a summer shard FAILED: {d.monitor.failed}"
        return [r.result() for r in runs]
    finally:
        failed.cancel()
        for r in runs:
            r.cancel()
        await asyncio.gather(*runs, failed, return_exceptions=True)


def chunker(d: Deployment, **kwargs: Any) -> Chunker:
    kwargs.setdefault("workers", 2)
    kwargs.setdefault("chunks", 5)
    kwargs.setdefault("sum_timeout", WAIT)
    return Chunker(d.client, prefix=d.prefix, **kwargs)


async def test_chunkers_and_summers_agree(deployment: Deployment, store: dict[str, Any]) -> None:
    """2 chunkers, 4 summer shards on 2 services: every stream's sum verifies, once; no shard fails."""
    d = deployment
    await d.start_service("one")
    await d.start_service("two")
    await d.all_primary()
    chunkers = [chunker(d, streams=6), chunker(d, streams=6)]
    stats = await run_chunkers(d, chunkers)

    assert [(s.streams, s.verified) for s in stats] == [(12, 12), (12, 12)]
    assert [s.chunks for s in stats] == [12 * 6, 12 * 6]
    sums = await d.committed_sums()
    assert len(sums) == 24 and len({s.ID for s in sums}) == 24, "each stream's sum, exactly once"
    assert all(s.SeqNo == 6 for s in sums)
    assert d.open_streams(store) == 0, "finished streams' rows are deleted"
    assert not d.monitor.failed
    assert sorted(d.monitor.primaries()) == d.shards


async def test_summer_fails_a_shard_on_an_out_of_sequence_chunk(deployment: Deployment) -> None:
    """A duplicated chunk (as an exactly-once violation would deliver) FAILS its shard, naming the
    stream and the sequence numbers."""
    d = deployment
    await d.start_service("one")
    await d.all_primary()
    from broker.client import AppendService
    from consumer.message import Publisher, modulo_mapping
    from examples.stream_sum.messages import stream_key
    from examples.stream_sum.specs import chunk_journals

    stream = bytes(range(16))
    mapping = modulo_mapping(stream_key, chunk_journals(d.prefix, CHUNK_PARTITIONS))
    journal, _ = mapping(Chunk(ID=stream))
    async with AppendService(d.client) as svc:
        pub = Publisher(svc)
        for seq in (1, 2, 2):  # Self-committed, each with its own UUID: the Sequencer passes all three.
            await pub.publish_committed(lambda _m: (journal, "application/x-ndjson"),
                                        Chunk(ID=stream, SeqNo=seq, Data=b"x"))
    await asyncio.wait_for(d.monitor.failed_event.wait(), WAIT)
    ((shard, errors),) = d.monitor.failed.items()
    assert shard == d.shards[chunk_journals(d.prefix, CHUNK_PARTITIONS).index(journal)]
    assert errors == [
        f"runTransactions: app.ConsumeMessage: invalid chunk: chunk SeqNo 2 of stream {stream.hex()} is out of "
        "sequence (expected 3: a duplicate)"
    ]


async def test_exactly_once_across_restarts_and_crashes(deployment: Deployment, store: dict[str, Any]) -> None:
    """While 2 chunkers run, the services are stopped and replaced, and crashed (tasks cancelled
    without stop(); the lease revoked, or left to expire): no shard ever sees a chunk out of
    sequence, and every stream's sum verifies, exactly once."""
    d = deployment
    await d.start_service("one")
    await d.start_service("two")
    await d.all_primary()
    chunkers = [chunker(d), chunker(d)]
    runs = asyncio.ensure_future(run_chunkers(d, chunkers))

    def verified() -> int:
        return sum(c.stats.verified for c in chunkers)

    async def progress(n: int = 4) -> None:
        """Wait until the chunkers verified `n` more streams (and fail early if they stopped)."""
        target = verified() + n
        await until(lambda: (verified(), runs.done()), lambda v: v[0] >= target or v[1], f"{n} more sums")
        if runs.done():
            runs.result()  # A ChunkerError or a FAILED shard, raised here.
            pytest.fail("the chunkers stopped early")

    try:
        await progress()
        # 1. A graceful stop (shards handed over), and a fresh service.
        await d.services["one"].stop()
        d.services.pop("one")
        await progress()
        await d.start_service("one")
        await d.all_primary()
        await progress()
        # 2. A crash whose lease is revoked at once (as etcd does when the lease's keepalive stops
        # and... a test cannot wait for it), and a fresh service.
        await d.crash("two", revoke=True)
        await d.all_primary()
        await progress()
        await d.start_service("two")
        await d.all_primary()
        await progress()
        # 3. A crash left to expire (the lease TTL is 3 s) while the other service is replaced.
        await d.crash("one", revoke=False)
        await d.all_primary()
        await progress()
        await d.start_service("one")
        await d.all_primary()
        await progress()
        # 4. Both crash, one after the other; fresh services take over.
        await d.crash("two", revoke=True)
        await d.crash("one", revoke=False)
        await d.start_service("three")
        await d.start_service("four")
        await d.all_primary()
        await progress()
    finally:
        for c in chunkers:
            c.stop()
    stats = await runs

    total = sum(s.streams for s in stats)
    assert [s.verified for s in stats] == [s.streams for s in stats]
    assert total >= 4 * 8
    sums = await d.committed_sums()
    assert len(sums) == total and len({s.ID for s in sums}) == total, "each stream's sum, exactly once"
    assert not d.monitor.failed, d.monitor.failed
    assert d.open_streams(store) == 0
    # Every shard changed primaries at least twice (step 2 moved all of them, step 4 all again).
    fences = d.fences(store)
    assert sorted(fences) == d.shards and min(fences.values()) >= 3, fences


async def test_chunker_fails_on_a_missing_sum(deployment: Deployment) -> None:
    """With no summer running, the chunker's first finished stream has no sum: ChunkerError."""
    c = chunker(deployment, workers=1, streams=1, chunks=1, sum_timeout=1.0)
    with pytest.raises(ChunkerError, match=r"missing sum: no Sum of stream [0-9a-f]{32} \(expected SeqNo 2"):
        await c.run()


# -- under `gazette consume` processes, killed with SIGKILL ---------------------------------------


class SummerProcess:
    """`python -m consumer consume examples.stream_sum:summer` (what the `gazette` script runs), with
    a 3 s lease, its store and journal prefix given by the environment."""

    def __init__(self, d: Deployment, store: dict[str, Any], etcd: str, broker: BrokerProcess, name: str,
                 tmp: Path) -> None:
        self.name = name
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CONSUMER_", "ETCD_", "BROKER_", "LOG_", "STREAM_SUM_"))}
        env["PYTHONPATH"] = str(ROOT)
        env[ENV_PREFIX] = d.prefix
        if "dsn" in store:
            env[ENV_DSN] = store["dsn"]
        else:
            env[ENV_SQLITE_DIR] = str(store["sqlite_dir"])
        self.port = free_port()
        args = [
            sys.executable, "-m", "consumer", "consume", "examples.stream_sum:summer",
            "--consumer.id", name, "--consumer.port", str(self.port), "--consumer.host", "127.0.0.1",
            "--consumer.bind", "127.0.0.1", "--broker.address", broker.url, "--etcd.address", etcd,
            "--etcd.prefix", d.root, "--etcd.lease", "3", "--consumer.watch-delay", "0.01",
        ]
        self.log_path = tmp / f"summer-{name}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> None:
        """Until the process serves (a restart under the same ID first waits out the old lease)."""
        wait_http_ready(self.name, f"http://127.0.0.1:{self.port}", self.proc, self.logs, WAIT)

    async def signal(self, sig: int) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return await asyncio.to_thread(self.proc.wait, WAIT)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)  # The consumer logs its tasks' stacks.
            await asyncio.sleep(1.0)
            self.proc.kill()
            raise


async def test_exactly_once_across_sigkilled_consume_processes(
    deployment: Deployment, store: dict[str, Any], etcd_endpoint: str, broker: BrokerProcess, tmp_path: Path
) -> None:
    """The crash test as Gazette runs it, on one machine: summers are `gazette consume` processes
    that are SIGKILLed (their leases expire) and SIGTERMed while 2 chunkers run; no shard ever
    FAILS, and every stream's sum verifies, exactly once."""
    d = deployment
    procs: dict[str, SummerProcess] = {}
    started: list[SummerProcess] = []

    def start(name: str) -> None:
        procs[name] = SummerProcess(d, store, etcd_endpoint, broker, name, tmp_path)
        started.append(procs[name])

    def print_logs() -> None:
        for p in started:
            print(f"--- {p.name} (exit {p.proc.poll()}) ---\n{p.logs()[-6000:]}")

    async def stop(name: str, sig: int) -> int:
        return await procs.pop(name).signal(sig)

    chunkers = [chunker(d), chunker(d)]
    runs: asyncio.Future[list[ChunkerStats]] | None = None

    def verified() -> int:
        return sum(c.stats.verified for c in chunkers)

    async def progress(n: int = 4) -> None:
        assert runs is not None
        target = verified() + n
        await until(lambda: (verified(), runs.done()), lambda v: v[0] >= target or v[1], f"{n} more sums")
        if runs.done():
            runs.result()
            pytest.fail("the chunkers stopped early")

    try:
        start("summer-a")
        start("summer-b")
        await d.all_primary({"summer-a", "summer-b"})
        runs = asyncio.ensure_future(run_chunkers(d, chunkers))
        await progress()
        assert await stop("summer-a", signal.SIGKILL) == -signal.SIGKILL
        await d.all_primary({"summer-b"})  # Once summer-a's lease expired.
        await progress()
        start("summer-c")
        await d.all_primary({"summer-b", "summer-c"})
        await progress()
        assert await stop("summer-b", signal.SIGTERM) == 0  # A graceful exit hands its shards over.
        await d.all_primary({"summer-c"})
        await progress()
        start("summer-d")
        await d.all_primary({"summer-c", "summer-d"})
        await progress()
        assert await stop("summer-c", signal.SIGKILL) == -signal.SIGKILL
        assert await stop("summer-d", signal.SIGKILL) == -signal.SIGKILL
        start("summer-e")
        start("summer-f")
        await d.all_primary({"summer-e", "summer-f"})
        await progress()
    except BaseException:
        print_logs()
        raise
    finally:
        for c in chunkers:
            c.stop()
        try:
            stats = await runs if runs is not None else []
            codes = {name: await stop(name, signal.SIGTERM) for name in list(procs)}
        except BaseException:
            print_logs()
            raise
    assert codes == {"summer-e": 0, "summer-f": 0}, [p.logs()[-6000:] for p in started[-2:]]

    total = sum(s.streams for s in stats)
    assert [s.verified for s in stats] == [s.streams for s in stats]
    assert total >= 6 * 4
    sums = await d.committed_sums()
    assert len(sums) == total and len({s.ID for s in sums}) == total, "each stream's sum, exactly once"
    assert not d.monitor.failed, d.monitor.failed
    assert d.open_streams(store) == 0
    fences = d.fences(store)
    assert sorted(fences) == d.shards and min(fences.values()) >= 3, fences


async def test_command_line_apply_and_chunk(
    etcd_client: Any, etcd_prefix: str, etcd_endpoint: str, client: JournalClient, broker: BrokerProcess,
    tmp_path: Path,
) -> None:
    """`python -m examples.stream_sum apply` creates the journals and shards; `... chunk` publishes
    and verifies streams (against an in-process summer service), printing its counts."""
    prefix = f"test/stream-sum-cli/{uuid.uuid4().hex[:12]}/"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    async def run(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "examples.stream_sum", *args, cwd=ROOT, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), WAIT)
        return await proc.wait(), out.decode()

    code, out = await run("apply", "--broker.address", broker.url, "--etcd.address", etcd_endpoint,
                          "--etcd.prefix", etcd_prefix, "--prefix", prefix)
    assert code == 0, out
    assert out.splitlines() == [
        *(f"journal {prefix}chunks/part-{i:03d}" for i in range(4)),
        *(f"journal {prefix}sums/part-{i:03d}" for i in range(2)),
        *(f"shard stream-sum-summer-part-{i:03d} <- {prefix}chunks/part-{i:03d}" for i in range(4)),
    ]
    d = Deployment(etcd_client, etcd_prefix, client, Summer(prefix=prefix, sqlite_dir=tmp_path / "sums"), 3.0)
    await d.monitor.start()
    try:
        await d.start_service("one")
        await d.all_primary()
        code, out = await run("chunk", "--broker.address", broker.url, "--prefix", prefix, "--workers", "2",
                              "--streams", "3", "--chunks", "4")
        assert code == 0, out
        assert out.splitlines()[-1] == "streams=6 verified=6 chunks=30 sums_read=6"
        assert not d.monitor.failed
    finally:
        await d.close()


# -- consume processes and brokers SIGKILLed in turn ---------------------------------------------

BROKER_LEASE = 3.0
"""--etcd.lease of the brokers (the summers' is 3 s too): a SIGKILLed broker's assignments expire within it."""
CHAOS_ROUNDS = 6


@pytest.fixture
def two_brokers(etcd_endpoint: str, tmp_path: Path) -> Iterator[BrokerCluster]:
    """Two brokers (zones a and b) of a keyspace root of their own, sharing a `file://` root."""
    cluster = BrokerCluster(tmp_path / "brokers", etcd_endpoint, f"/test/{uuid.uuid4().hex}", ("a", "b"),
                            lease=BROKER_LEASE)
    try:
        yield cluster.start()
    finally:
        cluster.stop_all()


@pytest.mark.timeout(240)
async def test_exactly_once_while_consumers_and_brokers_are_sigkilled(
    etcd_client: Any, etcd_prefix: str, etcd_endpoint: str, two_brokers: BrokerCluster, tmp_path: Path
) -> None:
    """The consumer issue's done-when 2: stream-sum with 2 `gazette consume` summer processes, 4 shards
    and 2 brokers (journals at replication 2, persisted to a `file://` store) while 2 chunkers run; in
    turn a summer process, then a broker (restarted under its ID and state dir) is SIGKILLed and
    restarted. While a broker is down the journals have too few brokers (INSUFFICIENT_JOURNAL_BROKERS):
    chunkers and summers retry until it is back. No shard ever FAILS, every sum verifies, exactly once."""
    cluster = two_brokers
    store: dict[str, Any] = {"sqlite_dir": tmp_path / "sums"}
    summer = Summer(prefix=f"test/stream-sum/{uuid.uuid4().hex[:12]}/", **store)
    procs: dict[str, SummerProcess] = {}
    events: list[str] = []
    async with JournalClient(cluster.urls[0]) as client:
        d = Deployment(etcd_client, etcd_prefix, client, summer, lease_ttl=3.0)
        journals, _ = await apply(client, etcd_client, etcd_prefix, d.prefix, chunk_partitions=CHUNK_PARTITIONS,
                                  sum_partitions=SUM_PARTITIONS, replication=2, stores=["file:///"])
        names = [j.name for j in journals]
        await asyncio.to_thread(cluster.wait_routed, names, 2)
        await d.monitor.start()

        def start(name: str, broker: int) -> None:
            # Each summer reads and publishes through a broker of its own.
            procs[name] = SummerProcess(d, store, etcd_endpoint, cluster.slots[broker].proc, name, tmp_path)
            events.append(f"started {name} (via broker {broker})")

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
            events.append(f"verified {verified()}")

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
                if round % 2 == 0:
                    index = (round // 2) % 2
                    name = summers[index]
                    assert await procs.pop(name).signal(signal.SIGKILL) == -signal.SIGKILL
                    events.append(f"SIGKILLed {name}")
                    start(name, index)  # The same --consumer.id: it announces once the old lease expired.
                    # Until then the dead process's assignments still read PRIMARY under its name.
                    await asyncio.to_thread(procs[name].wait_ready)
                    await d.all_primary(set(summers))
                else:
                    index = (round // 2) % 2
                    old = cluster.slots[index].proc
                    assert await asyncio.to_thread(cluster.kill, index) == -signal.SIGKILL
                    events.append(f"SIGKILLed {old.broker_id}")
                    new = cluster.restart(index, same_id=True)
                    await asyncio.to_thread(new.wait_ready, BROKER_LEASE + 30.0)
                    await asyncio.to_thread(cluster.wait_routed, names, 2)
                    events.append(f"restarted {new.broker_id}; journals routed")
                await progress()
        except BaseException:
            # What each process waits on (their SIGUSR1 logs every asyncio task's stack).
            for proc in [p.proc for p in procs.values()] + [slot.proc.proc for slot in cluster.slots]:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGUSR1)
            await asyncio.sleep(1.0)
            print("events:", *events, sep="\n  ")
            for p in procs.values():
                print(f"--- {p.name} ---\n{p.logs()[-12000:]}")
            print("broker warnings and errors:", *cluster.log_lines()[-40:], sep="\n")
            raise
        finally:
            for c in chunkers:
                c.stop()
            if runs is not None:
                stats = await runs
            codes = {name: await procs.pop(name).signal(signal.SIGTERM) for name in list(procs)}
            await d.monitor.close()
        assert codes == {"summer-a": 0, "summer-b": 0}

        total = sum(s.streams for s in stats)
        assert [s.verified for s in stats] == [s.streams for s in stats]
        assert total >= 4 * (CHAOS_ROUNDS + 1)
        assert sum(s.chunks for s in stats) == total * 6, "5 chunks and a final one per stream"
        sums = await d.committed_sums()
        assert len(sums) == total and len({s.ID for s in sums}) == total, "each stream's sum, exactly once"
        assert all(s.SeqNo == 6 for s in sums)
        assert not d.monitor.failed, d.monitor.failed
        assert d.open_streams(store) == 0
