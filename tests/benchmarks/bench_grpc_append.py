"""Per-RPC cost of small appends, in the shapes Gazette's own Go clients use.

Gazette's client (broker/client/appender.go) makes one `Append` RPC per synchronous append: a
request naming the journal, one content request, an empty request that commits, a half-close,
then the response and the stream's end. This load generator issues exactly that, over grpc.aio,
from `--procs` client processes (so that the client is not the bottleneck), each writer to its
own journal, one append at a time, dialing that journal's primary (the endpoint of `route.primary`
in a List, as Gazette's route-caching client does), so that with `--broker-args "--broker.processes 2"`
each writer reaches the member that serves its journal, not a proxy:

* 1 writer and 16 writers, 256 B and 4 KiB appends (`--writers`, `--sizes`);
* the same shapes from h2load (nghttp2's C load generator, Debian's `nghttp2-client`), one h2load
  process per writer sending the same three messages and half-close as one HTTP/2 request: a client
  as cheap per RPC as Gazette's Go client, so that on a small host the broker, not a Python client,
  sets the pace (skipped with a note when `h2load` is not on PATH); the appends it logged are checked
  against the journals' write heads, since h2load counts HTTP statuses, not gRPC ones;
* beside them, the client library's `append()` (an HTTP PUT) one at a time, same sizes.

For every shape: appends/s, p50/p99 latency, and the broker's CPU per append (its processes'
user+system seconds from /proc over the shape, divided by the appends: with several broker
processes, the supervisor's and all its members'), with the client processes' CPU per append for
reference. One real etcd and `gazette serve` (replication 1,
file:// store), started here; `--broker-args` passes more flags to it (e.g. `--broker.processes 2`).
With `--peer-bench SCRIPT --peer-python PYTHON` it also runs a peer benchmark script (one that runs
NATS JetStream and Redis Streams and writes its rows as JSON to `--out`) with that interpreter in
the same run, so their one-at-a-time figures print beside ours.

    python -m tests.benchmarks.bench_grpc_append [--seconds 8] [--writers 1,16] [--sizes 256,4096]
        [--procs 4] [--broker-args "--broker.processes 2"] [--peer-bench SCRIPT --peer-python PYTHON]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import grpc

from broker.client import JournalClient, append
from broker.protocol import pb, pb_grpc
from tests.benchmarks.stack import etcd_and_broker, log, percentile, tree_cpu_seconds
from tests.support.harness import (
    BrokerProcess,
    apply_specs,
    journal_spec,
    list_routes,
    wait_for_primary,
    wait_http_ready,
)

APPEND_METHOD = "/protocol.Journal/Append"


@dataclass
class Shape:
    """One measured shape: `writers` concurrent synchronous appends of `size` bytes over `path`."""

    path: str  # "grpc" (a grpc.aio client), "h2load" (gRPC from h2load) or "http" (PUT)
    writers: int
    size: int
    appends: int = 0
    seconds: float = 0.0
    latencies: tuple[float, ...] = ()
    broker_cpu: float = 0.0
    client_cpu: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.path} {self.writers}w {self.size} B"


async def grpc_writer(target: str, journal: str, payload: bytes, until: float, warmup: float) -> list[float]:
    """One writer: Append RPCs in Go's shape, one at a time, until `until`; latencies after `warmup`."""
    latencies: list[float] = []
    header = pb.AppendRequest(journal=journal).SerializeToString()
    content = pb.AppendRequest(content=payload).SerializeToString()
    async with grpc.aio.insecure_channel(target) as channel:
        rpc = channel.stream_unary(APPEND_METHOD, request_serializer=None,
                                   response_deserializer=pb.AppendResponse.FromString)
        while (now := time.perf_counter()) < until:
            call = rpc()
            await call.write(header)
            await call.write(content)
            await call.write(b"")
            await call.done_writing()
            resp: pb.AppendResponse = await call
            if resp.status != pb.OK:
                raise RuntimeError(f"append to {journal}: {pb.Status.Name(resp.status)}")
            if now >= warmup:
                latencies.append(time.perf_counter() - now)
    return latencies


async def http_writer(target: str, journal: str, payload: bytes, until: float, warmup: float) -> list[float]:
    """One writer: the client library's `append()` (HTTP PUT), one at a time."""
    latencies: list[float] = []
    async with JournalClient(target) as client:
        while (now := time.perf_counter()) < until:
            await append(client, journal, payload)
            if now >= warmup:
                latencies.append(time.perf_counter() - now)
    return latencies


