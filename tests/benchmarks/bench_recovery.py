"""Benchmark of recovery logs, local stores and hot standbys (issue 16, done-when item 4).

Starts its own etcd and one `gazette serve` broker (and, for the take-over part, real `gazette
consume` processes). Four parts, all in one run:

1. Recording overhead: SQLite transactions/s, each an upsert of a 100-byte row (1,000 keys), an
   UPDATE of a counter row and an INSERT into a history table, then the checkpoint UPDATE and
   COMMIT. Recorded: a `SQLiteStore` over the recording VFS (`--journal-mode`, TRUNCATE by default
   as the store's; exclusive locking and synchronous FULL, as the store sets them), its commits
   either pipelined (up to `--window` commit futures in flight) or each awaited (durable in the log
   before the next transaction begins). Plain: the same SQL and pragmas on a local SQLite file
   through apsw, no recorder, with synchronous FULL and NORMAL. Each variant runs `--seconds`;
   ratios recorded / plain.
2. Playback: `--playback-mib` MiB of file writes (1 MiB writes through a FileRecorder) recorded to
   a log journal; then, alternately, `--rounds` times each: the raw read rate of the whole journal
   (the client's RetryReader, chunks read and discarded) and a Player playing the log (from the
   Recorder's hints) into a fresh temporary directory, to the write head. Best of each; goal
   >= 200 MB/s, or >= 50% of the raw rate.
3. Take-over, with real `gazette consume` processes running `tests.support.cli_apps:recorded_app`
   (the JSON counting store of tests/consumer/test_recovery_cli.py, whose Consumer and Cluster
   classes are reused; `--etcd.lease 3`): a shard with `hot_standbys: 1` on two members, messages
   consumed, the standby tailing the log. Stat requests (read_through = the source's head) are
   launched every 50 ms at the standby's member. SIGKILL of the primary: the time from the kill
   until a Stat is first answered OK (goal <= lease TTL + 1 s). Then a third member joins as the
   new standby, messages are published every 20 ms and Stats launched every 50 ms at the member
   that stays, and the primary gets SIGTERM: the longest gap between consecutive answered Stats
   and the slowest Stat (goal: both <= 1 s), and failed Stats (goal 0).
4. Cold start with hints, for two logs full of dead files: a JSONFileStore of `--json-keys` keys
   committed `--json-commits` times (each commit writes a new state file and renames it over the
   old one), and a SQLiteStore of `--sqlite-keys` rows committed `--sqlite-commits` times, 20
   rows updated each time, with `compact_after` `--sqlite-compact-mib` (each transaction's
   journal is a new file, and a compaction kills the database's old file); commits pipelined one
   deep, as a shard's. Then a Player with the Recorder's hints (round-tripped through Gazette's
   JSON, as etcd stores them) and one with empty hints (`FSMHints(log=...)`): the bytes of log
   each read (counted at the RetryReader the Player reads through), their times and the ratio.
   Both must recover the last committed state.

The report goes to stdout, progress to stderr. MB is 10^6 bytes, MiB 2^20.

    python -m tests.benchmarks.bench_recovery [--seconds 3] [--journal-mode TRUNCATE] [--playback-mib 256]
        [--rounds 3] [--json-commits 300] [--sqlite-commits 300] [--parts overhead,playback,takeover,hints]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw
import grpc

from broker.client import AppendService, JournalClient, OffsetNotYetAvailable, RetryReader
from broker.protocol import labels, pb
from consumer.protocol import pb as cpb
from consumer.recoverylog import FSM, FileRecorder, FSMHints, Player, Recorder, decode_hints, encode_hints
from consumer.recoverylog import player as player_module
from consumer.stores import JSONFileStore, SQLiteStore
from tests.benchmarks.bench_broker import bench_spec
from tests.benchmarks.stack import etcd_and_broker, log
from tests.consumer.stores.recorded import FakeShard
from tests.consumer.test_consume_cli import publish
from tests.consumer.test_recovery_cli import LEASE, Cluster
from tests.support.harness import BrokerProcess
from tests.support.journals import create_journal

MB = 1e6
MiB = 1 << 20
GOAL_PLAYBACK_MBS = 200.0
GOAL_PLAYBACK_RATIO = 0.5
GOAL_KILL_SECONDS = LEASE + 1.0
GOAL_TERM_SECONDS = 1.0
POLL_EVERY = 0.05
PUBLISH_EVERY = 0.02
SHARD = FakeShard(id="bench-recovery")
AUTHOR = 0x1234
Code = cpb.ReplicaStatus.Code

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS totals (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS history (id INTEGER PRIMARY KEY, k TEXT NOT NULL, t INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO totals VALUES (0, 0)",
)
UPSERT = "INSERT INTO kv VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v"
COUNT = "UPDATE totals SET n = n + 1 WHERE id = 0"
HISTORY = "INSERT INTO history (k, t) VALUES (?, ?)"
VALUE = os.urandom(100)


def checkpoint(n: int) -> cpb.Checkpoint:
    cp = cpb.Checkpoint()
    cp.sources["bench/source"].read_through = n * 256
    return cp


def run_txn(execute: Callable[..., Any], n: int) -> None:
    """The statements of one benchmark transaction (without its checkpoint and COMMIT)."""
    key = f"k{n % 1000}"
    execute(UPSERT, (key, VALUE))
    execute(COUNT)
    execute(HISTORY, (key, n))


async def new_log(client: JournalClient, name: str) -> str:
    spec = bench_spec(name, pb.NONE)  # One 512 MiB fragment, uncompressed.
    del spec.fragment.stores[:]  # Read from the broker's spool: no persisting in the background.
    spec.labels.labels.add(name=labels.CONTENT_TYPE, value=labels.CONTENT_TYPE_RECOVERY_LOG)
    await create_journal(client, spec)
    return name


async def new_recorder(ajc: AppendService, journal: str, dir: Path) -> Recorder:
    dir.mkdir(parents=True, exist_ok=True)
    return await Recorder.open(journal, FSM(FSMHints(log=journal)), AUTHOR, str(dir), ajc)


# -- 1. recording overhead ------------------------------------------------------------------------


@dataclass
class Overhead:
    name: str
    txns: int
    seconds: float
    log_bytes: int = 0

    @property
    def rate(self) -> float:
        return self.txns / self.seconds if self.seconds else 0.0


async def recorded_sqlite(client: JournalClient, ajc: AppendService, tmp: Path, seconds: float, window: int,
                          name: str, journal_mode: str) -> Overhead:
    """Transactions of a SQLiteStore for `seconds`; `window` commits in flight (1: each awaited)."""
    journal = await new_log(client, f"bench/recovery/overhead-window-{window}")
    rec = await new_recorder(ajc, journal, tmp / f"rec-{journal.rsplit('/', 1)[1]}")
    store = await SQLiteStore.open(rec, journal_mode=journal_mode)
    try:
        for sql in SCHEMA:
            store.execute(sql)
        await store.start_commit(SHARD, checkpoint(0), [])  # type: ignore[arg-type]
        head0 = rec.write_head
        pending: deque[Awaitable[Any]] = deque()
        n = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            n += 1
            run_txn(store.execute, n)
            pending.append(store.start_commit(SHARD, checkpoint(n), []))  # type: ignore[arg-type]
            while len(pending) >= window:
                await pending.popleft()
        while pending:
            await pending.popleft()
        elapsed = time.perf_counter() - started
        total = store.query("SELECT n FROM totals WHERE id = 0")[0][0]
        if total != n:
            raise RuntimeError(f"recorded store counted {total} transactions, not {n}")
        return Overhead(name, n, elapsed, rec.write_head - head0)
    finally:
        await store.destroy()
        await rec.close()


def plain_sqlite(tmp: Path, seconds: float, synchronous: str, journal_mode: str) -> Overhead:
    """The same transactions on a local SQLite file, no recorder."""
    path = tmp / f"plain-{synchronous.lower()}.db"
    conn = apsw.Connection(str(path))
    try:
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        conn.execute(f"PRAGMA journal_mode={journal_mode}")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute("CREATE TABLE gazette_checkpoint (rowid INTEGER PRIMARY KEY DEFAULT 0 CHECK (rowid=0), "
                     "checkpoint BLOB)")
        conn.execute("INSERT INTO gazette_checkpoint VALUES (0, X'')")
        for sql in SCHEMA:
            conn.execute(sql)
        n = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            n += 1
            conn.execute("BEGIN")
            run_txn(conn.execute, n)
            conn.execute("UPDATE gazette_checkpoint SET checkpoint=? WHERE rowid=0",
                         (checkpoint(n).SerializeToString(deterministic=True),))
            conn.execute("COMMIT")
        return Overhead(f"plain SQLite, synchronous={synchronous}", n, time.perf_counter() - started)
    finally:
        conn.close()
        path.unlink(missing_ok=True)


async def overhead(args: argparse.Namespace, client: JournalClient, ajc: AppendService, tmp: Path) -> list[Overhead]:
    out = []
    for sync in ("FULL", "NORMAL"):
        log(f"overhead: plain SQLite, synchronous={sync}, {args.seconds:g} s")
        out.append(plain_sqlite(tmp, args.seconds, sync, args.journal_mode))
        log(f"  {out[-1].rate:,.0f} txn/s")
    for name, window in ((f"recorded, commits pipelined ({args.window})", args.window),
                         ("recorded, each commit awaited", 1)):
        log(f"overhead: {name}, {args.seconds:g} s")
        out.append(await recorded_sqlite(client, ajc, tmp, args.seconds, window, name, args.journal_mode))
        log(f"  {out[-1].rate:,.0f} txn/s")
    return out


# -- 2. playback ----------------------------------------------------------------------------------


@dataclass
class Playback:
    mib: int = 0
    log_bytes: int = 0
    record_seconds: float = 0.0
    raw: list[float] = field(default_factory=list)
    played: list[float] = field(default_factory=list)
    verified: bool = True

    @property
    def raw_rate(self) -> float:
        return max(self.raw, default=0.0)

    @property
    def play_rate(self) -> float:
        return max(self.played, default=0.0)


class CountingRetryReader(RetryReader):
    """A RetryReader adding every byte it returns to `CountingRetryReader.total`."""

    total = 0

    async def read(self, size: int = -1) -> bytes:
        data = await super().read(size)
        CountingRetryReader.total += len(data)
        return data


@contextmanager
def counting_reads() -> Iterator[type[CountingRetryReader]]:
    """Make the Player read through a CountingRetryReader (its bytes counted from 0)."""
    saved = player_module.RetryReader
    player_module.RetryReader = CountingRetryReader  # type: ignore[misc]
    CountingRetryReader.total = 0
    try:
        yield CountingRetryReader
    finally:
        player_module.RetryReader = saved  # type: ignore[misc]


async def raw_read(client: JournalClient, journal: str, head: int) -> int:
    n = 0
    async with RetryReader(client, journal, offset=0, block=False, end_offset=head) as rr:
        while True:
            try:
                data = await rr.read()
            except OffsetNotYetAvailable:
                break
            if not data:
                break
            n += len(data)
    return n


async def play(client: JournalClient, ajc: AppendService, hints: FSMHints, dir: Path) -> float:
    player = Player()
    player.finish_at_write_head()
    started = time.perf_counter()
    await player.play(hints, dir, client, ajc)
    return time.perf_counter() - started


def same_file(path: Path, chunks: list[bytes], mib: int) -> bool:
    """Whether `path` holds exactly the `mib` recorded 1 MiB writes."""
    with open(path, "rb") as f:
        for i in range(mib):
            if f.read(MiB) != chunks[i % len(chunks)]:
                return False
        return f.read(1) == b""


async def playback(args: argparse.Namespace, client: JournalClient, ajc: AppendService, tmp: Path) -> Playback:
    r = Playback(mib=args.playback_mib)
    journal = await new_log(client, "bench/recovery/playback")
    rec = await new_recorder(ajc, journal, tmp / "rec-playback")
    chunks = [os.urandom(MiB) for _ in range(4)]
    log(f"playback: recording {r.mib} MiB of 1 MiB writes")
    started = time.perf_counter()
    fr = FileRecorder(rec, rec.record_create(tmp / "rec-playback" / "big.bin"))
    for i in range(r.mib):
        fr.record_write(chunks[i % len(chunks)])
        if rec.pending_bytes >= 32 * MiB:
            await rec.barrier()
    hints = await rec.build_hints()
    r.record_seconds = time.perf_counter() - started
    r.log_bytes = rec.write_head
    await rec.close()
    log(f"  {r.log_bytes / MB / r.record_seconds:,.0f} MB/s recorded; log is {r.log_bytes:,} bytes")
    out = tmp / "played"
    for i in range(args.rounds):
        seconds = time.perf_counter()
        got = await raw_read(client, journal, r.log_bytes)
        seconds = time.perf_counter() - seconds
        if got != r.log_bytes:
            raise RuntimeError(f"raw read {got} bytes of {journal}, not {r.log_bytes}")
        r.raw.append(got / seconds)
        log(f"  round {i + 1}: raw RetryReader {r.raw[-1] / MB:,.0f} MB/s")
        seconds = await play(client, ajc, hints, out)
        r.played.append(r.log_bytes / seconds)
        log(f"  round {i + 1}: Player {r.played[-1] / MB:,.0f} MB/s")
        r.verified = same_file(out / "big.bin", chunks, r.mib) and r.verified
        shutil.rmtree(out)
    return r


# -- 3. take-over ---------------------------------------------------------------------------------


@dataclass
class StatSample:
    began: float
    ended: float
    ok: bool
    error: str = ""


@dataclass
class TakeOver:
    kill_seconds: float = float("nan")
    kill_promoted: bool = False
    kill_samples: int = 0
    kill_unanswered: int = 0
    term_samples: int = 0
    term_failed: int = 0
    term_errors: list[str] = field(default_factory=list)
    term_gap: float = float("nan")
    term_slowest: float = float("nan")
    term_exit: int | None = None
    term_exit_seconds: float = float("nan")
    term_promoted: bool = False


class Poller:
    """Stat requests of the cluster's shard, launched every POLL_EVERY seconds at one member, each
    asking for read_through = `head[0]` (what was published when it was launched)."""

    def __init__(self, cluster: Cluster, member: str, head: list[int]) -> None:
        self.cluster, self.member, self.head = cluster, member, head
        self.samples: list[StatSample] = []
        self.first_ok = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _one(self, stub: Any, head: int) -> None:
        began = time.monotonic()
        try:
            resp = await stub.Stat(cpb.StatRequest(shard=self.cluster.shard, read_through={self.cluster.source: head}),
                                   timeout=5)
            ok, error = resp.status == cpb.OK, "" if resp.status == cpb.OK else cpb.Status.Name(resp.status)
        except grpc.aio.AioRpcError as exc:
            ok, error = False, f"{exc.code()}: {exc.details()}"
        self.samples.append(StatSample(began, time.monotonic(), ok, error))
        if ok:
            self.first_ok.set()

    async def _run(self, stop: asyncio.Event) -> None:
        channel, stub = self.cluster.stub(self.member)
        calls: set[asyncio.Task[None]] = set()
        async with channel:
            while not stop.is_set():
                t = asyncio.create_task(self._one(stub, self.head[0]))
                calls.add(t)
                t.add_done_callback(calls.discard)
                try:
                    await asyncio.wait_for(stop.wait(), POLL_EVERY)
                except TimeoutError:
                    pass
            await asyncio.gather(*calls)

    def start(self, stop: asyncio.Event) -> None:
        self._task = asyncio.create_task(self._run(stop))

    async def join(self) -> None:
        assert self._task is not None
        await self._task


async def wait_logged(consumer: Any, text: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in consumer.logs():
        if time.monotonic() > deadline:
            raise TimeoutError(f"consumer {consumer.id} did not log {text!r}:\n{consumer.logs()[-4000:]}")
        await asyncio.sleep(0.05)


async def takeover(client: JournalClient, ajc: AppendService, tmp: Path, broker: BrokerProcess, etcd: str) -> TakeOver:
    r = TakeOver()
    (tmp / "takeover").mkdir()
    cluster = Cluster(tmp / "takeover", broker, etcd, client)
    await cluster.create_journals()
    try:
        log(f"take-over: starting two `gazette consume` members (--etcd.lease {LEASE:g})")
        await cluster.start("bench-a", "bench-b")
        channel, stub = cluster.stub("bench-a")
        async with channel:
            applied = await stub.Apply(cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(upsert=cluster.spec(1))]))
            if applied.status != cpb.OK:
                raise RuntimeError(f"applying the shard failed: {applied}")
            primary = cluster.primary_of(await cluster.wait_statuses(stub, {Code.PRIMARY: 1, Code.STANDBY: 1}))
            standby = "bench-b" if primary == "bench-a" else "bench-a"
            keys = [f"k{i % 17}" for i in range(200)]
            head = [await publish(ajc, cluster.source, *keys)]
            await cluster.stat_through(stub, head[0])
            await cluster.wait_committed({k: keys.count(k) for k in set(keys)})
        await wait_logged(cluster.consumers[standby], "shard standby is tailing its recovery log")
        await asyncio.sleep(0.5)  # The standby plays the last commit's ops.

        log(f"take-over: SIGKILL of the primary {primary}; Stat every {POLL_EVERY * 1000:.0f} ms at {standby}")
        stop = asyncio.Event()
        poller = Poller(cluster, standby, head)
        killed_at = time.monotonic()
        cluster.consumers[primary].proc.send_signal(signal.SIGKILL)
        poller.start(stop)
        try:
            await asyncio.wait_for(poller.first_ok.wait(), 60)
        finally:
            stop.set()
            await poller.join()
        await asyncio.to_thread(cluster.consumers[primary].stop, signal.SIGKILL)
        r.kill_seconds = min(s.ended for s in poller.samples if s.ok) - killed_at
        r.kill_samples = len(poller.samples)
        r.kill_unanswered = sum(not s.ok for s in poller.samples)
        log(f"  served {r.kill_seconds:.2f} s after the SIGKILL")
        r.kill_promoted = "promoted from a hot standby" in cluster.consumers[standby].logs()

        log("take-over: a third member joins as the new standby")
        await cluster.start("bench-c")
        channel, stub = cluster.stub(standby)
        async with channel:
            await cluster.wait_statuses(stub, {Code.PRIMARY: 1, Code.STANDBY: 1}, primary=standby)
        await wait_logged(cluster.consumers["bench-c"], "shard standby is tailing its recovery log")
        await asyncio.sleep(0.5)

        log(f"take-over: SIGTERM of the primary {standby}; publishing every {PUBLISH_EVERY * 1000:.0f} ms, "
            f"Stat every {POLL_EVERY * 1000:.0f} ms at bench-c")
        stop = asyncio.Event()

        async def publishing() -> None:
            i = 0
            while not stop.is_set():
                head[0] = await publish(ajc, cluster.source, f"t{i % 5}")
                i += 1
                await asyncio.sleep(PUBLISH_EVERY)

        publisher = asyncio.create_task(publishing())
        poller = Poller(cluster, "bench-c", head)
        poller.start(stop)
        try:
            await asyncio.sleep(1.0)
            termed_at = time.monotonic()
            r.term_exit = await asyncio.to_thread(cluster.consumers[standby].stop, signal.SIGTERM)
            r.term_exit_seconds = time.monotonic() - termed_at
            await asyncio.sleep(1.0)
        finally:
            stop.set()
            await poller.join()
            await publisher
        samples = poller.samples
        r.term_samples = len(samples)
        failed = [s for s in samples if not s.ok]
        r.term_failed = len(failed)
        r.term_errors = sorted({s.error for s in failed})
        answered = sorted(s.ended for s in samples if s.ok)
        # The longest stretch without an answer, from the SIGTERM's window on.
        first = min(s.began for s in samples)
        points = [first, *answered]
        r.term_gap = max(b - a for a, b in itertools.pairwise(points)) if answered else float("inf")
        r.term_slowest = max(s.ended - s.began for s in samples)
        r.term_promoted = "promoted from a hot standby" in cluster.consumers["bench-c"].logs()
        log(f"  longest gap {r.term_gap * 1000:.0f} ms, slowest Stat {r.term_slowest * 1000:.0f} ms, "
            f"{r.term_failed} failed of {r.term_samples}")
        return r
    except BaseException:
        log(cluster.all_logs())
        raise
    finally:
        await cluster.stop_all()


# -- 4. hints -------------------------------------------------------------------------------------


@dataclass
class ColdStart:
    store: str
    commits: int = 0
    log_bytes: int = 0
    hints_json_bytes: int = 0
    live_segments: int = 0
    with_hints_bytes: int = 0
    with_hints_seconds: float = 0.0
    without_bytes: int = 0
    without_seconds: float = 0.0
    verified: bool = False


async def cold_starts(client: JournalClient, ajc: AppendService, tmp: Path, journal: str, built: FSMHints,
                      r: ColdStart, verify: Callable[[Path], bool]) -> ColdStart:
    """Play `journal` with `built` hints (round-tripped through Gazette's JSON, as a new primary reads
    them from etcd) and with none: the bytes each read, and whether both recovered what `verify` wants."""
    encoded = encode_hints(built)
    r.hints_json_bytes = len(encoded)
    hints = decode_hints(encoded)
    r.live_segments = sum(len(node.segments) for node in hints.live_nodes)
    ok = True
    for with_hints in (True, False):
        out = tmp / "cold"
        with counting_reads() as counter:
            seconds = await play(client, ajc, hints if with_hints else FSMHints(log=journal), out)
        ok = verify(out) and ok
        shutil.rmtree(out)
        log(f"  {'with' if with_hints else 'without'} hints: read {counter.total:,} bytes in {seconds:.3f} s")
        if with_hints:
            r.with_hints_bytes, r.with_hints_seconds = counter.total, seconds
        else:
            r.without_bytes, r.without_seconds = counter.total, seconds
    r.verified = ok
    return r


async def commit_all(commits: int, txn: Callable[[int], Awaitable[Any]]) -> None:
    """`commits` transactions, each's commit in flight while the next one runs (as a shard's)."""
    pending: deque[Awaitable[Any]] = deque()
    for n in range(1, commits + 1):
        pending.append(txn(n))
        while len(pending) >= 2:
            await pending.popleft()
    while pending:
        await pending.popleft()


async def json_cold_start(args: argparse.Namespace, client: JournalClient, ajc: AppendService,
                          tmp: Path) -> ColdStart:
    journal = await new_log(client, "bench/recovery/hints-json")
    rec = await new_recorder(ajc, journal, tmp / "rec-hints-json")
    store: JSONFileStore[dict[str, int]] = JSONFileStore(rec, {f"key-{i:06d}": i for i in range(args.json_keys)})
    log(f"hints: {args.json_commits} commits of a JSONFileStore of {args.json_keys:,} keys")

    def txn(n: int) -> Awaitable[Any]:
        for j in range(10):
            k = f"key-{(n * 10 + j) % args.json_keys:06d}"
            store.state[k] = store.state[k] + n
        return store.start_commit(SHARD, checkpoint(n), [])  # type: ignore[arg-type]

    await commit_all(args.json_commits, txn)
    expect = (Path(rec.dir) / "state.json").read_bytes()
    built = await rec.build_hints()
    r = ColdStart(f"JSONFileStore, {len(expect):,}-byte state.json", args.json_commits, rec.write_head)
    await store.destroy()
    await rec.close()
    return await cold_starts(client, ajc, tmp, journal, built, r,
                             lambda out: (out / "state.json").read_bytes() == expect)


async def sqlite_cold_start(args: argparse.Namespace, client: JournalClient, ajc: AppendService,
                            tmp: Path) -> ColdStart:
    journal = await new_log(client, "bench/recovery/hints-sqlite")
    rec = await new_recorder(ajc, journal, tmp / "rec-hints-sqlite")
    compact_after = int(args.sqlite_compact_mib * MiB)
    store = await SQLiteStore.open(rec, journal_mode=args.journal_mode, compact_after=compact_after)
    store.execute("CREATE TABLE kv (k TEXT PRIMARY KEY, v BLOB NOT NULL)")
    store.executemany("INSERT INTO kv VALUES (?, ?)", [(f"key-{i:06d}", VALUE * 2) for i in range(args.sqlite_keys)])
    log(f"hints: {args.sqlite_commits} commits of a SQLiteStore of {args.sqlite_keys:,} rows, compact_after "
        f"{args.sqlite_compact_mib:g} MiB")

    def txn(n: int) -> Awaitable[Any]:
        for j in range(20):
            store.execute("UPDATE kv SET v = ? WHERE k = ?",
                          (n.to_bytes(4, "big") * 50, f"key-{(n * 20 + j) % args.sqlite_keys:06d}"))
        return store.start_commit(SHARD, checkpoint(n), [])  # type: ignore[arg-type]

    await commit_all(args.sqlite_commits, txn)
    expect = store.query("SELECT k, v FROM kv ORDER BY k")
    built = await rec.build_hints()
    r = ColdStart(f"SQLiteStore, {args.sqlite_keys:,} rows of 200 bytes, {store.compactions} compactions",
                  args.sqlite_commits, rec.write_head)
    await store.destroy()
    await rec.close()

    def verify(out: Path) -> bool:
        conn = apsw.Connection(str(out / "store.db"))
        try:
            got = [tuple(row) for row in conn.execute("SELECT k, v FROM kv ORDER BY k")]
            return got == expect and conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        finally:
            conn.close()

    return await cold_starts(client, ajc, tmp, journal, built, r, verify)


# -- the run and the report -----------------------------------------------------------------------


@dataclass
class Results:
    overhead: list[Overhead] = field(default_factory=list)
    playback: Playback | None = None
    takeover: TakeOver | None = None
    cold: list[ColdStart] = field(default_factory=list)


async def measure(args: argparse.Namespace, tmp: Path, broker: BrokerProcess, etcd: str) -> Results:
    r = Results()
    async with JournalClient(broker.url) as client, AppendService(client) as ajc:
        if "overhead" in args.parts:
            r.overhead = await overhead(args, client, ajc, tmp)
        if "playback" in args.parts:
            r.playback = await playback(args, client, ajc, tmp)
        if "hints" in args.parts:
            r.cold = [await json_cold_start(args, client, ajc, tmp), await sqlite_cold_start(args, client, ajc, tmp)]
        if "takeover" in args.parts:
            r.takeover = await takeover(client, ajc, tmp, broker, etcd)
    return r


def print_report(args: argparse.Namespace, r: Results) -> bool:
    def verdict(ok: bool) -> str:
        return "PASS" if ok else "MISS"

    def row(name: str, value: str, goal: str = "", v: str = "") -> None:
        print(f"  {name:58s} {value:>18s} {goal:>14s}  {v}")

    oks: list[bool] = []
    print()
    print("Gazette recovery-log benchmark: one etcd, one `gazette serve`, this process (and `gazette consume` "
          "processes for the take-over)")
    print(f"  machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"SQLite {apsw.sqlite_lib_version()}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"  {'figure':58s} {'value':>18s} {'goal':>14s}  verdict")
    if r.overhead:
        print(f" 1. recording overhead: SQLite transactions (3 small writes + checkpoint + COMMIT), journal_mode "
              f"{args.journal_mode}, {args.seconds:g} s each")
        by = {o.name: o for o in r.overhead}
        for o in r.overhead:
            extra = f", {o.log_bytes / o.txns:,.0f} log bytes/txn" if o.log_bytes and o.txns else ""
            row(f"{o.name}{extra}", f"{o.rate:,.0f} txn/s")
        full, normal = by["plain SQLite, synchronous=FULL"], by["plain SQLite, synchronous=NORMAL"]
        for o in r.overhead:
            if o.log_bytes:
                row(f"ratio {o.name.removeprefix('recorded, ')} / plain FULL; / NORMAL",
                    f"{o.rate / full.rate:.2f}; {o.rate / normal.rate:.2f}")
    if r.playback:
        p = r.playback
        ratio = p.play_rate / p.raw_rate if p.raw_rate else 0.0
        ok = p.play_rate >= GOAL_PLAYBACK_MBS * MB or ratio >= GOAL_PLAYBACK_RATIO
        oks.append(ok and p.verified)
        print(f" 2. playback: {p.mib} MiB of 1 MiB file writes, a log of {p.log_bytes:,} bytes (recorded at "
              f"{p.log_bytes / MB / p.record_seconds:,.0f} MB/s), best of {len(p.played)}")
        row("raw RetryReader, read and discarded", f"{p.raw_rate / MB:,.0f} MB/s")
        row("Player into a temporary directory (from hints)", f"{p.play_rate / MB:,.0f} MB/s",
            f">= {GOAL_PLAYBACK_MBS:.0f} MB/s", verdict(p.play_rate >= GOAL_PLAYBACK_MBS * MB))
        row("ratio Player / raw", f"{ratio:.2f}", f">= {GOAL_PLAYBACK_RATIO}", verdict(ratio >= GOAL_PLAYBACK_RATIO))
        row("playback judged (either goal)", "", "", verdict(ok))
        row("played file's size and content", "as recorded" if p.verified else "DIFFERENT", "exactly",
            verdict(p.verified))
    if r.takeover:
        t = r.takeover
        ok_kill = t.kill_seconds <= GOAL_KILL_SECONDS
        ok_term = max(t.term_gap, t.term_slowest) <= GOAL_TERM_SECONDS
        oks += [ok_kill, ok_term, t.term_failed == 0, t.kill_promoted and t.term_promoted, t.term_exit == 0]
        print(f" 3. take-over: real `gazette consume` members, JSON counting store, hot_standbys 1, --etcd.lease "
              f"{LEASE:g} s, Stat every {POLL_EVERY * 1000:.0f} ms")
        row("SIGKILL of the primary: to the standby's first OK Stat", f"{t.kill_seconds:.2f} s",
            f"<= {GOAL_KILL_SECONDS:g} s", verdict(ok_kill))
        row("  Stats made in this phase; not answered OK (no live primary)",
            f"{t.kill_samples}; {t.kill_unanswered}")
        row("SIGTERM of the primary: longest gap between answered Stats", f"{t.term_gap * 1000:,.0f} ms",
            f"<= {GOAL_TERM_SECONDS * 1000:.0f} ms", verdict(t.term_gap <= GOAL_TERM_SECONDS))
        row("  slowest Stat", f"{t.term_slowest * 1000:,.0f} ms", f"<= {GOAL_TERM_SECONDS * 1000:.0f} ms",
            verdict(t.term_slowest <= GOAL_TERM_SECONDS))
        row(f"  failed Stats of {t.term_samples} {', '.join(t.term_errors)}".rstrip(), f"{t.term_failed}", "0",
            verdict(t.term_failed == 0))
        row("  the primary's exit code; its exit after SIGTERM", f"{t.term_exit}; {t.term_exit_seconds:.2f} s", "0",
            verdict(t.term_exit == 0))
        row("both new primaries promoted from hot standbys (no replay)", "yes" if t.kill_promoted and t.term_promoted
            else f"kill {t.kill_promoted}, term {t.term_promoted}", "yes", verdict(t.kill_promoted and t.term_promoted))
    if r.cold:
        print(" 4. cold start: bytes of the log a Player reads with the Recorder's hints, and without hints")
        for h in r.cold:
            oks.append(h.verified)
            print(f"   {h.store}, committed {h.commits} times: a log of {h.log_bytes:,} bytes; hints of "
                  f"{h.live_segments} segment(s), {h.hints_json_bytes:,} bytes of JSON")
            row(f"bytes read with hints (in {h.with_hints_seconds * 1000:,.0f} ms)", f"{h.with_hints_bytes:,}")
            row(f"bytes read without hints, from offset 0 (in {h.without_seconds * 1000:,.0f} ms)",
                f"{h.without_bytes:,}")
            ratio = h.without_bytes / h.with_hints_bytes if h.with_hints_bytes else float("inf")
            row("ratio without / with hints", f"{ratio:,.1f}x")
            row("both recovered the last committed state", "yes" if h.verified else "NO", "yes", verdict(h.verified))
    overall = all(oks)
    print(f"  overall: {'PASS' if overall else 'MISS'}")
    return overall


PARTS = ("overhead", "playback", "takeover", "hints")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench_recovery",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each SQLite overhead variant")
    parser.add_argument("--window", type=int, default=64, help="commits in flight when pipelined")
    parser.add_argument("--playback-mib", type=int, default=256, help="MiB of file writes in the playback log")
    parser.add_argument("--rounds", type=int, default=3, help="raw reads and playbacks; the best of each is reported")
    parser.add_argument("--json-commits", type=int, default=300, help="commits of the JSONFileStore (part 4)")
    parser.add_argument("--json-keys", type=int, default=2000, help="keys of the JSONFileStore's state (part 4)")
    parser.add_argument("--journal-mode", choices=["TRUNCATE", "DELETE", "PERSIST", "WAL"], default="TRUNCATE",
                        help="SQLite journal mode of parts 1 and 4 (the store's default, TRUNCATE)")
    parser.add_argument("--sqlite-commits", type=int, default=300, help="commits of the SQLiteStore (part 4)")
    parser.add_argument("--sqlite-keys", type=int, default=2000, help="rows of the SQLiteStore (part 4)")
    parser.add_argument("--sqlite-compact-mib", type=float, default=1.0,
                        help="the SQLiteStore's compact_after, in MiB of database writes (part 4)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    args = parser.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if unknown := set(args.parts) - set(PARTS):
        parser.error(f"unknown parts {sorted(unknown)}")
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp_name:
        tmp = Path(tmp_name)
        with etcd_and_broker(tmp, "--log.level", "info") as broker:
            broker_args = [str(a) for a in broker.proc.args]  # type: ignore[union-attr]
            etcd = broker_args[broker_args.index("--etcd.address") + 1]
            results = asyncio.run(measure(args, tmp, broker, etcd))
    ok = print_report(args, results)
    sys.stdout.flush()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
