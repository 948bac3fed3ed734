"""Network faults between real brokers: three `gazette serve` brokers (zones a, b, c; --etcd.lease 5), each
a host in a Linux network namespace of its own, etcd apart in the root namespace (tests/support/netfaults.py).

A journal's primary is isolated, cut from etcd, cut from its peers, isolated in the middle of an append
streaming to it, or has 200 ms added to its egress, while writers append (gRPC Appends, 3 s each at most)
through brokers; then the fault heals, the test restarts (as a supervisor would: same ID, state dir and
address) a broker that exited, and every journal must take an append through every broker. Last, every
journal is read through every broker: each acknowledged append is there exactly once at its acknowledged
offsets, and the brokers agree byte for byte.

All along, tailing readers (one per journal and broker, blocking reads from offset 0; HTTP GETs, and for
the victim's journal gRPC Reads too) record every chunk they are given: none may hold bytes that the
journal does not end up holding at those offsets (a dirty read: content served before it was committed,
and later rolled back).

The measured figures (the longest stretch without an acknowledged append of each journal, the time to
recover, the counts of appends, the bytes the readers were given and checked) are printed (`pytest -s`)
and named in failure messages.
"""

from __future__ import annotations

import ast
import asyncio
import itertools
import os
import signal
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.client import (
    Appender,
    AppendOutcomeUnknown,
    ClientError,
    JournalClient,
    OffsetJump,
    RetryReader,
    StatusError,
    TransportError,
    append,
)
from tests.broker.test_cluster_chaos import BrokerRead, Ledger, Verdict, read_back, record
from tests.support.harness import apply_specs, journal_spec
from tests.support.netfaults import DelayFault, Fault, NetBroker, NetworkLab, connect_seconds, netfaults_unavailable

UNAVAILABLE = netfaults_unavailable()
pytestmark = [
    pytest.mark.netfaults,
    pytest.mark.skipif(UNAVAILABLE is not None, reason=UNAVAILABLE or ""),
    pytest.mark.timeout(150),
]

ZONES = ("a", "b", "c")
LEASE = 5.0
"""--etcd.lease of every broker."""
FAULT_SECONDS = 15.0
APPEND_TIMEOUT = 3.0
"""A client gives up on an append after this long (its outcome is then unknown)."""
FAILOVER = LEASE + 2.0
"""The longest a journal may go without an acknowledged append once a fault starts."""
STOP_ACKING = LEASE + 0.5
"""How long after being cut from etcd a broker may still acknowledge appends."""
RECOVERY = 10.0
"""How long after the heal every journal must take an append through every broker."""
RECOVERY_PATIENCE = 25.0
"""How long the recovery probes go on (to measure, past RECOVERY, when recovery did happen)."""
READ_BACK = 20.0
SHORT_FAULT_SECONDS = 10.0
"""How long the faults of the newer tests last (mid-append isolation)."""
TAIL_STALL = 3.0
"""A tailing read given nothing for this long is made again on a fresh client (its connection may be to an
isolated broker, dead without a word)."""
SLOW_CHUNKS = 16
SLOW_CHUNK = 64 * 1024
SLOW_PAUSE = 0.1
"""The slow append: SLOW_CHUNKS content messages of SLOW_CHUNK bytes, SLOW_PAUSE apart (640 KiB/s, well above
the brokers' --broker.min-append-rate of 64 KiB/s), one record of 1 MiB."""
SLOW_TIMEOUT = 12.0
"""A slow append not done in this long is cancelled (rolled back: its commit was not asked for)."""
PRE_FAULT = 3.0
"""How long the writers write before the fault (the allocator settles the new journals' assignments meanwhile)."""
PRE_FAULT_QUIET = 1.5
"""A journal without an acknowledged append in this long before the fault fails the test (a broker fault: no
network fault has been made yet)."""
LATENCY = 0.2
"""Added to the primary's egress in the latency test."""
LATENCY_GAP = 2.0
"""The longest a journal may go without an acknowledged append while its primary's egress is delayed."""


@contextmanager
def broker_lab(tmp: Path) -> Iterator[NetworkLab]:
    """Etcd and three ready brokers, broker-a, broker-b and broker-c, each on a host of its own."""
    with NetworkLab(tmp) as lab:
        lab.start_etcd()
        brokers = [lab.add_broker(f"broker-{zone}", zone=zone, lease=LEASE) for zone in ZONES]
        for broker in brokers:
            broker.wait_ready(40.0)
        yield lab


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[NetworkLab]:
    with broker_lab(tmp_path) as lab:
        yield lab


def create_journals(lab: NetworkLab, with_r3: bool) -> dict[str, int]:
    """Three journals at replication 2 (and, `with_r3`, one at 3), with a `file:///` store, routed; their
    replication by name."""
    base = f"netfaults/{uuid.uuid4().hex[:8]}"
    want = {f"{base}/r2-{i}": 2 for i in range(3)} | ({f"{base}/r3-0": 3} if with_r3 else {})
    specs = []
    for name, replication in want.items():
        spec = journal_spec(name, replication=replication)
        spec.fragment.length = 64 * 1024
        spec.fragment.stores.append("file:///")
        spec.fragment.refresh_interval.seconds = 1
        specs.append(spec)
    channel, stub = lab.brokers[0].stub()
    try:
        apply_specs(stub, *specs)
    finally:
        channel.close()
    lab.wait_routed(list(want), want, 30.0)
    return want


