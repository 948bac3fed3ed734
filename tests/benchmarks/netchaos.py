"""Network chaos: brokers in network namespaces isolated, cut from etcd, cut from their peers, or slowed, run
after run, with a table per fault kind (the network-fault sibling of tests/benchmarks/chaos.py).

Each run is a fresh lab of tests/broker/test_network_faults.py (etcd in the root namespace, three `gazette
serve` brokers on hosts of their own, --etcd.lease 5, journals at replication 2 and one at 3, writers,
tailing readers): the fault on the primary of a journal for `--fault-seconds`, the heal, a broker that
exited restarted as itself, recovery probes through every broker, and a read back. Per fault kind it
prints, over the runs (min / median / max):

* outage: the longest stretch after the fault began without an acknowledged append to a journal, through
  the brokers the writers used (the healthy ones, for an isolation); replication-3 journals, which take no
  append while one of their three brokers is out, are left out of an isolation's figure;
* health: seconds after the heal until every journal took an append through every broker;
* appends acknowledged and failed, acknowledged bytes lost (goal 0), bytes tailing readers were given that
  the journals do not end up holding (dirty, goal 0).

Goals (issue 34): outage <= lease + 2 s for an isolation or an etcd cut, <= 2 s under 200 ms latency;
health <= 10 s; 0 lost, 0 dirty. A cut from peers alone costs its journals the whole cut (as in Gazette:
the cut broker keeps its lease). Needs root and nftables; the report goes to stdout, progress to stderr.

    python -m tests.benchmarks.netchaos [--runs 3] [--kinds isolate,cut-etcd,cut-peers,latency]
        [--fault-seconds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.broker.test_network_faults import (
    FAILOVER,
    LATENCY,
    LATENCY_GAP,
    RECOVERY,
    Inject,
    Outcome,
    Run,
    broker_lab,
    fault_run,
    lab_fault,
)
from tests.support.netfaults import Fault, NetBroker, netfaults_unavailable


async def _latency(run: Run, victim: NetBroker) -> Fault:
    fault: Fault = run.lab.delay(victim, LATENCY)
    return fault


@dataclass(frozen=True)
class Kind:
    inject: Inject
    through_victim: bool
    with_r3: bool
    outage_goal: float | None


KINDS: dict[str, Kind] = {
    "isolate": Kind(lab_fault("isolate"), through_victim=False, with_r3=True, outage_goal=FAILOVER),
    "cut-etcd": Kind(lab_fault("cut_etcd"), through_victim=True, with_r3=False, outage_goal=FAILOVER),
    "cut-peers": Kind(lab_fault("cut_peers"), through_victim=True, with_r3=False, outage_goal=None),
    "latency": Kind(_latency, through_victim=True, with_r3=True, outage_goal=LATENCY_GAP),
}


@dataclass
class Figures:
    outage: float
    health: float | None
    acked: int
    failed: int
    lost_bytes: int
    dirty: int
    checked: int


def figures(out: Outcome, kind: str) -> Figures:
    bounded = [g for j, (g, _start) in out.gaps.items() if not (kind == "isolate" and out.run.unbounded(j))]
    recovered = list(out.recovery.values())
    health = None if any(t is None for t in recovered) else max(t for t in recovered if t is not None)
    return Figures(
        outage=max(bounded, default=0.0), health=health, acked=len(out.run.ledger.acked),
        failed=len(out.run.ledger.failed), lost_bytes=out.verdict.lost_bytes, dirty=len(out.dirty),
        checked=out.tails_checked,
    )


def spread(values: list[float], unit: str = "s") -> str:
    if not values:
        return "-"
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f} {unit}"


def table(results: dict[str, list[Figures]], runs: int, fault_seconds: float) -> str:
    lines = [
        f"network chaos: {runs} run(s) per fault kind, {fault_seconds:g} s each, --etcd.lease 5",
        "",
        f"{'fault':<10} {'outage min/med/max':<26} {'goal':>6} {'health after heal':<26} {'acked':>7} "
        f"{'failed':>7} {'lost B':>7} {'dirty':>6} {'read B checked':>15}",
    ]
    for kind, figs in results.items():
        goal = KINDS[kind].outage_goal
        healths = [f.health for f in figs if f.health is not None]
        never = sum(f.health is None for f in figs)
        lines.append(
            f"{kind:<10} {spread([f.outage for f in figs]):<26} {('-' if goal is None else f'{goal:g}s'):>6} "
            f"{spread(healths) + (f' ({never} never)' if never else ''):<26} {sum(f.acked for f in figs):>7} "
            f"{sum(f.failed for f in figs):>7} {sum(f.lost_bytes for f in figs):>7} {sum(f.dirty for f in figs):>6} "
            f"{sum(f.checked for f in figs):>15}"
        )
    misses = [
        f"{kind}: outage {f.outage:.2f}s > {KINDS[kind].outage_goal:g}s"
        for kind, figs in results.items() for f in figs
        if KINDS[kind].outage_goal is not None and f.outage > (KINDS[kind].outage_goal or 0)
    ]
    misses += [f"{kind}: health {'never' if f.health is None else f'{f.health:.2f}s'} > {RECOVERY:g}s"
               for kind, figs in results.items() for f in figs if f.health is None or f.health > RECOVERY]
    misses += [f"{kind}: {f.lost_bytes} acknowledged bytes lost, {f.dirty} dirty chunks"
               for kind, figs in results.items() for f in figs if f.lost_bytes or f.dirty]
    lines += ["", "goals missed: " + ("none" if not misses else "; ".join(misses))]
    return "\n".join(lines)


async def one_run(kind: str, fault_seconds: float, log: Callable[[str], None]) -> Figures:
    spec = KINDS[kind]
    with tempfile.TemporaryDirectory(prefix="netchaos-") as tmp, broker_lab(Path(tmp)) as lab:
        out = await fault_run(lab, spec.inject, through_victim=spec.through_victim, with_r3=spec.with_r3,
                              fault_seconds=fault_seconds)
    found = figures(out, kind)
    log(f"{kind}: outage {found.outage:.2f}s, health "
        f"{'never' if found.health is None else f'{found.health:.2f}s'}, {found.acked} acked, {found.failed} failed, "
        f"{found.lost_bytes} bytes lost, {found.dirty} dirty")
    return found


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--fault-seconds", type=float, default=15.0)
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown fault kinds {unknown}: choose from {', '.join(KINDS)}")
    reason = netfaults_unavailable()
    if reason:
        print(f"netchaos: {reason}", file=sys.stderr)
        return 2

    # The tailing readers' retries (a broker cut off) are the run's business, not the report's.
    logging.getLogger("broker.client.reader").setLevel(logging.ERROR)

    def log(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    results: dict[str, list[Figures]] = {k: [] for k in kinds}
    for run in range(args.runs):
        for kind in kinds:
            log(f"run {run + 1}/{args.runs}: {kind}")
            results[kind].append(await one_run(kind, args.fault_seconds, log))
    print(table(results, args.runs, args.fault_seconds))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
