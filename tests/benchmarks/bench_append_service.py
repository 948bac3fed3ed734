"""Benchmark of AppendService: committed 256-byte records per second from one client process.

Starts a real etcd and one real `gazette serve` (file:// store under a temp dir, replication 1,
512 MiB fragments, NONE codec), then from one asyncio process sharing one AppendService measures:

* tight loop: one coroutine issuing `service.append(journal, record)` without awaiting each (it
  yields to the event loop every `--window` records and keeps at most two windows outstanding);
* producers: `--producers` coroutines over `--journals` journals, each awaiting every
  `--await-every`-th of its own appends (so each has that many records in flight at most);

A figure is records committed per second: from the first append until every append committed.
Batch sizes (records per Append RPC) come from the service's stats and from the broker's
`gazette_append_requests_total` metric (/debug/metrics). The goal is >= 100,000 records/s.
The report goes to stdout, progress to stderr.

    python -m tests.benchmarks.bench_append_service [--records 500000] [--rounds 3]
        [--producers 200] [--journals 4] [--profile client.prof]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import platform
import pstats
import re
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from broker.client import AppendService, AsyncAppend, JournalClient
from broker.protocol import pb
from tests.benchmarks.bench_broker import bench_spec, log
from tests.benchmarks.stack import etcd_and_broker
from tests.support.harness import apply_specs, wait_for_primary

RECORD_SIZE = 256
GOAL = 100_000.0


@dataclass
class Phase:
    name: str
    records: int = 0
    seconds: float = float("inf")
    service_rpcs: int = 0
    broker_rpcs: int = 0
    rates: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return max(self.rates, default=0.0)

    def batch(self, rpcs: int) -> float:
        return self.records / rpcs if rpcs else 0.0


def make_records(n: int) -> list[bytes]:
    """`n` distinct newline-terminated records of RECORD_SIZE bytes."""
    pad = b"x" * RECORD_SIZE
    out = []
    for i in range(n):
        head = f"record {i:010d} ".encode()
        out.append(head + pad[: RECORD_SIZE - len(head) - 1] + b"\n")
    return out


def append_rpcs_total(url: str) -> int:
    """The broker's committed Append RPCs, over all journals."""
    with urllib.request.urlopen(f"{url}/debug/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(int(float(v)) for v in re.findall(r"^gazette_append_requests_total\{[^}]*\} (\S+)$", text, re.MULTILINE))


async def tight_loop(service: AppendService, journal: str, records: list[bytes], total: int, window: int) -> None:
    n = len(records)
    previous: AsyncAppend | None = None
    last: AsyncAppend | None = None
    append = service.append
    for begin in range(0, total, window):
        for i in range(begin, min(begin + window, total)):
            last = append(journal, records[i % n])
        if previous is not None:
            await previous  # At most two windows outstanding: bounded memory, and the pipe stays full.
        else:
            await asyncio.sleep(0)
        previous = last
    await service.flush()


async def producers(
    service: AppendService, journals: list[str], records: list[bytes], total: int, count: int, await_every: int
) -> None:
    n = len(records)
    per = total // count

    async def produce(p: int) -> None:
        journal = journals[p % len(journals)]
        append = service.append
        base = p * per
        for i in range(per):
            aa = append(journal, records[(base + i) % n])
            if i % await_every == await_every - 1:
                await aa

    await asyncio.gather(*(produce(p) for p in range(count)))
    await service.flush()


