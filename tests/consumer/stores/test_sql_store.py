"""SQLStore against real databases: a PostgreSQL server the tests start (tests/support/postgres.py) and
SQLite files. Ports Gazette's TestSQLCheckpointPersistAndRestore and TestSQLCheckpointInsertRace
(store level), and checks atomicity of state and checkpoint, overlapping transactions, commit
order and destroy."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from consumer.protocol import pb
from consumer.store import Store
from consumer.stores import (
    ConsumerStoreError,
    FenceError,
    SQLStore,
    StoreClosedError,
    StoreDependencyError,
    create_checkpoint_table,
)
from consumer.stores.sql import FENCE_UPDATED, _Dialect


@dataclass
class FakeShard:
    """The part of a shard a store sees."""

    id: str
    fqn: str = ""
    spec: pb.ShardSpec = field(default_factory=pb.ShardSpec)
    journal_client: Any = None

    def __post_init__(self) -> None:
        self.fqn = self.fqn or f"/consumer.test/items/{self.id}"
        self.spec.id = self.id


@dataclass
class Database:
    """One test database: how to connect, its placeholder, and out-of-band SQL."""

    kind: str
    connect: Callable[[], Any]
    ph: str  # the driver's positional placeholder

    def sql(self, text: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one statement on a connection of its own and commit it: out-of-band SQL."""
        conn = self.connect()
        try:
            cur = conn.cursor()
            cur.execute(text.replace("?", self.ph), params)
            rows = [tuple(r) for r in cur.fetchall()] if cur.description is not None else []
            conn.commit()
            return rows
        finally:
            conn.close()

    def checkpoint(self, fqn: str) -> tuple[int, pb.Checkpoint] | None:
        rows = self.sql("SELECT fence, checkpoint FROM gazette_checkpoints WHERE shard_fqn=?", (fqn,))
        if not rows:
            return None
        return int(rows[0][0]), pb.Checkpoint.FromString(bytes(rows[0][1]))

    def keys(self) -> set[str]:
        return {r[0] for r in self.sql("SELECT k FROM kv")}


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        path = tmp_path / "store.db"
        database = Database("sqlite", lambda: sqlite3.connect(path, timeout=30.0), "?")
    else:
        dsn: str = request.getfixturevalue("postgres_dsn")
        database = Database("postgres", lambda: psycopg.connect(dsn), "%s")
    conn = database.connect()
    try:
        create_checkpoint_table(conn)
        conn.cursor().execute("CREATE TABLE kv (k TEXT PRIMARY KEY NOT NULL, v INTEGER NOT NULL)")
        conn.commit()
    finally:
        conn.close()
    yield database


@pytest.fixture
async def stores(db: Database) -> AsyncIterator[Callable[[], SQLStore]]:
    """Make stores of `db`; each is destroyed at the end of the test."""
    made: list[SQLStore] = []

    def make() -> SQLStore:
        store = SQLStore(db.connect)
        made.append(store)
        return store

    yield make
    for store in made:
        await store.destroy()


def checkpoint(journal: str, offset: int) -> pb.Checkpoint:
    cp = pb.Checkpoint()
    cp.sources[journal].read_through = offset
    return cp


def done_future(exc: BaseException | None = None) -> asyncio.Future[None]:
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)
    return fut


async def test_persist_and_restore(db: Database, stores: Callable[[], SQLStore]) -> None:
    """TestSQLCheckpointPersistAndRestore: fence 1 after the first primary, 2 after reassignment;
    the old primary, and a store whose fence moved out of band, cannot commit."""
    shard = FakeShard("shard-A")
    first = stores()
    assert isinstance(first, Store)
    assert await first.restore_checkpoint(shard) == pb.Checkpoint()
    assert first.fence == 1
    assert db.checkpoint(shard.fqn) == (1, pb.Checkpoint())

    await first.execute(f"INSERT INTO kv (k, v) VALUES ({db.ph}, {db.ph})", ("a", 1))
    await first.start_commit(shard, checkpoint("foo", 111), [done_future()])
    assert db.checkpoint(shard.fqn) == (1, checkpoint("foo", 111))
    assert db.keys() == {"a"}

    # Reassignment: a new primary restores the checkpoint and bumps the fence.
    second = stores()
    assert await second.restore_checkpoint(shard) == checkpoint("foo", 111)
    assert second.fence == 2
    assert db.checkpoint(shard.fqn) == (2, checkpoint("foo", 111))

    # The old primary's next commit is fenced off, and its state writes roll back with it.
    await first.execute(f"INSERT INTO kv (k, v) VALUES ({db.ph}, {db.ph})", ("stale", 1))
    with pytest.raises(FenceError) as info:
        await first.start_commit(shard, checkpoint("foo", 999), [])
    assert info.value.reason == FENCE_UPDATED
    assert str(info.value) == f"{FENCE_UPDATED} (shard shard-A)"
    assert info.value.shard == "shard-A"
    assert db.keys() == {"a"}

    await second.execute(f"INSERT INTO kv (k, v) VALUES ({db.ph}, {db.ph})", ("b", 2))
    await second.start_commit(shard, checkpoint("foo", 222), [])
    assert db.checkpoint(shard.fqn) == (2, checkpoint("foo", 222))

    # An out-of-band fence bump fails the next commit.
    db.sql("UPDATE gazette_checkpoints SET fence=fence+1 WHERE shard_fqn=?", (shard.fqn,))
    await second.execute(f"INSERT INTO kv (k, v) VALUES ({db.ph}, {db.ph})", ("c", 3))
    with pytest.raises(FenceError, match=r"checkpoint fence was updated \(ie, by a new primary\)"):
        await second.start_commit(shard, checkpoint("foo", 333), [])
    assert db.checkpoint(shard.fqn) == (3, checkpoint("foo", 222))
    assert db.keys() == {"a", "b"}

    third = stores()
    assert await third.restore_checkpoint(shard) == checkpoint("foo", 222)
    assert third.fence == 4


