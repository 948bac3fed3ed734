"""Benchmark of one broker's append and read paths, against raw baselines measured in the same run.

Starts a real etcd and one real `gazette serve` (file:// store under a temp dir), applies two
journals with replication 1 and 512 MiB fragments (bench/none: NONE codec, bench/snappy: SNAPPY)
and a third (bench/small, NONE) for small appends, then measures from one grpc.aio client:

* append throughput of 1 MiB content chunks, in three shapes: one Append streaming all chunks,
  one Append per chunk sent one after another, and one Append per chunk with several in flight;
* read throughput: a non-blocking Read from offset 0 to the write head (`end_offset`);
* appends/s and p50/p90/p99 latency of 4 KiB appends from concurrent closed-loop writers to one
  journal, written through one shared AppendService of the client library (the judged figure:
  it is how Gazette clients write small records) and, for comparison, one Append RPC per write;

and, as baselines, a grpc.aio client stream of 1 MiB bytes messages to a trivial grpc.aio server
in a separate process over TCP loopback (as the broker is), the same server taking append-shaped
4 KiB client streams from the same number of writers, server streams of 1 MiB, 256 KiB and 32 KiB
messages (for reference), and python-snappy StreamCompressor speed on the same data.
The client sends each AppendRequest serialized once up front (bytes through the Append method),
as the raw baseline sends pre-built bytes messages: the two then differ only in their server.
CPU use of the broker's event-loop thread, its other threads and the client is printed per phase.
Content is semi-compressible newline-delimited JSON events with random ids, timestamps and values.
MB is 10^6 bytes. The report goes to stdout, progress to stderr.

    python -m tests.benchmarks.bench_broker [--mib 256] [--rounds 3] [--writers 16]
        [--small-appends 4000] [--profile-broker broker.prof [--profile-phase append-none]]

With --profile-broker the broker runs under cProfile during one phase only (its numbers are then
skewed by the profiler) and the top functions by cumulative and own time are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import platform
import pstats
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import snappy

from broker.client import AppendService, JournalClient
from broker.protocol import pb, pb_grpc
from tests.benchmarks.stack import etcd_and_broker, log, percentile, stat_cpu_seconds
from tests.support.harness import BrokerProcess, apply_specs, journal_spec, wait_for_primary

MiB = 1 << 20
MB = 1e6
CHUNK = MiB
FRAGMENT_LENGTH = 512 * MiB
POOL_CHUNKS = 16  # Distinct 1 MiB chunks of content, cycled.
CHANNEL_OPTIONS = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
SINK_METHOD = "/bench.Bench/Sink"
APPEND_METHOD = "/protocol.Journal/Append"
SOURCE_METHOD = "/bench.Bench/Source"

GOALS = {"append_none": 0.40, "read_none": 0.50, "append_snappy": 0.70, "p99_ms": 5.0}


# --- Content --------------------------------------------------------------------------------


def make_content(total: int, seed: int = 7) -> bytes:
    """Newline-delimited JSON events: fixed keys, random ids, timestamps, users and values."""
    rng = random.Random(seed)
    events = ("page_view", "click", "add_to_cart", "purchase", "search", "logout", "login", "share")
    countries = ("US", "DE", "FR", "BR", "IN", "JP", "GB", "CA", "MX", "NG")
    out = io.StringIO()
    size = 0
    ts = 1_712_000_000_000
    while size < total:
        ts += rng.randrange(0, 50)
        line = (
            f'{{"id":"{rng.getrandbits(128):032x}","ts":{ts},"user":"user-{rng.randrange(1_000_000):06d}",'
            f'"event":"{rng.choice(events)}","country":"{rng.choice(countries)}",'
            f'"session":"{rng.getrandbits(64):016x}","value":{rng.random() * 1000:.4f},'
            f'"ok":{"true" if rng.random() < 0.97 else "false"}}}\n'
        )
        out.write(line)
        size += len(line)
    return out.getvalue().encode()[:total]


def chunks_of(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data) - size + 1, size)]


# --- Raw baselines ----------------------------------------------------------------------------


async def _sink(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
    total = 0
    async for chunk in requests:
        total += len(chunk)
    return str(total).encode()


_SOURCE_PAYLOAD = os.urandom(CHUNK)


async def _source(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    size, count = (int(x) for x in request.split(b","))
    payload = _SOURCE_PAYLOAD[:size]
    for _ in range(count):
        yield payload


async def serve_sink() -> None:
    """The raw baseline's server process: prints its port, serves until SIGTERM."""
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    handler = grpc.method_handlers_generic_handler(
        "bench.Bench",
        {
            "Sink": grpc.stream_unary_rpc_method_handler(_sink),
            "Source": grpc.unary_stream_rpc_method_handler(_source),
        },
    )
    server.add_generic_rpc_handlers([handler])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print(port, flush=True)
    await stop.wait()
    await server.stop(None)


