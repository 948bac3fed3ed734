"""The Summer: a consumer application folding each stream's chunks into a running CRC-64 sum.

Each shard reads one chunk partition (see `specs.shard_specs`) read-committed. Its store is
chosen by the shard's `store` label, as Gazette's summer chooses RocksDB or SQLite:

- no label (or `store: sql`): a `SQLStore` (`SumStore`): a SQLite file per shard by default, or
  one PostgreSQL database for all shards when a DSN is configured, holding the checkpoint table
  and::

      stream_sums (stream_id TEXT PRIMARY KEY, seq_no INTEGER, value BIGINT)

- `store: sqlite`: a `SQLiteStore` on the shard's local disk, recorded to its recovery log
  (`RecordedSumStore`), with the same `stream_sums` table;
- `store: json`: a `JSONFileStore` recorded to the recovery log (`JSONSumStore`), whose state
  maps each open stream's ID to `[seq_no, value]`.

The recorded stores need the shard's spec to name a `recovery_log_prefix` (`specs.shard_specs`
does when given store labels); another label value fails the shard, naming it.

`value` is the running CRC-64, stored as a signed 64-bit integer in the SQL tables (both
databases' integers are signed; `to_signed` / `to_unsigned` convert), unsigned in JSON.

For each chunk (ACKs are skipped) the summer takes the stream's state from the store's cache,
or else from the table (a missing row is a new stream: SeqNo 0, sum 0), and requires the chunk's
SeqNo to be the next one. A chunk out of sequence (a duplicate, or one after a skipped chunk:
an exactly-once violation upstream or in the runtime) raises `OutOfSequence`, naming the stream
and both sequence numbers: the shard FAILS, which is how the crash test detects it, as
Gazette's summer `log.Fatal`s. On a stream's final (empty) chunk it publishes the `Sum`
uncommitted to a sums partition (ModuloMapping on the stream ID), so its ACK follows the
transaction's commit, and deletes the stream's row. `finalize_txn` writes the rows changed in
the transaction (upsert, or delete for finished streams).

The cache (Gazette's store Cache) keeps every stream this store instance has touched, and
finished streams as tombstones (bounded, oldest dropped first): on PostgreSQL the next
transaction runs while the previous one commits, so a row re-read from the table could be one
commit behind; the cache is always current. It is cleared whenever the store restores its
checkpoint (the table is then settled).

Configuration (constructor arguments, else environment variables, read when the first store
is built):

- `dsn` / `STREAM_SUM_POSTGRES_DSN`: a libpq DSN; PostgreSQL when set.
- `sqlite_dir` / `STREAM_SUM_SQLITE_DIR` (default `./stream-sum-data`): the directory of the
  per-shard SQLite files, `<shard id, quoted>.db`.
- `prefix` / `STREAM_SUM_PREFIX` (default `examples/stream-sum/`): the journal name prefix; the
  sum partitions are the journals labelled `message-type: stream_sum.Sum` under it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import sqlite3
import urllib.parse
from pathlib import Path
from typing import Any, Final

from broker.client import list_journals
from broker.protocol import pb
from consumer.message import Envelope, Flags, Publisher, get_flags, modulo_mapping
from consumer.message.mapping import MappingFunc
from consumer.shard import Shard
from consumer.stores import JSONFileStore, SQLiteStore, SQLStore, create_checkpoint_table
from examples.stream_sum import crc64
from examples.stream_sum.messages import SUM_MESSAGE_TYPE, Chunk, Sum, stream_key
from examples.stream_sum.specs import DEFAULT_PREFIX, STORE_LABEL, partitions_selector

LIST_RETRY_SECONDS = 60.0
"""How long a new store retries listing the sum journals while brokers are unreachable."""

log = logging.getLogger(__name__)

ENV_DSN: Final = "STREAM_SUM_POSTGRES_DSN"
ENV_SQLITE_DIR: Final = "STREAM_SUM_SQLITE_DIR"
ENV_PREFIX: Final = "STREAM_SUM_PREFIX"
DEFAULT_SQLITE_DIR: Final = "stream-sum-data"
MAX_TOMBSTONES: Final = 100_000
"""Finished streams remembered per store (a chunk of one is out of sequence)."""

STORE_KINDS: Final = ("sql", "sqlite", "json")

SUMS_TABLE_SQL: Final = (
    "CREATE TABLE IF NOT EXISTS stream_sums ("
    "stream_id TEXT PRIMARY KEY NOT NULL, seq_no INTEGER NOT NULL, value BIGINT NOT NULL)"
)


class OutOfSequence(Exception):
    """A chunk is not the next one of its stream: a duplicate, or one after a skipped chunk."""

    def __init__(self, stream: str, seq_no: int, expected: int, *, finished: bool = False) -> None:
        self.stream, self.seq_no, self.expected, self.finished = stream, seq_no, expected, finished
        if finished:
            what = f"chunk SeqNo {seq_no} of stream {stream}, which already finished"
        else:
            kind = "a duplicate" if seq_no < expected else "chunks were skipped"
            what = f"chunk SeqNo {seq_no} of stream {stream} is out of sequence (expected {expected}: {kind})"
        super().__init__(f"invalid chunk: {what}")


def to_signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def to_unsigned(value: int) -> int:
    return value + (1 << 64) if value < 0 else value


class SumCache:
    """A store's view of its streams: (seq_no, sum) by stream ID hex, None for a finished stream."""

    def __init__(self) -> None:
        self.streams: dict[str, tuple[int, int] | None] = {}
        self.finished: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.dirty: set[str] = set()

    def clear(self) -> None:
        self.streams.clear()
        self.finished.clear()
        self.dirty.clear()

    def finish(self, stream: str) -> None:
        self.streams[stream] = None
        self.dirty.add(stream)
        self.finished[stream] = None
        while len(self.finished) > MAX_TOMBSTONES:
            old, _ = self.finished.popitem(last=False)
            if old not in self.dirty:
                self.streams.pop(old, None)