@dataclass
class Ack:
    at: float
    journal: str
    via: str
    """The broker the append was sent to."""
    committer: str
    """The broker whose reply header says it committed the append (the primary)."""


@dataclass
class Tail:
    """What one tailing reader of a journal, through one broker, was given."""

    journal: str
    broker: str
    transport: str
    """`http` (the gateway's GETs) or `grpc` (Read RPCs)."""
    chunks: list[tuple[int, bytes]] = field(default_factory=list)
    """Every chunk it was given, at its offset."""
    jumps: list[tuple[int, int]] = field(default_factory=list)
    stalls: int = 0
    """Reads made again after TAIL_STALL without content."""
    errors: list[str] = field(default_factory=list)

    @property
    def given(self) -> int:
        return sum(len(data) for _, data in self.chunks)


@dataclass
class SlowAppend:
    """One Append RPC streaming a record of SLOW_CHUNKS chunks, SLOW_PAUSE apart, and how it ended."""

    name: str
    journal: str
    via: str
    rec: bytes
    sent: int = 0
    """Content chunks handed to the RPC."""
    outcome: str = "not started"
    committed: tuple[int, int] | None = None
    definite: bool = False
    """Whether it failed, certainly not having committed (its commit was never asked for)."""
    began: float = 0.0
    ended: float = 0.0

    @property
    def head(self) -> bytes:
        return self.rec.split(b" ", 2)[0] + b" " + self.rec.split(b" ", 2)[1] + b" "