async def test_insert_race(db: Database, stores: Callable[[], SQLStore]) -> None:
    """TestSQLCheckpointInsertRace: a row with fence -1 is bumped to 0, which reads as "no row",
    so the store INSERTs, and the primary key refuses it."""
    shard = FakeShard("shard-B")
    db.sql("INSERT INTO gazette_checkpoints (shard_fqn, fence, checkpoint) VALUES (?, ?, ?)",
           (shard.fqn, -1, checkpoint("bar", 5).SerializeToString()))
    store = stores()
    with pytest.raises(ConsumerStoreError) as info:
        await store.restore_checkpoint(shard)
    assert not isinstance(info.value, FenceError)
    assert info.value.shard == "shard-B"
    if db.kind == "sqlite":
        assert info.value.reason == "UNIQUE constraint failed: gazette_checkpoints.shard_fqn"
    else:
        assert 'duplicate key value violates unique constraint "gazette_checkpoints_pkey"' in info.value.reason
        assert isinstance(info.value.__cause__, psycopg.errors.UniqueViolation)
    # Nothing was committed: the fence bump rolled back with the failed INSERT.
    assert db.checkpoint(shard.fqn) == (-1, checkpoint("bar", 5))


async def test_state_commits_atomically_with_checkpoint(db: Database, stores: Callable[[], SQLStore]) -> None:
    """State written in the transaction commits with the checkpoint; a failed dependency rolls
    back both, and fails every later commit of that store until the shard is restored."""
    shard = FakeShard("shard-C")
    store = stores()
    await store.restore_checkpoint(shard)

    await store.execute(f"INSERT INTO kv (k, v) VALUES ({db.ph}, {db.ph})", ("a", 1))
    assert db.keys() == set()  # Not before the commit.
    await store.start_commit(shard, checkpoint("foo", 1), [done_future(), done_future()])
    assert db.keys() == {"a"}
    assert db.checkpoint(shard.fqn) == (1, checkpoint("foo", 1))

    await store.executemany(f"INSERT INTO kv (k, v) VALUES ({db.ph}, {db.ph})", [("b", 2), ("c", 3)])
    appends = [done_future(), done_future(RuntimeError("append failed"))]
    failed = store.start_commit(shard, checkpoint("foo", 2), appends)
    with pytest.raises(StoreDependencyError) as info:
        await failed
    assert info.value.reason == "dependency failed: append failed"
    assert db.keys() == {"a"}
    assert db.checkpoint(shard.fqn) == (1, checkpoint("foo", 1))

    # The next transaction is a fresh one (b and c are gone), but its checkpoint builds on the
    # failed one, so its commit fails too.
    result = await store.execute(f"SELECT k FROM kv WHERE k IN ({db.ph}, {db.ph})", ("b", "c"))
    assert result.rows == []
    await store.execute(f"INSERT INTO kv (k, v) VALUES ({db.ph}, {db.ph})", ("d", 4))
    with pytest.raises(StoreDependencyError, match="the previous commit failed: dependency failed: append failed"):
        await store.start_commit(shard, checkpoint("foo", 3), [])
    assert db.keys() == {"a"}

    # Restoring starts the store afresh.
    assert await store.restore_checkpoint(shard) == checkpoint("foo", 1)
    await store.execute(f"INSERT INTO kv (k, v) VALUES ({db.ph}, {db.ph})", ("e", 5))
    await store.start_commit(shard, checkpoint("foo", 4), [])
    assert db.keys() == {"a", "e"}
    assert db.checkpoint(shard.fqn) == (2, checkpoint("foo", 4))


