"""Executor-side reading of one partition into Arrow record batches.

Bytes come straight from the fragment's store when the partition has a URL (a `file://` one under
`fileRoot`, or a presigned S3 URL), decompressed per codec; otherwise through the broker's Read
RPC, bounded by the partition's end. Messages are framed per the journal's framing:

- `lines` and `json`: split at newlines into Arrow arrays (`split_lines`) in chunks of a few MiB,
  with no Python work per message. JSON messages carrying a Gazette UUID (a top-level `UUID` or
  `uuid` field, as the Publisher writes them, or `_meta.uuid`) have it extracted by Arrow's JSON
  parser and decoded into producer, clock and flags with numpy. A chunk whose first and last
  messages carry no UUID is taken to carry none (journals have UUIDs in every message or none).
- `csv` (UUID in the first field) and `fixed` (protobuf frames; no UUID): framed by the
  consumer's Unpackers, message by message.

Read-committed (the default, where messages carry UUIDs) filters rows through `CommittedFilter`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from uuid import UUID

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from broker.client import ClientError, JournalClient, OffsetJump, OffsetNotYetAvailable, RetryReader
from broker.client.fragments import _open_http, file_url_path, redact
from broker.fragment.codecs import decompressor
from broker.protocol import pb
from consumer.message import CSV_FRAMING, PROTO_FIXED_FRAMING, CSVRecord, Envelope, Flags, MessageError, parse_uuid
from pipelines.source.committed import CommittedFilter
from pipelines.source.lines import split_lines
from pipelines.source.options import SourceOptions
from pipelines.source.planning import GazettePartition, lost
from pipelines.source.schema import ARROW_BASE

log = logging.getLogger(__name__)

CHUNK = 4 << 20
"""Bytes split at once: large enough to amortize Arrow calls, small enough to stay in cache."""
RAW_READ = 1 << 20
"""Raw (compressed) bytes read from a store per step."""
JSON_BLOCK = 4 << 20
"""Arrow's JSON block size; a longer line falls back to Python's parser."""

Chunks = Iterator[tuple[int, bytes]]
"""(journal offset, bytes) in order: the content of a range."""

_UUID_KEYS = (b'"UUID"', b'"uuid"', b'"_meta"')
_UUID_SCHEMA = pa.schema(
    [pa.field("UUID", pa.string()), pa.field("uuid", pa.string()),
     pa.field("_meta", pa.struct([pa.field("uuid", pa.string())]))]
)
_UUID_RE = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
_ZERO_TEXT = "00000000-0000-0000-0000-000000000000"
_HEX_COLUMNS = np.r_[0:8, 9:13, 14:18, 19:23, 24:36]


# --- Byte sources -------------------------------------------------------------------------------


def direct_chunks(p: GazettePartition, file_root: str | None) -> Chunks:
    """Bytes [p.begin, p.end) of the partition's fragment, read from its store and decompressed."""
    frag = pb.Fragment(journal=p.journal.name, begin=p.fragment_begin, end=p.fragment_end, compression_codec=p.codec)  # type: ignore[arg-type]
    if p.url.startswith("file:"):
        raw = open(file_url_path(p.url, file_root), "rb")  # Closed below.
        codec = p.codec
    else:
        raw, codec = _open_http(p.url, frag)  # type: ignore[assignment]
    decomp = decompressor(codec)
    step = CHUNK if codec == pb.NONE else RAW_READ  # Uncompressed: read straight in chunks to split.
    at = p.fragment_begin
    try:
        while at < p.end:
            data = raw.read(step)
            if not data:
                raise OSError(f"fragment {redact(p.url)} ended at {at}, before {p.end}")
            out = decomp.decompress(data)
            start, at = at, at + len(out)
            if at <= p.begin:
                continue  # Before the partition: decoded only to get past it.
            lo = max(p.begin - start, 0)
            hi = min(p.end - start, len(out))
            yield start + lo, out[lo:hi] if lo or hi < len(out) else out
    finally:
        raw.close()


