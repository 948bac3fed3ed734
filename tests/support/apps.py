"""Test applications of the consumer runtime: a counter of messages by key into SQLite, and one
into a JSON state recorded to the shard's recovery log."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sqlite3
import uuid
from pathlib import Path
from typing import Any

from consumer.message import ZERO_UUID, Envelope, Flags, Publisher, get_flags
from consumer.stores import JSONFileStore, SQLiteStore, SQLStore, create_checkpoint_table

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


# -- a store recorded to the shard's recovery log ---------------------------------------------------


class RecordedCountingApp:
    """Counts read-committed messages by Key in a store recorded to the shard's recovery log: a
    `JSONFileStore` (`store="json"`) or a `SQLiteStore` (`store="sqlite"`; table `counts`).

    With `state_dir`, it mirrors the counts outside the recorded directory for tests to read:
    `<shard>.committed.json` after each commit ({"pid", "state"}), and `<shard>.recovered.json`
    with the counts a primary recovered, when its store opened, and the read-through offsets of
    the checkpoint it recovered, and the recorder's directory the store lives in ({"pid", "state",
    "read_through", "dir"})."""

    def __init__(self, state_dir: Path | None = None, store: str = "json") -> None:
        if store not in ("json", "sqlite"):
            raise ValueError(f"store {store!r} is not json or sqlite")
        self.state_dir = state_dir
        self.store_kind = store

    def _mirror(self, shard: Any, kind: str, state: dict[str, Any], **extra: Any) -> None:
        if self.state_dir is None:
            return
        name = shard.id.replace("/", "_")
        path = self.state_dir / f"{name}.{kind}.json"
        tmp = self.state_dir / f".{name}.{kind}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"pid": os.getpid(), "state": state, **extra}, sort_keys=True))
        os.replace(tmp, path)

    @staticmethod
    def counts(store: Any) -> dict[str, int]:
        """The counts in `store`'s current transaction."""
        if isinstance(store, SQLiteStore):
            return {key: int(n) for key, n in store.query("SELECT key, n FROM counts")}
        return dict(store.state)

    async def new_store(self, shard: Any, recorder: Any) -> JSONFileStore[dict[str, int]] | SQLiteStore:
        if recorder is None:
            raise ValueError(f"shard {shard.id} has no recovery log (set recovery_log_prefix)")
        store: JSONFileStore[dict[str, int]] | SQLiteStore
        if self.store_kind == "sqlite":
            store = await SQLiteStore.open(recorder)
            store.execute("CREATE TABLE IF NOT EXISTS counts (key TEXT PRIMARY KEY, n INTEGER NOT NULL)")
        else:
            store = JSONFileStore(recorder, {})
        if self.state_dir is not None:
            checkpoint = await store.restore_checkpoint(shard)
            read_through = {j: src.read_through for j, src in checkpoint.sources.items()}
            self._mirror(shard, "recovered", self.counts(store), read_through=read_through, dir=recorder.dir)
        return store

    def new_message(self, spec: Any) -> Event:
        return Event()

    async def consume_message(self, shard: Any, store: Any, envelope: Envelope[Any], publisher: Publisher) -> None:
        msg = envelope.message
        if get_flags(msg.UUID) == Flags.ACK_TXN:
            return
        if isinstance(store, SQLiteStore):
            store.execute("INSERT INTO counts (key, n) VALUES (?, 1) ON CONFLICT (key) DO UPDATE SET n = n + 1",
                          (msg.Key,))
        else:
            store.state[msg.Key] = store.state.get(msg.Key, 0) + 1

    async def finalize_txn(self, shard: Any, store: Any, publisher: Publisher) -> None:
        pass

    async def begin_txn(self, shard: Any, store: Any) -> None:
        pass

    def finished_txn(self, shard: Any, store: Any, committed: asyncio.Future[None]) -> None:
        # The commit started and the next transaction has not: the store holds what it commits.
        snapshot = self.counts(store)

        def mirror(f: asyncio.Future[None]) -> None:
            if not f.cancelled() and f.exception() is None:
                self._mirror(shard, "committed", snapshot)

        committed.add_done_callback(mirror)