_UPSERT_SQL: Final = (
    "INSERT INTO stream_sums (stream_id, seq_no, value) VALUES (?, ?, ?) "
    "ON CONFLICT (stream_id) DO UPDATE SET seq_no = excluded.seq_no, value = excluded.value"
)
_SELECT_SQL: Final = "SELECT seq_no, value FROM stream_sums WHERE stream_id = ?"
_DELETE_SQL: Final = "DELETE FROM stream_sums WHERE stream_id = ?"


class SumStore(SQLStore):
    """A SQLStore with the summer's cache, cleared whenever the checkpoint is restored."""

    def __init__(self, connect: Any, *, placeholder: str) -> None:
        super().__init__(connect)
        self.placeholder = placeholder
        self.cache: SumCache = SumCache()

    async def restore_checkpoint(self, shard: Shard) -> Any:
        self.cache.clear()
        return await super().restore_checkpoint(shard)

    def sql(self, text: str) -> str:
        return text.replace("?", self.placeholder)

    async def load(self, stream: str) -> tuple[int, int] | None:
        """The stored (seq_no, sum) of an open stream, or None."""
        rows = (await self.execute(self.sql(_SELECT_SQL), (stream,))).rows
        return (int(rows[0][0]), to_unsigned(int(rows[0][1]))) if rows else None

    async def write(self, upserts: list[tuple[str, int, int]], deletes: list[str]) -> None:
        """Store the (stream, seq_no, sum) of `upserts` and remove the finished `deletes`."""
        if upserts:
            await self.executemany(self.sql(_UPSERT_SQL), [(i, n, to_signed(v)) for i, n, v in upserts])
        if deletes:
            await self.executemany(self.sql(_DELETE_SQL), [(i,) for i in deletes])


class RecordedSumStore:
    """The sums in a `SQLiteStore` recorded to the shard's recovery log (`store: sqlite`)."""

    def __init__(self, sqlite: SQLiteStore) -> None:
        self.sqlite = sqlite
        self.cache: SumCache = SumCache()

    @classmethod
    async def open(cls, recorder: Any) -> RecordedSumStore:
        sqlite = await SQLiteStore.open(recorder)
        sqlite.execute(SUMS_TABLE_SQL)
        return cls(sqlite)

    async def restore_checkpoint(self, shard: Shard) -> Any:
        self.cache.clear()
        return await self.sqlite.restore_checkpoint(shard)

    def start_commit(self, shard: Shard, checkpoint: Any, wait_for: Any) -> Any:
        return self.sqlite.start_commit(shard, checkpoint, wait_for)

    async def destroy(self) -> None:
        await self.sqlite.destroy()

    async def load(self, stream: str) -> tuple[int, int] | None:
        rows = self.sqlite.query(_SELECT_SQL, (stream,))
        return (int(rows[0][0]), to_unsigned(int(rows[0][1]))) if rows else None

    async def write(self, upserts: list[tuple[str, int, int]], deletes: list[str]) -> None:
        if upserts:
            self.sqlite.executemany(_UPSERT_SQL, [(i, n, to_signed(v)) for i, n, v in upserts])
        if deletes:
            self.sqlite.executemany(_DELETE_SQL, [(i,) for i in deletes])


