"""Benchmark of `gazctl shards list` over 10,000 shards.

Starts a real etcd, one `gazette serve` and one `gazette consume tests.support.cli_apps:app`
process, applies --shards shard specs (each reading its own journal; `disable: true`, so the
one consumer process is not asked to run 10,000 replicas: List reports specs, statuses and
routes the same way) through the Shard API in transactions of 500, then times the real CLI
(`python -m gazctl shards list`, $CONSUMER_ADDRESS set) as a user runs it: the table (to a
file), `--format json` and `--format yaml`, best and median of --rounds; plus the List RPC
alone in this process, and gazctl's start-up (`shards list --help`) for scale. The goal (from
the issue) is `shards list` of 10,000 shards <= 1 s; nothing is asserted.

    python -m tests.benchmarks.bench_shards_list [--shards 10000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from google.protobuf.duration_pb2 import Duration

from consumer.protocol import pb as cpb
from consumer.protocol import pb_grpc as cpb_grpc
from tests.benchmarks.bench_gazctl import Timing, timed
from tests.benchmarks.stack import etcd_and_broker, log
from tests.support.harness import ROOT, BrokerProcess, free_port, gazctl_env, wait_http_ready

LIST_GOAL = 1.0
APPLY_BATCH = 500


def start_consumer(tmp: Path, broker: BrokerProcess, etcd: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONSUMER_", "ETCD_", "BROKER_", "LOG_"))}
    env.update({"PYTHONPATH": str(ROOT), "GAZETTE_TEST_COUNTS_DB": str(tmp / "counts.db")})
    args = [
        sys.executable, "-m", "consumer", "consume", "tests.support.cli_apps:app", "--consumer.id", "bench",
        "--consumer.port", str(port), "--consumer.host", "127.0.0.1", "--consumer.bind", "127.0.0.1",
        "--broker.address", broker.url, "--etcd.address", etcd, "--etcd.prefix", "/bench-shards",
    ]
    proc = subprocess.Popen(args, stdout=open(tmp / "consumer.log", "wb"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ready("consumer", url, proc, (tmp / "consumer.log").read_text, 60.0)
    except Exception:
        proc.kill()
        raise
    return proc, url


def shard(i: int) -> cpb.ShardSpec:
    spec = cpb.ShardSpec(id=f"bench/shard-{i:05d}", max_txn_duration=Duration(seconds=1), disable=True,
                         hot_standbys=1, recovery_log_prefix="bench/recovery", hint_prefix="/bench-hints")
    spec.sources.add(journal=f"bench/topic-{i // 100:03d}/part-{i % 100:03d}")
    spec.labels.labels.add(name="app", value="bench")
    spec.labels.labels.add(name="topic", value=f"topic-{i // 100:03d}")
    return spec


async def apply_shards(address: str, count: int) -> float:
    started = time.perf_counter()
    async with grpc.aio.insecure_channel(address.removeprefix("http://")) as channel:
        stub = cpb_grpc.ShardStub(channel)
        for begin in range(0, count, APPLY_BATCH):
            changes = [cpb.ApplyRequest.Change(upsert=shard(i)) for i in range(begin, min(begin + APPLY_BATCH, count))]
            resp = await stub.Apply(cpb.ApplyRequest(changes=changes), timeout=120)
            if resp.status != cpb.OK:
                raise RuntimeError(f"Apply failed: {resp}")
    return time.perf_counter() - started


async def list_rpc(address: str, rounds: int) -> tuple[Timing, int]:
    t = Timing()
    count = 0
    options = [("grpc.max_receive_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(address.removeprefix("http://"), options=options) as channel:
        stub = cpb_grpc.ShardStub(channel)
        for _ in range(rounds):
            started = time.perf_counter()
            resp = await stub.List(cpb.ListRequest(), timeout=120)
            t.runs.append(time.perf_counter() - started)
            count = len(resp.shards)
    return t, count


def gazctl(env: dict[str, str], tmp: Path, *args: str) -> tuple[float, int]:
    out_path = tmp / "stdout"
    with open(out_path, "wb") as out:
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "gazctl", *args], stdout=out, stderr=subprocess.PIPE, env=env,
                              cwd=tmp)
        elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"gazctl {' '.join(args)} exited {proc.returncode}: {proc.stderr.decode()[-2000:]}")
    return elapsed, out_path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-shards-list-") as tmp_name:
        tmp = Path(tmp_name)
        etcd: list[str] = []

        def start_broker(tmp: Path, endpoint: str, *rest: str) -> BrokerProcess:
            etcd.append(endpoint)
            return BrokerProcess(tmp, endpoint, *rest)

        with etcd_and_broker(tmp, file_root=False, start_broker=start_broker) as broker:
            proc, url = start_consumer(tmp, broker, etcd[0])
            try:
                log(f"applying {args.shards:,} shard specs")
                applied = asyncio.run(apply_shards(url, args.shards))
                env = gazctl_env(None, tmp)
                env["CONSUMER_ADDRESS"] = url
                log("timing gazctl shards list")
                startup = timed(args.rounds, lambda: gazctl(env, tmp, "shards", "list", "--help"))
                table = timed(args.rounds, lambda: gazctl(env, tmp, "shards", "list"))
                as_json = timed(args.rounds, lambda: gazctl(env, tmp, "shards", "list", "--format", "json"))
                as_yaml = timed(args.rounds, lambda: gazctl(env, tmp, "shards", "list", "--format", "yaml"))
                selected = timed(args.rounds, lambda: gazctl(env, tmp, "shards", "list", "-l", "topic=topic-007"))
                rpc, listed = asyncio.run(list_rpc(url, args.rounds))
            finally:
                proc.terminate()
                proc.wait(60)

    def row(name: str, t: Timing, goal: float | None = None, extra: str = "") -> None:
        verdict = "" if goal is None else ("PASS" if t.best <= goal else "MISS")
        goal_text = f"<= {goal:.1f} s" if goal is not None else ""
        print(f"  {name:<46} {t.best:7.3f} s {t.median:7.3f} s  {goal_text:>9} {verdict:>5}  {extra}")

    print(f"gazctl shards list: {args.shards:,} shards on one `gazette consume`, best/median of {args.rounds}")
    print(f"  machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"  applied through the Shard API in {applied:.1f} s ({APPLY_BATCH} a transaction); List returned {listed:,}")
    print(f"  {'step':<46} {'best':>9} {'median':>9}  {'goal':>9}")
    row("shards list (table, to a file)", table, LIST_GOAL, f"{table.out_bytes:,} bytes")
    row("shards list --format json", as_json, LIST_GOAL, f"{as_json.out_bytes:,} bytes")
    row("shards list --format yaml", as_yaml, None, f"{as_yaml.out_bytes:,} bytes")
    row("shards list -l topic=topic-007 (100 shards)", selected, None)
    row("List RPC alone, in process", rpc, None)
    row("gazctl start-up (shards list --help)", startup, None)


if __name__ == "__main__":
    main()
