"""Network faults of consumer members: stream-sum (examples/stream_sum) with three `gazette consume
examples.stream_sum:summer` members (--etcd.lease 5), each a host in a Linux network namespace of its
own, one `gazette serve` broker on a host of its own, etcd apart in the root namespace (tests/support/netfaults.py,
tests/consumer/netfaults_consumer.py). Four summer shards (one per chunk partition) have a hot standby
each; their store is the summer's default SQLStore on per-shard SQLite files in the shared lab directory
(one machine: the filesystem is not faulted, so an isolated member can still reach its store, and only
the checkpoint fence keeps a replaced primary from committing).

Two chunkers in the test process publish streams through the broker and verify every stream's sum (a
wrong, missing or duplicated sum raises ChunkerError). Then the member that is primary of the most shards
is isolated, or cut from etcd only, for 12 s; the fault heals, and the member, which exits once its lease
is lost, is restarted as itself (as a supervisor restarts a pod).

Measured (seconds since the fault began): when another member's replica of each of the victim's shards
reported PRIMARY (keyspace watch in the test process), when that new primary first committed progress
(its checkpoint fence and read-through offsets, polled from the SQLite files), the victim's last
checkpoint commit under its own fence, the newest Sum/ACK its publishers stamped (the wall clock in the
UUIDs of every message of the sum partitions), the last change of its transaction metrics, the longest
stretch without a verified sum, and the time from the heal to full health. They are printed (`pytest -s`)
and named in failure messages; exactly-once is checked at the end (every stream's sum read committed
exactly once and verified; no shard FAILED; no open stream rows left).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aetcd
import pytest

from broker.client import JournalClient, apply_journals, upsert
from cluster.keyspace import KeySpace, item_key
from cluster.keyspace.etcd import parse_address
from consumer.keyspace import CONSUMER_SCHEMA
from consumer.message import Flags, get_flags, read_committed, read_uncommitted
from consumer.message.clock import clock_unix_ns
from consumer.message.uuid import get_clock, get_producer_id
from consumer.protocol import pb as cpb
from examples.stream_sum import Chunker, ChunkerStats, Sum, journal_specs, shard_specs
from examples.stream_sum.specs import sum_journals
from examples.stream_sum.summer import ENV_PREFIX, ENV_SQLITE_DIR, sqlite_path
from tests.consumer.netfaults_consumer import NetConsumer, kill_all
from tests.support.netfaults import Fault, NetworkLab, netfaults_unavailable

UNAVAILABLE = netfaults_unavailable()
pytestmark = [
    pytest.mark.netfaults,
    pytest.mark.skipif(UNAVAILABLE is not None, reason=UNAVAILABLE or ""),
    pytest.mark.timeout(100),
]

Code = cpb.ReplicaStatus.Code
LEASE = 5.0
"""--etcd.lease of the broker and of every consumer member."""
FAULT_SECONDS = 12.0
FAILOVER = LEASE + 2.0
"""How long after the fault began another member's replica of each of the victim's shards must be PRIMARY."""
STOP_OUTPUT = LEASE + 0.5
"""How long after the fault began the victim may still commit or publish."""
RECOVERY = 15.0
"""How long after the heal the deployment must be fully healthy again. It includes the victim's exit: a member
whose lease is lost stops serving at once, but exits only once it revoked that lease, which waits for etcd (so
for the heal, and the TCP retransmission after it)."""
RECOVERY_PATIENCE = 25.0
MEMBERS = ("summer-a", "summer-b", "summer-c")
APP = "examples.stream_sum:summer"
CHUNK_PARTITIONS = 4
SUM_PARTITIONS = 2
CHUNKS = 5
"""Chunks of each stream before its final one."""
POLL = 0.05
"""Seconds between two polls of the checkpoints (and of the chunkers' counts)."""
METRICS_POLL = 0.25
WAIT = 30.0
CONSUMER_LOG_LEVEL = "debug"


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[NetworkLab]:
    """Etcd, a ready broker on host `broker`, and hosts summer-a, summer-b and summer-c."""
    with NetworkLab(tmp_path) as lab:
        lab.start_etcd()
        broker = lab.add_broker("broker", zone="a", lease=LEASE)
        for name in MEMBERS:
            lab.add_host(name)
        broker.wait_ready(40.0)
        yield lab


# -- observing -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One checkpoint row as the poller saw it change."""

    at: float
    fence: int
    read_through: int
    producers: frozenset[bytes]
    """Producers of the checkpoint's ACK intents: the committing primary's publisher."""


class CheckpointPoller:
    """A thread reading every shard's checkpoint row (fence, checkpoint) from its SQLite file every POLL
    seconds, keeping each change; and, once `victim` is set, the victim's transaction metrics."""

    def __init__(self, sqlite_dir: Path, shards: list[str]) -> None:
        self.sqlite_dir, self.shards = sqlite_dir, shards
        self.samples: dict[str, list[Sample]] = {s: [] for s in shards}
        self.victim: NetConsumer | None = None
        self.metrics: list[tuple[float, float | None]] = []
        """(time, the victim's transactions + messages read, None when it did not answer) when it changed, until
        its first exit (a restarted incarnation counts anew)."""
        self._last_blob: dict[str, tuple[int, bytes]] = {}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._checkpoints, daemon=True),
                         threading.Thread(target=self._metrics, daemon=True)]

    def start(self) -> CheckpointPoller:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10.0)

    def _checkpoints(self) -> None:
        while not self._stop.is_set():
            for shard in self.shards:
                path = sqlite_path(self.sqlite_dir, shard)
                if not path.exists():
                    continue
                try:
                    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
                    try:
                        rows = conn.execute("SELECT fence, checkpoint FROM gazette_checkpoints").fetchall()
                    finally:
                        conn.close()
                except sqlite3.Error:
                    continue
                if not rows:
                    continue
                fence, blob = int(rows[0][0]), bytes(rows[0][1])
                if self._last_blob.get(shard) == (fence, blob):
                    continue
                self._last_blob[shard] = (fence, blob)
                cp = cpb.Checkpoint.FromString(blob)
                producers = set()
                for intent in cp.ack_intents.values():
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        producers.add(get_producer_id(uuid.UUID(json.loads(intent)["UUID"])))
                self.samples[shard].append(Sample(
                    time.monotonic(), fence, sum(s.read_through for s in cp.sources.values()), frozenset(producers)
                ))
            self._stop.wait(POLL)

    def _metrics(self) -> None:
        while not self._stop.is_set():
            victim = self.victim
            if victim is not None and victim.incarnation == 1:
                found = victim.metrics(timeout=0.5)
                value = None if found is None else sum(
                    v for k, v in found.items()
                    if k.startswith(("gazette_shard_transactions_total{", "gazette_shard_read_messages_total{"))
                )
                if not self.metrics or self.metrics[-1][1] != value:
                    self.metrics.append((time.monotonic(), value))
            self._stop.wait(METRICS_POLL)

    def last_before(self, shard: str, t: float) -> Sample | None:
        return next((s for s in reversed(self.samples[shard]) if s.at <= t), None)


