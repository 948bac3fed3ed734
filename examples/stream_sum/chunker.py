"""The Chunker: publishes random streams of chunks and verifies every stream's sum (Gazette's
`GenerateAndVerifyStreams`).

Before publishing anything it learns the write head of each sum partition with an empty append
(a write barrier), and tails each of them from there with a read-committed reader (Sequencer
ring of 16), skipping ACKs. Each of its `workers` interleaves chunks of a few open streams:
a stream has a random 16-byte ID and `chunks` chunks of `chunk_size` random bytes (SeqNo 1 …),
then an empty final chunk; chunks are published self-committed (`publish_committed`) through
an AppendService, ModuloMapping on the stream ID over the chunk partitions. Having published a
stream's final chunk, a worker publishes nothing more until it has read that stream's Sum and
checked it against the CRC-64 it computed itself, so sums never race each other.

It fails (raises `ChunkerError`, as Gazette's chunker `log.Fatal`s) when:

- a stream's Sum has the wrong SeqNo or Value ("mis-matched sum");
- no Sum of a finished stream is read within `sum_timeout` seconds (a missing sum);
- a second Sum of one of its streams is read (a duplicate sum: stricter than Gazette, which
  skips it), or a Sum of one of its streams arrives before the stream's final chunk was
  published.

Sums of other chunkers' streams are skipped. `stop()` makes the workers start no new stream:
they finish and verify the streams they have open, then `run()` returns its `ChunkerStats`.

Run one from the command line (see `main`)::

    python -m examples.stream_sum chunk --broker.address http://localhost:8080 --streams 100
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import random
import sys
from typing import Final

from broker.client import AppendService, AsyncAppend, JournalClient, list_journals
from consumer.message import Flags, Publisher, get_flags, modulo_mapping, read_committed
from consumer.message.mapping import MappingFunc
from examples.stream_sum import crc64
from examples.stream_sum.messages import CHUNK_MESSAGE_TYPE, STREAM_ID_SIZE, SUM_MESSAGE_TYPE, Chunk, Sum, stream_key
from examples.stream_sum.specs import DEFAULT_PREFIX, partitions_selector

log = logging.getLogger(__name__)

SUM_RING_SIZE: Final = 16
"""The Sequencer ring of each sums reader (Gazette's chunker uses 16)."""
MAX_PENDING_APPENDS: Final = 64
"""Chunks a worker publishes before it waits for their appends."""


class ChunkerError(Exception):
    """A stream's sum is wrong, missing or duplicated: an exactly-once (or latency) violation."""


@dataclasses.dataclass
class ChunkerStats:
    streams: int = 0
    """Streams started."""
    verified: int = 0
    """Streams whose Sum was read and matched."""
    chunks: int = 0
    """Chunks published (final chunks included)."""
    sums_read: int = 0
    """Committed Sums read (any chunker's)."""


@dataclasses.dataclass
class _Stream:
    id: bytes
    seq_no: int = 0
    value: int = 0


class Chunker:
    """Generates and verifies streams (see the module's doc)."""

    def __init__(
        self,
        client: JournalClient,
        *,
        prefix: str = DEFAULT_PREFIX,
        workers: int = 4,
        streams: int | None = None,
        chunks: int = 10,
        chunk_size: int = 32,
        sum_timeout: float = 60.0,
        seed: int | None = None,
    ) -> None:
        if workers < 1 or chunks < 0 or chunk_size < 1 or (streams is not None and streams < 0):
            raise ValueError("workers and chunk_size must be positive, chunks and streams not negative")
        self.client = client
        self.prefix = prefix
        self.workers = workers
        self.streams_per_worker = streams
        self.chunks = chunks
        self.chunk_size = chunk_size
        self.sum_timeout = sum_timeout
        self._seed = seed
        self.stats = ChunkerStats()
        self._stopping = asyncio.Event()
        self._waiting: dict[bytes, asyncio.Future[Sum]] = {}
        self._open: set[bytes] = set()
        self._verified: set[bytes] = set()
        self._failure: ChunkerError | None = None

    def stop(self) -> None:
        """Start no new streams; `run()` returns once the open ones are verified."""
        self._stopping.set()

    async def run(self) -> ChunkerStats:
        """Publish and verify streams until each worker has done `streams` (or `stop()`)."""
        chunk_parts = await list_journals(self.client, partitions_selector(CHUNK_MESSAGE_TYPE, self.prefix))
        sum_parts = await list_journals(self.client, partitions_selector(SUM_MESSAGE_TYPE, self.prefix))
        for parts, what in ((chunk_parts, CHUNK_MESSAGE_TYPE), (sum_parts, SUM_MESSAGE_TYPE)):
            if not parts.journals:
                raise ChunkerError(f"no journals labelled {what} under {self.prefix!r}")
        mapping = modulo_mapping(stream_key, chunk_parts)
        # Chunks carry UUIDs that the summers' read-committed readers deduplicate: an append whose
        # outcome is unknown (its broker died) is retried rather than failing the chunker.
        async with AppendService(self.client, retry_unknown_outcome=True) as svc:
            # Write barriers: the sums are read from the heads as of before any chunk.
            heads = {}
            for j in sum_parts.journals:
                heads[j.spec.name] = (await svc.append(j.spec.name)).commit.end
            pumps = [asyncio.create_task(self._pump(name, head), name=f"sums {name}") for name, head in heads.items()]
            publisher = Publisher(svc)
            seeds = random.Random(self._seed if self._seed is not None else int.from_bytes(os.urandom(8)))
            workers = [
                asyncio.create_task(self._work(publisher, mapping, random.Random(seeds.getrandbits(64))))
                for _ in range(self.workers)
            ]
            try:
                pending: set[asyncio.Task[None]] = set(workers) | set(pumps)
                while any(not w.done() for w in workers):
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        if task.cancelled():
                            continue
                        exc = task.exception()
                        if exc is not None:
                            raise exc
                        if task in pumps:
                            raise ChunkerError(f"the sums reader {task.get_name()} ended")
            finally:
                for task in (*workers, *pumps):
                    task.cancel()
                await asyncio.gather(*workers, *pumps, return_exceptions=True)
        return self.stats

    # -- verification ---------------------------------------------------------------------------

    async def _pump(self, journal: str, head: int) -> None:
        async for env in read_committed(self.client, journal, head, lambda _spec: Sum(), buffer=SUM_RING_SIZE):
            if get_flags(env.uuid) == Flags.ACK_TXN:
                continue
            self.stats.sums_read += 1
            got: Sum = env.message
            waiter = self._waiting.pop(got.ID, None)
            if waiter is not None:
                if not waiter.done():
                    waiter.set_result(dataclasses.replace(got))
            elif got.ID in self._verified:
                raise ChunkerError(
                    f"duplicate sum of stream {got.ID.hex()} (SeqNo {got.SeqNo}, Value {got.Value:#x}) "
                    f"at {journal}:{env.begin}"
                )
            elif got.ID in self._open:
                raise ChunkerError(
                    f"sum of stream {got.ID.hex()} (SeqNo {got.SeqNo}) at {journal}:{env.begin} "
                    "before its final chunk was published"
                )
            # Else another chunker's stream.

    async def _verify(self, stream: _Stream, waiter: asyncio.Future[Sum]) -> None:
        try:
            async with asyncio.timeout(self.sum_timeout):
                got = await waiter
        except TimeoutError:
            self._waiting.pop(stream.id, None)
            raise ChunkerError(
                f"missing sum: no Sum of stream {stream.id.hex()} (expected SeqNo {stream.seq_no}, "
                f"Value {stream.value:#x}) within {self.sum_timeout:g}s"
            ) from None
        if got.SeqNo != stream.seq_no or got.Value != stream.value:
            raise ChunkerError(
                f"mis-matched sum! stream {stream.id.hex()}: expected SeqNo {stream.seq_no}, Value "
                f"{stream.value:#x}; read SeqNo {got.SeqNo}, Value {got.Value:#x}"
            )
        self._verified.add(stream.id)
        self.stats.verified += 1

    # -- generation -----------------------------------------------------------------------------

    async def _work(self, publisher: Publisher, mapping: MappingFunc, rng: random.Random) -> None:
        open_streams: list[_Stream] = []
        started = 0
        pending: list[AsyncAppend] = []
        loop = asyncio.get_running_loop()
        while True:
            can_start = not self._stopping.is_set() and (
                self.streams_per_worker is None or started < self.streams_per_worker
            )
            n = len(open_streams) + (1 if can_start else 0)
            if n == 0:
                break
            i = rng.randrange(n)
            if i == len(open_streams):
                stream = _Stream(rng.randbytes(STREAM_ID_SIZE))
                open_streams.append(stream)
                self._open.add(stream.id)
                started += 1
                self.stats.streams += 1
            stream = open_streams[i]
            data = rng.randbytes(self.chunk_size) if stream.seq_no < self.chunks else b""
            stream.seq_no += 1
            stream.value = crc64.update(stream.value, data)
            chunk = Chunk(ID=stream.id, SeqNo=stream.seq_no, Data=data)
            waiter: asyncio.Future[Sum] | None = None
            if chunk.final:
                waiter = loop.create_future()
                self._waiting[stream.id] = waiter
                self._open.discard(stream.id)
            pending.append(publisher.publish_committed(mapping, chunk))
            self.stats.chunks += 1
            if waiter is not None:
                open_streams.pop(i)
                await _all(pending)
                await self._verify(stream, waiter)
            elif len(pending) >= MAX_PENDING_APPENDS:
                await _all(pending)
            else:
                await asyncio.sleep(0)
        await _all(pending)


async def _all(appends: list[AsyncAppend]) -> None:
    """Wait for `appends` (raising the first failure), and clear the list."""
    batch = list(appends)
    appends.clear()
    for aa in batch:
        await aa


def main(argv: list[str] | None = None) -> int:
    """`python -m examples.stream_sum chunk`: run a chunker until its streams are verified (or
    Ctrl-C, which finishes the open streams); exit 1 on a failed verification."""
    parser = argparse.ArgumentParser(prog="python -m examples.stream_sum chunk", description=__doc__.split("\n")[0])
    parser.add_argument("--broker.address", dest="broker", default=os.environ.get("BROKER_ADDRESS",
                                                                                 "http://localhost:8080"))
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="journal name prefix (default %(default)s)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--streams", type=int, default=-1, help="streams per worker; <0 for infinite")
    parser.add_argument("--chunks", type=int, default=100, help="chunks per stream (before the final one)")
    parser.add_argument("--delay", type=float, default=40.0, help="seconds to wait for a stream's sum")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")

    async def run() -> ChunkerStats:
        async with JournalClient(args.broker) as client:
            chunker = Chunker(client, prefix=args.prefix, workers=args.workers,
                              streams=None if args.streams < 0 else args.streams, chunks=args.chunks,
                              sum_timeout=args.delay)
            task = asyncio.ensure_future(chunker.run())
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                chunker.stop()
                return await task

    try:
        stats = asyncio.run(run())
    except ChunkerError as exc:
        log.critical("%s", exc)
        return 1
    except KeyboardInterrupt:
        return 130
    print(f"streams={stats.streams} verified={stats.verified} chunks={stats.chunks} sums_read={stats.sums_read}")
    return 0


__all__ = ["Chunker", "ChunkerError", "ChunkerStats", "main"]