class JSONSumStore:
    """The sums in a `JSONFileStore` recorded to the shard's recovery log (`store: json`): its
    state maps each open stream's ID (hex) to `[seq_no, sum]`."""

    def __init__(self, recorder: Any) -> None:
        self.json: JSONFileStore[dict[str, list[int]]] = JSONFileStore(recorder, {})
        self.cache: SumCache = SumCache()

    async def restore_checkpoint(self, shard: Shard) -> Any:
        self.cache.clear()
        return await self.json.restore_checkpoint(shard)

    def start_commit(self, shard: Shard, checkpoint: Any, wait_for: Any) -> Any:
        return self.json.start_commit(shard, checkpoint, wait_for)

    async def destroy(self) -> None:
        await self.json.destroy()

    async def load(self, stream: str) -> tuple[int, int] | None:
        found = self.json.state.get(stream)
        return (int(found[0]), int(found[1])) if found else None

    async def write(self, upserts: list[tuple[str, int, int]], deletes: list[str]) -> None:
        state = self.json.state
        for stream, seq_no, value in upserts:
            state[stream] = [seq_no, value]
        for stream in deletes:
            state.pop(stream, None)


AnySumStore = SumStore | RecordedSumStore | JSONSumStore


def store_kind(shard: Shard) -> str:
    """The store a shard's `store` label names (`sql` without one); ValueError for another value."""
    found = [lbl.value for lbl in shard.spec.labels.labels if lbl.name == STORE_LABEL]
    kind = found[0] if found else "sql"
    if kind not in STORE_KINDS:
        raise ValueError(f"shard {shard.id}: label {STORE_LABEL}={kind!r} is not one of {', '.join(STORE_KINDS)}")
    if kind != "sql" and not shard.spec.recovery_log_prefix:
        raise ValueError(f"shard {shard.id}: store {kind} is recorded to a recovery log, and the shard's spec "
                         "has no recovery_log_prefix")
    return kind


def sqlite_path(directory: Path, shard_id: str) -> Path:
    """The SQLite file of a shard: its ID, quoted to one file name."""
    return directory / (urllib.parse.quote(shard_id, safe="-_+.") + ".db")


