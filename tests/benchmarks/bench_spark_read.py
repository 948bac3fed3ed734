"""Benchmark of Spark batch reads of the `gazette` data source, against one plain Python process.

Starts a real etcd and one real `gazette serve` with a `file://` store under a temp dir, applies
two journals of JSON lines (`bench/spark-none`, codec NONE, and `bench/spark-snappy`, codec
SNAPPY; labels `bench=spark`, `codec=<NONE|SNAPPY>`; content-type application/x-ndjson;
replication 1; 512 MiB fragments, Gazette's default length) and appends at least --gib GiB of JSON
lines (~200 bytes, varying fields per event type) to each in line-aligned appends of ~8 MiB, until
the last fragment is over its length so that one empty append rolls it. Once every fragment is
persisted (ListFragments shows a backing store on each), it measures per codec, over exactly the
same fragment files:

* BASELINE: one plain Python process (a subprocess, measured inside it: interpreter start-up
  excluded) that lists the journal's fragment files under the file root, reads each,
  decompresses it (python-snappy stream format for `.sz`, raw for `.raw`) and splits it into
  messages with `bytes.split(b"\\n")`, counting them; two shapes: whole files, and 4 MiB reads
  with the partial last line carried over. The faster shape is the baseline.
* SPARK: a fresh `local[2]` SparkSession (UI off) with format `gazette` registered,
  `spark.read.format("gazette").schema("offset bigint, value binary").option("broker", ...)
  .option("selector", "bench=spark,codec=...")` and the action
  `selectExpr("sum(length(value))", "count(*)").collect()`: every `value` is materialized. This
  lean read is the primary figure, the one the goal is judged on: it is what a job that reads
  every message asks for, and Spark 4.0 prunes no columns of a Python data source (every column
  the schema names crosses from the Python worker into the JVM and is converted there row by
  row), so a job should name the columns it needs. Then, as secondary figures: the same sum with
  the default schema (all nine base columns: journal, offset, value, uuid, producer, clock,
  flags, fragment_mod_time, labels), and `.count()` with the lean schema. JVM start and the first
  queries on a tiny warm-up journal (Python worker start and imports) are timed apart and
  excluded.

MB is 10^6 bytes of uncompressed content (newlines included). Each measurement is the best of
--rounds. The report goes to stdout, progress to stderr. Nothing is asserted about speed.

    python -m tests.benchmarks.bench_spark_read [--gib 1.0] [--codecs NONE,SNAPPY] [--rounds 2]
        [--max-records-per-batch N,...] [--no-all-columns] [--profile-partition [--profile-top 30]]

--max-records-per-batch reruns the Spark query with `spark.sql.execution.arrow.maxRecordsPerBatch`
set to each value. --profile-partition runs the data source's reader in this process (no Spark:
`GazetteDataSource(options).reader(schema)`, `partitions()`, then `read()` of the first
partition of each codec) under cProfile and prints the top functions.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import platform
import pstats
import random
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import snappy

from broker.client import JournalClient
from broker.client.listing import fragments_request, list_all_fragments
from broker.protocol import pb
from tests.benchmarks.bench_broker import CHANNEL_OPTIONS, append_once, append_rpc, content_requests
from tests.benchmarks.stack import etcd_and_broker, log
from tests.support.harness import BrokerProcess, apply_specs, journal_spec, wait_for_primary
from tests.support.spark_session import local_spark

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
MB = 1e6
APPEND_SIZE = 8 * MiB  # Content per Append (whole lines), sent as 1 MiB content messages.
REQUEST_SIZE = MiB
POOL_CHUNKS = 8  # Distinct appends of content, cycled (snappy's window is far smaller).
FRAGMENT_LENGTH = 512 * MiB  # Gazette's default `fragment.length`: one Spark partition per fragment.
BASELINE_READ = 4 * MiB
GOAL = 1.0  # Spark local[2] / one plain Python process.
CODECS = {"NONE": pb.NONE, "SNAPPY": pb.SNAPPY}
LABEL = "bench=spark"
LEAN = "offset bigint, value binary"  # The primary read: what a job reading every message needs.
WARMUP = "bench/spark-warmup"  # A tiny journal read first, so that the measured queries find Python workers up.
WARMUP_LENGTH = 64 * KiB


# --- Content --------------------------------------------------------------------------------

_WORDS = (
    "red", "shoes", "running", "winter", "jacket", "cheap", "flights", "paris", "laptop", "stand", "coffee",
    "grinder", "usb", "cable", "garden", "hose", "kids", "books", "wireless", "mouse", "desk", "lamp", "tent",
)
_PATHS = ("/", "/home", "/search", "/cart", "/checkout", "/product/{}", "/category/{}", "/account", "/help/{}")
_REFERRERS = ("", "https://www.google.com/", "https://t.co/x", "https://news.example.org/a/{}", "direct")
_COUNTRIES = ("US", "DE", "FR", "BR", "IN", "JP", "GB", "CA", "MX", "NG", "ES", "IT")
_DEVICES = (("ios", "17.4"), ("android", "14"), ("windows", "11"), ("macos", "14.3"), ("linux", "6.6"))


def make_line(rng: random.Random, ts: int) -> str:
    """One JSON event: common fields, then fields that depend on the event type."""
    os_name, os_version = rng.choice(_DEVICES)
    head = (
        f'{{"id":"{rng.getrandbits(128):032x}","ts":{ts},"user":"u{rng.randrange(2_000_000)}",'
        f'"country":"{rng.choice(_COUNTRIES)}","device":{{"os":"{os_name}","v":"{os_version}"}},'
    )
    kind = rng.random()
    if kind < 0.45:
        path = rng.choice(_PATHS).format(rng.randrange(100_000))
        ref = rng.choice(_REFERRERS).format(rng.randrange(1000))
        body = f'"event":"page_view","path":"{path}","ref":"{ref}","ms":{rng.randrange(20, 9000)}'
    elif kind < 0.70:
        body = (
            f'"event":"click","el":"btn-{rng.randrange(500)}","x":{rng.randrange(1920)},'
            f'"y":{rng.randrange(1080)}'
        )
    elif kind < 0.85:
        query = " ".join(rng.choice(_WORDS) for _ in range(rng.randrange(1, 5)))
        body = f'"event":"search","q":"{query}","hits":{rng.randrange(0, 5000)},"page":{rng.randrange(1, 6)}'
    elif kind < 0.95:
        items = ",".join(
            f'{{"sku":"SKU-{rng.randrange(10**6):06d}","qty":{rng.randrange(1, 4)},'
            f'"price":{rng.random() * 200:.2f}}}'
            for _ in range(rng.randrange(1, 4))
        )
        body = (
            f'"event":"purchase","order":"o-{rng.getrandbits(48):012x}","items":[{items}],'
            f'"total":{rng.random() * 500:.2f},"cur":"{rng.choice(("USD", "EUR", "BRL", "JPY"))}"'
        )
    else:
        ok = "true" if rng.random() < 0.93 else "false"
        body = f'"event":"{rng.choice(("login", "logout"))}","method":"{rng.choice(("pw", "sso", "otp"))}","ok":{ok}'
    return f"{head}{body}}}\n"


@dataclass
class Chunk:
    """The content of one Append: whole lines, and its 1 MiB content requests."""

    data: bytes
    messages: int
    requests: list[bytes] = field(default_factory=list)  # Serialized, for bench_broker.append_once.


def make_chunks(count: int, size: int, seed: int = 11) -> list[Chunk]:
    """`count` distinct chunks of whole lines, each just under `size` bytes."""
    rng = random.Random(seed)
    ts = 1_712_000_000_000
    chunks = []
    for _ in range(count):
        lines: list[str] = []
        total = 0
        while True:
            ts += rng.randrange(0, 20)
            line = make_line(rng, ts)
            if total + len(line) > size:
                break
            lines.append(line)
            total += len(line)
        data = "".join(lines).encode()
        reqs = content_requests([data[i : i + REQUEST_SIZE] for i in range(0, len(data), REQUEST_SIZE)])
        chunks.append(Chunk(data, len(lines), reqs))
    return chunks


# --- The broker side: journals, appends, persistence ------------------------------------------


def journal_name(codec: str) -> str:
    return f"bench/spark-{codec.lower()}"


def bench_spec(name: str, compression: int, length: int = FRAGMENT_LENGTH, **labels: str) -> pb.JournalSpec:
    spec = journal_spec(name, replication=1, content_type="application/x-ndjson", **labels)
    spec.fragment.length = length
    spec.fragment.compression_codec = compression  # type: ignore[assignment]
    spec.fragment.stores.append("file:///")
    return spec


@dataclass
class Written:
    """What was appended to one journal."""

    journal: str
    content: int = 0
    messages: int = 0
    appends: int = 0
    seconds: float = 0.0


async def spool_length(client: JournalClient, journal: str) -> int:
    """The length of the journal's last fragment if it is not persisted yet (the primary's spool), else 0."""
    resp = await list_all_fragments(client, fragments_request(journal))
    frags = [f.spec for f in resp.fragments if f.spec.end > f.spec.begin]
    if not frags:
        return 0
    last = max(frags, key=lambda f: f.begin)
    return 0 if last.backing_store else last.end - last.begin


async def fill_journal(
    broker: BrokerProcess, journal: str, chunks: list[Chunk], total: int, offset: int, length: int = FRAGMENT_LENGTH
) -> Written:
    """Append chunks until at least `total` bytes are written and the spool is over `length`, then roll it.

    A spool rolls before an append when its fragment is longer than `fragment.length`, so the
    appends continue until the broker's spool (its last, unpersisted fragment in ListFragments) is
    over the length; an empty append then rolls it and the persister uploads it, leaving no content
    that only the broker holds.
    """
    out = Written(journal)
    started = time.perf_counter()
    async with (
        grpc.aio.insecure_channel(broker.target, options=CHANNEL_OPTIONS) as channel,
        JournalClient(broker.url) as client,
    ):
        rpc = append_rpc(channel)
        i = offset
        while out.content < total or await spool_length(client, journal) <= length:
            chunk = chunks[i % len(chunks)]
            i += 1
            await append_once(rpc, journal, iter(chunk.requests))
            out.content += len(chunk.data)
            out.messages += chunk.messages
            out.appends += 1
        head = await append_once(rpc, journal, iter(()))  # Rolls the last fragment.
    out.seconds = time.perf_counter() - started
    if head != out.content:
        raise RuntimeError(f"{journal}: write head {head} after appending {out.content} bytes")
    return out


async def wait_persisted(address: str, journal: str, head: int, timeout: float) -> list[pb.Fragment]:
    """The fragments of `journal` once [0, head) is covered by persisted fragments only."""
    deadline = time.monotonic() + timeout
    async with JournalClient(address) as client:
        while True:
            resp = await list_all_fragments(client, fragments_request(journal))
            frags = sorted((f.spec for f in resp.fragments if f.spec.end > f.spec.begin), key=lambda f: f.begin)
            persisted = [f for f in frags if f.backing_store]
            covered = sum(f.end - f.begin for f in persisted)
            if covered == head and len(persisted) == len(frags):
                return persisted
            if time.monotonic() > deadline:
                raise TimeoutError(f"{journal}: {covered} of {head} bytes persisted after {timeout}s")
            await asyncio.sleep(0.5)


# --- Baseline: one plain Python process -----------------------------------------------------


def fragment_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix in (".raw", ".sz"))


def read_whole(files: list[Path]) -> tuple[int, int]:
    """(content bytes, messages): each file read whole, decompressed whole, split whole."""
    content = messages = 0
    for path in files:
        data = path.read_bytes()
        if path.suffix == ".sz":
            data = snappy.StreamDecompressor().decompress(data)
        content += len(data)
        parts = data.split(b"\n")
        messages += len(parts) - 1 + (1 if parts[-1] else 0)
    return content, messages


def read_chunked(files: list[Path], size: int = BASELINE_READ) -> tuple[int, int]:
    """(content bytes, messages): `size` reads, decompressed and split, the partial last line carried over."""
    content = messages = 0
    for path in files:
        dec = snappy.StreamDecompressor() if path.suffix == ".sz" else None
        carry = b""
        with open(path, "rb", buffering=0) as f:
            while block := f.read(size):
                if dec is not None:
                    block = dec.decompress(block)
                content += len(block)
                parts = (carry + block).split(b"\n") if carry else block.split(b"\n")
                messages += len(parts) - 1
                carry = parts[-1]
        messages += 1 if carry else 0
    return content, messages


def baseline_main(directory: str, shape: str) -> None:
    """The baseline child: measure one read of the directory's fragments and print it as JSON."""
    files = fragment_files(Path(directory))
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    content, messages = (read_whole if shape == "whole" else read_chunked)(files)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    rss = after.ru_maxrss * KiB
    print(json.dumps({"files": len(files), "content": content, "messages": messages, "seconds": seconds,
                      "cpu": cpu, "rss": rss}))


