"""Test applications of the consumer runtime: a counter of messages by key into SQLite, and one
into a JSON state recorded to the shard's recovery log."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import sqlite3
import uuid
from pathlib import Path
from typing import Any

from consumer.message import ZERO_UUID, Envelope, Flags, Publisher, get_flags
from consumer.protocol import pb as cpb
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


# -- a store recorded to the shard's recovery log ---------------------------------------------------


class RecordedJSONStore:
    """A minimal store on a recoverylog Recorder (until consumer.stores' JSONFileStore is used):
    the state (a JSON object) and the checkpoint live in `<recorder dir>/state.json`. A commit
    waits on the transaction's appends through a recorder barrier, writes `next.json` and renames
    it over `state.json`, recording each operation, and is durable once the recorder's next
    barrier commits."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder
        self.path = os.path.join(recorder.dir, "state.json")
        self.next_path = os.path.join(recorder.dir, "next.json")
        self.state: dict[str, Any] = {}
        self.checkpoint = cpb.Checkpoint()
        if os.path.exists(self.path):
            with open(self.path, "rb") as f:
                doc = json.loads(f.read())
            self.state = doc["state"]
            self.checkpoint = cpb.Checkpoint.FromString(base64.b64decode(doc["checkpoint"]))

    async def restore_checkpoint(self, shard: Any) -> cpb.Checkpoint:
        out = cpb.Checkpoint()
        out.CopyFrom(self.checkpoint)
        return out

    def start_commit(self, shard: Any, checkpoint: cpb.Checkpoint, wait_for: Any) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        out: asyncio.Future[None] = loop.create_future()
        try:
            self.recorder.barrier(wait_for)
            data = json.dumps({
                "state": self.state, "checkpoint": base64.b64encode(checkpoint.SerializeToString()).decode(),
            }, sort_keys=True).encode()
            with open(self.next_path, "wb") as f:
                f.write(data)
            fnode = self.recorder.record_create(self.next_path)
            self.recorder.record_write_at(fnode, data, 0)
            os.replace(self.next_path, self.path)
            self.recorder.record_rename(self.next_path, self.path)
            barrier = self.recorder.barrier()
        except Exception as exc:
            out.set_exception(exc)
            return out

        def done(b: asyncio.Future[Any]) -> None:
            if out.done():
                return
            if b.cancelled():
                out.cancel()
            elif b.exception() is not None:
                out.set_exception(b.exception())  # type: ignore[arg-type]
            else:
                out.set_result(None)

        barrier.add_done_callback(done)
        self.checkpoint = checkpoint
        return out

    async def destroy(self) -> None:
        pass


class RecordedCountingApp:
    """Counts read-committed messages by Key in a RecordedJSONStore (its shards need a recovery log).

    With `state_dir`, it mirrors the state outside the recorded directory for tests to read:
    `<shard>.committed.json` after each commit ({"pid", "state"}), and `<shard>.recovered.json` with
    the state a primary recovered, when it restores the checkpoint."""

    def __init__(self, state_dir: Path | None = None) -> None:
        self.state_dir = state_dir

    def _mirror(self, shard: Any, kind: str, state: dict[str, Any]) -> None:
        if self.state_dir is None:
            return
        name = shard.id.replace("/", "_")
        path = self.state_dir / f"{name}.{kind}.json"
        tmp = self.state_dir / f".{name}.{kind}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"pid": os.getpid(), "state": state}, sort_keys=True))
        os.replace(tmp, path)

    async def new_store(self, shard: Any, recorder: Any) -> RecordedJSONStore:
        if recorder is None:
            raise ValueError(f"shard {shard.id} has no recovery log (set recovery_log_prefix)")
        store = RecordedJSONStore(recorder)
        self._mirror(shard, "recovered", dict(store.state))
        return store

    def new_message(self, spec: Any) -> Event:
        return Event()

    async def consume_message(self, shard: Any, store: Any, envelope: Envelope[Any], publisher: Publisher) -> None:
        msg = envelope.message
        if get_flags(msg.UUID) == Flags.ACK_TXN:
            return
        store.state[msg.Key] = store.state.get(msg.Key, 0) + 1

    async def finalize_txn(self, shard: Any, store: Any, publisher: Publisher) -> None:
        pass

    async def begin_txn(self, shard: Any, store: Any) -> None:
        pass

    def finished_txn(self, shard: Any, store: Any, committed: asyncio.Future[None]) -> None:
        snapshot = dict(store.state)

        def mirror(f: asyncio.Future[None]) -> None:
            if not f.cancelled() and f.exception() is None:
                self._mirror(shard, "committed", snapshot)

        committed.add_done_callback(mirror)