def client_main(spec: str) -> None:
    """A client process: run its writers and print their latencies as JSON."""
    args = json.loads(spec)
    writer = grpc_writer if args["path"] == "grpc" else http_writer
    payload = os.urandom(args["size"] // 2).hex().encode()[: args["size"]]

    async def run() -> list[list[float]]:
        return await asyncio.gather(*(
            writer(target, j, payload, args["until"], args["warmup"]) for j, target in args["targets"].items()))

    out = asyncio.run(run())
    print(json.dumps({"latencies": [x for w in out for x in w], "cpu": time.process_time()}))


def measure(shape: Shape, broker: BrokerProcess, primaries: dict[str, str], procs: int, seconds: float) -> None:
    """Run `shape` over `procs` client processes (each a share of the writers, each writer to its journal
    of `primaries` at that journal's primary endpoint) and fill in its figures."""
    journals = list(primaries)
    procs = max(1, min(procs, shape.writers))
    start = time.perf_counter() + 1.5  # Client processes start (imports) before the clock runs.
    warmup, until = start + 1.0, start + 1.0 + seconds
    # perf_counter is CLOCK_MONOTONIC on Linux: the same clock in every process of this host.
    groups = [journals[i::procs] for i in range(procs)]
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.benchmarks.bench_grpc_append", "--client", json.dumps({
                "path": shape.path, "size": shape.size, "until": until, "warmup": warmup,
                "targets": {j: primaries[j].removeprefix("http://") if shape.path == "grpc" else primaries[j]
                            for j in group}})],
            stdout=subprocess.PIPE)
        for group in groups if group
    ]
    while time.perf_counter() < warmup:
        time.sleep(0.005)
    cpu0 = tree_cpu_seconds(broker.proc.pid)
    while time.perf_counter() < until:
        time.sleep(0.005)
    cpu1 = tree_cpu_seconds(broker.proc.pid)
    latencies: list[float] = []
    for child in children:
        out, _ = child.communicate(timeout=120)
        if child.returncode != 0:
            raise RuntimeError(f"client process of {shape.name} failed ({child.returncode})")
        result = json.loads(out)
        latencies += result["latencies"]
        shape.client_cpu += result["cpu"]
    shape.latencies = tuple(sorted(latencies))
    shape.appends = len(latencies)
    shape.seconds = seconds
    shape.broker_cpu = cpu1 - cpu0


def grpc_body(journal: str, payload: bytes) -> bytes:
    """An Append as Gazette's client sends it, framed as gRPC messages: the journal, the content, the commit."""
    messages = (pb.AppendRequest(journal=journal), pb.AppendRequest(content=payload), pb.AppendRequest())
    return b"".join(b"\x00" + struct.pack(">I", len(m)) + m for m in (m.SerializeToString() for m in messages))


def write_head(endpoint: str, journal: str) -> int:
    """The journal's write head, asked of `endpoint` (a metadata-only, non-blocking Read)."""
    with grpc.insecure_channel(endpoint.removeprefix("http://")) as channel:
        for resp in pb_grpc.JournalStub(channel).Read(
                pb.ReadRequest(journal=journal, offset=-1, block=False, metadata_only=True)):
            return int(resp.write_head)
    raise RuntimeError(f"no Read response for {journal}")