async def test_cancelled_dependency_fails_commit(db: Database, stores: Callable[[], SQLStore]) -> None:
    shard = FakeShard("shard-D")
    store = stores()
    await store.restore_checkpoint(shard)
    await store.execute(f"INSERT INTO kv (k, v) VALUES ({db.ph}, {db.ph})", ("a", 1))
    op: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    commit = store.start_commit(shard, checkpoint("foo", 1), [op])
    op.cancel()
    with pytest.raises(StoreDependencyError, match="dependency failed: an operation was cancelled"):
        await commit
    assert db.keys() == set()


async def test_commit_overlaps_next_transaction(db: Database, stores: Callable[[], SQLStore]) -> None:
    """While a commit waits for its appends, the next transaction is a new one: its writes go to
    a database transaction of their own (at once on PostgreSQL; on SQLite, one writer at a time,
    once the commit is done) and commit only with the next checkpoint."""
    shard = FakeShard("shard-E")
    store = stores()
    await store.restore_checkpoint(shard)

    first = store.transaction()
    assert store.transaction() is first
    await first.execute(f"INSERT INTO kv (k, v) VALUES ({db.ph}, {db.ph})", ("a", 1))
    appended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    commit = store.start_commit(shard, checkpoint("foo", 1), [appended])

    second = store.transaction()
    assert second is not first and second.active and not first.active
    with pytest.raises(StoreClosedError, match="this transaction is committing"):
        await first.execute(f"INSERT INTO kv (k, v) VALUES ({db.ph}, {db.ph})", ("late", 1))

    write = asyncio.create_task(second.execute(f"INSERT INTO kv (k, v) VALUES ({db.ph}, {db.ph})", ("b", 2)))
    if db.kind == "postgres":
        await asyncio.wait_for(write, 10)  # Runs while the commit waits.
    else:
        await asyncio.sleep(0.2)
        assert not write.done()  # Waits for the commit, rather than on SQLite's lock.
    assert not commit.done()
    assert db.keys() == set()

    appended.set_result(None)
    await commit
    await write
    assert db.keys() == {"a"}
    assert db.checkpoint(shard.fqn) == (1, checkpoint("foo", 1))

    await store.start_commit(shard, checkpoint("foo", 2), [])
    assert db.keys() == {"a", "b"}
    assert db.checkpoint(shard.fqn) == (1, checkpoint("foo", 2))


async def test_commits_apply_in_order(db: Database, stores: Callable[[], SQLStore]) -> None:
    """A commit whose dependencies resolve first still waits for the commit started before it."""
    shard = FakeShard("shard-F")
    store = stores()
    await store.restore_checkpoint(shard)
    appended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    earlier = store.start_commit(shard, checkpoint("foo", 1), [appended])
    later = store.start_commit(shard, checkpoint("foo", 2), [])
    await asyncio.sleep(0.1)
    assert not earlier.done() and not later.done()
    appended.set_result(None)
    await asyncio.gather(earlier, later)
    assert db.checkpoint(shard.fqn) == (1, checkpoint("foo", 2))


async def test_run_and_reads_in_transaction(db: Database, stores: Callable[[], SQLStore]) -> None:
    """`run` calls a function with the connection inside the transaction; reads see its writes."""
    shard = FakeShard("shard-G")
    store = stores()
    await store.restore_checkpoint(shard)
    assert store.paramstyle == ("qmark" if db.kind == "sqlite" else "pyformat")

    def insert(conn: Any) -> int:
        cur = conn.cursor()
        cur.execute(f"INSERT INTO kv (k, v) VALUES ({db.ph}, {db.ph})", ("x", 41))
        cur.execute(f"UPDATE kv SET v = v + 1 WHERE k = {db.ph}", ("x",))
        count: int = cur.rowcount
        return count

    assert await store.run(insert) == 1
    result = await store.execute(f"SELECT k, v FROM kv WHERE k = {db.ph}", ("x",))
    assert result.rows == [("x", 42)]
    assert db.keys() == set()
    await store.start_commit(shard, checkpoint("foo", 1), [])
    assert db.keys() == {"x"}


async def test_statement_errors_are_store_errors(db: Database, stores: Callable[[], SQLStore]) -> None:
    shard = FakeShard("shard-H")
    store = stores()
    await store.restore_checkpoint(shard)
    with pytest.raises(ConsumerStoreError, match="no_such_table") as info:
        await store.execute("SELECT * FROM no_such_table")
    assert info.value.shard == "shard-H"
    assert info.value.__cause__ is not None


