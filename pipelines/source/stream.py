"""Streaming reads: `spark.readStream.format("gazette")`, with offsets {journal: offset}.

`initialOffset` resolves `startingOffsets` (default `latest`, as Kafka's) for the journals the
selector matches. Each `latestOffset` lists the selector again, so journals that start matching
join the query from their beginning (offset 0: their first fragment), and follows each journal's
write head with a non-blocking metadata read at offset -1. Journals that stop matching keep their
last offset, so they are never read twice. `maxBytesPerTrigger` caps a micro-batch, cutting at
fragment boundaries (which are message boundaries; each journal advances by one fragment at
least). `partitions(start, end)` plans one partition per fragment as batch reads do, and `read`
is the batch reading code.

Read-committed with transactional producers: a micro-batch must not end inside an open
transaction, or the transaction's messages before the end would be dropped by this batch (not yet
committed) and never read by the next. So the driver runs a Sequencer over each journal's new
bytes (json and csv framings only; through the broker) and ends the journal's range at the
*stable end*: the offset of the first message of the oldest transaction still open at the end,
or the end itself when none is open; a transaction whose last message is older than
`transactionTimeout` (600 s) counts as abandoned (its producer died without an ACK or a
rollback) and no longer holds the end back (journals whose first new message carries no UUID are not
scanned: a journal carries UUIDs in every message or in none). The next batch re-reads from
there with an empty Sequencer, which is exact: every transaction open at a later end began at
or after the stable end. Executors then settle transactions open at a partition's end by reading on to the write head.
The scan continues from where the previous call stopped. Spark 4.0 does not pass `start` to
`latestOffset`; the reader learns it from `initialOffset`, `partitions` and `commit`, and when it
cannot (the first call after a restart whose last batch was committed) it scans the journal from
its first fragment, which is exact but reads the whole journal once. `maxBytesPerTrigger` is not
applied on that one call, for the same reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from broker.client import JournalClient, list_journals
from broker.protocol import pb
from broker.protocol.selectors import parse_selector
from pipelines.source.batch import GazetteBatchReader
from pipelines.source.committed import CommittedFilter
from pipelines.source.options import EARLIEST, SourceOptions
from pipelines.source.planning import (
    GazettePartition,
    JournalInfo,
    broker_client,
    fragments_of,
    head_of,
    journal_info,
    lost,
    matching_journals,
    plan_range,
    resolve_offset,
    run,
    write_head,
)
from pipelines.source.read import broker_chunks, csv_uuid, feed, json_uuids, messages

log = logging.getLogger(__name__)

PEEK = 1 << 20
"""Bytes read at most to find whether a journal's new messages carry UUIDs."""


@dataclass
class _Scan:
    """Read-committed scan state of one journal: started empty at `start`, applied through `to`."""

    start: int
    to: int
    filter: CommittedFilter