@dataclass
class Run:
    """What the writers and the probes saw, and what happened when (seconds since `t0`)."""

    lab: NetworkLab
    replication: dict[str, int]
    ledger: Ledger = field(default_factory=Ledger)
    acks: list[Ack] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)
    restart_exited: bool = False
    """Whether the supervisor restarts an exited broker (after the heal), else it only notes the exit."""
    exits: dict[str, list[float]] = field(default_factory=dict)
    tails: list[Tail] = field(default_factory=list)
    background: list[asyncio.Task[None]] = field(default_factory=list)
    """Tasks a fault started (slow appends): awaited before the read back."""

    @property
    def journals(self) -> list[str]:
        return list(self.replication)

    def unbounded(self, journal: str) -> bool:
        """Whether the journal needs every broker (replication 3 of 3): it takes no append while one is out,
        by design (INSUFFICIENT_JOURNAL_BROKERS), so its outage has no bound."""
        return self.replication[journal] >= len(self.lab.brokers)

    def rel(self, t: float) -> float:
        return t - self.t0

    def note(self, text: str) -> None:
        line = f"  {self.rel(time.monotonic()):7.2f}s {text}"
        self.events.append(line)

    async def append_once(
        self, client: JournalClient, journal: str, broker: NetBroker, name: str, seq: int, timeout: float
    ) -> bool:
        rec = record(name, seq, 120)
        try:
            async with asyncio.timeout(timeout):
                resp = await append(client, journal, rec)
        except TimeoutError:
            self.ledger.fail(name, journal, rec, f"{broker.broker_id}: no reply in {timeout:.1f}s", definite=False)
            return False
        except ClientError as exc:
            definite = isinstance(exc, StatusError) or (
                isinstance(exc, TransportError) and not isinstance(exc, AppendOutcomeUnknown)
            )
            self.ledger.fail(name, journal, rec, f"{broker.broker_id}: {type(exc).__name__}: {exc}", definite)
            return False
        except Exception as exc:  # Anything else the client lets through is a failure of unknown outcome.
            self.ledger.fail(name, journal, rec, f"{broker.broker_id}: {type(exc).__name__}: {exc}", False)
            return False
        committer = resp.header.process_id.suffix
        self.ledger.ack(name, journal, resp.commit.begin, resp.commit.end, rec,
                        via=f"{broker.broker_id} (committed by {committer})")
        self.acks.append(Ack(time.monotonic(), journal, broker.broker_id, committer))
        return True

    async def writer(self, journal: str, broker: NetBroker, stop: asyncio.Event) -> None:
        """Appends to `journal` through `broker` (which proxies them to the primary), one at a time, until `stop`."""
        name = f"w-{broker.broker_id}-{journal.rsplit('/', 1)[1]}"
        async with JournalClient(broker.url, route_cache=False, http_appends=False) as client:
            seq = 0
            while not stop.is_set():
                ok = await self.append_once(client, journal, broker, name, seq, APPEND_TIMEOUT)
                seq += 1
                await asyncio.sleep(0.1 if ok else 0.25)

    async def tail(self, tail: Tail, broker: NetBroker) -> None:
        """Read `tail.journal` through `broker` from offset 0, blocking, until cancelled, recording every chunk
        given. A read given nothing for TAIL_STALL is made again, on a fresh client, from where it was."""
        offset = 0
        while True:
            async with JournalClient(broker.url, route_cache=False, http_reads=tail.transport == "http") as client:
                reader = RetryReader(client, tail.journal, offset=offset, block=True, max_backoff=1.0)
                try:
                    while True:
                        at = reader.offset
                        try:
                            async with asyncio.timeout(TAIL_STALL):
                                data = await reader.read()
                        except OffsetJump as jump:
                            tail.jumps.append((at, jump.to))
                            offset = reader.offset
                            continue
                        if data:
                            tail.chunks.append((at, data))
                        offset = reader.offset
                except TimeoutError:
                    tail.stalls += 1
                except ClientError as exc:
                    tail.errors.append(f"{type(exc).__name__}: {exc}")
                    await asyncio.sleep(0.5)
                finally:
                    await reader.close()

    async def slow_append(self, slow: SlowAppend, broker: NetBroker, half: asyncio.Event | None = None) -> None:
        """Stream `slow.rec` to `slow.journal` through `broker` in SLOW_CHUNKS gRPC Append content messages,
        SLOW_PAUSE apart (setting `half` once half of them went), then commit; note its outcome in the ledger."""
        slow.began = time.monotonic()
        async with JournalClient(broker.url, route_cache=False, http_appends=False) as client:
            app = Appender(client, slow.journal)
            try:
                async with asyncio.timeout(SLOW_TIMEOUT):
                    for i in range(SLOW_CHUNKS):
                        await app.write(slow.rec[i * SLOW_CHUNK : (i + 1) * SLOW_CHUNK])
                        slow.sent = i + 1
                        if half is not None and slow.sent == SLOW_CHUNKS // 2:
                            half.set()
                        await asyncio.sleep(SLOW_PAUSE)
                    resp = await app.commit()
            except TimeoutError:
                slow.outcome = f"no reply in {SLOW_TIMEOUT:.0f}s (cancelled)"
            except ClientError as exc:
                slow.outcome = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
            else:
                slow.committed = (resp.commit.begin, resp.commit.end)
                slow.outcome = f"committed [{resp.commit.begin}, {resp.commit.end}) by {resp.header.process_id.suffix}"
            finally:
                slow.ended = time.monotonic()
                if half is not None:
                    half.set()
        if slow.committed is not None:
            self.ledger.ack(slow.name, slow.journal, *slow.committed, slow.rec, via=f"{slow.via} (slow append)")
        else:
            # Cancelled or failed before its commit was asked for, it certainly did not commit.
            slow.definite = not app.commit_requested
            self.ledger.fail(slow.name, slow.journal, slow.rec, f"{slow.via}: {slow.outcome}", slow.definite)

    async def supervise(self, stop: asyncio.Event) -> None:
        """Note every broker's exit; with `restart_exited`, start it again as itself."""
        while not stop.is_set():
            for broker in self.lab.brokers:
                if broker.proc is not None and not broker.running():
                    rc = broker.returncode
                    self.exits.setdefault(broker.broker_id, []).append(time.monotonic())
                    last = (broker.log_lines(r"\berror\b") or ["(no error logged)"])[-1]
                    self.note(f"{broker.broker_id} exited with {rc}: {last.strip()[:160]}")
                    broker.stop()  # Reaps it.
                if broker.proc is None and self.restart_exited:
                    broker.restart()
                    self.note(f"{broker.broker_id} restarted (incarnation {broker.incarnation})")
            await asyncio.sleep(0.1)

    async def recover(self, t_heal: float) -> dict[tuple[str, str], float | None]:
        """Append to every journal through every broker until each takes one; seconds after `t_heal` each
        (journal, broker) pair first did (None: not within RECOVERY_PATIENCE)."""
        deadline = t_heal + RECOVERY_PATIENCE

        async def probe(journal: str, broker: NetBroker) -> float | None:
            name = f"probe-{broker.broker_id}-{journal.rsplit('/', 1)[1]}"
            seq = 0
            while time.monotonic() < deadline:
                if broker.running():
                    # A fresh client each try: a channel that failed while the broker was away may be backing off.
                    async with JournalClient(broker.url, route_cache=False, http_appends=False) as client:
                        left = max(0.5, min(APPEND_TIMEOUT, deadline - time.monotonic()))
                        if await self.append_once(client, journal, broker, name, seq, left):
                            return time.monotonic() - t_heal
                    seq += 1
                await asyncio.sleep(0.2)
            return None

        pairs = [(j, b) for j in self.journals for b in self.lab.brokers]
        found = await asyncio.gather(*(probe(j, b) for j, b in pairs))
        return {(j, b.broker_id): t for (j, b), t in zip(pairs, found, strict=True)}


