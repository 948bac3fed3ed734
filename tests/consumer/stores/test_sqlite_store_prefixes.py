"""Crash consistency of SQLiteStore's recording: whatever op of the log a primary died after, a
playback of the log up to there opens as a sound database holding exactly the state of one
committed transaction (with that transaction's checkpoint), never a state between two, and never
an older one than a shorter prefix gave."""

from __future__ import annotations

import random
from pathlib import Path

import apsw
import pytest

from consumer.protocol import pb
from consumer.recoverylog import FSMHints
from consumer.recoverylog.ops import decode_frames
from consumer.stores import SQLiteStore
from consumer.stores.sqlite_vfs import CHECKPOINT_TABLE
from tests.consumer.stores.recorded import (
    FakeShard,
    Log,
    checkpoint,
    new_log_with,
    read_log,
    recorded,
)

__all__ = ["recorded"]  # A fixture.

SHARD = FakeShard()


def state_of(dir: Path) -> tuple[int, dict[int, bytes]]:
    """The checkpoint's number (its source's read-through / 100) and rows of a played-back database."""
    path = dir / "store.db"
    if not path.exists():
        return 0, {}
    conn = apsw.Connection(str(path))  # Rolls a hot journal back, as the next primary would.
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if CHECKPOINT_TABLE not in tables:
            return 0, {}
        blob = conn.execute(f"SELECT checkpoint FROM {CHECKPOINT_TABLE}").fetchall()[0][0]
        cp = pb.Checkpoint.FromString(bytes(blob))
        n = cp.sources["a/journal"].read_through // 100 if cp.sources else 0
        if n == 0:
            return 0, {}
        assert cp == checkpoint(n)
        return n, {k: bytes(v) for k, v in conn.execute("SELECT k, v FROM kv")}
    finally:
        conn.close()


@pytest.mark.parametrize("mode", ["TRUNCATE", "WAL"])
async def test_every_prefix_of_the_log_is_a_committed_state(recorded: Log, tmp_path: Path, mode: str) -> None:
    rng = random.Random(7)
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    store = await SQLiteStore.open(rec, journal_mode=mode)
    recorded.cleanups.append(store.destroy)
    store.execute("PRAGMA cache_size=8")  # Transactions spill pages to the database (or WAL) before they commit.
    store.execute("PRAGMA wal_autocheckpoint=40")  # And WAL checkpoints and restarts happen.
    store.execute("CREATE TABLE kv (k INTEGER PRIMARY KEY, v BLOB)")
    states: dict[int, dict[int, bytes]] = {0: {}}
    current: dict[int, bytes] = {}
    for n in range(1, 13):
        for _ in range(25):
            k = rng.randrange(60)
            if rng.random() < 0.2:
                store.execute("DELETE FROM kv WHERE k = ?", (k,))
                current.pop(k, None)
            else:
                v = rng.randbytes(rng.randrange(100, 6000))
                store.execute("INSERT INTO kv VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v", (k, v))
                current[k] = v
        if n == 7:
            store.request_compaction()
        await store.start_commit(SHARD, checkpoint(n), [])
        states[n] = dict(current)
    assert store.compactions == 1
    assert store.vfs.stats.truncations >= 3  # Journals truncated, or WALs restarted.
    # The primary dies in a transaction that spilled.
    store.executemany("INSERT INTO kv VALUES (?, randomblob(5000)) ON CONFLICT(k) DO NOTHING",
                      [(k,) for k in range(100, 160)])
    await rec.barrier()

    data = await read_log(recorded.client, recorded.name)
    frames = decode_frames(data)
    ends = [op.last_offset for op, _, _ in frames]
    # No log ends inside the compaction's rename (its ops are appended together): skip those cuts.
    inside_rename = {
        frames[i][0].last_offset for i in range(len(frames) - 1)
        if frames[i][0].HasField("unlink") and frames[i][0].unlink.path == "/store.db"
    }
    cuts = sorted({ends[i] for i in range(0, len(ends), max(1, len(ends) // 24))} | {ends[-1]})
    cuts = [c for c in cuts if c not in inside_rename]
    assert len(cuts) >= 20

    last = 0
    seen = set()
    for i, cut in enumerate(cuts):
        log = await new_log_with(recorded.client, recorded.ajc, data[:cut])
        dir = tmp_path / f"prefix-{i}"
        resolved = await recorded.play(dir, hints=FSMHints(log=log))
        n, rows = state_of(Path(resolved.dir))
        assert rows == states[n], f"prefix of {cut} bytes: rows are not those of commit {n}"
        assert n >= last, f"prefix of {cut} bytes: commit {n} after commit {last}"
        last = n
        seen.add(n)
    assert last == 12
    assert len(seen) >= 6  # The cuts did land between many commits.
