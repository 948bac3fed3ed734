"""Chaos: brokers killed and restarted for minutes while writers append, as a scheduler treats cattle.

Starts its own etcd and `--brokers` `gazette serve` brokers (zones a, b, c, ...; each its own state dir, one shared
file:// root; `--etcd.lease` TTL), `--journals` journals at `--replication`, and writers appending unique records to
random journals through random brokers: 2 over HTTP PUT, 2 over one gRPC Append each (`broker.client.append`,
proxied by the broker), and 2 through the retrying AppendService. A prober appends a tiny record to every journal
every `--probe-interval` seconds through a broker that is not being killed.

The kill loop takes the brokers in turn, cycling through the kinds of `--kinds`:

* `sigkill-same`: SIGKILL, then after `--restart-delay` restart under the same --broker.id, state dir and port
  (a container restarted in place);
* `sigkill-new`: SIGKILL, then after `--restart-delay` start a broker with a new ID, a fresh state dir and a new
  port (a rescheduled pod);
* `sigterm`: SIGTERM, wait for the exit, restart under the same ID, state dir and port (a rolling restart).

Each time it waits until the new broker is ready and every journal is routed to running brokers again, then lets
the cluster run for `--interval` seconds. A kill's outage is how long, from the kill (or from the last
acknowledgement before it, if later), some journal went without acknowledging a probe: the longest gap between
acknowledgements of a journal's probes in the kill's window, the worst journal's. Goals: <= lease + 2 s for
SIGKILL, <= 1 s for SIGTERM.

At the end the writers stop and every journal is read through every broker, first as it is (a replica that
rejoined serves only what was persisted before, until an append syncs it), then after one more append to each:
every acknowledged record must be there once at its offsets (lost bytes: goal 0), no record torn, the brokers
agreeing byte for byte. The report goes to stdout, progress to stderr.

    python -m tests.benchmarks.chaos [--minutes 3] [--etcd-lease 5] [--brokers 3] [--replication 3]
        [--kinds sigkill-same,sigkill-new,sigterm] [--interval 3] [--restart-delay 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import re
import shutil
import signal
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from broker.client import ClientError, JournalClient, append
from cluster.keyspace.etcd import EtcdProcess
from tests.benchmarks.stack import log
from tests.broker.test_cluster_chaos import (
    Ledger,
    Verdict,
    Workload,
    barrier,
    committed_by,
    create_journals,
    read_back,
    record,
)
from tests.support.harness import BrokerCluster, free_port

KINDS = {
    "sigkill-same": ("SIGKILL same id", signal.SIGKILL, True),
    "sigkill-new": ("SIGKILL new id", signal.SIGKILL, False),
    "sigterm": ("SIGTERM", signal.SIGTERM, True),
}
RECOVERY_TIMEOUT = 120.0
"""How long a replaced broker may take to be ready and routed before the loop gives up."""


@dataclass
class Kill:
    kind: str
    broker: str
    successor: str = ""
    signalled: float = 0.0
    exited: float = 0.0
    ready: float = 0.0
    routed: float = 0.0
    exit_status: int | None = None
    error: str = ""
    outage: float = 0.0
    outage_journal: str = ""
    recovered: bool = True
    probe_errors: Counter[str] = field(default_factory=Counter)

    def goal(self, lease: float) -> float:
        return 1.0 if self.kind == "SIGTERM" else lease + 2.0


@dataclass
class Probe:
    journal: str
    started: float
    finished: float
    ok: bool
    error: str = ""


class Prober:
    """Appends a tiny record to each journal every `interval` seconds through a broker `live()` names."""

    def __init__(
        self, journals: list[str], live: Callable[[], list[str]], ledger: Ledger, interval: float, timeout: float
    ) -> None:
        self.journals = journals
        self.live = live
        self.ledger = ledger
        self.interval = interval
        self.timeout = timeout
        self.probes: list[Probe] = []
        self.stop = asyncio.Event()
        self._clients: dict[str, JournalClient] = {}

    async def run(self) -> None:
        try:
            await asyncio.gather(*(self._probe(i, j) for i, j in enumerate(self.journals)))
        finally:
            for client in self._clients.values():
                await client.close()

    async def _probe(self, index: int, journal: str) -> None:
        seq = 0
        name = f"probe-{index}"
        rng = random.Random(index)
        while not self.stop.is_set():
            tick = time.monotonic()
            url = rng.choice(self.live())
            client = self._clients.get(url)
            if client is None:
                client = self._clients[url] = JournalClient(url, route_cache=False)
            rec = record(name, seq, 0)
            seq += 1
            try:
                async with asyncio.timeout(self.timeout):
                    resp = await append(client, journal, rec)
            except (ClientError, TimeoutError) as exc:
                error = f"{type(exc).__name__}: {exc}" if str(exc) else f"no reply in {self.timeout}s"
                self.probes.append(Probe(journal, tick, time.monotonic(), False, error))
                self.ledger.fail(name, journal, rec, error, False)
            else:
                self.probes.append(Probe(journal, tick, time.monotonic(), True))
                self.ledger.ack(name, journal, resp.commit.begin, resp.commit.end, rec, via=committed_by(url, resp))
            await asyncio.sleep(max(0.0, tick + self.interval - time.monotonic()))


def outages(kills: list[Kill], probes: list[Probe], journals: list[str], end: float) -> None:
    """Set each kill's outage: the worst journal's longest gap between probe acknowledgements in its window
    (from the kill to the next one), counted from the kill at the earliest."""
    acks = {j: sorted(p.finished for p in probes if p.journal == j and p.ok) for j in journals}
    for n, kill in enumerate(kills):
        start = kill.signalled
        stop = kills[n + 1].signalled if n + 1 < len(kills) else end
        kill.outage, kill.recovered = 0.0, True
        for journal, times in acks.items():
            previous, worst = start, 0.0
            for t in times:
                if t <= start:
                    continue
                if previous >= stop:
                    break
                worst = max(worst, min(t, stop) - previous)  # A gap the next kill began belongs to it.
                previous = t
            if previous < stop and not any(t > previous for t in times) and end - previous > 1.0:
                worst, kill.recovered = max(worst, end - previous), False  # No acknowledgement after this.
            if worst > kill.outage:
                kill.outage, kill.outage_journal = worst, journal
        for p in probes:
            if not p.ok and start <= p.started < stop:
                kill.probe_errors[_error_kind(p.error)] += 1


def _error_kind(error: str) -> str:
    text = " ".join(error.split(" (journal ")[0].split())
    text = re.sub(r"(https?://)?127\.0\.0\.1:\d+", "<broker>", text)
    text = re.sub(r"chaos/[0-9a-f]+/j\d+", "<journal>", text)
    text = re.sub(r"broker-([a-z])-\d+", r"broker-\1-N", text)
    return text if len(text) <= 150 else text[:147] + "..."


class Chaos:
    def __init__(self, args: argparse.Namespace, cluster: BrokerCluster, journals: list[str]) -> None:
        self.args = args
        self.cluster = cluster
        self.journals = journals
        self.down: set[int] = set()
        self.kills: list[Kill] = []
        self.t0 = time.monotonic()

    def live_urls(self) -> list[str]:
        urls = [url for i, url in enumerate(self.cluster.urls) if i not in self.down]
        return urls or self.cluster.urls

    async def replace(self, index: int, kind_key: str) -> Kill:
        kind, sig, same_id = KINDS[kind_key]
        cluster = self.cluster
        old = cluster.slots[index].proc
        kill = Kill(kind, old.broker_id)
        self.kills.append(kill)
        self.down.add(index)
        kill.signalled = time.monotonic()
        log(f"{kill.signalled - self.t0:7.1f}s {kind} {old.broker_id}")
        try:
            kill.exit_status = await asyncio.to_thread(cluster.kill, index, sig, RECOVERY_TIMEOUT)
        except Exception as exc:
            kill.error = f"no exit within {RECOVERY_TIMEOUT}s ({exc})"
        kill.exited = time.monotonic()
        if sig == signal.SIGKILL:
            await asyncio.sleep(self.args.restart_delay)
        new = cluster.restart(index, same_id=same_id)
        kill.successor = new.broker_id
        try:
            await asyncio.to_thread(new.wait_ready, RECOVERY_TIMEOUT)
            kill.ready = time.monotonic()
            left = RECOVERY_TIMEOUT - (kill.ready - kill.exited)
            await asyncio.to_thread(cluster.wait_routed, self.journals, self.args.replication, max(1.0, left))
            kill.routed = time.monotonic()
        except (TimeoutError, RuntimeError) as exc:
            kill.error = kill.error or str(exc).splitlines()[0]
            log(f"  {new.broker_id} did not recover: {kill.error}")
            raise
        finally:
            self.down.discard(index)
        log(f"  {new.broker_id} ready after {kill.ready - kill.signalled:.1f}s, routed after "
            f"{kill.routed - kill.signalled:.1f}s")
        return kill

    async def loop(self, deadline: float) -> None:
        kinds = self.args.kinds.split(",")
        n = 0
        while time.monotonic() < deadline:
            # Each broker in turn, each kind in turn, shifted every round so that every broker meets every kind.
            victim = (n + n // len(kinds)) % len(self.cluster.slots)
            await self.replace(victim, kinds[n % len(kinds)])
            n += 1
            await asyncio.sleep(self.args.interval)


def print_report(
    args: argparse.Namespace, chaos: Chaos, workload: Workload, prober: Prober, seconds: float,
    first: Verdict, first_seconds: float, verdict: Verdict, settle_seconds: float, logs: list[str],
) -> None:
    lease = args.etcd_lease
    ledger = workload.ledger
    print(f"chaos: {args.brokers} brokers (zones {' '.join(chaos.cluster.zones)}), {args.journals} journals at "
          f"replication {args.replication}, etcd lease {lease:g}s, kill loop {seconds:.0f}s")
    by_kind = Counter(k.kind for k in chaos.kills)
    print(f"kills: {len(chaos.kills)} (" + ", ".join(f"{kind} {by_kind[kind]}" for kind, _, _ in KINDS.values())
          + ")")
    print()
    print(f"{'appends':<10} {'acknowledged':>12} {'per s':>8} {'errored':>8}")
    writers = ("http", "grpc", "service")
    for kind in writers:
        acked = sum(1 for a in ledger.acked if a.writer.startswith(kind))
        failed = sum(1 for f in ledger.failed if f.writer.startswith(kind))
        print(f"{kind:<10} {acked:>12} {acked / seconds:>8.1f} {failed:>8}")
    acked = sum(1 for a in ledger.acked if a.writer.startswith(writers))
    failed = sum(1 for f in ledger.failed if f.writer.startswith(writers))
    print(f"{'total':<10} {acked:>12} {acked / seconds:>8.1f} {failed:>8}")
    probes_ok = sum(1 for p in prober.probes if p.ok)
    print(f"{'probes':<10} {probes_ok:>12} {probes_ok / seconds:>8.1f} {len(prober.probes) - probes_ok:>8}")
    errors = Counter(
        f"{f.writer.rsplit('-', 1)[0]}: {_error_kind(f.error)}" for f in ledger.failed if f.writer.startswith(writers)
    )
    if errors:
        print("commonest append errors:")
        for text, n in errors.most_common(8):
            print(f"  {n:6d} x {text}")
    print()
    print(f"{'#':>3} {'at s':>7} {'kind':<16} {'broker':<14} {'-> new':<14} {'exit s':>7} {'ready s':>8} "
          f"{'routed s':>9} {'outage s':>9} {'goal s':>7}")
    for n, k in enumerate(chaos.kills, 1):
        rel = k.signalled - chaos.t0

        def since(t: float, k: Kill = k) -> str:
            return f"{t - k.signalled:.2f}" if t else "-"

        verdict_text = "PASS" if k.recovered and k.outage <= k.goal(lease) and not k.error else "MISS"
        outage = f"{k.outage:.2f}" + ("" if k.recovered else "+")
        print(f"{n:>3} {rel:>7.1f} {k.kind:<16} {k.broker:<14} {k.successor:<14} {since(k.exited):>7} "
              f"{since(k.ready):>8} {since(k.routed):>9} {outage:>9} {'<= ' + format(k.goal(lease), 'g'):>7} "
              f"{verdict_text}" + (f"  ({k.error})" if k.error else ""))
        for text, count in k.probe_errors.most_common(3):
            print(f"{'':>12} probe errors: {count} x {text}")
    print()
    print(f"{'outage by kind':<16} {'kills':>5} {'median s':>9} {'max s':>7} {'goal s':>7} {'met':>5}")
    for kind, _, _ in KINDS.values():
        ks = [k for k in chaos.kills if k.kind == kind]
        if not ks:
            continue
        goal = ks[0].goal(lease)
        met = sum(1 for k in ks if k.recovered and k.outage <= goal and not k.error)
        print(f"{kind:<16} {len(ks):>5} {statistics.median(k.outage for k in ks):>9.2f} "
              f"{max(k.outage for k in ks):>7.2f} {'<= ' + format(goal, 'g'):>7} {met:>2}/{len(ks):<2} "
              f"{'PASS' if met == len(ks) else 'MISS'}")
    print()
    print(f"read back as it was (after {first_seconds:.1f}s): {len(first.problems)} problems")
    for problem in first.problems[:6]:
        print(f"  {problem}")
    print(f"read back after one more append to each journal (after {settle_seconds:.1f}s): "
          f"{verdict.acked} acknowledged records ({verdict.acked_bytes} B) in {verdict.journal_bytes} B")
    print(f"  acknowledged bytes lost: {verdict.lost_bytes} ({verdict.lost} records)   goal 0   "
          f"{'PASS' if verdict.lost_bytes == 0 else 'MISS'}")
    print(f"  duplicated records: {verdict.duplicated}, torn: {verdict.torn}, failed appends that committed "
          f"(outcome unknown to the writer): {verdict.unacked_present}")
    other = [p for p in verdict.problems if "not at [" not in p]
    print(f"  brokers agree byte for byte: {'yes' if not any('differ' in p for p in other) else 'NO'}")
    for problem in verdict.problems[:10]:
        print(f"  {problem}")
    print()
    counts = Counter(
        re.sub(r"^\[[^\]]*\] \S+ ", "", re.sub(r"\b(\d+|[0-9a-f]{8,})\b", "N", line)) for line in logs
    )
    print(f"broker warnings and errors: {len(logs)}; the commonest:")
    for text, n in counts.most_common(10):
        print(f"  {n:6d} x {text[:160]}")


def write_probe_log(path: Path, chaos: Chaos, prober: Prober) -> None:
    """Every kill and probe, in seconds since the kill loop began, tab-separated."""
    rows = [(k.signalled - chaos.t0, "-", "kill", "-", f"{k.kind} {k.broker} -> {k.successor}") for k in chaos.kills]
    rows += [(p.started - chaos.t0, p.journal, str(int(p.ok)), f"{p.finished - p.started:.3f}",
              " ".join(p.error.split())) for p in prober.probes]
    with path.open("w") as out:
        out.write("at_s\tjournal\tok\tlatency_s\terror\n")
        for at, *rest in sorted(rows, key=lambda r: r[0]):
            out.write(f"{at:.3f}\t" + "\t".join(rest) + "\n")


async def run_async(args: argparse.Namespace, cluster: BrokerCluster) -> None:
    journals = await asyncio.to_thread(create_journals, cluster, args.journals, args.replication)
    chaos = Chaos(args, cluster, journals)
    workload = Workload(journals, chaos.live_urls if args.writers_avoid_victim else lambda: cluster.urls,
                        interval=args.writer_interval)
    prober = Prober(journals, chaos.live_urls, workload.ledger, args.probe_interval, args.probe_timeout)
    tasks = [
        asyncio.create_task(workload.http_writer("http-0")),
        asyncio.create_task(workload.http_writer("http-1")),
        asyncio.create_task(workload.grpc_writer("grpc-0")),
        asyncio.create_task(workload.grpc_writer("grpc-1")),
        asyncio.create_task(workload.service_writer("service-routed", route_cache=True)),
        asyncio.create_task(workload.service_writer("service-proxied", route_cache=False)),
    ]
    probing = asyncio.create_task(prober.run())
    await asyncio.sleep(2.0)
    start = time.monotonic()
    chaos.t0 = start
    try:
        await chaos.loop(start + args.minutes * 60)
    except (TimeoutError, RuntimeError):
        log("the kill loop stopped: a broker did not recover")
    seconds = time.monotonic() - start
    end = time.monotonic()
    log("stopping the writers")
    workload.stop.set()
    prober.stop.set()
    await asyncio.wait([*tasks, probing], timeout=90)
    outages(chaos.kills, prober.probes, journals, end)
    if args.probe_log:
        write_probe_log(Path(args.probe_log), chaos, prober)

    log("reading every journal back through every broker")
    t = time.monotonic()
    first, _ = await read_back(cluster.urls, journals, workload.ledger, timeout=10.0, t0=chaos.t0)
    first_seconds = time.monotonic() - t
    await barrier(cluster.urls, journals, workload.ledger)
    verdict, _ = await read_back(cluster.urls, journals, workload.ledger, timeout=45.0, t0=chaos.t0)
    settle_seconds = time.monotonic() - t
    print_report(args, chaos, workload, prober, seconds, first, first_seconds, verdict, settle_seconds,
                 cluster.log_lines())


def run(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gazette-chaos-"))
    etcd = EtcdProcess(tmp / "etcd", client_port=free_port(), peer_port=free_port(), log_path=tmp / "etcd.log")
    cluster: BrokerCluster | None = None
    try:
        log(f"starting etcd and {args.brokers} brokers under {tmp}")
        etcd.start()
        etcd.wait_ready(30.0)
        zones = tuple("abcdefghijklmnopqrstuvwxyz"[: args.brokers])
        cluster = BrokerCluster(tmp, etcd.endpoint, "/chaos", zones, lease=args.etcd_lease).start()
        asyncio.run(run_async(args, cluster))
    finally:
        if cluster is not None:
            cluster.stop_all()
        etcd.stop()
        if args.keep:
            log(f"logs and state kept under {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.chaos", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--minutes", type=float, default=3.0, help="how long the kill loop runs")
    parser.add_argument("--etcd-lease", type=float, default=5.0, help="the brokers' --etcd.lease, in seconds")
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--journals", type=int, default=4)
    parser.add_argument("--replication", type=int, default=3)
    parser.add_argument("--kinds", default="sigkill-same,sigkill-new,sigterm",
                        help=f"kill kinds to cycle through, comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--interval", type=float, default=3.0,
                        help="seconds of steady state after a replaced broker is routed, before the next kill")
    parser.add_argument("--restart-delay", type=float, default=0.5,
                        help="seconds between a SIGKILLed broker's death and its successor's start")
    parser.add_argument("--probe-interval", type=float, default=0.1)
    parser.add_argument("--probe-timeout", type=float, default=2.0)
    parser.add_argument("--writer-interval", type=float, default=0.02, help="pause of each writer between appends")
    parser.add_argument("--writers-avoid-victim", action="store_true",
                        help="writers skip the broker being replaced (by default they pick any, as clients would)")
    parser.add_argument("--probe-log", help="write every probe (and kill) to this file, tab-separated")
    parser.add_argument("--keep", action="store_true", help="keep the brokers' logs and state directories")
    args = parser.parse_args(argv)
    for kind in args.kinds.split(","):
        if kind not in KINDS:
            parser.error(f"unknown kind {kind!r}; use {', '.join(KINDS)}")
    logging.basicConfig(level=logging.ERROR)
    run(args)


if __name__ == "__main__":
    main()
