"""Network faults between real brokers: three `gazette serve` brokers (zones a, b, c; --etcd.lease 5), each
a host in a Linux network namespace of its own, etcd apart in the root namespace (tests/netfaults.py).

A journal's primary is isolated, cut from etcd, or cut from its peers for 15 s while writers append (gRPC
Appends, 3 s each at most) through brokers; then the fault heals, the test restarts (as a supervisor
would: same ID, state dir and address) a broker that exited, and every journal must take an append
through every broker. Last, every journal is read through every broker: each acknowledged append is
there exactly once at its acknowledged offsets, and the brokers agree byte for byte.

The measured figures (the longest stretch without an acknowledged append of each journal, the time to
recover, the counts of appends) are printed (`pytest -s`) and named in failure messages.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.client import AppendOutcomeUnknown, ClientError, JournalClient, StatusError, TransportError, append
from tests.broker.test_cluster_chaos import Ledger, Verdict, read_back, record
from tests.harness import apply_specs, journal_spec
from tests.netfaults import Fault, NetBroker, NetworkLab, netfaults_unavailable

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


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[NetworkLab]:
    """Etcd and three ready brokers, broker-a, broker-b and broker-c, each on a host of its own."""
    with NetworkLab(tmp_path) as lab:
        lab.start_etcd()
        brokers = [lab.add_broker(f"broker-{zone}", zone=zone, lease=LEASE) for zone in ZONES]
        for broker in brokers:
            broker.wait_ready(40.0)
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


def report(
    title: str, run: Run, victim: NetBroker, fault: Fault, t_heal: float, gaps: dict[str, tuple[float, float]],
    victim_roles: dict[str, str], recovery: dict[tuple[str, str], float | None], verdict: Verdict | None,
    extra: list[str],
) -> str:
    t_fault = fault.started
    lines = [f"== {title}: {fault.kind} of {victim.broker_id} ({victim.addr}) for {t_heal - t_fault:.1f}s"]
    lines += [
        f"  {short(j)} ({victim_roles.get(j, '?')} on the victim): longest stretch without an acknowledged append "
        f"{g:.2f}s, from +{start - t_fault:.2f}s after the fault began"
        + (" (replication 3 of 3 brokers: unavailable while one is out; not bounded)" if run.unbounded(j) else "")
        for j, (g, start) in gaps.items()
    ]
    done = [t for t in recovery.values() if t is not None]
    missing = [f"{short(j)} via {b}" for (j, b), t in recovery.items() if t is None]
    slowest = max(recovery.items(), key=lambda kv: float("inf") if kv[1] is None else kv[1])
    lines.append(
        f"  recovery: {len(done)}/{len(recovery)} (journal, broker) pairs took an append after the heal; slowest "
        + (f"{slowest[1]:.2f}s ({short(slowest[0][0])} via {slowest[0][1]})" if slowest[1] is not None else "never")
        + (f"; never: {', '.join(missing)}" if missing else "")
    )
    lines += extra
    lines.append(f"  appends: {len(run.ledger.acked)} acknowledged, {len(run.ledger.failed)} failed")
    if verdict is not None:
        lines.append(
            f"  read back: {verdict.acked} acknowledged appends checked, lost {verdict.lost}, duplicated "
            f"{verdict.duplicated}, torn {verdict.torn}, unacknowledged present {verdict.unacked_present}, "
            f"{len(verdict.problems)} problems"
        )
    return "\n".join(lines)


def details(run: Run, verdict: Verdict | None) -> str:
    lines = ["events (seconds since the run began):", *run.events]
    lines += ["commonest append errors:", run.ledger.error_summary()]
    if verdict is not None:
        lines += verdict.problems[:20]
    for broker in run.lab.brokers:
        logged = broker.log_lines()
        lines.append(f"{broker.broker_id} warnings and errors ({len(logged)}, the last 15):")
        lines += [f"  {line[:300]}" for line in logged[-15:]]
    return "\n".join(lines)


async def stop_tasks(stop: asyncio.Event, tasks: list[asyncio.Task[None]], timeout: float = 15.0) -> None:
    stop.set()
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        task.result()


async def fault_run(
    lab: NetworkLab, inject: str, *, through_victim: bool, with_r3: bool = False
) -> tuple[Run, NetBroker, Fault, float, dict[str, str], dict[str, tuple[float, float]], list[str],
           dict[tuple[str, str], float | None], Verdict]:
    """Journals, writers, the fault on the primary of a replication-2 journal for FAULT_SECONDS, the heal,
    recovery probes through every broker and the read back."""
    want = await asyncio.to_thread(create_journals, lab, with_r3)
    journals = list(want)
    victim = await asyncio.to_thread(lab.primary_of, journals[0])
    assert victim is not None, "no primary"
    victim_roles = await asyncio.to_thread(roles, lab, journals, victim)
    run = Run(lab, want)
    writing = [b for b in lab.brokers if through_victim or b is not victim]
    stop_writers, stop_supervisor = asyncio.Event(), asyncio.Event()
    writers = [asyncio.create_task(run.writer(j, b, stop_writers)) for j in journals for b in writing]
    supervisor = asyncio.create_task(run.supervise(stop_supervisor))
    try:
        await asyncio.sleep(2.0)
        fault: Fault = getattr(lab, inject)(victim)
        run.note(f"{inject}({victim.broker_id}): {', '.join(f'{short(j)} {r}' for j, r in victim_roles.items())}")
        await asyncio.sleep(FAULT_SECONDS)
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
        verdict, _reads = await read_back([b.url for b in lab.brokers], journals, run.ledger, READ_BACK, run.t0)
        run.note("read back done")
    finally:
        await stop_tasks(stop_writers, writers)
        await stop_tasks(stop_supervisor, [supervisor])
    return run, victim, fault, t_heal, victim_roles, gaps, [], recovery, verdict


def judge(
    title: str, run: Run, victim: NetBroker, fault: Fault, t_heal: float, victim_roles: dict[str, str],
    gaps: dict[str, tuple[float, float]], extra: list[str], recovery: dict[tuple[str, str], float | None],
    verdict: Verdict, complaints: list[str], *, bound_gaps: bool = True,
) -> None:
    """Print the report; fail with it and every complaint, adding the common ones (with `bound_gaps`, a
    journal that went longer than FAILOVER without an acknowledged append)."""
    for journal, (gap, start) in gaps.items():
        if bound_gaps and gap > FAILOVER and not run.unbounded(journal):
            complaints.append(
                f"{short(journal)} ({victim_roles.get(journal)} on the victim) went {gap:.2f}s without an acknowledged "
                f"append (from +{start - fault.started:.2f}s after the fault began; at most {FAILOVER:.0f}s allowed)"
            )
    late = {k: t for k, t in recovery.items() if t is None or t > RECOVERY}
    if late:
        shown = ", ".join(f"{short(j)} via {b}: {'never' if t is None else f'{t:.2f}s'}" for (j, b), t in late.items())
        complaints.append(f"{len(late)} (journal, broker) pairs took no append within {RECOVERY:.0f}s of the heal: "
                          + shown)
    if verdict.problems:
        complaints.append(
            f"reading back: {verdict.lost} acknowledged appends lost, {verdict.duplicated} duplicated, "
            f"{verdict.torn} torn, {len(verdict.problems)} problems"
        )
    if verdict.acked != len(run.ledger.acked):
        complaints.append(f"read back checked {verdict.acked} of {len(run.ledger.acked)} acknowledged appends")
    text = report(title, run, victim, fault, t_heal, gaps, victim_roles, recovery, verdict, extra)
    print("\n" + text)
    if complaints:
        pytest.fail("; ".join(complaints) + "\n" + text + "\n" + details(run, verdict), pytrace=False)


async def test_isolated_primary_fails_over_within_lease(lab: NetworkLab) -> None:
    """Isolated (its bridge port down), a primary loses its lease and exits; its journals fail over to the
    healthy brokers within the lease (+2 s), and once healed and restarted it serves again within 10 s."""
    run, victim, fault, t_heal, victim_roles, gaps, extra, recovery, verdict = await fault_run(
        lab, "isolate", through_victim=False, with_r3=True
    )
    exits = [t - fault.started for t in run.exits.get(victim.broker_id, []) if t <= t_heal]
    extra.append(f"  {victim.broker_id} exited at " + (", ".join(f"+{t:.2f}s" for t in exits) or "no time")
                 + " of the isolation")
    judge("isolated primary", run, victim, fault, t_heal, victim_roles, gaps, extra, recovery, verdict, [])


async def test_primary_cut_from_etcd_stops_acknowledging(lab: NetworkLab) -> None:
    """Cut from etcd alone, a primary acknowledges no append past its lease (+0.5 s), and its journals fail
    over to another broker within the lease (+2 s); healed and restarted it serves again within 10 s."""
    run, victim, fault, t_heal, victim_roles, gaps, extra, recovery, verdict = await fault_run(
        lab, "cut_etcd", through_victim=True
    )
    t_cut = fault.started
    complaints = []
    by_victim = [a for a in run.acks if victim.broker_id in (a.via, a.committer) and t_cut <= a.at <= t_heal]
    last = max((a.at - t_cut for a in by_victim), default=None)
    late = [a for a in by_victim if a.at - t_cut > STOP_ACKING]
    if late:
        complaints.append(
            f"{victim.broker_id}, cut from etcd, acknowledged {len(late)} appends more than {STOP_ACKING}s after "
            f"the cut (the last at +{last:.2f}s)"
        )
    failovers: dict[str, float | None] = {}
    for journal, role in victim_roles.items():
        if role != "primary":
            continue
        after = [a.at - t_cut for a in run.acks if a.journal == journal and a.committer != victim.broker_id
                 and t_cut <= a.at <= t_heal]
        failover = failovers[journal] = min(after, default=None)
        if failover is None or failover > FAILOVER:
            shown = "never" if failover is None else f"+{failover:.2f}s"
            complaints.append(f"{short(journal)} failed over from {victim.broker_id} at {shown} (by {FAILOVER:.0f}s)")
    exits = [t - t_cut for t in run.exits.get(victim.broker_id, []) if t <= t_heal]
    extra += [
        f"  {victim.broker_id}: last append it acknowledged (through it or committed by it) at "
        + ("none" if last is None else f"+{last:.2f}s") + " of the cut; exited at "
        + (", ".join(f"+{t:.2f}s" for t in exits) or "no time"),
        "  failover (first append committed by another broker): "
        + ", ".join(f"{short(j)} {'never' if t is None else f'+{t:.2f}s'}" for j, t in failovers.items()),
    ]
    judge("primary cut from etcd", run, victim, fault, t_heal, victim_roles, gaps, extra, recovery, verdict,
          complaints)


async def test_primary_cut_from_peers(lab: NetworkLab) -> None:
    """Cut from its peers alone (etcd and clients still reach it), a primary keeps its lease, so its
    assignments: as in Gazette, whose allocator acts on etcd membership alone, the journals it shares with
    the cut broker take no appends until the heal (reported, not bounded), and nothing acknowledged is
    lost. Healed, every journal takes appends through every broker within 10 s."""
    run, victim, fault, t_heal, victim_roles, gaps, extra, recovery, verdict = await fault_run(
        lab, "cut_peers", through_victim=True
    )
    exits = [t - fault.started for t in run.exits.get(victim.broker_id, []) if t <= t_heal]
    late_start = fault.started + FAILOVER
    committers = {
        short(j): sorted({a.committer for a in run.acks if a.journal == j and late_start < a.at <= t_heal})
        for j in run.journals
    }
    extra += [
        f"  {victim.broker_id} exited at " + (", ".join(f"+{t:.2f}s" for t in exits) or "no time") + " of the cut",
        f"  committed by, late in the cut: {committers}",
    ]
    judge("primary cut from peers", run, victim, fault, t_heal, victim_roles, gaps, extra, recovery, verdict, [],
          bound_gaps=False)


def test_longest_gap() -> None:
    assert longest_gap([], 10.0, 20.0) == (10.0, 10.0)
    assert longest_gap([11.0, 12.0, 18.0], 10.0, 20.0) == (6.0, 12.0)
    assert longest_gap([5.0, 25.0], 10.0, 20.0) == (10.0, 10.0)