def longest_gap(times: list[float], start: float, end: float) -> tuple[float, float]:
    """The longest stretch of [start, end] with none of `times` in it: its length and where it began."""
    points = sorted(t for t in times if start <= t <= end)
    edges = [start, *points, end]
    return max((b - a, a) for a, b in itertools.pairwise(edges))


def roles(lab: NetworkLab, journals: list[str], broker: NetBroker) -> dict[str, str]:
    """What `broker` is of each journal now: primary, replica or -."""
    out = {}
    for name, route in lab.routes(journals).items():
        members = [(m.zone, m.suffix) for m in route.members]
        if route.primary >= 0 and members[route.primary] == broker.member:
            out[name] = "primary"
        else:
            out[name] = "replica" if broker.member in members else "-"
    return out


def short(journal: str) -> str:
    return journal.rsplit("/", 1)[1]


def check_tails(tails: list[Tail], finals: dict[str, bytes]) -> tuple[int, list[str]]:
    """Every chunk the readers were given against the journals' final content: the bytes checked, and a
    description of each chunk the journal does not end up holding at its offsets (a dirty read)."""
    checked = 0
    dirty: list[str] = []
    for tail in tails:
        final = finals.get(tail.journal, b"")
        for at, data in tail.chunks:
            held = final[at : at + len(data)]
            if held == data:
                checked += len(data)
                continue
            first = next((i for i, (x, y) in enumerate(zip(data, held, strict=False)) if x != y),
                         min(len(data), len(held)))
            dirty.append(
                f"{short(tail.journal)}: the reader through {tail.broker} ({tail.transport}) was given "
                f"[{at}, {at + len(data)}), which the journal ({len(final)} bytes in the end) does not hold: they "
                f"differ from offset {at + first} (given {data[first : first + 40]!r}, held "
                f"{held[first : first + 40]!r})"
            )
    return checked, dirty


def final_contents(reads: dict[str, list[BrokerRead]]) -> dict[str, bytes]:
    """Each journal's content as read back (the longest read: the read back waits until they agree)."""
    return {journal: max((r.content for r in rs), key=len, default=b"") for journal, rs in reads.items()}


@dataclass
class Outcome:
    """A fault run, measured: what `judge` reports and checks."""

    run: Run
    victim: NetBroker
    fault: Fault
    t_heal: float
    victim_roles: dict[str, str]
    gaps: dict[str, tuple[float, float]]
    recovery: dict[tuple[str, str], float | None]
    verdict: Verdict
    finals: dict[str, bytes]
    tails_checked: int
    dirty: list[str]
    extra: list[str] = field(default_factory=list)
    complaints: list[str] = field(default_factory=list)


def report(title: str, out: Outcome) -> str:
    run, victim, fault, t_heal, verdict = out.run, out.victim, out.fault, out.t_heal, out.verdict
    t_fault = fault.started
    lines = [f"== {title}: {fault.kind} of {victim.broker_id} ({victim.addr}) for {t_heal - t_fault:.1f}s"]
    lines += [
        f"  {short(j)} ({out.victim_roles.get(j, '?')} on the victim): longest stretch without an acknowledged "
        f"append {g:.2f}s, from +{start - t_fault:.2f}s after the fault began"
        + (" (replication 3 of 3 brokers: unavailable while one is out; not bounded)"
           if run.unbounded(j) and fault.kind == "isolate" else "")
        for j, (g, start) in out.gaps.items()
    ]
    done = [t for t in out.recovery.values() if t is not None]
    missing = [f"{short(j)} via {b}" for (j, b), t in out.recovery.items() if t is None]
    slowest = max(out.recovery.items(), key=lambda kv: float("inf") if kv[1] is None else kv[1])
    lines.append(
        f"  recovery: {len(done)}/{len(out.recovery)} (journal, broker) pairs took an append after the heal; slowest "
        + (f"{slowest[1]:.2f}s ({short(slowest[0][0])} via {slowest[0][1]})" if slowest[1] is not None else "never")
        + (f"; never: {', '.join(missing)}" if missing else "")
    )
    lines += out.extra
    lines.append(f"  appends: {len(run.ledger.acked)} acknowledged, {len(run.ledger.failed)} failed")
    lines.append(
        f"  read back: {verdict.acked} acknowledged appends checked, lost {verdict.lost}, duplicated "
        f"{verdict.duplicated}, torn {verdict.torn}, unacknowledged present {verdict.unacked_present}, "
        f"{len(verdict.problems)} problems"
    )
    given = sum(t.given for t in run.tails)
    by_broker: dict[str, int] = {}
    for t in run.tails:
        by_broker[t.broker] = by_broker.get(t.broker, 0) + t.given
    lines.append(
        f"  dirty reads: {len(run.tails)} tailing readers were given {given} bytes in "
        f"{sum(len(t.chunks) for t in run.tails)} chunks ({', '.join(f'{b} {n}' for b, n in sorted(by_broker.items()))}"
        f"); {out.tails_checked} bytes checked against the final journals "
        f"({sum(len(c) for c in out.finals.values())} bytes), {len(out.dirty)} dirty chunks; reads made again after "
        f"stalling {sum(t.stalls for t in run.tails)}, offset jumps {sum(len(t.jumps) for t in run.tails)}"
    )
    return "\n".join(lines)


