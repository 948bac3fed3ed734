"""Benchmark of `gazctl journals apply` and `list` against one broker holding 10,000 journals.

Starts a real etcd (the embedded etcd's settings, which allow transactions of up to 16384
operations; a stock etcd allows 128, refusing batches of 1000) and one real `gazette serve`, writes a journalspace
YAML tree of TOPICS x PARTS journals (a root directory `bench/` with the common fragment settings
and labels, one sub-directory per topic with its own labels, journals `bench/topic-NN/part-NNN`),
then runs the real CLI as a user would (`python -m gazctl`, $BROKER_ADDRESS set) and times:

* `journals apply --specs tree.yaml --dry-run` to /dev/null: read, flatten, validate, print (no RPC);
* `journals apply --specs tree.yaml --max-txn-size 1000`: the same plus the batched Apply RPCs;
* `journals list` (table), `list -l group=g3` (one topic in ten) and `list --format yaml`,
  right after the apply (while the broker's allocator assigns the new journals; the broker's
  default `--broker.limit` of 1024 leaves most of them unassigned) and again once it is idle;

and, to separate the CLI's start-up (Python imports) from the work: `python -m gazctl --help`,
the in-process `broker.client.list_journals` call, and rendering its result in-process.
Each timing is the best (and median) of --rounds runs. Nothing is asserted about speed.

    python -m tests.benchmarks.bench_gazctl [--topics 100] [--parts 100] [--rounds 3]
        [--max-txn-size 1000] [--profile-cli DIR]

With --profile-cli each CLI step is run once more under `python -m cProfile -o DIR/STEP.prof`,
and the top functions by cumulative time are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from broker.protocol import pb
from tests.benchmarks.bench_broker import CpuMeter, CpuUse, thread_cpu
from tests.benchmarks.stack import etcd_and_broker, log
from tests.support.harness import BrokerProcess, gazctl_env

GOALS = {"list": 1.0, "apply": 10.0}  # Wall seconds of one CLI run.
LABEL_SELECTOR = "group=g3"


# --- The journalspace tree ------------------------------------------------------------------


def make_tree(topics: int, parts: int) -> str:
    """The YAML text of the benchmark's journalspace tree."""
    out = io.StringIO()
    w = out.write
    w("name: bench/\n")
    w("replication: 1\n")
    w("labels:\n")
    w("- {name: app.gazette.dev/message-type, value: BenchEvent}\n")
    w("- {name: content-type, value: application/x-ndjson}\n")
    w("fragment:\n")
    w("  length: 134217728\n")
    w("  compression_codec: SNAPPY\n")
    w("  refresh_interval: 1m0s\n")
    w("  retention: 720h0m0s\n")
    w("  flush_interval: 6h0m0s\n")
    w("children:\n")
    for t in range(topics):
        w(f"- name: bench/topic-{t:02d}/\n")
        w("  labels:\n")
        w(f"  - {{name: group, value: g{t % 10}}}\n")
        w(f"  - {{name: topic, value: topic-{t:02d}}}\n")
        w("  children:\n")
        for p in range(parts):
            w(f"  - name: bench/topic-{t:02d}/part-{p:03d}\n")
    return out.getvalue()


# --- Runs -----------------------------------------------------------------------------------


@dataclass
class Timing:
    """Wall seconds of the rounds of one step, and what it produced."""

    runs: list[float] = field(default_factory=list)
    journals: int = 0
    out_bytes: int = 0
    cpu: CpuUse | None = None
    gazctl_cpu: float = 0.0  # Cores used by the gazctl child processes (user + system), over the wall time.

    @property
    def best(self) -> float:
        return min(self.runs)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)


class Gazctl:
    """Runs `python -m gazctl` as a user would, stdout to a file; optionally under cProfile."""

    def __init__(self, broker: BrokerProcess, tmp: Path, profile_dir: Path | None) -> None:
        self.env = gazctl_env(broker, tmp)
        self.tmp = tmp
        self.profile_dir = profile_dir
        self.profiles: dict[str, Path] = {}

    def run(self, *args: str, profile: str = "") -> tuple[float, int]:
        """Run gazctl ARGS; return (wall seconds, bytes of stdout). Raises if it fails."""
        command = [sys.executable]
        if profile and self.profile_dir is not None:
            self.profiles[profile] = self.profile_dir / f"{profile}.prof"
            command += ["-m", "cProfile", "-o", str(self.profiles[profile])]
        command += ["-m", "gazctl", *args]
        out_path = self.tmp / "stdout"
        with open(out_path, "wb") as out:
            started = time.perf_counter()
            proc = subprocess.run(command, stdout=out, stderr=subprocess.PIPE, env=self.env, cwd=self.tmp)
            elapsed = time.perf_counter() - started
        if proc.returncode != 0:
            raise RuntimeError(f"gazctl {' '.join(args)} exited {proc.returncode}: {proc.stderr.decode()[-2000:]}")
        return elapsed, out_path.stat().st_size

    def lines(self) -> int:
        with open(self.tmp / "stdout", "rb") as f:
            return sum(1 for _ in f)


