"""The application `bench_consumer` runs under `gazette consume tests.benchmarks.consumer_app:app`.

It counts read-committed messages by Key into the shard's SQLStore and, once per `every` inputs
(100), publishes one derived message to the output journal within the transaction (so it is
committed with it: read-committed readers see it once the transaction's ACK follows).

Counts are summed in memory during a transaction, in the store's `cache` (as Gazette's
`SQLStore.Cache` keeps a shard's state beside its store), and written in `finalize_txn` (one row
per key the transaction saw), rather than one statement per message: on SQLite by one
`executemany` upsert, on PostgreSQL by one upsert of `unnest`ed arrays (psycopg pipelines an
executemany, a Python round of its own per row: a thousand rows cost the process a tenth of a
second a commit).

Configured by the consumer process's environment:

- $GAZETTE_BENCH_STORE: `sqlite:<path>` (created with its tables when missing; WAL journal,
  `synchronous=NORMAL`) or `postgres:<libpq DSN>` (tables created when missing);
- $GAZETTE_BENCH_DERIVED: the output journal (no derived messages when unset);
- $GAZETTE_BENCH_EVERY: inputs per derived message (default 100).
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from consumer.message import ZERO_UUID, Envelope, Flags, Publisher, get_flags
from consumer.stores import SQLStore, create_checkpoint_table

NDJSON = "application/x-ndjson"
STORE_ENV = "GAZETTE_BENCH_STORE"
DERIVED_ENV = "GAZETTE_BENCH_DERIVED"
EVERY_ENV = "GAZETTE_BENCH_EVERY"

COUNTS_DDL = ("CREATE TABLE IF NOT EXISTS counts (shard TEXT NOT NULL, key TEXT NOT NULL, n BIGINT NOT NULL, "
              "PRIMARY KEY (shard, key))")


@dataclasses.dataclass
class Event:
    """An input message: {"UUID", "Key", "T" (ns since the epoch when published), "Pad"}."""

    UUID: uuid.UUID = ZERO_UUID
    Key: str = ""
    T: int = 0
    Pad: str = ""

    def get_uuid(self) -> uuid.UUID:
        return self.UUID

    def set_uuid(self, value: uuid.UUID) -> None:
        self.UUID = value

    def new_acknowledgement(self, journal: str) -> Event:
        return Event()


@dataclasses.dataclass
class Derived:
    """An output message: the `N`-th input of the shard was `Key`, published at `T`."""

    UUID: uuid.UUID = ZERO_UUID
    Key: str = ""
    N: int = 0
    T: int = 0

    def get_uuid(self) -> uuid.UUID:
        return self.UUID

    def set_uuid(self, value: uuid.UUID) -> None:
        self.UUID = value

    def new_acknowledgement(self, journal: str) -> Derived:
        return Derived()


def sqlite_connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30.0)
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def create_tables(conn: Any) -> None:
    """The checkpoint table and the counts table, where missing, on a DB-API connection; committed."""
    create_checkpoint_table(conn)
    conn.execute(COUNTS_DDL)
    conn.commit()


def create_sqlite_tables(path: Path) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        create_tables(conn)
    finally:
        conn.close()


def create_postgres_tables(dsn: str) -> None:
    postgres_connect(dsn).close()


def postgres_connect(dsn: str) -> Any:
    """A connection whose tables exist: made in the store's own thread, where a second connection
    opened by new_store would block the event loop for tens of milliseconds."""
    import psycopg

    conn = psycopg.connect(dsn)
    create_tables(conn)
    return conn


def read_total(store: str) -> int:
    """Committed count of all keys, over all shards, in the store named as $GAZETTE_BENCH_STORE names it."""
    kind, _, where = store.partition(":")
    query = "SELECT COALESCE(SUM(n), 0) FROM counts"
    if kind == "sqlite":
        conn = sqlite3.connect(where, timeout=30.0)
        try:
            return int(conn.execute(query).fetchone()[0])
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(where) as pconn:
        row = pconn.execute(query).fetchone()
        return int(row[0]) if row else 0


ACK_TXN = int(Flags.ACK_TXN)  # A plain int: compared once per message.


@dataclasses.dataclass
class ShardCounts:
    """A shard's counts by key since its transaction began, and the messages it has seen."""

    # A defaultdict(int), not a Counter: a Counter's `+= 1` is a generic (unspecialized) subscript of a
    # dict subclass, 300 ns a message against 65 here.
    pending: defaultdict[str, int] = dataclasses.field(default_factory=lambda: defaultdict(int))
    seen: int = 0


class BenchApp:
    """Counts messages by key (in memory per transaction, upserted in finalize_txn), and publishes
    a Derived message per `every` inputs. Its consume_message never awaits, so it is a plain
    function, which the framework calls without making a coroutine."""

    def __init__(self) -> None:
        self.store_url = os.environ.get(STORE_ENV, "sqlite:bench-counts.db")
        self.derived = os.environ.get(DERIVED_ENV, "")
        self.every = int(os.environ.get(EVERY_ENV, "100"))
        if self.store_url.startswith("postgres:"):
            import psycopg  # noqa: F401  (At start, as an application imports its driver, not at a shard's assignment.)

    async def new_store(self, shard: Any, recorder: Any) -> SQLStore:
        kind, _, where = self.store_url.partition(":")
        if kind == "sqlite":
            path = Path(where)
            if not path.exists():
                create_sqlite_tables(path)
            store = SQLStore(lambda: sqlite_connect(path))
        elif kind == "postgres":
            store = SQLStore(lambda: postgres_connect(where))
        else:
            raise ValueError(f"${STORE_ENV} must be sqlite:<path> or postgres:<dsn>, not {self.store_url!r}")
        store.cache = ShardCounts()  # The shard's state in memory, where Gazette's SQLStore keeps it.
        return store

    def new_message(self, spec: Any) -> Event:
        return Event()

    def consume_message(self, shard: Any, store: Any, envelope: Envelope[Any], publisher: Publisher) -> None:
        msg = envelope.message
        if get_flags(msg.UUID) == ACK_TXN:
            return
        counts: ShardCounts = store.cache
        counts.pending[msg.Key] += 1
        counts.seen += 1
        if counts.seen % self.every == 0 and self.derived:
            derived, seen = self.derived, counts.seen
            publisher.publish_uncommitted(lambda _m: (derived, NDJSON), Derived(Key=msg.Key, N=seen, T=msg.T))

    async def finalize_txn(self, shard: Any, store: Any, publisher: Publisher) -> None:
        counts: ShardCounts = store.cache
        if not counts.pending:
            return
        pending, counts.pending = counts.pending, defaultdict(int)
        upsert = " ON CONFLICT (shard, key) DO UPDATE SET n = counts.n + excluded.n"
        if self.store_url.startswith("sqlite:"):
            await store.executemany(
                "INSERT INTO counts (shard, key, n) VALUES (?, ?, ?)" + upsert,
                [(shard.id, key, n) for key, n in pending.items()],
            )
        else:
            await store.execute(
                "INSERT INTO counts (shard, key, n) SELECT %s, k, n FROM unnest(%s::text[], %s::bigint[]) AS t(k, n)"
                + upsert,
                (shard.id, list(pending), list(pending.values())),
            )


app = BenchApp()
