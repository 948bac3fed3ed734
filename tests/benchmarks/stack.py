"""What the benchmarks share: the etcd + broker pair every broker benchmark runs against, started and
stopped in one place; progress logging; CPU seconds of a process from /proc; percentiles."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from cluster.keyspace.etcd import EtcdProcess
from tests.support.harness import BrokerProcess, free_port

CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    """Progress of a benchmark, on stderr (the report goes to stdout)."""
    print(msg, file=sys.stderr, flush=True)


def stat_cpu_seconds(stat_path: str) -> float:
    """User + system CPU seconds in a /proc `stat` file (a process's or a thread's); raises OSError if gone."""
    with open(stat_path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    return stat_cpu_seconds(f"/proc/{pid}/stat")


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants (a `gazette serve --broker.processes N`
    supervisor and its brokers); a descendant that exits between the walk and the read counts 0."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            total += cpu_seconds(current)
        except OSError:
            pass
        todo += children.get(current, [])
    return total


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank `q`th percentile (0-100) of an ascending list; NaN if it is empty."""
    if not sorted_values:
        return math.nan
    rank = max(1, min(len(sorted_values), math.ceil(q / 100 * len(sorted_values))))
    return sorted_values[rank - 1]


@contextmanager
def etcd_and_broker(
    tmp: Path,
    *broker_args: str,
    file_root: bool = True,
    etcd_factory: Callable[..., EtcdProcess] = EtcdProcess,
    start_broker: Callable[..., BrokerProcess] = BrokerProcess,
) -> Iterator[BrokerProcess]:
    """A ready broker (keyspace root `/bench`, a `file://` store at `tmp/fragments` if `file_root`) on a
    fresh etcd; on failure the broker's log tail is printed, and both are stopped on exit."""
    etcd = etcd_factory(tmp / "etcd", client_port=free_port(), peer_port=free_port(), log_path=tmp / "etcd.log")
    broker: BrokerProcess | None = None
    try:
        log("starting etcd and the broker")
        etcd.start()
        etcd.wait_ready(30.0)
        if file_root:
            (tmp / "fragments").mkdir(exist_ok=True)
            broker_args = ("--broker.file-root", str(tmp / "fragments"), *broker_args)
        broker = start_broker(tmp, etcd.endpoint, "/bench", *broker_args)
        broker.wait_ready()
        yield broker
    except Exception:
        if broker is not None and broker.proc.poll() is None:
            log(f"broker log tail:\n{broker.logs()[-4000:]}")
        raise
    finally:
        if broker is not None:
            running = broker.proc.poll() is None
            rc = broker.stop()
            if running and rc != 0:
                log(f"broker exited with {rc} when stopped:\n{broker.logs()[-4000:]}")
        etcd.stop()
