"""SQLiteStore against a real broker: SQL transactions recorded through the VFS play back into
another directory with exactly the last committed rows and checkpoint (and a database that passes
`PRAGMA integrity_check`); failed dependencies and a fenced log fail the commit; a large
transaction; a transaction cut off mid-way rolls back on playback; and the journal truncation rule
keeps the log's live files from growing across many small transactions."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import apsw
import pytest

from consumer.protocol import pb
from consumer.recoverylog import Recorder, RecorderFailedError, RecoveryLogError
from consumer.stores import ConsumerStoreError, FenceError, SQLiteStore, StoreDependencyError
from consumer.stores.sqlite_vfs import CHECKPOINT_TABLE
from tests.consumer.stores.recorded import TIMEOUT, FakeShard, Log, checkpoint, failed, recorded

__all__ = ["recorded"]  # A fixture.

SHARD = FakeShard()
MODES = ["TRUNCATE", "DELETE", "PERSIST", "WAL"]


async def open_store(log: Log, rec: Recorder, journal_mode: str = "TRUNCATE") -> SQLiteStore:
    store = await SQLiteStore.open(rec, journal_mode=journal_mode)
    log.cleanups.append(store.destroy)
    store.execute("CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v BLOB)")
    return store


async def commit(store: SQLiteStore, n: int, wait_for: list[asyncio.Future[None]] | None = None) -> None:
    await asyncio.wait_for(store.start_commit(SHARD, checkpoint(n), wait_for or []), TIMEOUT)


def rows(store: SQLiteStore) -> dict[str, bytes]:
    return {k: bytes(v) for k, v in store.query("SELECT k, v FROM kv")}


def integrity(path: Path) -> list[tuple[str]]:
    """`PRAGMA integrity_check` of a database file, opened read-only without the recording VFS."""
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return [tuple(r) for r in conn.execute("PRAGMA integrity_check")]
    finally:
        conn.close()


@pytest.mark.parametrize("mode", MODES)
async def test_commits_play_back_to_the_last_committed_state(recorded: Log, tmp_path: Path, mode: str) -> None:
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    store = await open_store(recorded, rec, mode)
    assert await store.restore_checkpoint(SHARD) == pb.Checkpoint()
    expect: dict[str, bytes] = {}
    for n in range(1, 8):
        for i in range(20):
            key, value = f"k{(n * 7 + i) % 50}", f"{n}:{i}".encode() * 50
            store.execute("INSERT INTO kv VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v", (key, value))
            expect[key] = value
        if n % 3 == 0:
            store.execute("DELETE FROM kv WHERE k = ?", (f"k{n}",))
            expect.pop(f"k{n}", None)
        await commit(store, n)
    # Not committed: never seen by the next primary.
    store.execute("INSERT INTO kv VALUES ('uncommitted', x'00')")
    rec.barrier()

    rec2 = await recorded.take_over(tmp_path / "next", 2222)
    assert integrity(Path(rec2.dir) / "store.db") == [("ok",)]
    store2 = await open_store(recorded, rec2, mode)
    assert rows(store2) == expect
    assert await store2.restore_checkpoint(SHARD) == checkpoint(7)

    # The new primary commits on, and a third one sees that.
    store2.execute("INSERT INTO kv VALUES ('from-2', x'02')")
    await commit(store2, 8)
    expect["from-2"] = b"\x02"
    rec3 = await recorded.take_over(tmp_path / "third", 3333)
    store3 = await open_store(recorded, rec3, mode)
    assert rows(store3) == expect
    assert await store3.restore_checkpoint(SHARD) == checkpoint(8)
    assert store3.query("PRAGMA journal_mode") == [(mode.lower(),)]
    await store3.destroy()
    assert not Path(rec3.dir).exists()


async def test_a_failed_dependency_fails_the_commit(recorded: Log, tmp_path: Path) -> None:
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    store = await open_store(recorded, rec)
    store.execute("INSERT INTO kv VALUES ('one', x'01')")
    await commit(store, 1)
    store.execute("INSERT INTO kv VALUES ('two', x'02')")
    with pytest.raises(StoreDependencyError, match="dependency failed: append failed"):
        await commit(store, 2, [failed(RuntimeError("append failed"))])
    # The Recorder is failed: the store can't commit again.
    store.execute("INSERT INTO kv VALUES ('three', x'03')")
    with pytest.raises(ConsumerStoreError, match="recording the commit failed: a barrier dependency failed") as info:
        await commit(store, 3)
    assert isinstance(info.value.__cause__, RecorderFailedError)

    store2 = await open_store(recorded, await recorded.take_over(tmp_path / "next", 2222))
    assert rows(store2) == {"one": b"\x01"}
    assert await store2.restore_checkpoint(SHARD) == checkpoint(1)


async def test_a_fenced_recorder_fails_the_commit(recorded: Log, tmp_path: Path) -> None:
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    store = await open_store(recorded, rec)
    store.execute("INSERT INTO kv VALUES ('one', x'01')")
    await commit(store, 1)

    rec2 = await recorded.take_over(tmp_path / "next", 2222)
    store.execute("INSERT INTO kv VALUES ('two', x'02')")
    with pytest.raises(FenceError, match="fenced"):
        await commit(store, 2)

    store2 = await open_store(recorded, rec2)
    assert rows(store2) == {"one": b"\x01"}
    assert await store2.restore_checkpoint(SHARD) == checkpoint(1)
    resolved = await recorded.play(tmp_path / "later")
    assert integrity(Path(resolved.dir) / "store.db") == [("ok",)]


async def test_a_large_transaction(recorded: Log, tmp_path: Path) -> None:
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    store = await open_store(recorded, rec)
    store.execute("INSERT INTO kv VALUES ('small', x'00')")
    await commit(store, 1)
    # ~12 MB in one transaction: more than SQLite's page cache, so pages spill mid-transaction.
    store.executemany("INSERT INTO kv VALUES (?, randomblob(300000))", [(f"big{i}",) for i in range(40)])
    store.execute("UPDATE kv SET v = randomblob(1000) WHERE k = 'small'")
    await commit(store, 2)
    expect = rows(store)
    assert sum(len(v) for v in expect.values()) > 12_000_000
    assert store.vfs.stats.bytes > 12_000_000

    rec2 = await recorded.take_over(tmp_path / "next", 2222)
    assert integrity(Path(rec2.dir) / "store.db") == [("ok",)]
    store2 = await open_store(recorded, rec2)
    assert hashlib.sha256(repr(sorted(rows(store2).items())).encode()).digest() == \
        hashlib.sha256(repr(sorted(expect.items())).encode()).digest()
    assert await store2.restore_checkpoint(SHARD) == checkpoint(2)


@pytest.mark.parametrize("mode", ["TRUNCATE", "WAL"])
async def test_a_transaction_cut_off_mid_way_rolls_back(recorded: Log, tmp_path: Path, mode: str) -> None:
    """The primary dies mid-transaction, after SQLite spilled some of it to the database file
    (rollback journal) or the WAL: a playback of the log recovers the last committed state."""
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    store = await open_store(recorded, rec, mode)
    store.execute("INSERT INTO kv VALUES ('one', x'01')")
    await commit(store, 1)
    store.execute("PRAGMA cache_size=10")  # Spill early.
    store.executemany("INSERT INTO kv VALUES (?, randomblob(20000))", [(f"big{i}",) for i in range(100)])
    store.execute("UPDATE kv SET v = x'ff' WHERE k = 'one'")
    await asyncio.wait_for(rec.barrier(), TIMEOUT)  # Its spilled pages (and journal) are in the log.
    spilled = store.vfs.stats.bytes
    assert spilled > 1_000_000

    rec2 = await recorded.take_over(tmp_path / "next", 2222)
    store2 = await open_store(recorded, rec2, mode)
    assert rows(store2) == {"one": b"\x01"}
    assert await store2.restore_checkpoint(SHARD) == checkpoint(1)
    assert store2.query("PRAGMA integrity_check") == [("ok",)]


@pytest.mark.parametrize("mode", MODES)
async def test_journal_truncation_keeps_the_live_files_bounded(recorded: Log, tmp_path: Path, mode: str) -> None:
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    store = await open_store(recorded, rec, mode)
    store.execute("PRAGMA wal_autocheckpoint=10")  # WAL mode: a checkpoint, then a restart, every few commits.
    await commit(store, 0)
    log_path = "/store.db-wal" if mode == "WAL" else "/store.db-journal"
    journals = set()
    for n in range(1, 201):
        store.execute("INSERT INTO kv VALUES (?, ?)", (f"k{n}", b"x" * 100))
        await commit(store, n)
        journals.add(rec.fsm.links.get(log_path))
    # The journal (WAL) was a new Fnode every transaction (every restart), none of them live but the last.
    assert len(journals) >= (200 if mode != "WAL" else 20)
    assert set(rec.fsm.links) == {"/store.db", log_path}
    assert len(rec.fsm.live_nodes) == 2
    journal = rec.fsm.live_nodes[rec.fsm.links[log_path]]
    hints = await rec.build_hints()
    (db_hint, journal_hint) = sorted(hints.live_nodes, key=lambda n: n.fnode)
    assert journal_hint.fnode == rec.fsm.links[log_path]
    assert db_hint.fnode == rec.fsm.links["/store.db"]
    # The journal's live history is its last transaction's few ops (the WAL's: those since its
    # last restart), not 200 transactions' worth.
    live_ops = sum(s.last_seq_no - s.first_seq_no + 1 for s in journal.segments)
    assert live_ops <= (10 if mode != "WAL" else 30)
    assert journal_hint.segments[0].first_seq_no > rec.fsm.next_seq_no - (20 if mode != "WAL" else 100)
    assert store.vfs.stats.truncations >= len(journals) - 1

    # Playback from these hints skips every dead journal, and recovers the same database.
    rec2 = await recorded.take_over(tmp_path / "next", 2222, hints)
    store2 = await open_store(recorded, rec2, mode)
    assert len(store2.query("SELECT k FROM kv")) == 200
    assert await store2.restore_checkpoint(SHARD) == checkpoint(200)
    assert store2.query("PRAGMA integrity_check") == [("ok",)]


async def test_a_transaction_rolled_back_by_an_error_does_not_commit(recorded: Log, tmp_path: Path) -> None:
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    store = await open_store(recorded, rec)
    await commit(store, 0)
    store.execute("INSERT INTO kv VALUES ('one', x'01')")
    store.execute("ROLLBACK")  # As an error that rolls SQLite's transaction back would.
    with pytest.raises(ConsumerStoreError, match="rolled back"):
        await commit(store, 1)
    store.execute("INSERT INTO kv VALUES ('two', x'02')")
    await commit(store, 2)
    assert rows(store) == {"two": b"\x02"}
    assert store.query(f"SELECT count(*) FROM {CHECKPOINT_TABLE}") == [(1,)]



@pytest.mark.parametrize("mode", ["TRUNCATE", "WAL"])
async def test_compaction_moves_the_log_horizon(recorded: Log, tmp_path: Path, mode: str) -> None:
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    store = await open_store(recorded, rec, mode)
    for n in range(1, 31):
        store.executemany("INSERT INTO kv VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
                          [(f"k{i}", f"{n}".encode() * 500) for i in range(20)])
        await commit(store, n)
    old_db = rec.fsm.links["/store.db"]
    before = rec.fsm.next_seq_no
    store.request_compaction()
    store.execute("INSERT INTO kv VALUES ('last', x'01')")
    await commit(store, 31)
    assert store.compactions == 1
    assert rec.fsm.links["/store.db"] != old_db
    assert "/store.db.compact" not in rec.fsm.links
    # The database's only live history is from the compaction on.
    hints = await rec.build_hints()
    assert min(s.first_seq_no for node in hints.live_nodes for s in node.segments) > before
    expect = rows(store)
    assert len(expect) == 21
    # The store goes on after the compaction, on its new connection.
    store.execute("INSERT INTO kv VALUES ('after', x'02')")
    await commit(store, 32)
    expect["after"] = b"\x02"
    hints = await rec.build_hints()

    for author, name, play_hints in ((2222, "from-hints", hints), (3333, "from-start", None)):
        rec2 = await recorded.take_over(tmp_path / name, author, play_hints)
        assert integrity(Path(rec2.dir) / "store.db") == [("ok",)]
        store2 = await open_store(recorded, rec2, mode)
        assert rows(store2) == expect
        assert await store2.restore_checkpoint(SHARD) == checkpoint(32)
        await store2.destroy()


async def test_compact_after_bytes(recorded: Log, tmp_path: Path) -> None:
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    store = await SQLiteStore.open(rec, compact_after=200_000)
    recorded.cleanups.append(store.destroy)
    store.execute("CREATE TABLE kv (k TEXT PRIMARY KEY, v BLOB)")
    for n in range(1, 41):
        store.execute("INSERT INTO kv VALUES ('k', randomblob(8000)) ON CONFLICT(k) DO UPDATE SET v = excluded.v")
        await commit(store, n)
    assert store.compactions >= 2
    assert store.vfs.stats.db_bytes < 200_000 + 50_000
    store2 = await open_store(recorded, await recorded.take_over(tmp_path / "next", 2222))
    assert await store2.restore_checkpoint(SHARD) == checkpoint(40)


async def test_an_interrupted_compaction_is_cleaned_up(recorded: Log, tmp_path: Path) -> None:
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    store = await open_store(recorded, rec)
    store.execute("INSERT INTO kv VALUES ('one', x'01')")
    await commit(store, 1)
    # A compaction's VACUUM INTO was recorded, but not the rename (the primary died).
    store.connection.execute("COMMIT")
    store.connection.execute("VACUUM INTO ?", (str(tmp_path / "primary" / "store.db.compact"),))
    store.vfs.flush()
    await asyncio.wait_for(rec.barrier(), TIMEOUT)
    assert "/store.db.compact" in rec.fsm.links

    rec2 = await recorded.take_over(tmp_path / "next", 2222)
    store2 = await open_store(recorded, rec2)
    assert "/store.db.compact" not in rec2.fsm.links
    assert not (Path(rec2.dir) / "store.db.compact").exists()
    assert rows(store2) == {"one": b"\x01"}


async def test_a_recorder_dir_through_a_symbolic_link(recorded: Log, tmp_path: Path) -> None:
    """SQLite resolves symbolic links in the paths it opens; they are recorded under the
    Recorder's own directory name."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    rec = await recorded.recorder(tmp_path / "link" / "primary", 1111)
    store = await open_store(recorded, rec)
    store.execute("INSERT INTO kv VALUES ('one', x'01')")
    await commit(store, 1)
    assert set(rec.fsm.links) == {"/store.db", "/store.db-journal"}
    store2 = await open_store(recorded, await recorded.take_over(tmp_path / "next", 2222))
    assert rows(store2) == {"one": b"\x01"}


async def test_open_refuses_what_cannot_be_recorded(recorded: Log, tmp_path: Path) -> None:
    rec = await recorded.recorder(tmp_path / "primary", 1111)
    with pytest.raises(ConsumerStoreError, match="journal_mode 'OFF' is not one of"):
        await SQLiteStore.open(rec, journal_mode="OFF")
    with pytest.raises(ConsumerStoreError, match="needs a recovery log"):
        await SQLiteStore.open(None)  # type: ignore[arg-type]
    with pytest.raises(RecoveryLogError, match="not under the recorder dir"):
        await SQLiteStore.open(rec, "../elsewhere.db")