class Summer:
    """The stream-sum consumer application (see the module's doc)."""

    def __init__(self, *, dsn: str | None = None, sqlite_dir: str | Path | None = None,
                 prefix: str | None = None) -> None:
        self._dsn = dsn
        self._sqlite_dir = None if sqlite_dir is None else Path(sqlite_dir)
        self._prefix = prefix
        self._configured = False
        self._created: set[str] = set()
        self._lock = asyncio.Lock()
        self._sums: pb.ListResponse | None = None
        self.mapping: MappingFunc = modulo_mapping(stream_key, self._sum_partitions)
        self.sums_published = 0
        """Sums this process published (uncommitted: some may be rolled back)."""

    # -- configuration ------------------------------------------------------------------------

    def _configure(self) -> None:
        if self._configured:
            return
        self._configured = True
        if self._dsn is None:
            self._dsn = os.environ.get(ENV_DSN) or None
        if self._sqlite_dir is None:
            self._sqlite_dir = Path(os.environ.get(ENV_SQLITE_DIR) or DEFAULT_SQLITE_DIR)
        if self._prefix is None:
            self._prefix = os.environ.get(ENV_PREFIX) or DEFAULT_PREFIX

    @property
    def prefix(self) -> str:
        self._configure()
        assert self._prefix is not None
        return self._prefix

    def _sum_partitions(self) -> pb.ListResponse:
        if self._sums is None or not self._sums.journals:
            raise RuntimeError(f"no sum partitions (journals labelled {SUM_MESSAGE_TYPE} under {self.prefix!r})")
        return self._sums

    async def _refresh_sums(self, shard: Shard) -> None:
        # The broker may be restarting (or its lease expiring): retry for a while before failing the shard.
        selector = partitions_selector(SUM_MESSAGE_TYPE, self.prefix)
        sums = await list_journals(shard.journal_client, selector, retry_for=LIST_RETRY_SECONDS)
        if not sums.journals:
            raise RuntimeError(f"no journals labelled {SUM_MESSAGE_TYPE} under {self.prefix!r} to publish sums to")
        self._sums = sums

    # -- Application --------------------------------------------------------------------------

    async def new_store(self, shard: Shard, recorder: Any | None) -> AnySumStore:
        self._configure()
        kind = store_kind(shard)
        async with self._lock:
            await self._refresh_sums(shard)
            if kind == "sqlite":
                return await RecordedSumStore.open(recorder)
            if kind == "json":
                return JSONSumStore(recorder)
            if self._dsn:
                dsn = self._dsn
                if dsn not in self._created:
                    await asyncio.to_thread(_create_postgres_tables, dsn)
                    self._created.add(dsn)
                return SumStore(lambda: _psycopg_connect(dsn), placeholder="%s")
            assert self._sqlite_dir is not None
            path = sqlite_path(self._sqlite_dir, shard.id)
            if str(path) not in self._created:
                await asyncio.to_thread(_create_sqlite_tables, path)
                self._created.add(str(path))
            return SumStore(lambda: sqlite3.connect(path, timeout=30.0), placeholder="?")

    def new_message(self, spec: pb.JournalSpec) -> Chunk:
        return Chunk()

    async def consume_message(
        self, shard: Shard, store: Any, envelope: Envelope[Any], publisher: Publisher
    ) -> None:
        if get_flags(envelope.uuid) == Flags.ACK_TXN:
            return
        chunk: Chunk = envelope.message
        sums: AnySumStore = store
        cache = sums.cache
        stream = chunk.ID.hex()
        if stream in cache.streams:
            state = cache.streams[stream]
            if state is None:
                raise OutOfSequence(stream, chunk.SeqNo, 0, finished=True)
        else:
            state = await sums.load(stream) or (0, 0)
        seq_no, value = state
        if chunk.SeqNo != seq_no + 1:
            raise OutOfSequence(stream, chunk.SeqNo, seq_no + 1)
        value = crc64.update(value, chunk.Data)
        if chunk.final:
            publisher.publish_uncommitted(self.mapping, Sum(ID=chunk.ID, SeqNo=chunk.SeqNo, Value=value))
            self.sums_published += 1
            cache.finish(stream)
        else:
            cache.streams[stream] = (chunk.SeqNo, value)
            cache.dirty.add(stream)

    async def finalize_txn(self, shard: Shard, store: Any, publisher: Publisher) -> None:
        sums: AnySumStore = store
        cache = sums.cache
        upserts: list[tuple[str, int, int]] = []
        deletes: list[str] = []
        for stream in cache.dirty:
            state = cache.streams.get(stream)
            if state is None:
                deletes.append(stream)
            else:
                upserts.append((stream, state[0], state[1]))
        cache.dirty.clear()
        await sums.write(upserts, deletes)


def _psycopg_connect(dsn: str) -> Any:
    import psycopg

    return psycopg.connect(dsn)


def _create_sqlite_tables(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=30.0)
    try:
        create_checkpoint_table(conn)
        conn.execute(SUMS_TABLE_SQL)
        conn.commit()
    finally:
        conn.close()


def _create_postgres_tables(dsn: str) -> None:
    import psycopg

    # Concurrent CREATE TABLE IF NOT EXISTS of one table can still collide in PostgreSQL's
    # catalog (another process creating it at the same moment): try again, it exists by then.
    for attempt in range(5):
        try:
            with psycopg.connect(dsn) as conn:
                create_checkpoint_table(conn)
                conn.execute(SUMS_TABLE_SQL)
                conn.commit()
            return
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
            if attempt == 4:
                raise


__all__ = [
    "DEFAULT_SQLITE_DIR",
    "ENV_DSN",
    "ENV_PREFIX",
    "ENV_SQLITE_DIR",
    "STORE_KINDS",
    "STORE_LABEL",
    "JSONSumStore",
    "OutOfSequence",
    "RecordedSumStore",
    "SumCache",
    "SumStore",
    "Summer",
    "sqlite_path",
    "store_kind",
    "to_signed",
    "to_unsigned",
]