def broker_chunks(opts: SourceOptions, journal: str, begin: int, end: int) -> Chunks:
    """Bytes [begin, end) of `journal` through the broker (end 0: up to the write head at read time)."""
    loop = asyncio.new_event_loop()

    async def start() -> tuple[JournalClient, RetryReader]:
        client = JournalClient(opts.broker, credentials=opts.credentials())
        return client, RetryReader(client, journal, offset=begin, end_offset=end, block=False)

    client, reader = loop.run_until_complete(start())
    try:
        while True:
            try:
                data = loop.run_until_complete(reader.read())
            except OffsetJump as jump:
                lost(journal, jump.offset if jump.offset is not None else begin, jump.to, opts)
                continue
            except OffsetNotYetAvailable:
                return  # The write head.
            if not data:
                return
            yield reader.offset - len(data), data
    finally:
        loop.run_until_complete(reader.close())
        loop.run_until_complete(client.close())
        loop.close()


def partition_chunks(p: GazettePartition, opts: SourceOptions) -> Chunks:
    """The partition's bytes: straight from the store if it can, else (or if that fails) through the broker."""
    at = p.begin
    if p.direct and p.url:
        try:
            for offset, data in direct_chunks(p, opts.file_root):
                yield offset, data
                at = offset + len(data)
            return
        except (OSError, ValueError, ClientError) as exc:
            # E.g. an expired signature: the broker can still serve the rest.
            log.warning("direct read of %s failed at %d (%s); reading through the broker", redact(p.url), at, exc)
    if at < p.end:
        yield from broker_chunks(opts, p.journal.name, at, p.end)


# --- Framing ------------------------------------------------------------------------------------


@dataclass
class Messages:
    """Consecutive messages of a journal: offsets, ends, values, and UUID text (None if none carry one)."""

    offsets: pa.Int64Array
    ends: np.ndarray
    values: pa.BinaryArray
    uuids: pa.StringArray | None
    raw: pa.Buffer | None = None
    """The newline-delimited bytes of the values, for Arrow's JSON parser (lines framing only; a
    zero-copy view of the split chunk, so a read that parses nothing copies nothing)."""

    def __len__(self) -> int:
        return len(self.offsets)


def line_messages(chunks: Chunks, *, with_uuids: bool) -> Iterator[Messages]:
    """Newline-delimited messages of `chunks`, a few MiB at a time."""
    pending: list[bytes] = []
    size = 0
    base = -1  # Journal offset of the first pending byte (including `rest`).
    rest = b""
    expected = -1

    def split(final: bool) -> Iterator[Messages]:
        nonlocal rest, base, pending, size
        # One copy of the pending bytes at most (none for a lone block), whatever `rest` holds.
        data = (pending[0] if len(pending) == 1 else b"".join(pending)) if not rest else b"".join([rest, *pending])
        pending, size = [], 0
        values, offsets, consumed = split_lines(data, base)
        if consumed:
            raw = pa.py_buffer(data).slice(0, consumed)
            starts = offsets.to_numpy()
            ends = np.empty(len(starts), dtype=np.int64)
            ends[:-1] = starts[1:]
            ends[-1] = base + consumed
            uuids = json_uuids(raw, values) if with_uuids else None
            yield Messages(offsets, ends, values, uuids, raw)
        rest = data[consumed:]
        base += consumed
        if final and rest:
            log.warning("dropping %d bytes at offset %d: not a whole message (no trailing newline)", len(rest), base)
            rest = b""

    for offset, data in chunks:
        if expected not in (-1, offset):
            yield from split(final=True)  # Content was skipped (failOnDataLoss=false): start over.
        if base == -1 or (not rest and not pending):
            base = offset
        expected = offset + len(data)
        pending.append(data)
        size += len(data)
        if size >= CHUNK:
            yield from split(final=False)
    if pending or rest:
        yield from split(final=True)