def details(out: Outcome) -> str:
    run = out.run
    lines = ["events (seconds since the run began):", *run.events]
    lines += ["commonest append errors:", run.ledger.error_summary()]
    lines += out.verdict.problems[:20]
    lines += out.dirty[:10]
    errors = [f"  {short(t.journal)} via {t.broker} ({t.transport}): {e[:200]}" for t in run.tails for e in t.errors]
    if errors:
        lines += [f"tailing read errors ({len(errors)}, the first 10):", *errors[:10]]
    for broker in run.lab.brokers:
        logged = broker.log_lines()
        lines.append(f"{broker.broker_id} warnings and errors ({len(logged)}, the last 15):")
        lines += [f"  {line[:300]}" for line in logged[-15:]]
    return "\n".join(lines)


async def stop_tasks(stop: asyncio.Event, tasks: list[asyncio.Task[None]], timeout: float = 15.0) -> None:
    stop.set()
    done, pending = await asyncio.wait(tasks, timeout=timeout) if tasks else (set(), set())
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        task.result()


async def cancel_tasks(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for result in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            raise result


def await_stacks(brokers: list[NetBroker], pattern: str = "broker/append.py") -> list[str]:
    """SIGUSR1 each running broker (it logs the awaits of its tasks) and return those of its tasks whose awaits
    name `pattern`."""
    for broker in brokers:
        if broker.proc is not None and broker.running():
            os.kill(broker.proc.pid, signal.SIGUSR1)
    time.sleep(1.0)
    found = []
    for broker in brokers:
        dumps = [line for line in broker.logs().splitlines() if "asyncio tasks (SIGUSR1)" in line and "stacks=" in line]
        if not dumps:
            continue
        try:
            stacks = ast.literal_eval(dumps[-1].split("stacks=", 1)[1])
        except (ValueError, SyntaxError):
            continue
        for block in str(stacks).split("\n--- "):
            if pattern in block:
                found.append(f"{broker.broker_id}: --- " + block.strip().removeprefix("--- "))
    return found


async def check_pre_fault(run: Run) -> None:
    """Fail the test, with the awaits of the brokers' append tasks, if a journal took no append in the last
    PRE_FAULT_QUIET seconds (no fault has been made yet)."""
    now = time.monotonic()
    quiet = {j: max((a.at for a in run.acks if a.journal == j), default=None) for j in run.journals}
    quiet = {j: t for j, t in quiet.items() if t is None or now - t > PRE_FAULT_QUIET}
    if not quiet:
        return
    stacks = await asyncio.to_thread(await_stacks, run.lab.brokers)
    shown = ", ".join(f"{short(j)} (" + ("none" if t is None else f"the last {now - t:.2f}s before") + ")"
                      for j, t in quiet.items())
    pytest.fail(
        f"before any fault, journals took no append in the last {PRE_FAULT_QUIET}s: {shown} (a broker fault, not a "
        f"network one); the brokers' tasks awaiting in broker/append.py:\n" + "\n".join(stacks)
        + "\ncommonest append errors:\n" + run.ledger.error_summary(), pytrace=False)


Inject = Callable[[Run, NetBroker], Awaitable[Fault]]
"""Starts a fault on the victim (given the run, to note and to start tasks of its own), returning it."""


def lab_fault(name: str) -> Inject:
    """The NetworkLab fault `name` (isolate, cut_etcd, cut_peers) of the victim."""
    async def inject(run: Run, victim: NetBroker) -> Fault:
        fault: Fault = getattr(run.lab, name)(victim)
        return fault
    return inject


async def fault_run(
    lab: NetworkLab, inject: Inject, *, through_victim: bool, with_r3: bool = False,
    fault_seconds: float = FAULT_SECONDS,
) -> Outcome:
    """Journals, writers and tailing readers, the fault on the primary of a replication-2 journal for
    `fault_seconds`, the heal, recovery probes through every broker, the read back and the readers' check."""
    want = await asyncio.to_thread(create_journals, lab, with_r3)
    journals = list(want)
    victim = await asyncio.to_thread(lab.primary_of, journals[0])
    assert victim is not None, "no primary"
    victim_roles = await asyncio.to_thread(roles, lab, journals, victim)
    run = Run(lab, want)
    writing = [b for b in lab.brokers if through_victim or b is not victim]
    stop_writers, stop_supervisor = asyncio.Event(), asyncio.Event()
    run.tails = [Tail(j, b.broker_id, "http") for j in journals for b in lab.brokers]
    run.tails += [Tail(journals[0], b.broker_id, "grpc") for b in lab.brokers]
    tails = [asyncio.create_task(run.tail(t, lab.broker(t.broker))) for t in run.tails]
    writers = [asyncio.create_task(run.writer(j, b, stop_writers)) for j in journals for b in writing]
    supervisor = asyncio.create_task(run.supervise(stop_supervisor))
    try:
        await asyncio.sleep(PRE_FAULT)
        await check_pre_fault(run)
        fault = await inject(run, victim)
        run.note(f"{fault.kind}({victim.broker_id}): {', '.join(f'{short(j)} {r}' for j, r in victim_roles.items())}")
        await asyncio.sleep(max(0.0, fault.started + fault_seconds - time.monotonic()))
        fault.heal()
        t_heal = fault.healed or time.monotonic()
        run.note(f"healed {victim.broker_id}")
        run.restart_exited = True
        await stop_tasks(stop_writers, writers)
        writing_ids = {b.broker_id for b in writing}
        gaps = {
            j: longest_gap([a.at for a in run.acks if a.journal == j and a.via in writing_ids], fault.started, t_heal)
            for j in journals
        }
        recovery = await run.recover(t_heal)
        run.note("recovery probes done")
        await stop_tasks(asyncio.Event(), run.background, SLOW_TIMEOUT + 5.0)
        await cancel_tasks(tails)
        run.note("tailing readers stopped")
        verdict, reads = await read_back([b.url for b in lab.brokers], journals, run.ledger, READ_BACK, run.t0)
        run.note("read back done")
    finally:
        await stop_tasks(stop_writers, writers)
        await stop_tasks(asyncio.Event(), run.background, SLOW_TIMEOUT + 5.0)
        await cancel_tasks(tails)
        await stop_tasks(stop_supervisor, [supervisor])
    finals = final_contents(reads)
    checked, dirty = check_tails(run.tails, finals)
    return Outcome(run, victim, fault, t_heal, victim_roles, gaps, recovery, verdict, finals, checked, dirty)


def judge(title: str, out: Outcome, *, bound_gaps: bool = True) -> None:
    """Print the report; fail with it and every complaint, adding the common ones (with `bound_gaps`, a
    journal that went longer than FAILOVER without an acknowledged append)."""
    run, complaints = out.run, out.complaints
    for journal, (gap, start) in out.gaps.items():
        if bound_gaps and gap > FAILOVER and not run.unbounded(journal):
            complaints.append(
                f"{short(journal)} ({out.victim_roles.get(journal)} on the victim) went {gap:.2f}s without an "
                f"acknowledged append (from +{start - out.fault.started:.2f}s after the fault began; at most "
                f"{FAILOVER:.0f}s allowed)"
            )
    late = {k: t for k, t in out.recovery.items() if t is None or t > RECOVERY}
    if late:
        shown = ", ".join(f"{short(j)} via {b}: {'never' if t is None else f'{t:.2f}s'}" for (j, b), t in late.items())
        complaints.append(f"{len(late)} (journal, broker) pairs took no append within {RECOVERY:.0f}s of the heal: "
                          + shown)
    verdict = out.verdict
    if verdict.problems:
        complaints.append(
            f"reading back: {verdict.lost} acknowledged appends lost, {verdict.duplicated} duplicated, "
            f"{verdict.torn} torn, {len(verdict.problems)} problems"
        )
    if verdict.acked != len(run.ledger.acked):
        complaints.append(f"read back checked {verdict.acked} of {len(run.ledger.acked)} acknowledged appends")
    if out.dirty:
        complaints.append(f"dirty reads: {len(out.dirty)} chunks given to tailing readers are not in the final "
                          f"journals at their offsets: " + "; ".join(out.dirty[:3]))
    if not out.tails_checked:
        complaints.append("the tailing readers were given nothing")
    text = report(title, out)
    print("\n" + text)
    if complaints:
        pytest.fail("; ".join(complaints) + "\n" + text + "\n" + details(out), pytrace=False)


def victim_exits(out: Outcome) -> str:
    exits = [t - out.fault.started for t in out.run.exits.get(out.victim.broker_id, []) if t <= out.t_heal]
    return ", ".join(f"+{t:.2f}s" for t in exits) or "no time"


def check_failovers(out: Outcome) -> str:
    """Complain of each journal the victim was primary of that another broker took no append to within
    FAILOVER of the fault; the report's line of the failovers."""
    found = failovers(out)
    for journal, failover in found.items():
        if failover is None or failover > FAILOVER:
            shown = "never" if failover is None else f"+{failover:.2f}s"
            out.complaints.append(f"{short(journal)} failed over from {out.victim.broker_id} at {shown} "
                                  f"(by {FAILOVER:.0f}s)")
    return "  failover (first append committed by another broker): " + ", ".join(
        f"{short(j)} {'never' if t is None else f'+{t:.2f}s'}" for j, t in found.items())


def failovers(out: Outcome) -> dict[str, float | None]:
    """For each journal the victim was primary of: seconds after the fault began that another broker first
    committed an append to it (None: not before the heal)."""
    t_fault = out.fault.started
    found: dict[str, float | None] = {}
    for journal, role in out.victim_roles.items():
        if role == "primary":
            after = [a.at - t_fault for a in out.run.acks if a.journal == journal
                     and a.committer != out.victim.broker_id and t_fault <= a.at <= out.t_heal]
            found[journal] = min(after, default=None)
    return found


async def test_isolated_primary_fails_over_within_lease(lab: NetworkLab) -> None:
    """Isolated (its bridge port down), a primary loses its lease and exits; its journals fail over to the
    healthy brokers within the lease (+2 s), and once healed and restarted it serves again within 10 s."""
    out = await fault_run(lab, lab_fault("isolate"), through_victim=False, with_r3=True)
    out.extra.append(f"  {out.victim.broker_id} exited at {victim_exits(out)} of the isolation")
    judge("isolated primary", out)


async def test_primary_cut_from_etcd_stops_acknowledging(lab: NetworkLab) -> None:
    """Cut from etcd alone, a primary acknowledges no append past its lease (+0.5 s), and its journals fail
    over to another broker within the lease (+2 s); healed and restarted it serves again within 10 s."""
    out = await fault_run(lab, lab_fault("cut_etcd"), through_victim=True)
    run, victim, t_cut, t_heal = out.run, out.victim, out.fault.started, out.t_heal
    by_victim = [a for a in run.acks if victim.broker_id in (a.via, a.committer) and t_cut <= a.at <= t_heal]
    last = max((a.at - t_cut for a in by_victim), default=None)
    late = [a for a in by_victim if a.at - t_cut > STOP_ACKING]
    if late:
        out.complaints.append(
            f"{victim.broker_id}, cut from etcd, acknowledged {len(late)} appends more than {STOP_ACKING}s after "
            f"the cut (the last at +{last:.2f}s)"
        )
    failed_over = check_failovers(out)
    out.extra += [
        f"  {victim.broker_id}: last append it acknowledged (through it or committed by it) at "
        + ("none" if last is None else f"+{last:.2f}s") + f" of the cut; exited at {victim_exits(out)}",
        failed_over,
    ]
    judge("primary cut from etcd", out)


async def test_primary_cut_from_peers(lab: NetworkLab) -> None:
    """Cut from its peers alone (etcd and clients still reach it), a primary keeps its lease, so its
    assignments: as in Gazette, whose allocator acts on etcd membership alone, the journals it shares with
    the cut broker take no appends until the heal (reported, not bounded), and nothing acknowledged is
    lost. Healed, every journal takes appends through every broker within 10 s."""
    out = await fault_run(lab, lab_fault("cut_peers"), through_victim=True)
    late_start = out.fault.started + FAILOVER
    committers = {
        short(j): sorted({a.committer for a in out.run.acks if a.journal == j and late_start < a.at <= out.t_heal})
        for j in out.run.journals
    }
    out.extra += [
        f"  {out.victim.broker_id} exited at {victim_exits(out)} of the cut",
        f"  committed by, late in the cut: {committers}",
    ]
    judge("primary cut from peers", out, bound_gaps=False)


def slow_presence(slow: SlowAppend, final: bytes) -> tuple[str, bool]:
    """Where `slow`'s record is in the journal's final content, and whether that is whole or absent
    (the record's head once, followed by all of it; or no trace of it)."""
    places = []
    start = final.find(slow.head)
    while start >= 0:
        places.append(start)
        start = final.find(slow.head, start + 1)
    if not places:
        return "absent", True
    whole = [p for p in places if final[p : p + len(slow.rec)] == slow.rec]
    shown = ", ".join(f"[{p}, {p + len(slow.rec)})" + ("" if p in whole else " TORN") for p in places)
    return f"at {shown}", len(places) == 1 and len(whole) == 1


async def test_primary_isolated_mid_append(lab: NetworkLab) -> None:
    """A primary is isolated while appends stream to it: one straight from a client, SLOW_CHUNKS // 2 of its
    chunks sent; one proxied by another broker, queued behind it. Each is in the final journal wholly or not
    at all (and so if its commit was never asked for), its journal fails over within the lease (+2 s), no
    reader is given its uncommitted bytes, nothing acknowledged is lost, and once healed every journal takes
    appends through every broker within 10 s."""
    slows: list[SlowAppend] = []

    async def inject(run: Run, victim: NetBroker) -> Fault:
        journal = run.journals[0]
        proxy = next(b for b in run.lab.brokers if b is not victim)
        size = SLOW_CHUNKS * SLOW_CHUNK
        direct = SlowAppend(f"slow-direct-{victim.broker_id}", journal, victim.broker_id,
                            record(f"slow-direct-{victim.broker_id}", 0, size))
        proxied = SlowAppend(f"slow-proxied-{proxy.broker_id}", journal, proxy.broker_id,
                             record(f"slow-proxied-{proxy.broker_id}", 0, size))
        slows.extend([direct, proxied])
        half = asyncio.Event()
        run.background.append(asyncio.create_task(run.slow_append(direct, victim, half)))
        await asyncio.sleep(0.05)
        run.background.append(asyncio.create_task(run.slow_append(proxied, proxy)))
        async with asyncio.timeout(10.0):
            await half.wait()
        fault = run.lab.isolate(victim)
        run.note(f"{direct.name}: {direct.sent} of {SLOW_CHUNKS} chunks sent in {time.monotonic() - direct.began:.2f}s;"
                 f" {proxied.name}: {proxied.sent}")
        return fault

    out = await fault_run(lab, inject, through_victim=False, with_r3=True, fault_seconds=SHORT_FAULT_SECONDS)
    failed_over = check_failovers(out)
    for slow in slows:
        where, ok = slow_presence(slow, out.finals.get(slow.journal, b""))
        out.extra.append(
            f"  {slow.name} ({len(slow.rec)} bytes to {short(slow.journal)} via {slow.via}): {slow.sent}/{SLOW_CHUNKS}"
            f" chunks sent; {slow.outcome} at +{slow.ended - out.fault.started:.2f}s of the isolation; in the "
            f"journal: {where}"
        )
        if not ok:
            out.complaints.append(f"{slow.name} is not wholly present or wholly absent: {where}")
    out.extra += [
        f"  {out.victim.broker_id} exited at {victim_exits(out)} of the isolation",
        failed_over,
    ]
    judge("primary isolated mid-append", out)


async def test_primary_egress_latency(lab: NetworkLab) -> None:
    """With LATENCY added to everything a primary sends (its delay wire: no netem in this kernel) for
    FAULT_SECONDS, while writers append through every broker: no journal goes LATENCY_GAP without an
    acknowledged append, nothing acknowledged is lost, no reader is given bytes the journal does not keep,
    and once healed every journal takes appends through every broker within 10 s."""
    rtts: dict[str, list[float]] = {}

    async def probe(label: str, victim: NetBroker, n: int = 3) -> None:
        rtts[label] = [await asyncio.to_thread(connect_seconds, victim.addr, victim.port) for _ in range(n)]

    async def inject(run: Run, victim: NetBroker) -> Fault:
        await probe("before", victim)
        fault = run.lab.delay(victim, LATENCY)
        await probe("during", victim)
        return fault

    out = await fault_run(lab, inject, through_victim=True, with_r3=True)
    await probe("after", out.victim)
    assert isinstance(out.fault, DelayFault)
    stats = out.fault.wire.stats()
    during = statistics.median(rtts["during"])
    if during < 0.9 * LATENCY:
        out.complaints.append(f"the delay wire did not delay: connect times {rtts['during']}")
    if statistics.median(rtts["after"]) > 0.05:
        out.complaints.append(f"the link of {out.victim.broker_id} is slow after the heal: connect times "
                              f"{rtts['after']}")
    for journal, (gap, start) in out.gaps.items():
        if gap > LATENCY_GAP:
            out.complaints.append(
                f"{short(journal)} ({out.victim_roles.get(journal)} on the victim) went {gap:.2f}s without an "
                f"acknowledged append (from +{start - out.fault.started:.2f}s after the latency began; at most "
                f"{LATENCY_GAP:.0f}s allowed)"
            )
    by_journal = {
        short(j): [a.at for a in out.run.acks if a.journal == j and out.fault.started <= a.at <= out.t_heal]
        for j in out.run.journals
    }
    out.extra += [
        "  connect times to the victim (ms): " + "; ".join(
            f"{label} {', '.join(f'{t * 1000:.0f}' for t in ts)}" for label, ts in rtts.items()),
        f"  delay wire: {stats['egress']:.0f} frames out, {stats['ingress']:.0f} in, {stats['dropped']:.0f} dropped, "
        f"released at most {stats['late_max'] * 1000:.1f} ms late",
        "  acknowledged appends during the latency: "
        + ", ".join(f"{j} {len(ts)}" for j, ts in by_journal.items()),
        f"  {out.victim.broker_id} exited at {victim_exits(out)} of the latency",
    ]
    judge("primary egress latency", out, bound_gaps=False)


def test_longest_gap() -> None:
    assert longest_gap([], 10.0, 20.0) == (10.0, 10.0)
    assert longest_gap([11.0, 12.0, 18.0], 10.0, 20.0) == (6.0, 12.0)
    assert longest_gap([5.0, 25.0], 10.0, 20.0) == (10.0, 10.0)


def test_check_tails() -> None:
    final = b"0123456789"
    tails = [Tail("x/j", "b", "http", chunks=[(0, b"0123"), (4, b"456789")]),
             Tail("x/j", "c", "grpc", chunks=[(2, b"23"), (8, b"89A")])]
    checked, dirty = check_tails(tails, {"x/j": final})
    assert checked == 12 and len(dirty) == 1 and "[8, 11)" in dirty[0] and "offset 10" in dirty[0]
    slow = SlowAppend("s", "x/j", "b", record("s", 0, 100))
    assert slow_presence(slow, b"abc") == ("absent", True)
    assert slow_presence(slow, b"ab" + slow.rec)[1]
    assert not slow_presence(slow, slow.rec[:50] + b"\n")[1]
    assert not slow_presence(slow, slow.rec + slow.rec)[1]