class Monitor:
    """The application's keyspace, watched from the test process: when each shard's primary changed,
    and every FAILED status."""

    def __init__(self, etcd: Any, root: str) -> None:
        self.keyspace = KeySpace(etcd, root, schema=CONSUMER_SCHEMA, watch_delay=0.01)
        self.primary_changes: list[tuple[float, str, str | None]] = []
        self.failed: dict[str, list[str]] = {}
        self._primary: dict[str, str | None] = {}

    async def start(self) -> Monitor:
        await self.keyspace.load()
        self.keyspace.watch()
        self.keyspace.add_observer(self._observe)
        self._observe()
        return self

    def statuses(self) -> dict[str, list[tuple[str, int, Any]]]:
        """Shard -> [(member suffix, slot, status code)]."""
        out: dict[str, list[tuple[str, int, Any]]] = {s: [] for s in self.keyspace.items}
        for a in self.keyspace.all_assignments():
            out.setdefault(a.item_id, []).append((a.suffix, a.slot, a.value.code))
        return out

    def _observe(self) -> None:
        now = time.monotonic()
        for shard, found in self.statuses().items():
            primary = next((m for m, slot, code in found if slot == 0 and code == Code.PRIMARY), None)
            if self._primary.get(shard, "") != primary:
                self._primary[shard] = primary
                self.primary_changes.append((now, shard, primary))
            for m, _slot, code in found:
                if code == Code.FAILED:
                    a = next(a for a in self.keyspace.assignments(shard) if a.suffix == m)
                    self.failed.setdefault(f"{shard} on {m}", list(a.value.errors))

    def primaries(self) -> dict[str, str]:
        return {s: p for s, p in self._primary.items() if p is not None}

    def healthy(self, members: set[str]) -> bool:
        """Every shard has a PRIMARY at slot 0 and a STANDBY, and every one of `members` is announced."""
        announced = {m.suffix for m in self.keyspace.members.values()}
        if not members <= announced:
            return False
        for found in self.statuses().values():
            codes = sorted((slot == 0, code) for _m, slot, code in found)
            if codes != [(False, Code.STANDBY), (True, Code.PRIMARY)]:
                return False
        return True

    def describe(self) -> str:
        return "; ".join(
            f"{short(s)}: " + ", ".join(f"{m}#{slot} {Code.Name(c)}" for m, slot, c in sorted(found, key=by_slot))
            for s, found in sorted(self.statuses().items())
        )

    async def close(self) -> None:
        await self.keyspace.close()


