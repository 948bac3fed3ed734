"""The floor under one-at-a-time appends: what a server that does nothing costs the client library's
round trip, and what the two SHA-1 sums the protocol requires add to it, beside the broker in the
same run. It bounds issue 19's one-at-a-time goals (p50 at most NATS JetStream's, from peer_bench).

Three servers, each its own process on TCP loopback, take the same PUTs one at a time from the
client library's HTTP append path (`broker.client.http_append.HttpAppends`, which `append()` uses
for a plain append), each answering `100 Continue` and then `204` with a commit as the broker does:

* null: an asyncio server that reads each body and answers, with no other work;
* null + SHA-1: the same, also hashing each body twice as it arrives, as a broker must (the
  fragment's running sum and the append's own sum; in pieces of 256 KiB or the body's rest, those
  of 64 KiB or more in two worker threads, one per sum, as the broker's spool and append do, smaller
  ones on the event loop), answering once both are done;
* broker: `gazette serve` (one etcd, a journal of replication 1, a file:// store), via `append()`.

For each: p50 and p99 in ms, and CPU ms per append of the server process and of this (client)
process. Also this interpreter's hashlib SHA-1 speed, alone and two sums on two threads at once.
The report goes to stdout, progress to stderr.

    python -m tests.benchmarks.bench_append_floor [--sizes 256,4096,1048576] [--count 3000]
        [--big-count 300]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.client import JournalClient, append
from broker.client.http_append import HttpAppends
from broker.client.http_conn import HttpConnections
from broker.protocol import pb
from tests.benchmarks.stack import cpu_seconds, etcd_and_broker, log, percentile
from tests.support.harness import free_port, journal_spec
from tests.support.journals import create_journal

MiB = 1 << 20
THREADED_MIN = 64 << 10
"""Pieces of at least this many bytes are hashed in the worker threads (the broker's THREADED_APPLY_MIN)."""
PIECE = 256 << 10
"""The body goes to be hashed in pieces of at least this many bytes, or what is left of it (the
broker's LANDING_CHUNK): fewer hand-offs to the threads than one per read from the socket."""
BIG = 64 << 10
"""Sizes of at least this many bytes get --big-count appends instead of --count."""
JOURNAL = "floor/one-at-a-time"


# -- the null server ---------------------------------------------------------------------------------


class NullPut(asyncio.Protocol):
    """Answers each PUT once its body has arrived: `100 Continue` on its head, then 204 with a commit.
    With `hashing`, each body is hashed twice first (see the module's docstring)."""

    def __init__(self, hashing: bool, fragment_pool: ThreadPoolExecutor, commit_pool: ThreadPoolExecutor) -> None:
        self.hashing = hashing
        self.fragment_pool, self.commit_pool = fragment_pool, commit_pool
        self.fragment_sum = hashlib.sha1()  # Over everything appended on the connection, as a spool's.
        self.head = bytearray()
        self.left = -1  # Body bytes still to come; -1 while reading a head.
        self.offset = 0
        self.begin = 0
        self.commit_sum = hashlib.sha1()
        self.pending: list[Future[None]] = []
        self.answers: set[asyncio.Future[None]] = set()
        self.gathered: list[bytes] = []  # Body received since the last piece went to be hashed.
        self.gathered_bytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self.left < 0:
                self.head += view
                view = memoryview(b"")
                end = self.head.find(b"\r\n\r\n")
                if end < 0:
                    return
                lines = bytes(self.head[:end]).lower().split(b"\r\n")
                length = next(int(line.split(b":", 1)[1]) for line in lines if line.startswith(b"content-length:"))
                view = memoryview(bytes(self.head[end + 4 :]))
                self.head = bytearray()
                self.left, self.begin, self.commit_sum = length, self.offset, hashlib.sha1()
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                if length == 0:
                    self.left = -1
                    self._respond(self.begin, self.offset, self.commit_sum)
                    continue
            piece = view[: self.left]
            view = view[len(piece) :]
            self.left -= len(piece)
            self.offset += len(piece)
            if self.hashing and piece:
                self.gathered.append(bytes(piece))
                self.gathered_bytes += len(piece)
                if self.gathered_bytes >= PIECE or self.left == 0:
                    self._hash(b"".join(self.gathered))
                    self.gathered, self.gathered_bytes = [], 0
            if self.left == 0:
                self.left = -1
                pending, self.pending = self.pending, []
                if pending:  # Answered once the worker threads have hashed the body's pieces.
                    task = asyncio.ensure_future(self._answer(pending, self.begin, self.offset, self.commit_sum))
                    self.answers.add(task)
                    task.add_done_callback(self.answers.discard)
                else:
                    self._respond(self.begin, self.offset, self.commit_sum)

    def _hash(self, piece: bytes) -> None:
        if len(piece) < THREADED_MIN:
            self.fragment_sum.update(piece)
            self.commit_sum.update(piece)
            return
        # One thread per sum: each pool has one worker, so each sum is updated in order.
        self.pending.append(self.fragment_pool.submit(self.fragment_sum.update, piece))
        self.pending.append(self.commit_pool.submit(self.commit_sum.update, piece))

    async def _answer(self, pending: list[Future[None]], begin: int, end: int, commit_sum: Any) -> None:
        await asyncio.gather(*(asyncio.wrap_future(f) for f in pending))
        self._respond(begin, end, commit_sum)

    def _respond(self, begin: int, end: int, commit_sum: Any) -> None:
        digest = commit_sum.hexdigest() if self.hashing else "0" * 40
        self.transport.write(
            b"HTTP/1.1 204 No Content\r\nX-Commit-Begin: %d\r\nX-Commit-End: %d\r\nX-Commit-SHA1-Sum: %s\r\n\r\n"
            % (begin, end, digest.encode("ascii"))
        )


async def serve_null(port: int, hashing: bool) -> None:
    fragment_pool, commit_pool = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: NullPut(hashing, fragment_pool, commit_pool), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


@contextmanager
def null_server(hashing: bool) -> Iterator[tuple[str, int]]:
    """A null server process: (its endpoint, its pid)."""
    port = free_port()
    args = [sys.executable, "-m", "tests.benchmarks.bench_append_floor", "--serve", str(port)]
    proc = subprocess.Popen([*args, "--hash"] if hashing else args)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the null server did not start (exit {proc.poll()})") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        proc.kill()
        proc.wait()


# -- measuring ---------------------------------------------------------------------------------------


@dataclass
class Row:
    p50: float = 0.0
    p99: float = 0.0
    server_cpu_ms: float = 0.0
    client_cpu_ms: float = 0.0


async def one_at_a_time(put: Callable[[bytes], Awaitable[object]], payload: bytes, count: int, server_pid: int) -> Row:
    """`count` appends of `payload`, each awaited before the next, after a tenth as many unmeasured."""
    for _ in range(max(count // 10, 5)):
        await put(payload)
    latencies = []
    cpu0, own0 = cpu_seconds(server_pid), cpu_seconds(os.getpid())
    for _ in range(count):
        began = time.perf_counter()
        await put(payload)
        latencies.append(time.perf_counter() - began)
    server_cpu, client_cpu = cpu_seconds(server_pid) - cpu0, cpu_seconds(os.getpid()) - own0
    latencies.sort()
    return Row(percentile(latencies, 50) * 1e3, percentile(latencies, 99) * 1e3,
               server_cpu / count * 1e3, client_cpu / count * 1e3)


async def measure_null(endpoint: str, pid: int, sizes: list[int], counts: dict[int, int]) -> dict[int, Row]:
    connections = HttpConnections()
    appends = HttpAppends(connections)
    try:
        async def put(payload: bytes) -> object:
            return await appends.append(endpoint, JOURNAL, payload, None)

        return {size: await one_at_a_time(put, os.urandom(size), counts[size], pid) for size in sizes}
    finally:
        await connections.close()


async def measure_broker(url: str, pid: int, sizes: list[int], counts: dict[int, int]) -> dict[int, Row]:
    rows = {}
    async with JournalClient(url) as client:
        for size in sizes:
            spec = journal_spec(f"{JOURNAL}/{size}")
            spec.fragment.length = 512 * MiB
            spec.fragment.compression_codec = pb.NONE
            spec.fragment.stores.append("file:///")
            await create_journal(client, spec, timeout=30)

            async def put(payload: bytes, journal: str = spec.name) -> object:
                return await append(client, journal, payload)

            rows[size] = await one_at_a_time(put, os.urandom(size), counts[size], pid)
    return rows


def sha1_speed() -> tuple[float, float]:
    """MiB/s of one SHA-1 over 1 MiB pieces, and MiB/s of each of two SHA-1s updated at once on two threads."""
    data = os.urandom(MiB)
    rounds = 128
    h = hashlib.sha1()
    began = time.perf_counter()
    for _ in range(rounds):
        h.update(data)
    alone = rounds / (time.perf_counter() - began)

    def hash_all() -> None:
        s = hashlib.sha1()
        for _ in range(rounds):
            s.update(data)

    threads = [threading.Thread(target=hash_all) for _ in range(2)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return alone, rounds / (time.perf_counter() - began)


def size_label(size: int) -> str:
    return f"{size // MiB} MiB" if size >= MiB and size % MiB == 0 else (
        f"{size // 1024} KiB" if size >= 1024 and size % 1024 == 0 else f"{size} B")


def run(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    counts = {size: args.big_count if size >= BIG else args.count for size in sizes}
    results: dict[str, dict[int, Row]] = {}
    for name, hashing in (("null server", False), ("null + 2 SHA-1", True)):
        log(f"{name}: {', '.join(f'{counts[s]} x {size_label(s)}' for s in sizes)}")
        with null_server(hashing) as (endpoint, pid):
            results[name] = asyncio.run(measure_null(endpoint, pid, sizes, counts))
    log("broker")
    with tempfile.TemporaryDirectory(prefix="bench-append-floor-") as tmp_name:
        with etcd_and_broker(Path(tmp_name), "--log.level", "warning") as broker:
            results["broker"] = asyncio.run(measure_broker(broker.url, broker.proc.pid, sizes, counts))
    alone, each_of_two = sha1_speed()

    print()
    print("One-at-a-time appends through the client library's HTTP append path: the floor under the broker")
    print(f"  machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"  hashlib SHA-1: {alone:,.0f} MiB/s alone; {each_of_two:,.0f} MiB/s each, two at once on two threads")
    print(f"  {'size':>8}  {'server':<16} {'p50 ms':>8} {'p99 ms':>8} {'server CPU ms':>14} {'client CPU ms':>14}")
    for size in sizes:
        for name, rows in results.items():
            row = rows[size]
            print(f"  {size_label(size):>8}  {name:<16} {row.p50:8.3f} {row.p99:8.3f} "
                  f"{row.server_cpu_ms:14.3f} {row.client_cpu_ms:14.3f}")
        floor, broker_row = results["null + 2 SHA-1"][size], results["broker"][size]
        print(f"  {'':>8}  broker over the floor: p50 +{broker_row.p50 - floor.p50:.3f} ms, "
              f"server CPU +{broker_row.server_cpu_ms - floor.server_cpu_ms:.3f} ms an append")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench_append_floor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sizes", default=f"256,4096,{MiB}", help="append sizes in bytes, comma-separated")
    parser.add_argument("--count", type=int, default=3000, help="appends of each size under 64 KiB")
    parser.add_argument("--big-count", type=int, default=300, help="appends of each size of 64 KiB or more")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # The null server process's port.
    parser.add_argument("--hash", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(serve_null(args.serve, args.hash))
        return
    run(args)


if __name__ == "__main__":
    main()