async def measure(args: argparse.Namespace, url: str, journals: list[str]) -> list[Phase]:
    records = make_records(min(args.records, 100_000))
    tight = Phase("tight loop (1 journal)")
    prod = Phase(f"{args.producers} producers ({args.journals} journals)")
    profiler = cProfile.Profile() if args.profile else None
    async with JournalClient(url) as client:
        async with AppendService(client) as service:
            await tight_loop(service, journals[0], records, 20_000, args.window)  # Warm up.
            for _ in range(args.rounds):
                for phase in (tight, prod):
                    rpcs0, broker0 = service.stats.rpcs, await asyncio.to_thread(append_rpcs_total, url)
                    if profiler is not None:
                        profiler.enable()
                    started = time.perf_counter()
                    if phase is tight:
                        await tight_loop(service, journals[0], records, args.records, args.window)
                        done = args.records
                    else:
                        done = args.records // args.producers * args.producers
                        await producers(service, journals, records, args.records, args.producers, args.await_every)
                    seconds = time.perf_counter() - started
                    if profiler is not None:
                        profiler.disable()
                    rate = done / seconds
                    phase.rates.append(rate)
                    if seconds < phase.seconds:
                        phase.seconds, phase.records = seconds, done
                        phase.service_rpcs = service.stats.rpcs - rpcs0
                        phase.broker_rpcs = await asyncio.to_thread(append_rpcs_total, url) - broker0
                    log(f"  {phase.name}: {rate:,.0f} records/s ({service.stats.rpcs - rpcs0} RPCs)")
            assert service.stats.retries == 0, service.stats
    if profiler is not None:
        profiler.dump_stats(args.profile)
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.profile_top)
        log(out.getvalue())
    return [tight, prod]


def print_report(args: argparse.Namespace, phases: list[Phase]) -> None:
    print(f"AppendService benchmark: {RECORD_SIZE}-byte records, {args.records:,} per phase run, best of "
          f"{args.rounds}; Python {platform.python_version()} on {platform.machine()}")
    print(f"{'phase':<28} {'records/s':>12} {'MB/s':>7} {'rec/RPC (svc)':>14} {'rec/RPC (broker)':>17} "
          f"{'goal':>9}  verdict")
    best = 0.0
    for p in phases:
        best = max(best, p.rate)
        verdict = "PASS" if p.rate >= GOAL else "MISS"
        print(f"{p.name:<28} {p.rate:>12,.0f} {p.rate * RECORD_SIZE / 1e6:>7.1f} {p.batch(p.service_rpcs):>14,.0f} "
              f"{p.batch(p.broker_rpcs):>17,.0f} {'>=' + format(int(GOAL), ','):>9}  {verdict}")
    print(f"overall: best {best:,.0f} committed records/s vs goal {GOAL:,.0f}: {'PASS' if best >= GOAL else 'MISS'}")


def run(args: argparse.Namespace) -> list[Phase]:
    with tempfile.TemporaryDirectory(prefix="bench-append-service-") as tmp_name, \
            etcd_and_broker(Path(tmp_name), "--log.level", "info") as broker:
        specs = [bench_spec(f"bench/records-{i}", pb.NONE) for i in range(max(1, args.journals))]
        channel, stub = broker.stub()
        with channel:
            if apply_specs(stub, *specs).status != pb.OK:
                raise RuntimeError("applying the benchmark journals failed")
            for spec in specs:
                wait_for_primary(stub, spec.name)
        log("measuring")
        phases = asyncio.run(measure(args, broker.url, [s.name for s in specs]))
    print_report(args, phases)
    return phases


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench_append_service",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--records", type=int, default=500_000, help="records per phase run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per phase; the best is reported")
    parser.add_argument("--window", type=int, default=20_000, help="records the tight loop issues between yields")
    parser.add_argument("--producers", type=int, default=200, help="producer coroutines")
    parser.add_argument("--journals", type=int, default=4, help="journals of the producers")
    parser.add_argument("--await-every", type=int, default=100, help="each producer awaits every N-th append")
    parser.add_argument("--profile", metavar="PATH", default="", help="cProfile the client; write stats to PATH")
    parser.add_argument("--profile-top", type=int, default=30, help="functions listed from the profile")
    args = parser.parse_args(argv)
    phases = run(args)
    sys.exit(0 if max(p.rate for p in phases) >= GOAL else 1)


if __name__ == "__main__":
    main()