def by_slot(found: tuple[str, int, Any]) -> int:
    return found[1]


def short(shard: str) -> str:
    return shard.rsplit("-", 1)[-1]


# -- the run ---------------------------------------------------------------------------------------


@dataclass
class Result:
    kind: str
    victim: NetConsumer
    fault: Fault
    t_heal: float
    victim_primaries: list[str]
    victim_fences: dict[str, int]
    standbys: dict[str, str]
    """The member of each of the victim's shards' STANDBY when the fault began."""
    failovers: dict[str, tuple[float, str] | None]
    """Seconds after the fault began another member reported PRIMARY, and which, by shard of the victim."""
    progress: dict[str, float | None]
    """Seconds after the fault began the new primary first committed progress, by shard of the victim."""
    victim_last_commit: float | None
    """Seconds after the fault began of the victim's last checkpoint commit under its fence seen (None: none)."""
    victim_last_stamp: float | None
    """Seconds after the fault began of the newest UUID clock of the victim's publishers in the sum partitions."""
    victim_metrics_change: tuple[float, float] | None
    """The last change of the victim's transaction metrics after the fault: between these seconds."""
    exits: list[tuple[float, int | None, str]]
    """(seconds after the fault began, status, last error line) of the victim's exits."""
    lease_lost: list[str]
    """The victim's log lines saying its lease was lost (whole seconds), with the fault's wall-clock time."""
    longest_gap: tuple[float, float]
    """The longest stretch without a verified sum during the fault, and where it began (since the fault)."""
    t_health: float | None
    """Seconds after the heal the deployment was fully healthy again."""
    stats: list[ChunkerStats]
    committed: int
    distinct: int
    bad_seqno: int
    open_rows: int
    failed: dict[str, list[str]]
    events: list[str] = field(default_factory=list)
    complaints: list[str] = field(default_factory=list)

    @property
    def streams(self) -> int:
        return sum(s.streams for s in self.stats)

    @property
    def verified(self) -> int:
        return sum(s.verified for s in self.stats)