async def test_destroy_rolls_back_and_closes(db: Database, stores: Callable[[], SQLStore]) -> None:
    shard = FakeShard("shard-I")
    store = stores()
    await store.restore_checkpoint(shard)
    txn = store.transaction()
    await txn.execute(f"INSERT INTO kv (k, v) VALUES ({db.ph}, {db.ph})", ("a", 1))
    pending: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    await store.execute(f"INSERT INTO kv (k, v) VALUES ({db.ph}, {db.ph})", ("b", 1))
    commit = store.start_commit(shard, checkpoint("foo", 1), [pending])  # never resolves
    if db.kind == "postgres":  # The next transaction writes at once (on SQLite it would wait for the commit).
        await store.execute(f"INSERT INTO kv (k, v) VALUES ({db.ph}, {db.ph})", ("c", 1))

    await store.destroy()
    assert commit.cancelled()
    assert not pending.cancelled()  # The caller's operation is the caller's.
    assert db.keys() == set()
    assert db.checkpoint(shard.fqn) == (1, pb.Checkpoint())
    with pytest.raises(StoreClosedError, match="the store was destroyed"):
        store.transaction()
    with pytest.raises(StoreClosedError):
        await txn.execute("SELECT 1")
    with pytest.raises(StoreClosedError):
        store.start_commit(shard, pb.Checkpoint(), [])
    await store.destroy()  # Idempotent.

    if db.kind == "postgres":
        for _ in range(100):
            others = db.sql("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid()")
            if others == [(0,)]:
                break
            await asyncio.sleep(0.05)
        assert others == [(0,)], "the store's connections are closed"


def test_placeholders() -> None:
    text = "UPDATE t SET a=? WHERE b=? AND c=?"
    params = (1, 2, 3)
    assert _Dialect("qmark", None, False).sql(text, params) == (text, params)
    assert _Dialect("pyformat", None, False).sql(text, params) == ("UPDATE t SET a=%s WHERE b=%s AND c=%s", params)
    assert _Dialect("format", None, False).sql(text, params) == ("UPDATE t SET a=%s WHERE b=%s AND c=%s", params)
    assert _Dialect("numeric", None, False).sql(text, params) == ("UPDATE t SET a=:1 WHERE b=:2 AND c=:3", params)
    assert _Dialect("named", None, False).sql(text, params) == (
        "UPDATE t SET a=:p1 WHERE b=:p2 AND c=:p3", {"p1": 1, "p2": 2, "p3": 3})
    with pytest.raises(ConsumerStoreError, match="paramstyle 'weird'"):
        _Dialect("weird", None, False)


def test_table_name_is_checked() -> None:
    with pytest.raises(ConsumerStoreError, match="not a plain SQL identifier"):
        SQLStore(lambda: None, table="x; DROP TABLE y")
    SQLStore(lambda: None, table="myschema.checkpoints")


async def test_destroy_lets_a_commit_in_the_database_finish(db: Database, stores: Callable[[], SQLStore]) -> None:
    shard = FakeShard("shard-J")
    store = stores()
    await store.restore_checkpoint(shard)
    await store.execute(f"INSERT INTO kv (k, v) VALUES ({db.ph}, {db.ph})", ("a", 1))
    commit = store.start_commit(shard, checkpoint("foo", 1), [])
    await asyncio.sleep(0)  # The commit has no dependencies: it is in the database now.
    await store.destroy()
    assert commit.done() and commit.exception() is None
    assert db.keys() == {"a"}
    assert db.checkpoint(shard.fqn) == (1, checkpoint("foo", 1))


async def test_increment_during_commit_waits_for_it(db: Database, stores: Callable[[], SQLStore]) -> None:
    """The next transaction's write of a row the committing one wrote waits for that commit (a
    PostgreSQL row lock, or SQLite's one writer) in its own thread, and loses no update."""
    shard = FakeShard("shard-K")
    store = stores()
    await store.restore_checkpoint(shard)
    await store.execute(f"INSERT INTO kv (k, v) VALUES ({db.ph}, {db.ph})", ("a", 1))
    await store.start_commit(shard, checkpoint("foo", 1), [])

    await store.execute(f"UPDATE kv SET v = v + 1 WHERE k = {db.ph}", ("a",))
    appended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    commit = store.start_commit(shard, checkpoint("foo", 2), [appended])
    increment = asyncio.create_task(store.execute(f"UPDATE kv SET v = v + 10 WHERE k = {db.ph}", ("a",)))
    await asyncio.sleep(0.2)
    assert not increment.done()
    appended.set_result(None)
    await commit
    assert (await increment).rowcount == 1
    await store.start_commit(shard, checkpoint("foo", 3), [])
    assert db.sql("SELECT v FROM kv WHERE k = ?", ("a",)) == [(12,)]
