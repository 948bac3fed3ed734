"""Benchmark of persisting fragments to, and reading them back from, each fragment store, in one run:
file:// (a temp dir), s3:// (moto's server), gs:// (fake-gcs-server) and azure:// (Azurite), each
emulator a real HTTP server on loopback (tests/support/store_emulators.py; one not installed is left out).

One etcd and one `gazette serve` (started after the emulators, so it inherits their endpoints and
credentials) serve one journal per store: replication 1, SNAPPY, 8 MiB fragments. Per store:

* persist: `--mib` MiB of semi-compressible JSON lines appended in 1 MiB Appends, and the time until
  every rolled fragment is persisted (the broker compresses and uploads while appends continue):
  MB/s of journal content from the first append to the last rolled fragment listed as persisted,
  and how long persisting trailed the last append;
* read-back: the first broker stopped (SIGTERM persists its spool), a second broker on an empty
  disk serving the journal, and a non-blocking Read of all of it (every byte from the store,
  decompressed by the broker), MB/s of journal content;
* direct: a client RetryReader with do_not_proxy, fetching each fragment's signed URL itself;
* raw: the store layer itself in this process (no broker): the same content's fragments, compressed
  once beforehand, put (`store.put`) one after another and read back (`store.open`), MB/s of
  compressed bytes: what the store and its SDK move without the broker, measured in the same run.

MB = 10^6 bytes. The report goes to stdout, progress to stderr. The emulators are not the clouds:
the figures compare this broker's store paths with each other and with their own SDK's floor.

    python -m tests.benchmarks.bench_stores [--mib 64]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import snappy

from broker.client import JournalClient, RetryReader
from broker.protocol import pb, pb_grpc
from broker.stores import StoreRegistry
from tests.benchmarks.bench_broker import chunks_of, make_content
from tests.benchmarks.stack import etcd_and_broker, log
from tests.support.harness import BrokerProcess, apply_specs, journal_spec, wait_for_primary
from tests.support.store_emulators import EMULATORS, EmulatorMissing, EmulatorProcess

MiB = 1 << 20
MB = 1e6
FRAGMENT = 8 * MiB


@dataclass
class Figures:
    store: str
    persist: float = 0.0
    trail: float = 0.0
    read_back: float = 0.0
    direct: float = 0.0
    raw_put: float = 0.0
    raw_get: float = 0.0


def _persisted_end(stub: pb_grpc.JournalStub, journal: str) -> int:
    resp = stub.ListFragments(pb.FragmentsRequest(journal=journal))
    ends = [f.spec.end for f in resp.fragments if f.spec.backing_store]
    return max(ends, default=0)


def _append_all(stub: pb_grpc.JournalStub, journal: str, chunks: list[bytes]) -> None:
    for chunk in chunks:
        reqs = [pb.AppendRequest(journal=journal), pb.AppendRequest(content=chunk), pb.AppendRequest()]
        resp = stub.Append(iter(reqs), timeout=60)
        if resp.status != pb.OK:
            raise RuntimeError(f"append to {journal}: {pb.Status.Name(resp.status)}")


def _read_all(stub: pb_grpc.JournalStub, journal: str, end: int) -> int:
    got = 0
    for resp in stub.Read(pb.ReadRequest(journal=journal, offset=0, end_offset=end), timeout=300):
        if resp.status != pb.OK:
            raise RuntimeError(f"read of {journal}: {pb.Status.Name(resp.status)}")
        got += len(resp.content)
    return got


async def _read_direct(url: str, journal: str, end: int, file_root: str) -> int:
    got = 0
    async with JournalClient(url, file_root=file_root) as client:
        reader = RetryReader(client, journal, offset=0, end_offset=end, do_not_proxy=True, block=False)
        while data := await reader.read():
            got += len(data)
        await reader.close()
    return got


async def _raw(url: str, file_root: str, fragments: list[bytes]) -> tuple[float, float]:
    """put and open the compressed fragments through the store layer: (put MB/s, get MB/s)."""
    store = StoreRegistry(file_root).get(url)
    total = sum(len(f) for f in fragments)
    names = [f"raw-{uuid.uuid4().hex}/{i:04d}" for i in range(len(fragments))]
    start = time.perf_counter()
    for name, body in zip(names, fragments, strict=True):
        await store.put(name, io.BytesIO(body))
    put = total / (time.perf_counter() - start) / MB
    start = time.perf_counter()
    got = 0
    for name in names:
        async for chunk in store.open(name):
            got += len(chunk)
    get = total / (time.perf_counter() - start) / MB
    assert got == total, (got, total)
    for name in names:
        await store.remove(name)
    return put, get


def bench_store(
    kind: str, url: str, broker: BrokerProcess, restart: Callable[[], BrokerProcess], content: bytes,
    fragments: list[bytes], file_root: str,
) -> Figures:
    figures = Figures(kind)
    journal = f"bench/{kind}"
    spec = journal_spec(journal)
    spec.fragment.stores.append(url)
    spec.fragment.compression_codec = pb.SNAPPY
    spec.fragment.length = FRAGMENT
    spec.fragment.refresh_interval.seconds = 1
    chunks = chunks_of(content, MiB)
    channel, stub = broker.stub()
    with channel:
        assert apply_specs(stub, spec, revision=-1).status == pb.OK
        wait_for_primary(stub, journal)
        log(f"{kind}: appending {len(content) // MiB} MiB")
        start = time.perf_counter()
        _append_all(stub, journal, chunks)
        appended = time.perf_counter()
        rolled = len(content) - FRAGMENT - MiB  # What has certainly rolled; the rest is in the spool.
        while (end := _persisted_end(stub, journal)) < rolled:
            time.sleep(0.02)
        done = time.perf_counter()
        figures.persist = end / (done - start) / MB
        figures.trail = done - appended
    log(f"{kind}: reading back through a fresh broker")
    assert broker.stop() == 0, broker.logs()[-4000:]
    fresh = restart()
    channel, stub = fresh.stub()
    with channel:
        wait_for_primary(stub, journal)
        start = time.perf_counter()
        got = _read_all(stub, journal, len(content))
        figures.read_back = got / (time.perf_counter() - start) / MB
        assert got == len(content), (got, len(content))
    log(f"{kind}: reading signed URLs directly")
    start = time.perf_counter()
    got = asyncio.run(_read_direct(fresh.url, journal, len(content), file_root))
    figures.direct = got / (time.perf_counter() - start) / MB
    assert got == len(content), (got, len(content))
    log(f"{kind}: the store layer alone")
    figures.raw_put, figures.raw_get = asyncio.run(_raw(url, file_root, fragments))
    return figures


def run(args: argparse.Namespace) -> None:
    content = make_content(args.mib * MiB)
    fragments = [snappy.StreamCompressor().compress(c) for c in chunks_of(content, FRAGMENT)]
    results: list[Figures] = []
    missing: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-stores-") as tmp_name, ExitStack() as stack:
        tmp = Path(tmp_name)
        urls = {"file": "file:///"}
        for scheme, kind in EMULATORS.items():
            (tmp / kind.name).mkdir()
            try:
                server: EmulatorProcess = kind(tmp / kind.name)
            except EmulatorMissing as exc:
                missing.append(f"{scheme}: {exc}")
                continue
            log(f"starting {server.name}")
            server.start()
            stack.callback(server.stop)
            bucket = f"bench-{uuid.uuid4().hex[:8]}"
            server.create_bucket(bucket)
            urls[scheme] = server.store_url(bucket, "bench/")
        etcd_at: dict[str, tuple[str, tuple[str, ...]]] = {}

        def first(tmp: Path, etcd: str, prefix: str, *extra: str) -> BrokerProcess:
            etcd_at["args"] = (etcd, extra)
            return BrokerProcess(tmp, etcd, prefix, *extra)

        with etcd_and_broker(tmp, start_broker=first) as broker:
            etcd, extra = etcd_at["args"]
            current = broker
            for kind, url in urls.items():

                def restart() -> BrokerProcess:
                    nonlocal current
                    current = BrokerProcess(tmp, etcd, "/bench", *extra).wait_ready()
                    return current

                results.append(bench_store(kind, url, current, restart, content, fragments, str(tmp / "fragments")))
            current.stop()
    print_report(args, results, missing, sum(len(f) for f in fragments) / len(content))


def print_report(args: argparse.Namespace, results: list[Figures], missing: list[str], ratio: float) -> None:
    print(f"bench_stores: {args.mib} MiB of JSON lines per store, SNAPPY (compressed to {ratio:.2f}), "
          f"{FRAGMENT // MiB} MiB fragments, replication 1; MB = 10^6 bytes; host {os.cpu_count()} CPUs")
    print(f"{'store':<8} {'persist MB/s':>13} {'trails append':>14} {'read-back MB/s':>15} {'direct MB/s':>12} "
          f"{'raw put MB/s':>13} {'raw get MB/s':>13}")
    for r in results:
        print(f"{r.store:<8} {r.persist:>13.1f} {r.trail:>13.2f}s {r.read_back:>15.1f} {r.direct:>12.1f} "
              f"{r.raw_put:>13.1f} {r.raw_get:>13.1f}")
    for line in missing:
        print(f"not measured: {line}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=64, help="MiB appended to each store's journal")
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