async def fault_run(lab: NetworkLab, inject: str) -> Result:
    broker = lab.brokers[0]
    prefix = f"netfaults/stream-sum/{uuid.uuid4().hex[:8]}/"
    root = f"/netfaults-summer/{lab.id}"
    sqlite_dir = lab.tmp / "sums"
    shards = [s.id for s in shard_specs(prefix, CHUNK_PARTITIONS)]
    t0 = time.monotonic()
    events: list[str] = []

    def note(text: str) -> None:
        now = time.time()
        stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 100) % 100:02d}"
        events.append(f"  {time.monotonic() - t0:7.2f}s ({stamp}) {text}")

    host, port = parse_address(lab.etcd_endpoint)
    etcd = aetcd.Client(host=host, port=port)
    await etcd.connect()
    consumers: dict[str, NetConsumer] = {}
    poller = CheckpointPoller(sqlite_dir, shards)
    monitor = Monitor(etcd, root)
    runs: asyncio.Future[list[ChunkerStats]] | None = None
    chunkers: list[Chunker] = []
    stop_tasks = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        async with JournalClient(broker.url) as client:
            journals = journal_specs(prefix, CHUNK_PARTITIONS, SUM_PARTITIONS)
            await apply_journals(client, [upsert(spec, -1) for spec in journals])
            await asyncio.to_thread(lab.wait_routed, [j.name for j in journals], 1, WAIT)
            for spec in shard_specs(prefix, CHUNK_PARTITIONS, hot_standbys=1):
                await etcd.put(item_key(root, spec.id).encode(), spec.SerializeToString())
            await monitor.start()
            poller.start()
            env = {ENV_PREFIX: prefix, ENV_SQLITE_DIR: str(sqlite_dir)}
            for name in MEMBERS:
                consumers[name] = NetConsumer(
                    lab, lab.hosts[name], app=APP, consumer_id=name, root=root, broker_url=broker.url, lease=LEASE,
                    env=env, log_level=CONSUMER_LOG_LEVEL,
                ).start()
            await asyncio.gather(*(asyncio.to_thread(c.wait_ready, WAIT) for c in consumers.values()))
            await until(lambda: monitor.healthy(set(MEMBERS)), "every shard PRIMARY with a STANDBY", monitor.describe)
            note(f"deployed: {monitor.describe()}")

            chunkers = [Chunker(client, prefix=prefix, workers=2, chunks=CHUNKS, sum_timeout=WAIT) for _ in range(2)]
            runs = asyncio.ensure_future(asyncio.gather(*(c.run() for c in chunkers)))
            verified_at: list[tuple[float, int]] = []

            def verified() -> int:
                return sum(c.stats.verified for c in chunkers)

            async def count_verified() -> None:
                while not stop_tasks.is_set():
                    n = verified()
                    if not verified_at or verified_at[-1][1] != n:
                        verified_at.append((time.monotonic(), n))
                    await asyncio.sleep(POLL)

            tasks.append(asyncio.create_task(count_verified()))

            async def progress(n: int, what: str) -> None:
                assert runs is not None
                target = verified() + n
                await until(lambda: verified() >= target or runs.done(), what, lambda: f"{verified()} verified")
                if runs.done():
                    runs.result()
                    pytest.fail("the chunkers stopped early")

            await progress(8, "8 verified sums before the fault")
            primaries = monitor.primaries()
            by_member = {m: sorted(s for s, p in primaries.items() if p == m) for m in MEMBERS}
            victim_name = max(MEMBERS, key=lambda m: (len(by_member[m]), m))
            victim = consumers[victim_name]
            victim_primaries = by_member[victim_name]
            poller.victim = victim
            await asyncio.sleep(1.0)  # Metrics of the victim before the fault.

            exits: list[tuple[float, int | None, str]] = []
            restart = asyncio.Event()

            async def supervise() -> None:
                """Note every member's exit; once `restart` is set, start it again as itself."""
                while not stop_tasks.is_set():
                    for c in consumers.values():
                        if c.proc is not None and not c.running():
                            rc = c.returncode
                            last = (c.log_lines(r"\b(ERROR|error)\b") or ["(no error logged)"])[-1].strip()
                            if c is victim:
                                exits.append((time.monotonic() - fault.started, rc, last[:200]))
                            note(f"{c.consumer_id} exited with {rc}: {last[:200]}")
                            c.stop()  # Reaps it.
                        if c.proc is None and restart.is_set():
                            c.restart()
                            note(f"{c.consumer_id} restarted (incarnation {c.incarnation})")
                    await asyncio.sleep(0.1)

            standbys = {shard: next((m for m, slot, code in found if slot > 0 and code == Code.STANDBY), "-")
                        for shard, found in monitor.statuses().items() if shard in victim_primaries}
            fault: Fault = getattr(lab, inject)(victim.host)
            wall_offset = time.time() - time.monotonic()
            tasks.append(asyncio.create_task(supervise()))
            note(f"{inject}({victim_name}): primary of " + ", ".join(
                f"{short(s)} (standby on {standbys[s]})" for s in victim_primaries))
            t_fault = fault.started
            fences = {}
            for shard in victim_primaries:
                sample = poller.last_before(shard, t_fault)
                assert sample is not None, f"no checkpoint of {shard} seen before the fault"
                fences[shard] = sample.fence
            await asyncio.sleep(FAULT_SECONDS - (time.monotonic() - t_fault))
            fault.heal()
            t_heal = fault.healed or time.monotonic()
            lease_lost = [line.strip()[:160] for line in victim.log_lines(r"error .*lease .* is lost")]
            note(f"healed {victim_name}" + (" (it had exited)" if not victim.running() else
                                            " (still running; its log: " + "; ".join(lease_lost) + ")"))
            restart.set()

            t_health: float | None = None
            deadline = t_heal + RECOVERY_PATIENCE
            while time.monotonic() < deadline:
                members_ready = all(c.running() for c in consumers.values()) and all(
                    await asyncio.gather(*(asyncio.to_thread(c.ready, 0.5) for c in consumers.values()))
                )
                if members_ready and monitor.healthy(set(MEMBERS)):
                    t_health = time.monotonic() - t_heal
                    break
                await asyncio.sleep(0.1)
            note(f"healthy again at +{t_health:.2f}s of the heal: {monitor.describe()}" if t_health is not None
                 else f"not healthy within {RECOVERY_PATIENCE}s of the heal: {monitor.describe()}")
            target = verified() + 4  # Progress after the heal (the report counts on the verification).
            deadline = time.monotonic() + WAIT
            while verified() < target and not runs.done() and time.monotonic() < deadline:
                await asyncio.sleep(POLL)
            note(f"{verified()} sums verified")
            for c in chunkers:
                c.stop()
            async with asyncio.timeout(WAIT + 10):
                stats = await runs
            note("chunkers done")
            poller.stop()

            # Exactly once: the committed sums, as any read-committed reader reads them.
            committed: list[Sum] = []
            stamps: list[tuple[bytes, float]] = []  # (producer, wall-clock seconds of its UUID) of every message
            for journal in sum_journals(prefix, SUM_PARTITIONS):
                async for env_ in read_committed(client, journal, 0, lambda _s: Sum(), block=False):
                    if get_flags(env_.uuid) != Flags.ACK_TXN:
                        committed.append(env_.message)
                async for env_ in read_uncommitted(client, journal, 0, lambda _s: Sum(), block=False):
                    stamps.append((get_producer_id(env_.uuid), clock_unix_ns(get_clock(env_.uuid)) / 1e9))
    except BaseException:
        print("events (seconds since the run began):", *events, sep="\n")
        for member in consumers.values():
            print(f"{member.consumer_id} warnings and errors (the last 15):", *member.log_lines()[-15:], sep="\n  ")
        raise
    finally:
        stop_tasks.set()
        for c in chunkers:
            c.stop()
        if runs is not None and not runs.done():
            runs.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, *([runs] if runs is not None else []), return_exceptions=True)
        poller.stop()
        await asyncio.to_thread(kill_all, consumers.values())
        with contextlib.suppress(Exception):
            await monitor.close()
        await etcd.close()

    # Figures.
    def since(t: float) -> float:
        return t - t_fault

    failovers: dict[str, tuple[float, str] | None] = {}
    progress_at: dict[str, float | None] = {}
    last_commit: float | None = None
    victim_producers: set[bytes] = set()
    for shard in victim_primaries:
        moved = [(since(t), p) for t, s, p in monitor.primary_changes
                 if s == shard and t >= t_fault and p is not None and p != victim_name]
        failovers[shard] = moved[0] if moved else None
        own = [s for s in poller.samples[shard] if s.fence == fences[shard]]
        for s in own:
            victim_producers |= s.producers
        after = [s.at for s in own if s.at > t_fault]
        if after:
            last_commit = max(last_commit or 0.0, since(after[-1]))
        base = max((s.read_through for s in own), default=0)
        newer = [s for s in poller.samples[shard]
                 if s.at > t_fault and s.fence > fences[shard] and s.read_through > base]
        progress_at[shard] = since(newer[0].at) if newer else None
    wall_fault = t_fault + wall_offset
    victim_stamps = [w - wall_fault for p, w in stamps if p in victim_producers]
    last_stamp = max(victim_stamps) if victim_stamps else None
    metrics_change = None
    changes = [(i, t) for i, (t, v) in enumerate(poller.metrics) if t > t_fault and v is not None and i > 0
               and poller.metrics[i - 1][1] is not None]
    if changes:
        i, t = changes[-1]
        metrics_change = (since(poller.metrics[i - 1][0]), since(t))
    # The longest stretch of the fault without a newly verified sum.
    points = [t for t, _n in verified_at if t_fault <= t <= t_heal]
    edges = [t_fault, *points, t_heal]
    gap = max((b - a, a - t_fault) for a, b in itertools.pairwise(edges))
    open_rows = 0
    for shard in shards:
        conn = sqlite3.connect(sqlite_path(sqlite_dir, shard), timeout=30.0)
        try:
            open_rows += int(conn.execute("SELECT COUNT(*) FROM stream_sums").fetchone()[0])
        finally:
            conn.close()
    return Result(
        kind=inject, victim=victim, fault=fault, t_heal=t_heal, victim_primaries=victim_primaries,
        victim_fences=fences, standbys=standbys, failovers=failovers, progress=progress_at,
        victim_last_commit=last_commit,
        victim_last_stamp=last_stamp, victim_metrics_change=metrics_change, exits=exits, lease_lost=lease_lost,
        longest_gap=gap,
        t_health=t_health, stats=list(stats), committed=len(committed), distinct=len({s.ID for s in committed}),
        bad_seqno=sum(1 for s in committed if s.SeqNo != CHUNKS + 1), open_rows=open_rows, failed=monitor.failed,
        events=events,
    )