def frame_messages(chunks: Chunks, journal: str, framing: str, begin: int) -> Iterator[Messages]:
    """Messages of the csv or fixed framing, through the consumer's Unpackers."""
    fr = CSV_FRAMING if framing == "csv" else PROTO_FIXED_FRAMING
    unpacker = fr.unpacker(journal, begin)
    offsets: list[int] = []
    ends: list[int] = []
    values: list[bytes] = []
    uuids: list[str | None] = []

    def drain(eof: bool) -> None:
        while True:
            try:
                frame = unpacker.next_frame(eof=eof)
            except MessageError as exc:
                log.warning("skipping undecodable bytes: %s", exc)
                continue
            if frame is None:
                return
            offsets.append(frame.begin)
            ends.append(frame.end)
            if framing == "csv":
                values.append(frame.data.rstrip(b"\r\n"))
                uuids.append(csv_uuid(frame.data))
            else:
                values.append(frame.data[8:])
                uuids.append(None)

    def batch() -> Messages:
        u = pa.array(uuids, pa.string()) if any(x is not None for x in uuids) else None
        out = Messages(pa.array(offsets, pa.int64()), np.array(ends, dtype=np.int64), pa.array(values, pa.binary()), u)
        offsets.clear()
        ends.clear()
        values.clear()
        uuids.clear()
        return out

    for offset, data in chunks:
        unpacker.feed(data, offset)
        drain(False)
        if len(offsets) >= 65536:
            yield batch()
    drain(True)
    if offsets:
        yield batch()


def csv_uuid(data: bytes) -> str | None:
    record = CSVRecord()
    try:
        CSV_FRAMING.unmarshal(data, record)
        return str(parse_uuid(record[0])) if record else None
    except Exception:
        return None


def messages(p_journal: str, framing: str, chunks: Chunks, begin: int) -> Iterator[Messages]:
    if framing in ("lines", "json"):
        return line_messages(chunks, with_uuids=framing == "json")
    return frame_messages(chunks, p_journal, framing, begin)


