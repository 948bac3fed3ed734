"""Test applications of the consumer runtime: a counter of messages by key into SQLite."""

from __future__ import annotations

import dataclasses
import sqlite3
import uuid
from pathlib import Path
from typing import Any

from consumer.message import ZERO_UUID, Envelope, Flags, Publisher, get_flags
from consumer.stores import SQLStore, create_checkpoint_table

NDJSON = "application/x-ndjson"


@dataclasses.dataclass
class Event:
    """A JSON message {"UUID": ..., "Key": ..., "Value": ...}, as Gazette's test messages."""

    UUID: uuid.UUID = ZERO_UUID
    Key: str = ""
    Value: str = ""

    def get_uuid(self) -> uuid.UUID:
        return self.UUID

    def set_uuid(self, value: uuid.UUID) -> None:
        self.UUID = value

    def new_acknowledgement(self, journal: str) -> Event:
        return Event()


def create_tables(db: Path) -> None:
    """The checkpoint table and the application's `counts(shard, key, n)`."""
    conn = sqlite3.connect(db)
    try:
        create_checkpoint_table(conn)
        conn.execute("CREATE TABLE counts (shard TEXT NOT NULL, key TEXT NOT NULL, n INTEGER NOT NULL, "
                     "PRIMARY KEY (shard, key))")
        conn.commit()
    finally:
        conn.close()


def read_counts(db: Path) -> dict[str, int]:
    """Committed counts by key, summed over shards."""
    conn = sqlite3.connect(db, timeout=30.0)
    try:
        rows = conn.execute("SELECT key, SUM(n) FROM counts GROUP BY key").fetchall()
    finally:
        conn.close()
    return {key: int(n) for key, n in rows}


def read_counts_by_shard(db: Path) -> dict[str, dict[str, int]]:
    conn = sqlite3.connect(db, timeout=30.0)
    try:
        rows = conn.execute("SELECT shard, key, n FROM counts").fetchall()
    finally:
        conn.close()
    out: dict[str, dict[str, int]] = {}
    for shard, key, n in rows:
        out.setdefault(shard, {})[key] = int(n)
    return out


class CountingApp:
    """Counts read-committed messages by Key into `counts`, in the shard's SQLStore; each time a
    key's count reaches a multiple of `every`, publishes {Key, Value: count} to `derived`
    (uncommitted, so it is committed with the transaction). A message whose Key is in `fail_on`
    raises from consume_message."""

    def __init__(self, db: Path, derived: str, every: int = 5, fail_on: frozenset[str] = frozenset()) -> None:
        self.db = db
        self.derived = derived
        self.every = every
        self.fail_on = fail_on
        self.stores: list[SQLStore] = []

    async def new_store(self, shard: Any, recorder: Any) -> SQLStore:
        db = self.db
        store = SQLStore(lambda: sqlite3.connect(db, timeout=30.0))
        self.stores.append(store)
        return store

    def new_message(self, spec: Any) -> Event:
        return Event()

    async def consume_message(self, shard: Any, store: Any, envelope: Envelope[Any], publisher: Publisher) -> None:
        msg = envelope.message
        if get_flags(msg.UUID) == Flags.ACK_TXN:
            return
        if msg.Key in self.fail_on:
            raise ValueError(f"cannot count key {msg.Key!r}")
        await store.execute(
            "INSERT INTO counts (shard, key, n) VALUES (?, ?, 1) ON CONFLICT (shard, key) DO UPDATE SET n = n + 1",
            (shard.id, msg.Key),
        )
        n = (await store.execute("SELECT n FROM counts WHERE shard = ? AND key = ?", (shard.id, msg.Key))).rows[0][0]
        if n % self.every == 0:
            publisher.publish_uncommitted(lambda _m: (self.derived, NDJSON), Event(Key=msg.Key, Value=str(n)))

    async def finalize_txn(self, shard: Any, store: Any, publisher: Publisher) -> None:
        pass