async def until(check: Any, what: str, last: Any, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}; last: {last()}")
        await asyncio.sleep(0.05)


def fmt(t: float | None) -> str:
    return "never" if t is None else f"+{t:.2f}s"


def judge(title: str, r: Result, *, stop_output: bool) -> None:
    """Check the common figures, print the report; fail with it and every complaint."""
    complaints = r.complaints
    for shard, moved in r.failovers.items():
        if moved is None or moved[0] > FAILOVER:
            complaints.append(f"{short(shard)}: another member reported PRIMARY at {fmt(moved and moved[0])} "
                              f"(by {FAILOVER:.0f}s)")
        elif moved[1] != r.standbys[shard]:
            complaints.append(f"{short(shard)}: {moved[1]} became PRIMARY, not its standby {r.standbys[shard]}")
    if r.t_health is None or r.t_health > RECOVERY:
        complaints.append(f"fully healthy again at {fmt(r.t_health)} of the heal (by {RECOVERY:.0f}s)")
    if stop_output:
        if r.victim_last_commit is not None and r.victim_last_commit > STOP_OUTPUT:
            complaints.append(f"{r.victim.consumer_id} committed a checkpoint at {fmt(r.victim_last_commit)} "
                              f"(nothing past {STOP_OUTPUT}s)")
        if r.victim_last_stamp is not None and r.victim_last_stamp > STOP_OUTPUT:
            complaints.append(f"{r.victim.consumer_id} published a message stamped {fmt(r.victim_last_stamp)} "
                              f"(nothing past {STOP_OUTPUT}s)")
        if r.victim_metrics_change is not None and r.victim_metrics_change[0] > STOP_OUTPUT:
            complaints.append(f"{r.victim.consumer_id} completed transactions between "
                              f"{fmt(r.victim_metrics_change[0])} and {fmt(r.victim_metrics_change[1])}")
    if r.failed:
        complaints.append(f"shards FAILED: {r.failed}")
    if r.verified != r.streams or r.committed != r.streams or r.distinct != r.streams or r.bad_seqno:
        complaints.append(f"exactly-once: {r.streams} streams, {r.verified} verified, {r.committed} committed sums "
                          f"({r.distinct} distinct, {r.bad_seqno} with a wrong SeqNo)")
    if sum(s.chunks for s in r.stats) != r.streams * (CHUNKS + 1):
        complaints.append(f"{sum(s.chunks for s in r.stats)} chunks published for {r.streams} streams")
    if r.open_rows:
        complaints.append(f"{r.open_rows} open stream rows left in the stores")

    v = r.victim
    lines = [
        f"== {title}: {r.kind} of {v.consumer_id} ({v.addr}) for {r.t_heal - r.fault.started:.1f}s; it was primary of "
        + ", ".join(f"{short(s)} (fence {r.victim_fences[s]})" for s in r.victim_primaries),
        *(f"  {short(s)}: " + ("no other member PRIMARY" if (m := r.failovers[s]) is None else
                             f"{m[1]} ({'its standby' if m[1] == r.standbys[s] else 'not its standby'}) PRIMARY at "
                             f"{fmt(m[0])}")
          + f", first progress (a commit past the victim's offsets) at {fmt(r.progress[s])} of the fault"
          for s in r.victim_primaries),
        f"  {v.consumer_id}: last checkpoint commit under its fence at {fmt(r.victim_last_commit)}, newest message "
        f"its publishers stamped at {fmt(r.victim_last_stamp)}, its transaction metrics last changed "
        + ("never after the fault" if r.victim_metrics_change is None
           else f"between {fmt(r.victim_metrics_change[0])} and {fmt(r.victim_metrics_change[1])}")
        + "; exited at " + (", ".join(f"{fmt(t)} (status {rc})" for t, rc, _ in r.exits) or "no time")
        + (f" (at the heal it was still running, though its log said: {'; '.join(r.lease_lost)})"
           if r.exits and r.exits[0][0] > r.t_heal - r.fault.started else ""),
        f"  longest stretch without a verified sum: {r.longest_gap[0]:.2f}s from {fmt(r.longest_gap[1])}",
        f"  full health (every member ready and announced, every shard PRIMARY + STANDBY) at {fmt(r.t_health)} "
        "of the heal",
        f"  verification: {r.streams} streams, {r.verified} verified by the chunkers, {r.committed} committed sums "
        f"({r.distinct} distinct, {r.bad_seqno} wrong SeqNo), {r.open_rows} open rows, "
        f"{len(r.failed)} FAILED shards: " + ("PASS" if not complaints else "FAIL"),
    ]
    text = "\n".join(lines)
    print("\n" + text + "\n" + "\n".join(["events (seconds since the run began):", *r.events]))
    if complaints:
        detail = []
        for line in (r.exits or []):
            detail.append(f"  exit of {v.consumer_id}: {line}")
        detail.append(f"{v.consumer_id} warnings and errors (the last 20):")
        detail += [f"  {line[:300]}" for line in v.log_lines()[-20:]]
        pytest.fail("; ".join(complaints) + "\n" + text + "\n" + "\n".join(detail), pytrace=False)


async def test_isolated_primary_member_fails_over_to_its_standby(lab: NetworkLab) -> None:
    """Isolated (its bridge port down) for 12 s, the member primary of the most shards loses its lease and
    exits; each of its shards' standbys reports PRIMARY within the lease + 2 s and commits on; healed and
    restarted it rejoins, and every stream's sum is verified and committed exactly once."""
    r = await fault_run(lab, "isolate")
    judge("isolated primary member", r, stop_output=True)


async def test_member_cut_from_etcd_stops_consuming(lab: NetworkLab) -> None:
    """Cut from etcd alone for 12 s (the broker and its store stay reachable), the member primary of the most
    shards neither commits nor publishes past its lease (+0.5 s) and exits; its shards' standbys report
    PRIMARY within the lease + 2 s; healed and restarted it rejoins, and exactly-once holds."""
    r = await fault_run(lab, "cut_etcd")
    judge("primary member cut from etcd", r, stop_output=True)