@dataclass
class Measure:
    seconds: float
    content: int
    messages: int
    cpu: float = 0.0
    rss: int = 0
    all_seconds: list[float] = field(default_factory=list)

    def mbs(self) -> float:
        return self.content / self.seconds / MB

    def msgs(self) -> float:
        return self.messages / self.seconds


def run_baseline(directory: Path, shape: str, rounds: int) -> Measure:
    best: Measure | None = None
    times = []
    for _ in range(rounds):
        out = subprocess.run(
            [sys.executable, "-m", "tests.benchmarks.bench_spark_read", "--baseline-child", str(directory), shape],
            capture_output=True, text=True, check=True,
        )
        r = json.loads(out.stdout)
        m = Measure(r["seconds"], r["content"], r["messages"], r["cpu"], r["rss"])
        times.append(m.seconds)
        if best is None or m.seconds < best.seconds:
            best = m
    assert best is not None
    best.all_seconds = times
    return best


# --- Spark ------------------------------------------------------------------------------------


def gazette_df(spark: Any, options: dict[str, str], schema: str | None = None) -> Any:
    reader = spark.read.format("gazette")
    if schema is not None:
        reader = reader.schema(schema)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def spark_sum(spark: Any, options: dict[str, str], schema: str | None = None) -> tuple[float, int, int]:
    """(seconds, sum of value lengths, rows) of one aggregation that materializes every value."""
    started = time.perf_counter()
    row = gazette_df(spark, options, schema).selectExpr("sum(length(value)) AS n", "count(*) AS rows").collect()[0]
    return time.perf_counter() - started, int(row["n"] or 0), int(row["rows"])