class GazetteStreamReader(DataSourceStreamReader):
    """Micro-batches of every journal the selector matches, now and later."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self._reader = GazetteBatchReader(options, schema, streaming=True)
        self.opts: SourceOptions = self._reader.opts
        self._next: dict[str, int] | None = None  # Where the next micro-batch starts, when known.
        self._scans: dict[str, _Scan] = {}

    # --- Offsets --------------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        offsets = run(self._initial())
        self._next = dict(offsets)
        return offsets

    async def _initial(self) -> dict[str, int]:
        opts = self.opts
        out: dict[str, int] = {}
        async with broker_client(opts) as client:
            for spec in await matching_journals(client, opts):
                fragments = await fragments_of(client, spec.name, opts)
                head = head_of(fragments)
                begin = resolve_offset(spec.name, opts.starting, fragments, default=EARLIEST, head=head)
                ts = opts.starting_timestamp_ms
                if ts is not None:
                    newer = [f.spec.begin for f in fragments if f.spec.mod_time == 0 or f.spec.mod_time * 1000 >= ts]
                    begin = max(begin, min(newer, default=head))
                out[spec.name] = begin
        return out

    def latestOffset(self, start: dict | None = None, limit: object = None) -> dict:
        """The end of the next micro-batch (Spark 4.0 calls it without arguments; newer Sparks pass `start`)."""
        base = dict(start) if start is not None else self._next
        offsets = run(self._latest(base))
        self._next = dict(offsets)
        return offsets

    async def _latest(self, base: dict[str, int] | None) -> dict[str, int]:
        opts = self.opts
        async with broker_client(opts) as client:
            specs = await matching_journals(client, opts)
            heads = await asyncio.gather(*(write_head(client, s.name) for s in specs))
            out: dict[str, int] = dict(base or {})  # Journals that stopped matching keep their offsets.
            starts: dict[str, int | None] = {}
            for spec, head in zip(specs, heads, strict=True):
                # A journal new to the query is read from its beginning; None: not known (a restart).
                starts[spec.name] = (base.get(spec.name, 0) if base is not None else None)
                out[spec.name] = max(head, starts[spec.name] or 0)
            if opts.max_bytes_per_trigger is not None and base is not None:
                await self._limit(client, specs, starts, out, opts.max_bytes_per_trigger)
            if opts.read_committed:
                for spec in specs:
                    info = journal_info(spec, opts)
                    if info.framing in ("json", "csv"):
                        out[spec.name] = await self._stable_end(client, info, starts[spec.name], out[spec.name])
        return out

    async def _limit(
        self, client: JournalClient, specs: Sequence[pb.JournalSpec], starts: dict[str, int | None],
        ends: dict[str, int], limit: int,
    ) -> None:
        """Cut `ends` at fragment boundaries so that about `limit` bytes are read in all."""
        avail = {s.name: ends[s.name] - (starts[s.name] or 0) for s in specs}
        total = sum(avail.values())
        if total <= limit:
            return
        for spec in specs:
            name = spec.name
            if avail[name] <= 0:
                continue
            begin = starts[name] or 0
            budget = max(1, limit * avail[name] // total)
            fragments = [f.spec for f in await fragments_of(client, name, self.opts) if f.spec.end > begin]
            within = [f.end for f in fragments if f.end <= begin + budget]
            first = min((f.end for f in fragments), default=ends[name])
            ends[name] = min(ends[name], max(within, default=first))

    async def _stable_end(self, client: JournalClient, info: JournalInfo, start: int | None, end: int) -> int:
        """`end`, or the begin of the oldest transaction open at `end` if that is before it."""
        name = info.name
        if start is None:  # Not known (see the module docstring): scan from the first fragment.
            start = resolve_offset(name, "earliest", await fragments_of(client, name, self.opts), default=EARLIEST,
                                   head=end)
        scan = self._scans.get(name)
        if scan is None or not scan.start <= start <= scan.to or scan.to > end:
            scan = _Scan(start, start, CommittedFilter(name, start, start, lambda b, e: []))
            self._scans[name] = scan
        if scan.to < end and not scan.filter.open:
            if not await asyncio.to_thread(self._carries_uuids, info, scan.to, end):
                scan.to = end  # Journals carry UUIDs in every message or none: no transactions to wait for.
        if scan.to < end:

            def sequence() -> None:  # Blocking reads, streamed: the new range may be large.
                for m in messages(name, info.framing, broker_chunks(self.opts, name, scan.to, end), scan.to):
                    feed(scan.filter, m)

            await asyncio.to_thread(sequence)
            scan.to = end
        abandoned_before = time.time_ns() - int(self.opts.transaction_timeout * 1e9)
        return max(start, min(end, scan.filter.settled_before(abandoned_before)))

    def _carries_uuids(self, info: JournalInfo, begin: int, end: int) -> bool:
        """Whether the message at `begin` carries a UUID (read through the broker, up to its first newline)."""
        head = b""
        for _, data in broker_chunks(self.opts, info.name, begin, min(end, begin + PEEK)):
            head += data
            if b"\n" in head:
                break
        line = head[: head.find(b"\n") + 1]
        if info.framing == "csv":
            return csv_uuid(line) is not None
        return json_uuids(line, pa.array([line[:-1]], pa.binary())) is not None

    # --- Micro-batches --------------------------------------------------------------------------

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        if self._next is None:
            self._next = dict(end)  # A restart re-running its last planned batch.
        return run(self._plan(start, end))

    async def _plan(self, start: dict[str, int], end: dict[str, int]) -> list[GazettePartition]:
        opts = self.opts
        parts: list[GazettePartition] = []
        async with broker_client(opts) as client:
            specs = {s.name: s for s in await matching_journals(client, opts)}
            for name in sorted(end):
                stop = int(end[name])
                begin = int(start.get(name, 0))
                if stop <= begin:
                    continue
                spec = specs.get(name)
                if spec is None:  # It stopped matching after latestOffset: read the range it had.
                    listed = await list_journals(client, parse_selector(f"name={name}"))
                    if not listed.journals:
                        lost(name, begin, stop, opts)  # Deleted: its range is gone.
                        continue
                    spec = listed.journals[0].spec
                fragments = await fragments_of(client, name, opts)
                parts.extend(
                    plan_range(journal_info(spec, opts), fragments, begin, stop, opts, from_beginning=name not in start)
                )
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._reader.read(partition)

    def commit(self, end: dict) -> None:
        if self._next is None:
            self._next = dict(end)
