"""Benchmark of `gazctl plan` and `gazctl sync` of a 10,000-journal templated spec tree.

Starts a real etcd and one real `gazette serve`, writes a spec directory whose one jinja2
template loops over TOPICS x PARTS journals (`values.yaml` holds the counts), and times the
real CLI (`python -m gazctl`, $BROKER_ADDRESS set) as CI would run it:

* `plan` against an empty cluster (every journal a create), then `sync` (one transaction);
* `plan` and `sync` when the cluster is in sync (nothing to do);
* `plan` and `sync` after a change of the template that updates every journal.

Each timing is the best (and median) of --rounds runs where the step can repeat. The goal
(from the issue) is plan <= 5 s; nothing is asserted.

    python -m tests.benchmarks.bench_gitops [--topics 100] [--parts 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from pathlib import Path

from tests.benchmarks.bench_gazctl import Gazctl, Timing, timed
from tests.benchmarks.stack import etcd_and_broker, log

PLAN_GOAL = 5.0

TEMPLATE = """\
name: bench/
replication: 1
labels:
- name: content-type
  value: application/x-ndjson
fragment:
  length: 134217728
  compression_codec: SNAPPY
  stores:
  - file:///
  refresh_interval: 1m0s
  retention: {{ retention }}
children:
{%- for t in range(topics) %}
- name: bench/topic-{{ '%03d' % t }}/
  labels:
  - name: app.gazette.dev/message-type
    value: Topic{{ t }}
  children:
  {%- for p in range(parts) %}
  - name: bench/topic-{{ '%03d' % t }}/part-{{ '%03d' % p }}
  {%- endfor %}
{%- endfor %}
"""


def write_tree(directory: Path, topics: int, parts: int, retention: str) -> None:
    """The spec directory: one template and its values."""
    directory.mkdir(exist_ok=True)
    (directory / "topics.yaml.j2").write_text(TEMPLATE)
    (directory / "values.yaml").write_text(f"topics: {topics}\nparts: {parts}\nretention: {retention}\n")


def run(args: argparse.Namespace) -> dict[str, Timing]:
    results: dict[str, Timing] = {}
    with tempfile.TemporaryDirectory(prefix="bench-gitops-") as tmp_name:
        tmp = Path(tmp_name)
        specs = tmp / "specs"
        write_tree(specs, args.topics, args.parts, "720h0m0s")
        with etcd_and_broker(tmp, "--log.level", "warn", file_root=False) as broker:
            gazctl = Gazctl(broker, tmp, None)
            common = (str(specs), "--owner", "bench")

            log("plan, every journal a create")
            results["plan (10k creates)"] = timed(args.rounds, lambda: gazctl.run("plan", *common))
            results["plan --format json (10k creates)"] = timed(
                args.rounds, lambda: gazctl.run("plan", *common, "--format", "json"))
            log("sync, one transaction")
            results["sync (10k creates)"] = timed(1, lambda: gazctl.run("sync", *common))
            log("in sync")
            results["plan (in sync)"] = timed(args.rounds, lambda: gazctl.run("plan", *common))
            results["sync (in sync, no-op)"] = timed(args.rounds, lambda: gazctl.run("sync", *common))
            log("a template change that updates every journal")
            write_tree(specs, args.topics, args.parts, "168h0m0s")
            results["plan (10k updates)"] = timed(args.rounds, lambda: gazctl.run("plan", *common))
            results["sync (10k updates)"] = timed(1, lambda: gazctl.run("sync", *common))
            results["plan (in sync again)"] = timed(args.rounds, lambda: gazctl.run("plan", *common))
    return results


def print_report(args: argparse.Namespace, results: dict[str, Timing]) -> None:
    journals = args.topics * args.parts
    print()
    print(f"gazctl plan/sync of a templated tree of {journals} journals "
          f"({os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()})")
    for name, timing in results.items():
        goal = ""
        if name.startswith("plan"):
            goal = f"  goal <= {PLAN_GOAL:.0f} s: {'PASS' if timing.best <= PLAN_GOAL else 'MISS'}"
        print(f"  {name:34} best {timing.best:6.2f} s  median {timing.median:6.2f} s  "
              f"({journals / timing.best:8.0f} journals/s){goal}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--parts", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print_report(args, run(args))


if __name__ == "__main__":
    main()