@contextmanager
def sink_process() -> Iterator[tuple[str, int]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.benchmarks.bench_broker", "--sink-server"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


async def raw_client_stream(target: str, payloads: list[bytes], count: int) -> float:
    """Bytes/second of one client stream of `count` messages (cycling `payloads`) to the sink."""
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        await channel.channel_ready()
        sink = channel.stream_unary(SINK_METHOD)
        started = time.perf_counter()
        call = sink()
        for i in range(count):
            await call.write(payloads[i % len(payloads)])
        await call.done_writing()
        reply = await call
        elapsed = time.perf_counter() - started
        size = sum(len(payloads[i % len(payloads)]) for i in range(count))
        assert int(reply) == size, reply
        return size / elapsed


async def raw_server_stream(target: str, size: int, count: int) -> float:
    """Bytes/second of one server stream of `count` messages of `size` bytes from the source."""
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        await channel.channel_ready()
        source = channel.unary_stream(SOURCE_METHOD)
        started = time.perf_counter()
        total = 0
        async for msg in source(f"{size},{count}".encode()):
            total += len(msg)
        elapsed = time.perf_counter() - started
        assert total == size * count
        return total / elapsed


def snappy_speed(chunks: list[bytes], total_mib: int) -> tuple[float, float]:
    """(uncompressed bytes/second, compressed/raw ratio) of one StreamCompressor over the chunks."""
    comp = snappy.StreamCompressor()
    n = max(1, total_mib * MiB // CHUNK)
    out = 0
    started = time.perf_counter()
    for i in range(n):
        out += len(comp.add_chunk(chunks[i % len(chunks)]))
    elapsed = time.perf_counter() - started
    return n * CHUNK / elapsed, out / (n * CHUNK)


def disk_write_speed(directory: Path, chunks: list[bytes], total_mib: int) -> tuple[float, float]:
    """(bytes/second of the first `CHUNK`-sized quarter, of all) writing `total_mib` MiB in 1 MiB
    pwrites to a new unlinked file in `directory`, as a broker's spool does, then fsync."""
    n = max(4, total_mib * MiB // CHUNK)
    fd = os.open(directory, getattr(os, "O_TMPFILE", 0) | os.O_RDWR, 0o600)
    try:
        started = time.perf_counter()
        first = 0.0
        for i in range(n):
            os.pwrite(fd, chunks[i % len(chunks)], i * CHUNK)
            if i + 1 == n // 4:
                first = (i + 1) * CHUNK / (time.perf_counter() - started)
        os.fsync(fd)
        return first, n * CHUNK / (time.perf_counter() - started)
    finally:
        os.close(fd)


# --- Broker phases --------------------------------------------------------------------------


@dataclass
class Latency:
    """A closed-loop run of small operations: rate and latency percentiles in milliseconds."""

    rate: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, rate: float, latencies: list[float]) -> Latency:
        ordered = sorted(latencies)
        ms = [percentile(ordered, q) * 1e3 for q in (50, 90, 99)]
        return cls(rate, ms[0], ms[1], ms[2], ordered[-1] * 1e3)

    def __str__(self) -> str:
        return f"{self.rate:6.0f}/s, p50 {self.p50:.2f} ms, p90 {self.p90:.2f} ms, p99 {self.p99:.2f} ms"


@dataclass
class Results:
    raw_grpc: float = 0.0
    # Per round of a phase: (the phase's best rate in the round, a raw gRPC client stream of the same
    # volume run just before the round, in the same conditions).
    paired: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    raw_server_stream: dict[int, float] = field(default_factory=dict)
    snappy: float = 0.0
    append: dict[str, dict[str, float]] = field(default_factory=dict)  # codec -> shape -> B/s
    small: Latency | None = None  # One Append RPC per write.
    small_service: Latency | None = None  # Writes through the client library's AppendService.
    small_batch: float = 0.0  # Writes per Append RPC of the AppendService phase.
    raw_small: Latency | None = None
    disk_first: float = 0.0  # Raw spool-disk write speed of the first quarter, and of all of it.
    disk: float = 0.0
    cpu: dict[str, CpuUse] = field(default_factory=dict)
    load_before: str = ""


AppendRpc = grpc.aio.StreamUnaryMultiCallable
"""Append with requests sent as serialized bytes: the client serializes each content message once
up front, as the raw baseline sends pre-built bytes, so that both compare servers."""


def append_rpc(channel: grpc.aio.Channel) -> AppendRpc:
    return channel.stream_unary(APPEND_METHOD, request_serializer=None,
                                response_deserializer=pb.AppendResponse.FromString)


def content_requests(chunks: list[bytes]) -> list[bytes]:
    """Serialized content-only AppendRequests of `chunks`."""
    return [pb.AppendRequest(content=c).SerializeToString() for c in chunks]


async def append_once(rpc: AppendRpc, journal: str, content: Iterator[bytes]) -> int:
    """One Append RPC of the given serialized content requests; returns the commit's end offset."""
    call = rpc()
    await call.write(pb.AppendRequest(journal=journal).SerializeToString())
    for req in content:
        await call.write(req)
    await call.write(b"")  # The empty AppendRequest that commits.
    await call.done_writing()
    resp: pb.AppendResponse = await call
    if resp.status != pb.OK:
        raise RuntimeError(f"append to {journal}: {pb.Status.Name(resp.status)}")
    return int(resp.commit.end)


async def append_shape(
    rpc: AppendRpc, journal: str, reqs: list[bytes], count: int, shape: str, inflight: int
) -> tuple[float, int]:
    """(bytes/second, write head) of appending `count` 1 MiB chunks in the given shape."""
    head = 0
    started = time.perf_counter()
    if shape == "stream":
        head = await append_once(rpc, journal, (reqs[i % len(reqs)] for i in range(count)))
    elif shape == "serial":
        for i in range(count):
            head = await append_once(rpc, journal, iter([reqs[i % len(reqs)]]))
    else:
        sem = asyncio.Semaphore(inflight)

        async def one(i: int) -> int:
            async with sem:
                return await append_once(rpc, journal, iter([reqs[i % len(reqs)]]))

        head = max(await asyncio.gather(*(one(i) for i in range(count))))
    elapsed = time.perf_counter() - started
    return count * CHUNK / elapsed, head


async def read_range(stub: pb_grpc.JournalStub, journal: str, end: int) -> tuple[float, int, bytes]:
    """(bytes/second, bytes read, first MiB) of a non-blocking Read of [0, end)."""
    started = time.perf_counter()
    total = 0
    expect = 0
    head: list[bytes] = []
    head_len = 0
    async for resp in stub.Read(pb.ReadRequest(journal=journal, offset=0, end_offset=end)):
        if resp.status != pb.OK:
            raise RuntimeError(f"read of {journal}: {pb.Status.Name(resp.status)}")
        if resp.content:
            if resp.offset != expect:
                raise RuntimeError(f"read of {journal}: content at {resp.offset}, expected {expect}")
            total += len(resp.content)
            expect += len(resp.content)
            if head_len < CHUNK:
                head.append(resp.content)
                head_len += len(resp.content)
        elif resp.offset:
            expect = resp.offset
    elapsed = time.perf_counter() - started
    return total / elapsed, total, b"".join(head)[:CHUNK]


async def closed_loop(op: Callable[[int], Awaitable[object]], writers: int, total: int) -> Latency:
    """Rate and latencies of `total` calls of `op(i)` made by `writers` tasks, each one call at a time."""
    latencies: list[float] = []
    remaining = total

    async def writer(w: int) -> None:
        nonlocal remaining
        i = w
        while remaining > 0:
            remaining -= 1
            t0 = time.perf_counter()
            await op(i)
            latencies.append(time.perf_counter() - t0)
            i += writers

    started = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    elapsed = time.perf_counter() - started
    return Latency.of(total / elapsed, latencies)


async def raw_small_rpcs(target: str, payloads: list[bytes], writers: int, total: int) -> Latency:
    """Closed-loop client streams shaped like an append (a header, one payload, an empty message)."""
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        await channel.channel_ready()
        sink = channel.stream_unary(SINK_METHOD)

        async def rpc(i: int) -> None:
            call = sink()
            await call.write(b"bench/raw")
            await call.write(payloads[i % len(payloads)])
            await call.write(b"")
            await call.done_writing()
            await call

        await closed_loop(rpc, writers, max(writers * 10, total // 10))  # Warm up.
        return await closed_loop(rpc, writers, total)


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of `pid`, from /proc; empty where unavailable."""
    out: dict[int, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            out[int(tid)] = stat_cpu_seconds(f"/proc/{pid}/task/{tid}/stat")
        except OSError:
            continue
    return out


@dataclass
class CpuUse:
    """Fractions of one core used during a phase."""

    wall: float
    broker_main: float
    broker_other: float
    client: float

    def __str__(self) -> str:
        return (f"server event-loop thread {self.broker_main:4.0%}, other threads {self.broker_other:4.0%}; "
                f"client {self.client:4.0%}  ({self.wall:.1f} s)")


class CpuMeter:
    """Measures the CPU that the broker's event-loop thread, its other threads and this process use."""

    def __init__(self, broker_pid: int) -> None:
        self.pid = broker_pid

    @contextmanager
    def measure(self, into: dict[str, CpuUse], key: str) -> Iterator[None]:
        before = thread_cpu(self.pid)
        t0, c0 = time.perf_counter(), os.times()
        yield
        wall = time.perf_counter() - t0
        c1 = os.times()
        after = thread_cpu(self.pid)
        main = after.get(self.pid, 0.0) - before.get(self.pid, 0.0)
        other = sum(v - before.get(t, 0.0) for t, v in after.items() if t != self.pid)
        client = (c1.user - c0.user) + (c1.system - c0.system)
        into[key] = CpuUse(wall, main / wall, other / wall, client / wall)


class BrokerProfiler:
    """Starts and stops cProfile inside the broker process with SIGUSR1 / SIGUSR2."""

    SITECUSTOMIZE = '''
import cProfile, os, signal
_out = os.environ.get("BENCH_BROKER_PROFILE")
if _out:
    _prof = cProfile.Profile()
    def _start(signum, frame):
        _prof.enable()
    def _stop(signum, frame):
        _prof.disable()
        _prof.dump_stats(_out + ".tmp")
        os.replace(_out + ".tmp", _out)
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
'''

    def __init__(self, out: Path, hook_dir: Path) -> None:
        self.out = out.resolve()
        hook_dir.mkdir(parents=True, exist_ok=True)
        (hook_dir / "sitecustomize.py").write_text(self.SITECUSTOMIZE)
        self.hook_dir = hook_dir
        self.pid = 0

    @contextmanager
    def environment(self) -> Iterator[None]:
        """Set while the broker process is created, so that it loads the hook."""
        saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "BENCH_BROKER_PROFILE")}
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.hook_dir), saved["PYTHONPATH"]) if p)
        os.environ["BENCH_BROKER_PROFILE"] = str(self.out)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def start(self) -> None:
        if self.out.exists():
            self.out.unlink()
        os.kill(self.pid, signal.SIGUSR1)

    async def stop(self) -> None:
        os.kill(self.pid, signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while not self.out.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    def report(self, top: int) -> str:
        if not self.out.exists():
            return "no profile was written"
        buf = io.StringIO()
        stats = pstats.Stats(str(self.out), stream=buf)
        stats.strip_dirs()
        buf.write(f"broker cProfile, top {top} by cumulative time:\n")
        stats.sort_stats("cumulative").print_stats(top)
        buf.write(f"broker cProfile, top {top} by own time:\n")
        stats.sort_stats("tottime").print_stats(top)
        return buf.getvalue()


async def broker_phases(
    args: argparse.Namespace,
    target: str,
    broker_url: str,
    sink: str,
    results: Results,
    chunks: list[bytes],
    profiler: BrokerProfiler | None,
    meter: CpuMeter,
) -> None:
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        await channel.channel_ready()
        stub = pb_grpc.JournalStub(channel)
        rpc = append_rpc(channel)
        reqs = content_requests(chunks)
        count = max(1, args.mib * MiB // CHUNK)
        shapes = ("stream", "serial", "inflight")
        heads: dict[str, int] = {}

        def profiled(phase: str) -> bool:
            return profiler is not None and args.profile_phase == phase

        for codec in ("none", "snappy"):
            journal = f"bench/{codec}"
            # Warm up: the journal's first fragment closes after its first append.
            heads[codec] = await append_once(rpc, journal, iter(reqs[:4]))
            if profiled(f"append-{codec}"):
                assert profiler is not None
                profiler.start()
            rates: dict[str, float] = {}
            pairs = results.paired.setdefault(f"append {codec}", [])
            for r in range(args.rounds):
                raw = await raw_client_stream(sink, chunks, count)
                best = 0.0
                with meter.measure(results.cpu, f"append {codec}"):
                    for shape in shapes:
                        rate, heads[codec] = await append_shape(rpc, journal, reqs, count, shape, args.inflight)
                        rates[shape] = max(rates.get(shape, 0.0), rate)
                        best = max(best, rate)
                        log(f"  append {journal} {shape:8s} round {r + 1}: {rate / MB:8.1f} MB/s")
                pairs.append((best, raw))
                log(f"  raw gRPC just before round {r + 1}: {raw / MB:8.1f} MB/s")
            if profiled(f"append-{codec}"):
                assert profiler is not None
                await profiler.stop()
            results.append[codec] = rates

        for codec in ("none", "snappy"):
            journal = f"bench/{codec}"
            end = heads[codec]
            _, _, first = await read_range(stub, journal, CHUNK)  # Warm up, and check content.
            if first != chunks[0]:
                raise RuntimeError(f"{journal}: the first MiB read back differs from the first appended")
            if profiled(f"read-{codec}"):
                assert profiler is not None
                profiler.start()
            pairs = results.paired.setdefault(f"read {codec}", [])
            for r in range(args.rounds):
                raw = await raw_client_stream(sink, chunks, count)
                with meter.measure(results.cpu, f"read {codec}"):
                    rate, total, _ = await read_range(stub, journal, end)
                if total != end:
                    raise RuntimeError(f"read of {journal} returned {total} bytes, expected {end}")
                pairs.append((rate, raw))
                log(f"  read   {journal} [0, {end}) round {r + 1}: {rate / MB:8.1f} MB/s (raw gRPC just before: "
                    f"{raw / MB:.1f} MB/s)")
            if profiled(f"read-{codec}"):
                assert profiler is not None
                await profiler.stop()

        small_chunks = chunks_of(chunks[0], args.small_size)
        small = content_requests(small_chunks)

        async def small_append(i: int) -> None:
            await append_once(rpc, "bench/small", iter([small[i % len(small)]]))

        await closed_loop(small_append, args.writers, max(args.writers * 10, args.small_appends // 10))
        if profiled("small"):
            assert profiler is not None
            profiler.start()
        with meter.measure(results.cpu, "small appends"):
            results.small = await closed_loop(small_append, args.writers, args.small_appends)
        if profiled("small"):
            assert profiler is not None
            await profiler.stop()
        log(f"  small appends, one RPC each: {results.small}")

        # The client library's way to write small records: writers share one AppendService, which
        # sends the writes that meet while an RPC is in flight as the next RPC.
        async with JournalClient(broker_url) as client, AppendService(client) as service:
            payloads = small_chunks

            async def service_append(i: int) -> None:
                await service.append("bench/small", payloads[i % len(payloads)])

            await closed_loop(service_append, args.writers, max(args.writers * 10, args.small_appends // 10))
            rpcs = service.stats.rpcs
            with meter.measure(results.cpu, "small service"):
                results.small_service = await closed_loop(service_append, args.writers, args.small_appends)
            results.small_batch = args.small_appends / max(1, service.stats.rpcs - rpcs)
        log(f"  small appends through AppendService: {results.small_service} "
            f"({results.small_batch:.1f} writes per RPC)")


def bench_spec(name: str, codec: int) -> pb.JournalSpec:
    spec = journal_spec(name, replication=1)
    spec.fragment.length = FRAGMENT_LENGTH
    spec.fragment.compression_codec = codec  # type: ignore[assignment]
    spec.fragment.stores.append("file:///")
    return spec


# --- Report ---------------------------------------------------------------------------------


def print_report(args: argparse.Namespace, r: Results, content_ratio: float) -> None:
    def row(name: str, value: str, baseline: str, ratio: str, goal: str, verdict: str) -> None:
        print(f"  {name:34s} {value:>14s} {baseline:>14s} {ratio:>7s} {goal:>9s}  {verdict}")

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "MISS"

    def mbs(rate: float) -> str:
        return f"{rate / MB:.1f} MB/s"

    print()
    print("Gazette broker benchmark: one journal, replication 1, one broker process, one client process")
    print(f"  machine: {platform.machine()}, {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), "
          f"{platform.platform()}, Python {platform.python_version()}, grpcio {grpc.__version__}")
    print(f"  content: newline-delimited JSON events with random ids/values, {CHUNK} byte chunks, "
          f"snappy ratio {content_ratio:.2f}; {args.mib} MiB per append shape per round, best of {args.rounds}")
    print(f"  fragments: {FRAGMENT_LENGTH // MiB} MiB, store file:///; MB = 10^6 bytes; "
          f"load average before the run {r.load_before}")
    print()
    print("Append shapes (best of rounds):")
    for codec, rates in r.append.items():
        parts = ", ".join(f"{shape} {rate / MB:.1f}" for shape, rate in rates.items())
        print(f"  {codec:7s} {parts} MB/s")
    print("  (stream: one Append of all chunks; serial: one Append per 1 MiB chunk; "
          f"inflight: one per chunk, {args.inflight} in flight)")
    print("Raw server-stream reference (trivial server process -> this process; the broker's Read sends "
          "1 MiB content messages):")
    for size, rate in r.raw_server_stream.items():
        print(f"  {size:8d} byte messages {rate / MB:8.1f} MB/s")
    print()
    row("measurement", "value", "baseline", "ratio", "goal", "")
    def paired(phase: str) -> tuple[float, float]:
        """The round of `phase` with the best ratio to its own raw gRPC run: (rate, raw)."""
        return max(r.paired[phase], key=lambda pair: pair[0] / pair[1])

    best_snappy = max(r.append["snappy"].values())
    none, raw_none = paired("append none")
    row("append NONE 1 MiB chunks", mbs(none), mbs(raw_none), f"{none / raw_none:.2f}",
        f">= {GOALS['append_none']:.2f}", verdict(none / raw_none >= GOALS["append_none"]))
    row("  raw spool-disk writes, sustained", mbs(r.disk), "", "", "", "(info)")
    row("  raw spool-disk writes, first 1/4", mbs(r.disk_first), "", "", "", "(info)")
    read, raw_read = paired("read none")
    row("read NONE", mbs(read), mbs(raw_read), f"{read / raw_read:.2f}",
        f">= {GOALS['read_none']:.2f}", verdict(read / raw_read >= GOALS["read_none"]))
    row("append SNAPPY 1 MiB chunks", mbs(best_snappy), mbs(r.snappy), f"{best_snappy / r.snappy:.2f}",
        f">= {GOALS['append_snappy']:.2f}", verdict(best_snappy / r.snappy >= GOALS["append_snappy"]))
    read, raw_read = paired("read snappy")
    row("read SNAPPY", mbs(read), mbs(raw_read), f"{read / raw_read:.2f}", "", "(info)")
    row("raw gRPC, before the broker started", mbs(r.raw_grpc), "", "", "", "(info)")
    service, small, raws = r.small_service, r.small, r.raw_small
    assert service is not None and small is not None and raws is not None
    writes = f"{args.small_size // 1024} KiB x{args.writers}"
    for label, lat, judged in ((f"{writes} AppendService", service, True), (f"{writes} one RPC each", small, False)):
        goal, judgement = (f"<= {GOALS['p99_ms']:.0f} ms", verdict(service.p99 <= GOALS["p99_ms"])) if judged \
            else ("", "(info)")
        row(f"{label}: p99", f"{lat.p99:.2f} ms", f"{raws.p99:.2f} ms", f"{lat.p99 / raws.p99:.2f}", goal, judgement)
        row(f"{label}: p50", f"{lat.p50:.2f} ms", f"{raws.p50:.2f} ms", f"{lat.p50 / raws.p50:.2f}", "", "(info)")
        row(f"{label}: max", f"{lat.max:.2f} ms", f"{raws.max:.2f} ms", "", "", "(info)")
        row(f"{label}: rate", f"{lat.rate:.0f} /s", f"{raws.rate:.0f} /s", f"{lat.rate / raws.rate:.2f}", "",
            "(info)")
    print()
    print("CPU use during the phases (all rounds and shapes; 100% = one core; the server is the broker, "
          "or for 'raw gRPC' the trivial server):")
    for key, use in r.cpu.items():
        print(f"  {key:14s} {use}")
    print()
    print("  baselines: 'raw gRPC' is a grpc.aio client stream of 1 MiB bytes messages from this process to a")
    print("  trivial grpc.aio server process over TCP loopback, of one append shape's volume, run just before each")
    print("  round of appends or reads (the host's speed drifts over a run: each round is judged against its own")
    print("  baseline, and the round with the best ratio is shown); 'raw snappy' is python-snappy StreamCompressor")
    print("  compressing the same content in this process. The small-append baseline is the same trivial server")
    print(f"  taking {args.writers} closed-loop writers' client streams of a header, {args.small_size} bytes and an "
          "empty message.")
    print(f"  'raw spool-disk writes': {3 * args.mib} MiB (one round of the append shapes) written in 1 MiB pwrites")
    print("  to a new unlinked file beside the broker's spools, then fsynced: the page cache and disk that")
    print("  every appended byte passes through (first quarter, and the whole including the fsync).")
    print(f"  small appends: {args.writers} closed-loop writers, each awaiting its write's commit before the next.")
    print("  'AppendService' writers share the client library's AppendService, the way Gazette clients write")
    print("  small records: writes that meet while an RPC is in flight go together as the next RPC (here")
    print(f"  {r.small_batch:.1f} writes per RPC). 'one RPC each' writers each make their own Append RPC.")


# --- Main -----------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> None:
    results = Results(load_before=" ".join(f"{x:.2f}" for x in os.getloadavg()))
    log(f"generating {POOL_CHUNKS} MiB of content")
    chunks = chunks_of(make_content(POOL_CHUNKS * CHUNK), CHUNK)

    log("raw baselines")
    # The sink serves the baselines, and stays up (idle) to pair each round of the broker's phases.
    with sink_process() as (target, sink_pid):

        async def baselines() -> None:
            await raw_client_stream(target, chunks, 32)  # Warm up.
            with CpuMeter(sink_pid).measure(results.cpu, "raw gRPC"):
                for _ in range(args.rounds + 1):
                    rate = await raw_client_stream(target, chunks, args.baseline_mib)
                    results.raw_grpc = max(results.raw_grpc, rate)
            small = chunks_of(chunks[0], args.small_size)
            results.raw_small = await raw_small_rpcs(target, small, args.writers, args.small_appends)
            for _ in range(args.rounds + 1):
                for size in (CHUNK, 256 * 1024, 32 * 1024):
                    rate = await raw_server_stream(target, size, args.baseline_mib * MiB // size)
                    results.raw_server_stream[size] = max(results.raw_server_stream.get(size, 0.0), rate)

        asyncio.run(baselines())
        log(f"  raw gRPC client stream: {results.raw_grpc / MB:.1f} MB/s; small RPCs: {results.raw_small}")
        ratio = 0.0
        for _ in range(args.rounds + 1):
            rate, ratio = snappy_speed(chunks, args.mib)
            results.snappy = max(results.snappy, rate)
        log(f"  raw snappy: {results.snappy / MB:.1f} MB/s (ratio {ratio:.2f})")

        with tempfile.TemporaryDirectory(prefix="bench-broker-") as tmp_name:
            tmp = Path(tmp_name)
            # As much as one round of the three append shapes writes to the spool.
            results.disk_first, results.disk = disk_write_speed(tmp, chunks, 3 * args.mib)
            log(f"  raw spool-disk writes: {results.disk_first / MB:.1f} MB/s for the first quarter, "
                f"{results.disk / MB:.1f} MB/s sustained")
            profiler = BrokerProfiler(Path(args.profile_broker), tmp / "hook") if args.profile_broker else None

            def start_broker(tmp: Path, etcd: str, prefix: str, *extra: str) -> BrokerProcess:
                if profiler is None:
                    return BrokerProcess(tmp, etcd, prefix, *extra)
                with profiler.environment():
                    broker = BrokerProcess(tmp, etcd, prefix, *extra)
                profiler.pid = broker.proc.pid
                return broker

            with etcd_and_broker(tmp, "--log.level", args.log_level, start_broker=start_broker) as broker:
                channel, stub = broker.stub()
                with channel:
                    specs = [bench_spec("bench/none", pb.NONE), bench_spec("bench/snappy", pb.SNAPPY),
                             bench_spec("bench/small", pb.NONE)]
                    if apply_specs(stub, *specs).status != pb.OK:
                        raise RuntimeError("applying the benchmark journals failed")
                    for spec in specs:
                        wait_for_primary(stub, spec.name)
                log("broker phases")
                meter = CpuMeter(broker.proc.pid)
                asyncio.run(broker_phases(args, broker.target, broker.url, target, results, chunks, profiler, meter))

    print_report(args, results, ratio)
    if profiler is not None:
        print()
        print(f"(profiled phase: {args.profile_phase}; profile in {profiler.out})")
        print(profiler.report(args.profile_top))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench_broker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--mib", type=int, default=256, help="MiB appended per append shape per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per measurement; the best is reported")
    parser.add_argument("--baseline-mib", type=int, default=1024, help="MiB streamed per raw gRPC baseline run")
    parser.add_argument("--inflight", type=int, default=4, help="concurrent 1 MiB appends of the 'inflight' shape")
    parser.add_argument("--writers", type=int, default=16, help="concurrent writers of small appends")
    parser.add_argument("--small-appends", type=int, default=4000, help="small appends measured")
    parser.add_argument("--small-size", type=int, default=4096, help="bytes per small append")
    parser.add_argument("--log-level", default="info", help="the broker's --log.level")
    parser.add_argument("--profile-broker", metavar="PATH", default="",
                        help="run the broker under cProfile during --profile-phase and write the stats to PATH")
    parser.add_argument("--profile-phase", default="append-none",
                        choices=["append-none", "append-snappy", "read-none", "read-snappy", "small"])
    parser.add_argument("--profile-top", type=int, default=30, help="functions listed from the profile")
    parser.add_argument("--sink-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sink_server:
        asyncio.run(serve_sink())
        return
    run(args)


if __name__ == "__main__":
    main()