def spark_count(spark: Any, options: dict[str, str], schema: str | None = None) -> tuple[float, int]:
    started = time.perf_counter()
    rows = gazette_df(spark, options, schema).count()
    return time.perf_counter() - started, int(rows)


@dataclass
class SparkResults:
    version: str = ""
    session_start: float = 0.0
    warmup_first: float = 0.0
    warmup_second: float = 0.0
    sums: dict[str, Measure] = field(default_factory=dict)  # Schema LEAN: the primary figure.
    counts: dict[str, Measure] = field(default_factory=dict)  # Schema LEAN.
    all_columns: dict[str, Measure] = field(default_factory=dict)  # The default schema (nine columns).
    ceiling: Measure | None = None  # tests/benchmarks/spark_ceiling.py: Spark's part alone.
    batch_sizes: dict[str, dict[str, Measure]] = field(default_factory=dict)  # maxRecordsPerBatch -> codec ->
    error: str = ""


def measure_spark(
    args: argparse.Namespace, tmp: Path, base: dict[str, str], written: dict[str, Written], conf: dict[str, str],
    fragments: dict[str, list[pb.Fragment]],
) -> SparkResults:
    out = SparkResults()
    started = time.perf_counter()
    from pipelines.datasource import register

    with local_spark(tmp, "bench-spark-read", conf) as spark:
        out.session_start = time.perf_counter() - started
        out.version = spark.version
        register(spark)
        warm = {**base, "selector": "bench=spark-warmup"}
        out.warmup_first = spark_sum(spark, warm, LEAN)[0]
        out.warmup_second = spark_sum(spark, warm)[0]
        log(f"  session {out.session_start:.1f} s; warm-up query {out.warmup_first:.2f} s, "
            f"then {out.warmup_second:.2f} s")
        for codec, w in written.items():
            opts = {**base, "selector": f"{LABEL},codec={codec}"}
            times = []
            content = rows = 0
            for _ in range(args.rounds):
                seconds, total, rows = spark_sum(spark, opts, LEAN)
                content = total + rows  # Each value lost its newline.
                times.append(seconds)
                log(f"  spark {codec} schema {LEAN!r} sum(length(value)): {seconds:.2f} s, "
                    f"{content / seconds / MB:.1f} MB/s")
            out.sums[codec] = Measure(min(times), content, rows, all_seconds=times)
            times = []
            for _ in range(args.rounds):
                seconds, rows = spark_count(spark, opts, LEAN)
                times.append(seconds)
            out.counts[codec] = Measure(min(times), w.content, rows, all_seconds=times)
            log(f"  spark {codec} count(): {min(times):.2f} s")
            if args.all_columns:
                times = []
                for _ in range(args.rounds):
                    seconds, total, rows = spark_sum(spark, opts)
                    content = total + rows
                    times.append(seconds)
                out.all_columns[codec] = Measure(min(times), content, rows, all_seconds=times)
                log(f"  spark {codec} all columns: {out.all_columns[codec].mbs():.1f} MB/s")
        out.ceiling = measure_ceiling(spark, args.rounds, next(iter(written.values())),
                                      len(next(iter(fragments.values()))))
    return out