def measure_h2load(shape: Shape, broker: BrokerProcess, primaries: dict[str, str], seconds: float, tmp: Path) -> None:
    """Run `shape` with one h2load process per writer (one HTTP/2 connection, one RPC at a time)."""
    payload = os.urandom(shape.size // 2).hex().encode()[: shape.size]
    heads = {j: write_head(e, j) for j, e in primaries.items()}
    children = []
    for journal, endpoint in primaries.items():
        name = journal.replace("/", "_")
        body, log_file = tmp / f"{name}.body", tmp / f"{name}.{shape.writers}w.{shape.size}.log"
        body.write_bytes(grpc_body(journal, payload))
        children.append((log_file, subprocess.Popen(
            ["h2load", "-c", "1", "-m", "1", "--warm-up-time", "1", "-D", f"{seconds:g}", "-d", str(body),
             "-H", "content-type: application/grpc", "-H", "te: trailers", f"--log-file={log_file}",
             f"{endpoint}/protocol.Journal/Append"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
    started = time.perf_counter()
    measured_from = time.time() + 1.0
    time.sleep(1.0)
    cpu0 = tree_cpu_seconds(broker.proc.pid)
    time.sleep(max(0.0, started + 1.0 + seconds - time.perf_counter()))
    cpu1 = tree_cpu_seconds(broker.proc.pid)
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    for log_file, child in children:
        out, _ = child.communicate(timeout=seconds + 60)
        if child.returncode != 0 or not log_file.exists():
            raise RuntimeError(f"h2load of {shape.name} failed ({child.returncode}): {out.decode()[-400:]}")
        for line in log_file.read_text().splitlines():
            start_us, status, elapsed_us = line.split("\t")[:3]
            statuses[status] += 1
            if int(start_us) / 1e6 >= measured_from:
                latencies.append(int(elapsed_us) / 1e6)
    appended = sum(write_head(e, j) - heads[j] for j, e in primaries.items()) // shape.size
    # h2load logs the requests after its warm-up only: at least as many appends as it logged must have landed.
    if set(statuses) != {"200"} or appended < sum(statuses.values()):
        raise RuntimeError(f"{shape.name}: HTTP statuses {dict(statuses)}, but {appended} appends landed")
    shape.latencies = tuple(sorted(latencies))
    shape.appends = len(latencies)
    shape.seconds = seconds
    shape.broker_cpu = cpu1 - cpu0


def peer_latencies(script: str, python: str, sizes: list[int], seconds: float) -> list[str]:
    """The peer benchmark's rows (NATS JetStream, Redis) for `sizes`, as printed lines."""
    if not Path(script).exists():
        return [f"(no {script})"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peers.json"
        cmd = [python, script, "--out", str(out), "--lat-seconds", str(seconds)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0 or not out.exists():
            return [f"(peer_bench failed: {proc.stderr.strip()[-400:]})"]
        rows = json.loads(out.read_text())
    rows = rows.get("rows", rows) if isinstance(rows, dict) else rows
    lines = []
    for row in rows:
        text = json.dumps(row)
        if "lat" in text and any(f'"{s}"' in text or f": {s}," in text for s in sizes):
            lines.append(text)
    return lines or [json.dumps(r) for r in rows]


def print_report(shapes: list[Shape], broker_args: str, peers: list[str], primaries: dict[str, str]) -> None:
    spread = Counter(primaries.values())
    print(f"# gRPC Append in Go's shape vs HTTP PUT ({os.cpu_count()} cores; broker args: {broker_args or '-'}; "
          f"journals' primaries: {', '.join(f'{e} {n}' for e, n in sorted(spread.items()))})")
    print(f"{'shape':<22} {'appends/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'broker us/append':>17} "
          f"{'client us/append':>17}")
    for s in shapes:
        n = max(1, s.appends)
        print(f"{s.name:<22} {s.appends / s.seconds:>10,.0f} {percentile(list(s.latencies), 50) * 1e3:>8.2f} "
              f"{percentile(list(s.latencies), 99) * 1e3:>8.2f} {s.broker_cpu / n * 1e6:>17,.0f} "
              f"{'-' if s.path == 'h2load' else f'{s.client_cpu / n * 1e6:,.0f}':>17}")
    if peers:
        print("# peer_bench.py latency cases (same run)")
        for line in peers:
            print(line)


def run(args: argparse.Namespace) -> None:
    writers = [int(w) for w in args.writers.split(",")]
    sizes = [int(s) for s in args.sizes.split(",")]
    shapes = [Shape("grpc", w, s) for w in writers for s in sizes]
    h2load = shutil.which("h2load") is not None
    if h2load:
        shapes += [Shape("h2load", w, s) for w in writers for s in sizes]
    else:
        log("no h2load on PATH (Debian: nghttp2-client): the h2load shapes are skipped")
    shapes += [Shape("http", 1, s) for s in sizes]
    journals = [f"bench/w{i:02d}" for i in range(max(writers))]
    broker_args = shlex.split(args.broker_args)
    processes = int(broker_args[broker_args.index("--broker.processes") + 1]) \
        if "--broker.processes" in broker_args else 1
    with tempfile.TemporaryDirectory() as tmp, etcd_and_broker(Path(tmp), *broker_args) as broker:
        for i in range(1, processes):  # Every member is up before the journals are assigned, so they spread.
            wait_http_ready(f"broker process {i}", f"http://127.0.0.1:{broker.port + i}", broker.proc, broker.logs)
        with grpc.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
            stub = pb_grpc.JournalStub(channel)
            specs = [journal_spec(j) for j in journals]
            for spec in specs:
                spec.fragment.length = 256 << 20
            apply_specs(stub, *specs)
            for j in journals:
                wait_for_primary(stub, j)
        routes = list_routes([broker.stub], journals, 10.0)
        primaries = {name: route.endpoints[route.primary] for name, route in routes.items()}
        for shape in shapes:
            log(f"measuring {shape.name}")
            targets = {j: primaries[j] for j in journals[: shape.writers]}
            if shape.path == "h2load":
                measure_h2load(shape, broker, targets, args.seconds, Path(tmp))
            else:
                measure(shape, broker, targets, args.procs, args.seconds)
    peers = peer_latencies(args.peer_bench, args.peer_python, sizes, args.seconds) if args.peer_bench else []
    print_report(shapes, args.broker_args, peers, primaries)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=8, help="measured seconds per shape (after 1 s warm-up)")
    parser.add_argument("--writers", default="1,16", help="writer counts, comma-separated")
    parser.add_argument("--sizes", default="256,4096", help="append sizes in bytes, comma-separated")
    parser.add_argument("--procs", type=int, default=4, help="client processes sharing the writers")
    parser.add_argument("--broker-args", default="", help="more flags for `gazette serve`, as one string")
    parser.add_argument("--peer-bench", metavar="SCRIPT", default="",
                        help="also run this peer benchmark script (NATS JetStream, Redis) in the same run")
    parser.add_argument("--peer-python", metavar="PYTHON", default=sys.executable,
                        help="the interpreter that runs --peer-bench (one with its clients installed)")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        client_main(args.client)
    else:
        run(args)


if __name__ == "__main__":
    main()