def timed(rounds: int, step: Callable[[], tuple[float, int]]) -> Timing:
    t = Timing()
    for _ in range(rounds):
        elapsed, size = step()
        t.runs.append(elapsed)
        t.out_bytes = size
    return t


def wait_idle(pid: int, timeout: float, busy: float = 0.10) -> float:
    """Wait until `pid` uses under `busy` of a core over a second (or `timeout`); return seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        before = sum(thread_cpu(pid).values())
        time.sleep(1.0)
        if sum(thread_cpu(pid).values()) - before < busy:
            break
    return time.monotonic() - started


async def in_process_list(address: str, selector: pb.LabelSelector, rounds: int) -> tuple[Timing, pb.ListResponse]:
    """The client call under `journals list`, in this process (no start-up), best of `rounds`."""
    from broker.client import JournalClient, list_journals
    from broker.client.config import dial_target

    t = Timing()
    resp = pb.ListResponse()
    async with JournalClient(dial_target(address).address, route_cache=False) as client:
        for _ in range(rounds):
            started = time.perf_counter()
            resp = await list_journals(client, selector)
            t.runs.append(time.perf_counter() - started)
    t.journals = len(resp.journals)
    return t, resp


def in_process_render(resp: pb.ListResponse, rounds: int) -> dict[str, Timing]:
    """Rendering times of a ListResponse in-process: the table, the JSON and the journalspace YAML."""
    from gazctl.listing import table_text, to_json, to_yaml

    def render(how: Callable[[pb.ListResponse], str]) -> Callable[[], tuple[float, int]]:
        def one() -> tuple[float, int]:
            started = time.perf_counter()
            text = how(resp)
            return time.perf_counter() - started, len(text)

        return one

    return {
        "table": timed(rounds, render(table_text)),
        "json": timed(rounds, render(to_json)),
        "yaml": timed(rounds, render(to_yaml)),
    }


def in_process_flatten(text: str, rounds: int) -> Timing:
    from gazctl.commands.journals.specs import _changes

    def step() -> tuple[float, int]:
        started = time.perf_counter()
        changes = _changes(text, "tree.yaml")
        return time.perf_counter() - started, len(changes)

    return timed(rounds, step)


def print_profile(name: str, path: Path, top: int) -> None:
    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    print(f"--- profile of {name} ({path}), top {top} by cumulative time")
    print(out.getvalue().split("\n", 6)[-1].rstrip())


# --- Report ---------------------------------------------------------------------------------


@dataclass
class Results:
    journals: int = 0
    tree_bytes: int = 0
    steps: dict[str, Timing] = field(default_factory=dict)
    goals: dict[str, str] = field(default_factory=dict)  # step -> goal name
    assigned: int = 0
    idle_wait: float = 0.0
    load_before: str = ""
    profiles: dict[str, Path] = field(default_factory=dict)  # CLI step -> cProfile output


def print_report(args: argparse.Namespace, r: Results) -> None:
    def verdict(step: str, t: Timing) -> tuple[str, str]:
        goal = r.goals.get(step)
        if goal is None:
            return "", "(info)"
        return f"<= {GOALS[goal]:.0f} s", "PASS" if t.best <= GOALS[goal] else "MISS"

    print()
    print(f"gazctl benchmark: {r.journals} journals ({args.topics} topics x {args.parts} parts), one broker, "
          f"one etcd; gazctl runs as `python -m gazctl` subprocesses")
    print(f"  machine: {platform.machine()}, {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), "
          f"{platform.platform()}, Python {platform.python_version()}; load average before the run "
          f"{r.load_before}")
    print(f"  tree: {r.tree_bytes} bytes of YAML; apply batches of --max-txn-size {args.max_txn_size} "
          f"; best and median of {args.rounds} rounds")
    print(f"  the broker assigned {r.assigned} of {r.journals} journals (--broker.limit); "
          f"its allocator was idle {r.idle_wait:.1f} s after the apply")
    print()
    print(f"  {'step':52s} {'best s':>8s} {'median s':>8s} {'journals/s':>11s} {'out bytes':>10s} {'goal':>7s}")
    for step, t in r.steps.items():
        goal, ok = verdict(step, t)
        rate = f"{t.journals / t.best:11.0f}" if t.journals and t.best else f"{'':11s}"
        size = f"{t.out_bytes:10d}" if t.out_bytes else f"{'':10s}"
        print(f"  {step:52s} {t.best:8.3f} {t.median:8.3f} {rate} {size} {goal:>7s}  {ok}")
    cpu = [(step, t) for step, t in r.steps.items() if t.cpu is not None]
    if cpu:
        print()
        print("CPU use during the CLI steps (100% = one core; 'server' is the broker; 'client' is this benchmark "
              "process, idle while the gazctl child processes run):")
        for step, t in cpu:
            print(f"  {step:52s} {t.cpu}; gazctl {t.gazctl_cpu:4.0%}")
    print()
    print("  CLI start-up is `gazctl --help` (Python start-up and gazctl's imports); 'in-process' rows are the")
    print("  same work in this already-started process: the client's list_journals RPC, then rendering its result.")


# --- Main -----------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> None:
    r = Results(journals=args.topics * args.parts, load_before=" ".join(f"{x:.2f}" for x in os.getloadavg()))
    profile_dir = Path(args.profile_cli).resolve() if args.profile_cli else None
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-gazctl-") as tmp_name:
        tmp = Path(tmp_name)
        tree = make_tree(args.topics, args.parts)
        r.tree_bytes = len(tree)
        (tmp / "tree.yaml").write_text(tree)
        with etcd_and_broker(tmp, "--log.level", args.log_level) as broker:
            run_steps(args, r, broker, tmp, profile_dir)
    print_report(args, r)
    if profile_dir is not None:
        for name, path in r.profiles.items():
            print()
            print_profile(name, path, args.profile_top)


def run_steps(args: argparse.Namespace, r: Results, broker: BrokerProcess, tmp: Path, profile_dir: Path | None) -> None:
    gazctl = Gazctl(broker, tmp, profile_dir)
    meter = CpuMeter(broker.proc.pid)
    n = r.journals

    def step(name: str, *cli: str, journals: int = 0, goal: str | None = None, rounds: int | None = None,
             profile: str = "") -> Timing:
        log(f"  {name}")
        cpu: dict[str, CpuUse] = {}
        before = os.times()
        with meter.measure(cpu, name):
            t = timed(rounds or args.rounds, lambda: gazctl.run(*cli))
        after = os.times()
        t.cpu = cpu[name]
        children = (after.children_user - before.children_user) + (after.children_system - before.children_system)
        t.gazctl_cpu = children / t.cpu.wall
        t.journals = journals
        r.steps[name] = t
        if goal:
            r.goals[name] = goal
        if profile and profile_dir is not None:
            gazctl.run(*cli, profile=profile)
        return t

    log("CLI steps")
    step("CLI start-up: gazctl --help", "--help")
    step("apply --dry-run (flatten + validate, no RPC)", "journals", "apply", "--specs", "tree.yaml", "--dry-run",
         journals=n, profile="apply-dry-run")
    r.steps["  in-process: flatten + validate (_changes)"] = flat = in_process_flatten(tree_text(tmp), args.rounds)
    flat.journals = n
    # The apply creates the journals: one round only (again, it would fail: they exist at revision 0).
    step(f"apply --max-txn-size {args.max_txn_size}", "journals", "apply", "--specs", "tree.yaml",
         "--max-txn-size", str(args.max_txn_size), journals=n, goal="apply", rounds=1)
    listing = step("list (table), allocator busy", "journals", "list", journals=n, goal="list")
    if gazctl.lines() < n:
        raise RuntimeError(f"list printed {gazctl.lines()} lines, expected at least {n}")
    log("  waiting for the broker to go idle")
    r.idle_wait = wait_idle(broker.proc.pid, args.idle_timeout) + sum(listing.runs)
    step("list (table)", "journals", "list", journals=n, goal="list", profile="list-table")
    step(f"list -l {LABEL_SELECTOR} (table)", "journals", "list", "-l", LABEL_SELECTOR, journals=n // 10, goal="list",
         profile="list-selector")
    step("list --format yaml", "journals", "list", "--format", "yaml", journals=n, goal="list", profile="list-yaml")
    step("list --format yaml -l group=g3", "journals", "list", "--format", "yaml", "-l", LABEL_SELECTOR,
         journals=n // 10)
    step("list --primary", "journals", "list", "--primary", journals=n)

    log("in-process steps")
    t, resp = asyncio.run(in_process_list(broker.url, pb.LabelSelector(), args.rounds))
    r.steps["  in-process: list_journals (all)"] = t
    r.assigned = sum(1 for j in resp.journals if j.route.primary >= 0)
    from gazctl.selectors import parse_list_selector

    t_sel, _ = asyncio.run(in_process_list(broker.url, parse_list_selector(LABEL_SELECTOR), args.rounds))
    r.steps[f"  in-process: list_journals ({LABEL_SELECTOR})"] = t_sel
    for name, t in in_process_render(resp, args.rounds).items():
        t.journals = len(resp.journals)
        r.steps[f"  in-process: render {name}"] = t
    r.profiles = gazctl.profiles


def tree_text(tmp: Path) -> str:
    return (tmp / "tree.yaml").read_text()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench_gazctl",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--topics", type=int, default=100, help="topic directories of the tree")
    parser.add_argument("--parts", type=int, default=100, help="journals per topic")
    parser.add_argument("--rounds", type=int, default=3, help="runs per measurement; the best is reported")
    parser.add_argument("--max-txn-size", type=int, default=1000, help="apply's --max-txn-size")
    parser.add_argument("--idle-timeout", type=float, default=60.0,
                        help="seconds to wait at most for the broker to go idle after the apply")
    parser.add_argument("--log-level", default="info", help="the broker's --log.level")
    parser.add_argument("--profile-cli", metavar="DIR", default="",
                        help="run each CLI step once more under cProfile, writing DIR/STEP.prof")
    parser.add_argument("--profile-top", type=int, default=25, help="functions listed per profile")
    args = parser.parse_args(argv)
    run(args)


if __name__ == "__main__":
    main()
