"""Benchmark of `gazctl plan` and `gazctl sync` of a templated tree of 10,000 journals and 10,000 shards.

Starts a real etcd, one real `gazette serve` and one real `gazette consume
examples.stream_sum:summer` (whose Shard API sync applies shards through), writes a spec
directory of bench_gitops's jinja2 template of TOPICS x PARTS journals plus a shardspace whose
one template (`for_each_journal: prefix=bench/`) makes a shard per journal, and times the real
CLI (`python -m gazctl`, $BROKER_ADDRESS and $CONSUMER_ADDRESS set) as CI would run it:

* `plan` against an empty cluster (every journal and shard a create), then `sync`;
* `plan` and `sync` when the cluster is in sync (nothing to do);
* `plan` and `sync` after a change of both templates that updates every journal and shard.

The shards are `disable: true`, so the consumer assigns none of them: this measures the
control plane, not 10,000 running shards. Each timing is the best (and median) of --rounds runs
where the step can repeat. The goal (from the issue) is plan <= 5 s; nothing is asserted.

    python -m tests.benchmarks.bench_gitops_shards [--topics 100] [--parts 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from cluster.keyspace.etcd import EtcdProcess
from tests.benchmarks.bench_gazctl import Gazctl, Timing, timed
from tests.benchmarks.bench_gitops import write_tree
from tests.benchmarks.stack import etcd_and_broker, log
from tests.support.harness import ROOT, BrokerProcess, free_port, wait_http_ready

PLAN_GOAL = 5.0

SHARDS = """\
common:
  max_txn_duration: {txn}
  disable: true
  labels:
  - name: app
    value: bench
shards:
- id: "{{journal}}"
  for_each_journal: prefix=bench/
"""


def write_shards(directory: Path, txn: str) -> None:
    (directory / "shards.yaml").write_text(SHARDS.format(txn=txn))


class Consumer:
    """`python -m consumer consume examples.stream_sum:summer`, on the benchmark's etcd."""

    def __init__(self, tmp: Path, broker: BrokerProcess, etcd: str) -> None:
        self.port = free_port()
        self.log_path = tmp / "consumer.log"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CONSUMER_", "ETCD_", "BROKER_", "LOG_", "STREAM_SUM_"))}
        env.update({"PYTHONPATH": str(ROOT), "STREAM_SUM_SQLITE_DIR": str(tmp / "sums")})
        args = [
            sys.executable, "-m", "consumer", "consume", "examples.stream_sum:summer",
            "--consumer.id", "bench", "--consumer.port", str(self.port), "--consumer.host", "127.0.0.1",
            "--consumer.bind", "127.0.0.1", "--broker.address", broker.url, "--etcd.address", etcd,
            "--etcd.prefix", "/bench-consumer", "--log.level", "warn",
        ]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 60.0) -> None:
        wait_http_ready("consumer", f"http://127.0.0.1:{self.port}", self.proc, self.log_path.read_text, timeout)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        self._log.close()


def run(args: argparse.Namespace) -> dict[str, Timing]:
    results: dict[str, Timing] = {}
    etcds: list[EtcdProcess] = []

    def etcd_factory(*a: Any, **k: Any) -> EtcdProcess:
        etcds.append(EtcdProcess(*a, **k))
        return etcds[-1]

    with tempfile.TemporaryDirectory(prefix="bench-gitops-shards-") as tmp_name:
        tmp = Path(tmp_name)
        specs = tmp / "specs"
        write_tree(specs, args.topics, args.parts, "720h0m0s")
        write_shards(specs, "1s")
        with etcd_and_broker(tmp, "--log.level", "warn", file_root=False, etcd_factory=etcd_factory) as broker:
            consumer = Consumer(tmp, broker, etcds[0].endpoint)
            try:
                consumer.wait_ready()
                gazctl = Gazctl(broker, tmp, None)
                gazctl.env["CONSUMER_ADDRESS"] = consumer.url
                common = (str(specs), "--owner", "bench")

                log("plan, every journal and shard a create")
                results["plan (all created)"] = timed(args.rounds, lambda: gazctl.run("plan", *common))
                results["plan --format json (all created)"] = timed(
                    args.rounds, lambda: gazctl.run("plan", *common, "--format", "json"))
                log("sync: journals, then shards")
                results["sync (all created)"] = timed(1, lambda: gazctl.run("sync", *common))
                log("in sync")
                results["plan (in sync)"] = timed(args.rounds, lambda: gazctl.run("plan", *common))
                results["sync (in sync, no-op)"] = timed(args.rounds, lambda: gazctl.run("sync", *common))
                results["shards list --format json"] = timed(
                    args.rounds, lambda: gazctl.run("shards", "list", "--format", "json"))
                results["shards list (table)"] = timed(args.rounds, lambda: gazctl.run("shards", "list"))
                log("a change of both templates that updates every journal and shard")
                write_tree(specs, args.topics, args.parts, "168h0m0s")
                write_shards(specs, "2s")
                results["plan (all updated)"] = timed(args.rounds, lambda: gazctl.run("plan", *common))
                results["sync (all updated)"] = timed(1, lambda: gazctl.run("sync", *common))
                results["plan (in sync again)"] = timed(args.rounds, lambda: gazctl.run("plan", *common))
            finally:
                consumer.stop()
    return results


def print_report(args: argparse.Namespace, results: dict[str, Timing]) -> None:
    journals = args.topics * args.parts
    print()
    print(f"gazctl plan/sync of a templated tree of {journals} journals and {journals} shards "
          f"({os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()})")
    for name, timing in results.items():
        goal = ""
        if name.startswith("plan"):
            goal = f"  goal <= {PLAN_GOAL:.0f} s: {'PASS' if timing.best <= PLAN_GOAL else 'MISS'}"
        print(f"  {name:34} best {timing.best:6.2f} s  median {timing.median:6.2f} s{goal}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--parts", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print_report(args, run(args))


if __name__ == "__main__":
    main()