def read_json(raw: bytes | pa.Buffer, schema: pa.Schema, rows: int) -> pa.Table | None:
    """`raw` (JSON lines) parsed by Arrow into `schema`; None if it fails or yields another row count."""
    try:
        table = pajson.read_json(
            pa.BufferReader(raw),
            read_options=pajson.ReadOptions(block_size=JSON_BLOCK),
            parse_options=pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return table if table.num_rows == rows else None  # Blank lines are skipped by Arrow.


def _loads(value: bytes | None) -> object:
    try:
        return json.loads(value) if value is not None else None
    except ValueError:
        return None


def json_uuids(raw: bytes | pa.Buffer, values: pa.BinaryArray) -> pa.StringArray | None:
    """The UUID text of each JSON message (null where absent); None when no message has one."""
    # Journals carry UUIDs in every message or in none: looking at the first and last messages of
    # the chunk keeps plain JSON lines free of a scan of every byte (which cost ~40% of a read).
    if len(values) == 0:
        return None
    first, last = values[0].as_py(), values[len(values) - 1].as_py()
    if not any(key in first or key in last for key in _UUID_KEYS):
        return None
    table = read_json(raw, _UUID_SCHEMA, len(values))
    if table is not None:
        meta = pc.struct_field(table.column("_meta").combine_chunks(), [0])
        out = pc.coalesce(table.column("UUID").combine_chunks(), table.column("uuid").combine_chunks(), meta)
    else:
        texts: list[str | None] = []
        for doc in (_loads(v) for v in values.to_pylist()):
            found = None
            if isinstance(doc, dict):
                found = doc.get("UUID", doc.get("uuid"))
                meta_doc = doc.get("_meta")
                if found is None and isinstance(meta_doc, dict):
                    found = meta_doc.get("uuid")
            texts.append(found if isinstance(found, str) else None)
        out = pa.array(texts, pa.string())
    return None if out.null_count == len(out) else out


def uuid_columns(text: pa.StringArray) -> dict[str, pa.Array]:
    """uuid (canonical lower case), producer (12 hex digits), clock and flags of each UUID; null if invalid."""
    lower = pc.utf8_lower(text)
    ok = pc.fill_null(pc.match_substring_regex(lower, _UUID_RE), False)
    filled = pc.if_else(ok, lower, _ZERO_TEXT)
    n = len(filled)
    first = int(np.frombuffer(filled.buffers()[1], dtype=np.int32, count=1, offset=4 * filled.offset)[0])
    chars = np.frombuffer(filled.buffers()[2], dtype=np.uint8, count=36 * n, offset=first).reshape(n, 36)
    hexes = chars[:, _HEX_COLUMNS].astype(np.uint64)
    nibbles = np.where(hexes >= 97, hexes - 87, hexes - 48)
    b = (nibbles[:, 0::2] << np.uint64(4)) | nibbles[:, 1::2]
    time_low = (b[:, 0] << np.uint64(24)) | (b[:, 1] << np.uint64(16)) | (b[:, 2] << np.uint64(8)) | b[:, 3]
    time_mid = (b[:, 4] << np.uint64(8)) | b[:, 5]
    time_hi = (b[:, 6] << np.uint64(8)) | b[:, 7]
    # As Gazette's GetClock: the version nibble shifts out of the uint64.
    clock = (
        (time_low << np.uint64(4)) | (time_mid << np.uint64(36)) | (time_hi << np.uint64(52))
        | ((b[:, 8] >> np.uint64(2)) & np.uint64(0xF))
    )
    flags = ((b[:, 8] << np.uint64(8)) | b[:, 9]) & np.uint64(0x3FF)
    invalid = ~ok.to_numpy(zero_copy_only=False)
    return {
        "uuid": pc.if_else(ok, lower, None),
        "producer": pc.if_else(ok, pc.utf8_slice_codeunits(filled, 24, 36), None),
        "clock": pa.array(clock.view(np.int64), pa.int64(), mask=invalid),
        "flags": pa.array(flags.astype(np.int32), pa.int32(), mask=invalid),
    }


# --- Rows ---------------------------------------------------------------------------------------


class RowBuilder:
    """Turns Messages of one partition into record batches of exactly `schema`."""

    def __init__(self, p: GazettePartition, schema: pa.Schema, extra: pa.Schema | None) -> None:
        self.p = p
        self.schema = schema
        self.extra = extra
        # The schema's own type: a user schema may declare `labels` with nullable elements.
        labels = schema.field("labels").type if "labels" in schema.names else ARROW_BASE.field("labels").type
        self._labels = pa.array([list((k, v) for k, v in p.journal.labels.items())], labels)
        mod = p.mod_time * 1_000_000 if p.mod_time else None
        self._mod_time = pa.array([mod], ARROW_BASE.field("fragment_mod_time").type)
        self._journal = pa.array([p.journal.name], ARROW_BASE.field("journal").type)
        self._constants: dict[str, pa.Array] = {}  # Repeated columns, sliced for each batch.

    def _constant(self, name: str, one: pa.Array, n: int) -> pa.Array:
        """`one`'s value `n` times: built once per partition at the largest size, then sliced (no copy)."""
        have = self._constants.get(name)
        if have is None or len(have) < n:
            have = one.take(pa.array(np.zeros(max(n, 1 << 16), dtype=np.int32)))
            self._constants[name] = have
        return have.slice(0, n)

    def build(self, m: Messages, keep: np.ndarray | None) -> pa.RecordBatch | None:
        """The rows of `m` where `keep` (all if None), less ACKs; None if no row is left."""
        n = len(m)
        parts = uuid_columns(m.uuids) if m.uuids is not None else None
        if parts is not None:
            is_ack = pc.fill_null(pc.equal(parts["flags"], int(Flags.ACK_TXN)), False)
            not_ack = ~is_ack.to_numpy(zero_copy_only=False)
            keep = not_ack if keep is None else keep & not_ack
        if keep is not None and not keep.any():
            return None
        parsed: pa.StructArray | None = None
        columns = []
        for f in self.schema:
            name = f.name
            if name == "journal":
                col = self._constant(name, self._journal, n)
            elif name == "offset":
                col = m.offsets
            elif name == "value":
                col = m.values
            elif name in ("uuid", "producer", "clock", "flags"):
                col = parts[name] if parts is not None else pa.nulls(n, f.type)
            elif name == "fragment_mod_time":
                col = self._constant(name, self._mod_time, n)
            elif name == "labels":
                col = self._constant(name, self._labels, n)
            else:
                if parsed is None:
                    parsed = self._parse(m)
                col = parsed.field(name)
            columns.append(col)
        batch = pa.RecordBatch.from_arrays(columns, schema=self.schema)
        return batch.filter(pa.array(keep)) if keep is not None and not keep.all() else batch

    def _parse(self, m: Messages) -> pa.StructArray:
        """The extra columns, parsed from each JSON value (null where a value does not parse)."""
        assert self.extra is not None
        struct = pa.struct(list(self.extra))
        table = read_json(m.raw, self.extra, len(m)) if m.raw is not None else None
        if table is not None:
            return pa.StructArray.from_arrays([table.column(f.name).combine_chunks() for f in self.extra],
                                              fields=list(self.extra))
        rows = []
        for doc in (_loads(v) for v in m.values.to_pylist()):
            rows.append({f.name: doc.get(f.name) for f in self.extra} if isinstance(doc, dict) else None)
        try:
            return pa.array(rows, struct)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            out = []
            for row in rows:  # Row by row, so one bad value nulls only its own row.
                try:
                    out.append(pa.array([row], struct))
                except (pa.ArrowInvalid, pa.ArrowTypeError):
                    out.append(pa.nulls(1, struct))
            return pa.concat_arrays(out)


def to_uuids(text: pa.StringArray | None, n: int) -> list[UUID | None]:
    if text is None:
        return [None] * n
    out: list[UUID | None] = []
    for value in text.to_pylist():
        try:
            out.append(UUID(value) if value is not None else None)
        except ValueError:
            out.append(None)
    return out


def envelopes(journal: str, framing: str, chunks: Chunks, begin: int) -> Iterator[Envelope[None]]:
    """Envelopes of the messages of `chunks` which carry a UUID (for a Sequencer replay)."""
    for m in messages(journal, framing, chunks, begin):
        offsets = m.offsets.to_pylist()
        for i, u in enumerate(to_uuids(m.uuids, len(m))):
            if u is not None:
                yield Envelope(journal, offsets[i], int(m.ends[i]), None, u)


def read_partition(
    p: GazettePartition, opts: SourceOptions, schema: pa.Schema, extra: pa.Schema | None
) -> Iterator[pa.RecordBatch]:
    """The rows of partition `p` as record batches of `schema`."""
    rows = RowBuilder(p, schema, extra)
    framing = p.journal.framing
    source = messages(p.journal.name, framing, partition_chunks(p, opts), p.begin)
    if not opts.read_committed or framing in ("lines", "fixed"):
        for m in source:
            if (batch := rows.build(m, None)) is not None:
                yield batch
        return

    def replay(begin: int, end: int) -> Iterable[Envelope[None]]:
        return list(envelopes(p.journal.name, framing, broker_chunks(opts, p.journal.name, begin, end), begin))

    flt = CommittedFilter(p.journal.name, p.begin, p.end, replay)
    held: deque[Messages] = deque()
    for m in source:
        if m.uuids is None and not held and not flt.open:
            if (batch := rows.build(m, None)) is not None:  # Nothing to sequence: all rows commit.
                yield batch
            continue
        feed(flt, m)
        held.append(m)
        yield from flush(rows, flt, held, final=False)
    if flt.pending_inside() and (p.read_limit == 0 or p.read_limit > p.end):
        # Settle transactions left open at the end by reading on (they commit or roll back later).
        past = broker_chunks(opts, p.journal.name, p.end, p.read_limit)
        for m in messages(p.journal.name, framing, past, p.end):
            feed(flt, m)
            if not flt.pending_inside():
                break
    yield from flush(rows, flt, held, final=True)


def feed(flt: CommittedFilter, m: Messages) -> None:
    offsets = m.offsets.to_pylist()
    ends = m.ends.tolist()
    for offset, end, u in zip(offsets, ends, to_uuids(m.uuids, len(m)), strict=True):
        flt.feed(offset, end, u)


def flush(rows: RowBuilder, flt: CommittedFilter, held: deque[Messages], *, final: bool) -> Iterator[pa.RecordBatch]:
    """Emit held batches whose every message is decided (all of them if `final`)."""
    settled = flt.settled_before()
    while held and (final or int(held[0].ends[-1]) <= settled):
        m = held.popleft()
        keep = np.fromiter(flt.take(m.offsets.to_pylist()), dtype=bool, count=len(m))
        if (batch := rows.build(m, keep)) is not None:
            yield batch


PartitionReader = Callable[[GazettePartition], Iterator[pa.RecordBatch]]