def measure_ceiling(spark: Any, rounds: int, w: Written, partitions: int) -> Measure:
    """The lean sum over `tests/benchmarks/spark_ceiling.py`: the journal's shape, nothing read."""
    from tests.benchmarks.spark_ceiling import CeilingDataSource

    spark.dataSource.register(CeilingDataSource)
    value_size = round(w.content / w.messages) - 1  # Without its newline, as `value` is.
    per = -(-w.messages // partitions)
    reader = (spark.read.format("gazette-ceiling").option("partitions", partitions).option("rows", per)
              .option("valueSize", value_size))
    times = []
    content = rows = 0
    for _ in range(rounds + 1):  # The first query starts this source's Python workers: not counted.
        started = time.perf_counter()
        row = reader.load().selectExpr("sum(length(value)) AS n", "count(*) AS rows").collect()[0]
        times.append(time.perf_counter() - started)
        rows = int(row["rows"])
        content = int(row["n"]) + rows
    log(f"  spark ceiling (a source that reads nothing): {content / min(times[1:]) / MB:.1f} MB/s")
    return Measure(min(times[1:]), content, rows, all_seconds=times[1:])


def measure_batch_sizes(
    args: argparse.Namespace, tmp: Path, base: dict[str, str], written: dict[str, Written], out: SparkResults
) -> None:
    for value in args.max_records_per_batch.split(","):
        if not value.strip():
            continue
        log(f"spark with spark.sql.execution.arrow.maxRecordsPerBatch={value}")
        conf = {"spark.sql.execution.arrow.maxRecordsPerBatch": value.strip()}
        with local_spark(tmp, "bench-spark-read", conf) as spark:
            from pipelines.datasource import register

            register(spark)
            spark_sum(spark, {**base, "selector": "bench=spark-warmup"}, LEAN)
            per: dict[str, Measure] = {}
            for codec in written:
                opts = {**base, "selector": f"{LABEL},codec={codec}"}
                times = []
                content = rows = 0
                for _ in range(args.rounds):
                    seconds, total, rows = spark_sum(spark, opts, LEAN)
                    content = total + rows
                    times.append(seconds)
                per[codec] = Measure(min(times), content, rows, all_seconds=times)
                log(f"  {codec}: {per[codec].mbs():.1f} MB/s")
            out.batch_sizes[value.strip()] = per


# --- Profiling the partition read in-process ---------------------------------------------------


def profile_partitions(args: argparse.Namespace, base: dict[str, str], codecs: list[str]) -> str:
    """cProfile of the data source's reader (schema LEAN) reading the largest partition of each codec, no Spark."""
    from pyspark.sql.types import StructType

    from pipelines.datasource import GazetteDataSource
    from pipelines.source.schema import BASE_SCHEMA

    lean = StructType([BASE_SCHEMA[name.split()[0]] for name in LEAN.split(",")])

    report = io.StringIO()
    for codec in codecs:
        opts = {**base, "selector": f"{LABEL},codec={codec}"}
        source = GazetteDataSource(opts)
        reader = source.reader(lean)
        parts = list(reader.partitions())
        sizes = [int(getattr(p, "end", 0)) - int(getattr(p, "begin", 0)) for p in parts]
        part = parts[sizes.index(max(sizes))]  # The largest partition.
        profiler = cProfile.Profile()
        started = time.perf_counter()
        rows = batches = 0
        profiler.enable()
        for batch in reader.read(part):
            batches += 1
            rows += batch.num_rows if hasattr(batch, "num_rows") else 1
        profiler.disable()
        seconds = time.perf_counter() - started
        report.write(f"\n=== {codec}, schema {LEAN!r}: the largest of {len(parts)} partitions "
                     f"(bytes {sizes}): {max(sizes)} bytes, "
                     f"{rows} rows in {batches} batches, {seconds:.2f} s under the profiler "
                     f"({max(sizes) / seconds / MB:.0f} MB/s)\n")
        stats = pstats.Stats(profiler, stream=report)
        stats.sort_stats("cumulative").print_stats(args.profile_top)
        stats.sort_stats("tottime").print_stats(args.profile_top)
    return report.getvalue()


# --- Report ---------------------------------------------------------------------------------


def print_report(
    args: argparse.Namespace,
    written: dict[str, Written],
    fragments: dict[str, list[pb.Fragment]],
    baselines: dict[str, dict[str, Measure]],
    spark: SparkResults | None,
) -> None:
    print()
    print("Gazette Spark batch read benchmark: `gazette` data source in local[2] vs one plain Python process")
    cores = len(os.sched_getaffinity(0))
    print(f"  machine: {platform.machine()}, {os.cpu_count()} cores ({cores} usable), {platform.platform()}, "
          f"Python {platform.python_version()}, Spark {spark.version if spark and spark.version else '-'}")
    first = next(iter(written.values()))
    print(f"  load average (1 min) at the start of the run {args.load_start:.2f}, at the report "
          f"{os.getloadavg()[0]:.2f} (other work on the machine skews every figure)")
    print(f"  content: JSON lines (~{first.content // max(1, first.messages)} bytes each, fields vary by event "
          f"type), {APPEND_SIZE // MiB} MiB appends, {FRAGMENT_LENGTH // MiB} MiB "
          f"fragments in a file:// store; MB = 10^6 bytes of uncompressed content; best of {args.rounds}")
    print()
    for codec, w in written.items():
        frags = fragments[codec]
        stored = sum(f.backing_store != "" for f in frags)
        size = sum((Path(args.file_root) / w.journal).joinpath(p.name).stat().st_size
                   for p in fragment_files(Path(args.file_root) / w.journal))
        print(f"  {w.journal}: {w.content / GiB:.3f} GiB content, {w.messages:,} messages, {len(frags)} fragments "
              f"({stored} persisted), {size / GiB:.3f} GiB on disk; appended at {w.content / w.seconds / MB:.0f} MB/s")
    print()
    hdr = f"  {'codec':7s} {'reader':34s} {'seconds':>8s} {'MB/s':>8s} {'msgs/s':>11s} {'ratio':>6s}  goal"
    print(hdr)
    for codec, w in written.items():
        shapes = baselines[codec]
        base = min(shapes.values(), key=lambda m: m.seconds)
        for shape, m in shapes.items():
            tag = " (baseline)" if m is base else ""
            print(f"  {codec:7s} {'python ' + shape + tag:34s} {m.seconds:8.2f} {m.mbs():8.1f} {m.msgs():11,.0f} "
                  f"{'':>6s}  cpu {m.cpu:.2f} s, rss {m.rss / MiB:.0f} MiB")
        if spark is None or codec not in spark.sums:
            print(f"  {codec:7s} {'spark sum(length(value))':34s} {'-':>8s}  ({spark.error if spark else 'not run'})")
            continue
        s = spark.sums[codec]
        ratio = s.mbs() / base.mbs()
        verdict = "PASS" if ratio >= GOAL else "MISS"
        print(f"  {codec:7s} {'spark lean sum (the goal)':34s} {s.seconds:8.2f} {s.mbs():8.1f} "
              f"{s.msgs():11,.0f} {ratio:6.2f}  >= {GOAL:.1f}x {verdict}")
        if codec in spark.all_columns:
            v = spark.all_columns[codec]
            print(f"  {codec:7s} {'spark sum, all nine columns':34s} {v.seconds:8.2f} {v.mbs():8.1f} "
                  f"{v.msgs():11,.0f} {v.mbs() / base.mbs():6.2f}  (secondary)")
            if v.content != w.content or v.messages != w.messages:
                print(f"  {codec:7s} CHECK FAILED: all columns read {v.content} bytes, {v.messages} rows")
        if spark.ceiling is not None:
            z = spark.ceiling
            print(f"  {codec:7s} {'spark ceiling: a source reading nothing':34s} {z.seconds:8.2f} {z.mbs():8.1f} "
                  f"{z.msgs():11,.0f} {z.mbs() / base.mbs():6.2f}  (bound)")
        c = spark.counts[codec]
        print(f"  {codec:7s} {'spark lean count()':34s} {c.seconds:8.2f} {c.mbs():8.1f} {c.msgs():11,.0f} "
              f"{c.mbs() / base.mbs():6.2f}  (info)")
        for value, per in spark.batch_sizes.items():
            m = per[codec]
            print(f"  {codec:7s} {'spark maxRecordsPerBatch=' + value:34s} {m.seconds:8.2f} {m.mbs():8.1f} "
                  f"{m.msgs():11,.0f} {m.mbs() / base.mbs():6.2f}  (info)")
        problems = []
        if s.content != w.content:
            problems.append(f"content {s.content} != appended {w.content}")
        if s.messages != w.messages or c.messages != w.messages:
            problems.append(f"rows {s.messages} / count {c.messages} != appended messages {w.messages}")
        if base.content != w.content or base.messages != w.messages:
            problems.append(f"baseline saw {base.content} bytes, {base.messages} messages")
        if problems:
            print(f"  {codec:7s} CHECK FAILED: {'; '.join(problems)}")
    if spark is not None and spark.sums:
        print()
        print(f"  lean = user schema {LEAN!r}: the goal is judged on it (Spark 4.0 prunes no columns of a Python data")
        print("  source, so every column a schema names crosses into the JVM; a job names the ones it needs)")
        print("  ceiling = the same lean sum over tests/benchmarks/spark_ceiling.py, a Python data source whose")
        print("  partitions (one per fragment) yield pre-built Arrow batches of the journal's rows and mean message")
        print("  size: Spark's own part of any Python data source read (worker tasks, Arrow IPC, the JVM's rows)")
        print(f"  Spark overheads excluded above: session start (JVM) {spark.session_start:.2f} s; first query on "
              f"the warm-up journal (Python workers, imports) {spark.warmup_first:.2f} s, second "
              f"{spark.warmup_second:.2f} s")
        for codec, s in spark.sums.items():
            print(f"  {codec} lean sum query rounds: {', '.join(f'{t:.2f}' for t in s.all_seconds)} s")


# --- Main -----------------------------------------------------------------------------------


def reader_available() -> bool:
    root = Path(__file__).resolve().parents[2]
    return (root / "pipelines" / "source" / "batch.py").exists()


def run(args: argparse.Namespace) -> None:
    codecs = [c.strip().upper() for c in args.codecs.split(",") if c.strip()]
    for c in codecs:
        if c not in CODECS:
            raise SystemExit(f"unknown codec {c}; expected some of {', '.join(CODECS)}")
    total = int(args.gib * GiB)
    args.load_start = os.getloadavg()[0]
    log(f"generating {POOL_CHUNKS} x {APPEND_SIZE // MiB} MiB of JSON lines")
    chunks = make_chunks(POOL_CHUNKS, APPEND_SIZE)
    with tempfile.TemporaryDirectory(prefix="bench-spark-read-") as tmp_name:
        tmp = Path(tmp_name)
        written: dict[str, Written] | None = None
        fragments: dict[str, list[pb.Fragment]] = {}
        baselines: dict[str, dict[str, Measure]] = {}
        spark: SparkResults | None = None
        profile = ""
        root = tmp / "fragments"
        args.file_root = str(root)
        with etcd_and_broker(tmp, "--log.level", args.log_level) as broker:
            channel, stub = broker.stub()
            with channel:
                specs = [bench_spec(journal_name(c), CODECS[c], bench="spark", codec=c) for c in codecs]
                specs.append(bench_spec(WARMUP, pb.NONE, WARMUP_LENGTH, bench="spark-warmup"))
                if apply_specs(stub, *specs).status != pb.OK:
                    raise RuntimeError("applying the benchmark journals failed")
                for spec in specs:
                    wait_for_primary(stub, spec.name)

            async def fill() -> tuple[dict[str, Written], dict[str, list[pb.Fragment]]]:
                log(f"appending {args.gib} GiB to each of {', '.join(journal_name(c) for c in codecs)}")
                warm_chunks = make_chunks(2, WARMUP_LENGTH // 2, seed=5)
                done = await asyncio.gather(
                    *(fill_journal(broker, journal_name(c), chunks, total, i * 3) for i, c in enumerate(codecs)),
                    fill_journal(broker, WARMUP, warm_chunks, 1, 0, WARMUP_LENGTH),
                )
                written = {c: w for c, w in zip(codecs, done, strict=False)}
                for w in written.values():
                    log(f"  {w.journal}: {w.content / MiB:.0f} MiB, {w.messages} messages, {w.appends} appends "
                        f"in {w.seconds:.1f} s")
                log("waiting for every fragment to be persisted")
                started = time.perf_counter()
                frags = {}
                for c, w in written.items():
                    frags[c] = await wait_persisted(broker.url, w.journal, w.content, args.persist_timeout)
                await wait_persisted(broker.url, WARMUP, done[-1].content, args.persist_timeout)
                log(f"  persisted after {time.perf_counter() - started:.1f} s")
                return written, frags

            written, fragments = asyncio.run(fill())

            for c, w in written.items():
                log(f"baseline {c}")
                directory = root / w.journal
                baselines[c] = {shape: run_baseline(directory, shape, args.rounds) for shape in ("whole", "chunked")}
                for shape, m in baselines[c].items():
                    log(f"  {shape}: {m.seconds:.2f} s, {m.mbs():.1f} MB/s, {m.msgs():,.0f} msgs/s")

            base_opts = {"broker": broker.url}
            if args.file_root_option:
                base_opts["fileRoot"] = str(root)
            if not reader_available():
                spark = SparkResults(error="pipelines/source/batch.py does not exist yet")
            else:
                log("spark")
                try:
                    spark = measure_spark(args, tmp, base_opts, written, {}, fragments)
                    if args.max_records_per_batch:
                        measure_batch_sizes(args, tmp, base_opts, written, spark)
                except Exception as exc:  # Report what ran; the traceback goes to stderr.
                    import traceback

                    traceback.print_exc()
                    spark = spark or SparkResults()
                    spark.error = f"{type(exc).__name__}: {str(exc)[:200]}"
                if args.profile_partition:
                    log("profiling one partition per codec in-process")
                    profile = profile_partitions(args, base_opts, list(written))
        if written is not None:
            print_report(args, written, fragments, baselines, spark)
            if profile:
                print()
                print("In-process profile of the data source's partition read (no Spark):")
                print(profile)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench_spark_read",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--gib", type=float, default=1.0, help="GiB of content appended to each codec's journal")
    parser.add_argument("--codecs", default="NONE,SNAPPY", help="comma-separated codecs, one journal each")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per measurement; the best is reported")
    parser.add_argument("--max-records-per-batch", default="",
                        help="comma-separated spark.sql.execution.arrow.maxRecordsPerBatch values to also try")
    parser.add_argument("--no-all-columns", dest="all_columns", action="store_false",
                        help="skip the secondary Spark query with the default schema (all nine base columns)")
    parser.add_argument("--no-file-root-option", dest="file_root_option", action="store_false",
                        help="do not pass the data source option fileRoot (the broker's --broker.file-root)")
    parser.add_argument("--profile-partition", action="store_true",
                        help="profile the data source's read of one partition per codec in this process")
    parser.add_argument("--profile-top", type=int, default=30, help="functions listed from the profile")
    parser.add_argument("--persist-timeout", type=float, default=300.0, help="seconds to wait for persistence")
    parser.add_argument("--log-level", default="info", help="the broker's --log.level")
    parser.add_argument("--baseline-child", nargs=2, metavar=("DIR", "SHAPE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.baseline_child:
        baseline_main(*args.baseline_child)
        return
    run(args)


if __name__ == "__main__":
    main()
