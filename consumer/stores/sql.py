"""`SQLStore`: a shard's state and checkpoint in a SQL database, fenced (Gazette's SQLStore).

Any DB-API 2 driver works; PostgreSQL through psycopg 3 and SQLite through the standard
library's `sqlite3` (the single-machine default) are tested. For each consumer transaction the
store opens a database transaction, in which the application writes its state; `start_commit`
writes the shard's checkpoint into the same database transaction and commits it, so state and
checkpoint are committed together or not at all.

The table
---------
The user creates the checkpoint table (`create_checkpoint_table(conn)` does it, for tests and
examples). `shard_fqn` must be its primary key; it holds the shard's FQN, its etcd item key.

PostgreSQL::

    CREATE TABLE gazette_checkpoints (
        shard_fqn  TEXT    PRIMARY KEY NOT NULL,
        fence      INTEGER NOT NULL,
        checkpoint BYTEA   NOT NULL
    );

SQLite::

    CREATE TABLE gazette_checkpoints (
        shard_fqn  TEXT    PRIMARY KEY NOT NULL,
        fence      INTEGER NOT NULL,
        checkpoint BLOB    NOT NULL
    );

Fencing
-------
`restore_checkpoint` increments the row's `fence` and commits at once; each later commit
updates the checkpoint only `WHERE fence` is still the value it read. Once a new primary has
restored the shard, the old one's next commit changes no row, rolls back, and fails with
`FenceError: checkpoint fence was updated (ie, by a new primary)`. A shard seen for the first
time has no row: its first commit INSERTs one with fence 1, so two primaries racing to create
it cannot both succeed (the loser fails on the primary key).

Use from an application
-----------------------
Open one store per shard, from a function that opens a connection (called in the store's own
threads, as often as it needs connections)::

    store = SQLStore(lambda: psycopg.connect(dsn))                    # PostgreSQL
    store = SQLStore(lambda: sqlite3.connect(path, timeout=30.0))    # SQLite (a file)

In the consumer transaction, write through the store; statements use the driver's own
placeholders (psycopg `%s`, sqlite3 `?`; `store.paramstyle` says which, once connected)::

    await store.execute("UPDATE counts SET n = n + %s WHERE word = %s", (1, word))
    rows = (await store.execute("SELECT n FROM counts WHERE word = %s", (word,))).rows

`store.transaction()` is the open transaction itself, the same object until `start_commit`
takes it (its database transaction begins at its first statement): `execute`, `executemany`,
and `run(fn)`, which calls `fn(connection)` in the transaction's thread for anything else the
driver offers. A transaction handle used after its commit began raises `StoreClosedError`,
so a write can never slip into the wrong transaction.

Concurrency
-----------
`start_commit` returns at once; while the commit waits for its `wait_for` operations (the
appends of the messages the transaction published) and runs, the next consumer transaction
already has a fresh database transaction. As in Gazette, where each `sql.Tx` holds a connection
of the `sql.DB` pool, each open transaction has a connection of its own, so:

- On PostgreSQL the next transaction's statements run while the previous one commits. Its
  reads do not see the uncommitted writes of the committing transaction (READ COMMITTED);
  write increments (`SET n = n + 1`) or lock what you read (`SELECT ... FOR UPDATE`, which
  waits for that commit) rather than writing back values read.
- On SQLite, which has one writer at a time, a transaction begins with `BEGIN IMMEDIATE`, and
  its first statement first waits for the previous commit to finish: transactions are serial,
  and no statement waits on SQLite's lock timeout for a commit that waits on appends. Use a
  database file, not `:memory:` (each connection to `:memory:` is a different database).
- Commits are applied in the order `start_commit` was called: each waits for the previous one,
  and fails (`StoreDependencyError`) if it failed, since its checkpoint builds on it; so after
  a failed commit every later one fails, until `restore_checkpoint` starts the store afresh.

Where this differs from Gazette's SQLStore: commits are ordered as above (Go's goroutines are
not); a commit whose dependency failed rolls its transaction back (Go leaves it open); and the
store opens its connections itself from `connect` and closes them in `destroy` (Go borrows a
`*sql.DB` and leaves it open).

Why threads: DB-API calls block, so they must run off the event loop. Each connection gets one
thread of its own, which opens, uses and closes it: DB-API connections are not generally safe
to share between threads (`sqlite3` refuses it), a single thread keeps a transaction's
statements in the order they were issued, and a statement that waits on a database lock (a
write waiting for another transaction's commit) blocks only its own connection's thread, never
the commit it waits for, as a shared worker pool could.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import sys
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from google.protobuf.message import DecodeError

from consumer.protocol import pb
from consumer.stores.errors import ConsumerStoreError, FenceError, StoreClosedError, StoreDependencyError

if TYPE_CHECKING:
    from consumer.shard import Shard
    from consumer.store import OpFuture

T = TypeVar("T")

CHECKPOINT_TABLE = "gazette_checkpoints"
"""The default name of the checkpoint table."""

FENCE_UPDATED = "checkpoint fence was updated (ie, by a new primary)"
"""Gazette's words for a commit fenced off by a newer primary."""

_POSTGRES_DRIVERS = frozenset({"psycopg", "psycopg2", "pg8000"})
_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")
_MAX_IDLE = 2


@dataclass(frozen=True)
class SQLResult:
    """What a statement returned: its rows (empty for a statement that returns none), and its
    `rowcount` (rows changed, or -1 when the driver does not know)."""

    rows: list[tuple[Any, ...]]
    rowcount: int


def _driver_of(conn: Any) -> str:
    return type(conn).__module__.split(".")[0]


def _describe(exc: BaseException) -> str:
    """A driver error as one line: its lines joined, or its type when it says nothing."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return "; ".join(lines) if lines else type(exc).__name__


def _check_table(table: str) -> str:
    if not _TABLE_NAME.fullmatch(table):
        raise ConsumerStoreError(f"checkpoint table name {table!r} is not a plain SQL identifier (letters, digits, _)")
    return table


def create_checkpoint_table(conn: Any, table: str = CHECKPOINT_TABLE) -> None:
    """Create the checkpoint table if it does not exist (BYTEA on PostgreSQL, BLOB elsewhere), and
    commit. For tests and examples: production schemas are the user's."""
    blob = "BYTEA" if _driver_of(conn) in _POSTGRES_DRIVERS else "BLOB"
    cur = conn.cursor()
    try:
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {_check_table(table)} ("
            f"shard_fqn TEXT PRIMARY KEY NOT NULL, fence INTEGER NOT NULL, checkpoint {blob} NOT NULL)"
        )
    finally:
        cur.close()
    conn.commit()


class _Dialect:
    """What differs between drivers: placeholders, and how a transaction begins."""

    def __init__(self, paramstyle: str, begin: str | None, serial: bool) -> None:
        if paramstyle not in ("qmark", "format", "pyformat", "numeric", "named"):
            raise ConsumerStoreError(f"DB-API paramstyle {paramstyle!r} is not one SQLStore knows")
        self.paramstyle = paramstyle
        self.begin = begin  # an explicit BEGIN statement, or None: the driver begins implicitly
        self.serial = serial  # one writer at a time: a transaction waits for the previous commit

    @classmethod
    def prepare(cls, conn: Any, paramstyle: str | None) -> _Dialect:
        """The connection's dialect; puts the connection in the transaction mode the store drives."""
        driver = _driver_of(conn)
        style = paramstyle or getattr(sys.modules.get(driver), "paramstyle", None) or "qmark"
        if isinstance(conn, sqlite3.Connection):
            # sqlite3's legacy mode begins a transaction only before DML, not before a SELECT:
            # take control (autocommit mode plus our own BEGIN IMMEDIATE), so that a transaction
            # begins at its first statement and holds SQLite's one write lock from then on.
            legacy = getattr(sqlite3, "LEGACY_TRANSACTION_CONTROL", None)
            handle: Any = conn
            if legacy is not None and getattr(conn, "autocommit", legacy) != legacy:
                handle.autocommit = legacy
            conn.isolation_level = None
            return cls(style, "BEGIN IMMEDIATE", serial=True)
        if driver in _POSTGRES_DRIVERS and getattr(conn, "autocommit", False) is True:
            conn.autocommit = False  # The store's statements must share the consumer's transaction.
        return cls(style, None, serial=False)

    def sql(self, text: str, params: Sequence[Any]) -> tuple[str, Any]:
        """`text` with `?` placeholders (the store's own statements), in the driver's style."""
        if self.paramstyle == "qmark":
            return text, tuple(params)
        parts = text.split("?")
        out = [parts[0]]
        for i, part in enumerate(parts[1:], start=1):
            if self.paramstyle in ("format", "pyformat"):
                out.append("%s")
            elif self.paramstyle == "numeric":
                out.append(f":{i}")
            else:
                out.append(f":p{i}")
            out.append(part)
        if self.paramstyle == "named":
            return "".join(out), {f"p{i}": v for i, v in enumerate(params, start=1)}
        return "".join(out), tuple(params)


class _Connection:
    """One DB-API connection and the one thread that opens, uses and closes it."""

    def __init__(self, connect: Callable[[], Any], paramstyle: str | None) -> None:
        self._connect = connect
        self._paramstyle = paramstyle
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gazette-sqlstore")
        self.conn: Any = None
        self.dialect: _Dialect | None = None
        self.in_txn = False
        self.closed = False

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(self, *args)` in this connection's thread, opening the connection first."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(self._run, fn, *args))

    def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self.conn is None:
            self.conn = self._connect()
            self.dialect = _Dialect.prepare(self.conn, self._paramstyle)
        return fn(self, *args)

    def submit_rollback(self) -> None:
        """Queue a rollback behind whatever this thread still has to do."""
        if not self.closed:
            self._executor.submit(self.rollback_quietly)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._close)
        finally:
            self._executor.shutdown(wait=False)

    def close_soon(self) -> None:
        if not self.closed:
            self.closed = True
            self._executor.submit(self._close)
            self._executor.shutdown(wait=False)

    # The methods below run in the connection's thread.

    def begin(self) -> None:
        assert self.dialect is not None
        if not self.in_txn:
            if self.dialect.begin is not None:
                self._cursor_execute(self.dialect.begin, None)
            self.in_txn = True

    def _cursor_execute(self, sql: str, params: Any) -> SQLResult:
        cur = self.conn.cursor()
        try:
            if params is None:
                cur.execute(sql)
            else:
                cur.execute(sql, params)
            rows = [tuple(r) for r in cur.fetchall()] if cur.description is not None else []
            return SQLResult(rows, cur.rowcount)
        finally:
            cur.close()

    def execute(self, sql: str, params: Any) -> SQLResult:
        self.begin()
        return self._cursor_execute(sql, params)

    def executemany(self, sql: str, seq: list[Any]) -> int:
        self.begin()
        cur = self.conn.cursor()
        try:
            cur.executemany(sql, seq)
            rowcount: int = cur.rowcount
            return rowcount
        finally:
            cur.close()

    def run_fn(self, fn: Callable[[Any], T]) -> T:
        self.begin()
        return fn(self.conn)

    def store_sql(self, text: str, params: Sequence[Any]) -> SQLResult:
        """One of the store's own statements (`?` placeholders)."""
        assert self.dialect is not None
        self.begin()
        return self._cursor_execute(*self.dialect.sql(text, params))

    def commit(self) -> None:
        self.conn.commit()
        self.in_txn = False

    def rollback_quietly(self) -> None:
        if self.conn is not None and self.in_txn:
            self.in_txn = False
            try:
                self.conn.rollback()
            except Exception:
                pass  # A connection that cannot roll back fails its next statement, and is closed then.

    def _close(self) -> None:
        if self.conn is not None:
            self.rollback_quietly()
            try:
                self.conn.close()
            finally:
                self.conn = None


class SQLTransaction:
    """The store's open database transaction, for the application's reads and writes.

    Its database transaction begins at its first statement, on a connection of its own; it ends
    when the store commits it (`start_commit`) or rolls it back (a failed dependency, `destroy`).
    From then on every method raises `StoreClosedError`.
    """

    def __init__(self, store: SQLStore) -> None:
        self._store = store
        self._conn: _Connection | None = None
        self._sealed: str | None = None

    @property
    def active(self) -> bool:
        """True until the store began committing (or rolled back) this transaction."""
        return self._sealed is None

    async def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] | None = None) -> SQLResult:
        """Execute one statement, in the driver's placeholder style; fetch its rows, if any."""
        return await self._call(_Connection.execute, sql, params)

    async def executemany(self, sql: str, seq_of_params: Iterable[Sequence[Any] | dict[str, Any]]) -> int:
        """Execute one statement for each parameter set; returns the driver's rowcount."""
        return await self._call(_Connection.executemany, sql, list(seq_of_params))

    async def run(self, fn: Callable[[Any], T]) -> T:
        """Call `fn(connection)` in the transaction's thread, inside the transaction, and return its
        result: for what `execute` does not cover (cursors, COPY, driver extensions). `fn` must not
        commit or roll back; what it raises is raised here unchanged."""
        self._check()
        conn = await self._connection()
        return await conn.call(_Connection.run_fn, fn)

    def _check(self) -> None:
        if self._sealed is not None:
            raise StoreClosedError(self._sealed, shard=self._store._shard_id)

    async def _connection(self) -> _Connection:
        if self._conn is None:
            self._check()
            store = self._store
            previous = store._last_commit
            if store._serial and previous is not None and not previous.done():
                # One writer at a time (SQLite): begin once the previous commit let go of the lock.
                await asyncio.wait({previous})
                self._check()
            if self._conn is None:
                self._conn = store._acquire()
        return self._conn

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        self._check()
        conn = await self._connection()
        try:
            return await conn.call(fn, *args)
        except ConsumerStoreError:
            raise
        except Exception as exc:
            raise ConsumerStoreError(_describe(exc), shard=self._store._shard_id) from exc

    def _seal(self, reason: str) -> _Connection | None:
        """Close the handle to the application; hand its connection (if it has one) to the store."""
        self._sealed = reason
        conn, self._conn = self._conn, None
        return conn


class SQLStore:
    """A `consumer.store.Store` in a SQL database, fenced by the checkpoint table's `fence` column.

    `connect` opens a new DB-API connection (it is called in the store's own threads, once per
    connection the store needs); `paramstyle` overrides the driver module's `paramstyle`; `table`
    names the checkpoint table. The store owns the connections it opens and closes them in
    `destroy`.
    """

    def __init__(
        self, connect: Callable[[], Any], *, table: str = CHECKPOINT_TABLE, paramstyle: str | None = None
    ) -> None:
        self._connect = connect
        self._table = _check_table(table)
        self._paramstyle = paramstyle
        self._fence = 0
        self._txn: SQLTransaction | None = None
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()
        self._commits: set[asyncio.Future[None]] = set()
        self._waiting: set[asyncio.Future[None]] = set()  # commits still waiting for dependencies
        self._last_commit: asyncio.Future[None] | None = None
        self._closed = False
        self._shard_id: str | None = None
        self._dialect: _Dialect | None = None
        self.cache: Any = None
        """For the application's own use, e.g. records read and changed in memory this
        transaction, to be written out before it commits (Gazette's `SQLStore.Cache`)."""

    # ---- the application's transaction ----

    @property
    def fence(self) -> int:
        """The fence this store commits under (0 before the shard's first row exists)."""
        return self._fence

    @property
    def paramstyle(self) -> str | None:
        """The driver's DB-API placeholder style (`pyformat`: `%s`, `qmark`: `?`), once connected."""
        return self._dialect.paramstyle if self._dialect is not None else self._paramstyle

    def transaction(self) -> SQLTransaction:
        """The open transaction of the current consumer transaction; a new one when none is open
        (its database transaction begins at its first statement)."""
        if self._closed:
            raise StoreClosedError("the store was destroyed", shard=self._shard_id)
        if self._txn is None:
            self._txn = SQLTransaction(self)
        return self._txn

    async def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] | None = None) -> SQLResult:
        """`self.transaction().execute(sql, params)`."""
        return await self.transaction().execute(sql, params)

    async def executemany(self, sql: str, seq_of_params: Iterable[Sequence[Any] | dict[str, Any]]) -> int:
        """`self.transaction().executemany(sql, seq_of_params)`."""
        return await self.transaction().executemany(sql, seq_of_params)

    async def run(self, fn: Callable[[Any], T]) -> T:
        """`self.transaction().run(fn)`."""
        return await self.transaction().run(fn)

    # ---- the Store protocol ----

    async def restore_checkpoint(self, shard: Shard) -> pb.Checkpoint:
        """Bump the shard's fence and read its checkpoint (an empty one, fence 0, if it has no row),
        then commit at once: the fence bump, or the shard's first row. From then on, commits of
        any store that restored the shard before fail with `FenceError`."""
        self._shard_id = shard.id
        previous, self._last_commit = self._last_commit, None
        if previous is not None and not previous.done():
            # A restore starts the store afresh: it follows the commits before it, whatever their
            # outcome (a failed commit fails every later one, until the shard is restored).
            await asyncio.wait({previous})
        txn = self.transaction()
        table = self._table
        try:
            await txn._call(_Connection.store_sql, f"UPDATE {table} SET fence=fence+1 WHERE shard_fqn=?", (shard.fqn,))
            result = await txn._call(
                _Connection.store_sql, f"SELECT fence, checkpoint FROM {table} WHERE shard_fqn=?", (shard.fqn,)
            )
        except BaseException:
            self._abandon(txn, "the checkpoint restore failed")
            raise
        self._note_dialect(txn)
        checkpoint = pb.Checkpoint()
        if result.rows:
            fence, blob = result.rows[0]
            try:
                checkpoint.ParseFromString(bytes(blob))
            except DecodeError as exc:
                self._abandon(txn, "the checkpoint restore failed")
                raise ConsumerStoreError(
                    f"the checkpoint of {shard.fqn} in {table} does not decode: {exc}", shard=shard.id
                ) from exc
            self._fence = int(fence)
        else:
            self._fence = 0
        await self.start_commit(shard, checkpoint, [])
        return checkpoint

    def start_commit(
        self, shard: Shard, checkpoint: pb.Checkpoint, wait_for: Sequence[asyncio.Future[Any]]
    ) -> OpFuture:
        """Commit the open transaction with `checkpoint` once every `wait_for` operation (and the
        previous commit) succeeded; returns at once. The next `transaction()` is a new one."""
        if self._closed:
            raise StoreClosedError("the store was destroyed", shard=shard.id)
        self._shard_id = shard.id
        blob = checkpoint.SerializeToString(deterministic=True)
        txn = self.transaction()
        self._txn = None
        conn = txn._seal("this transaction is committing: use store.transaction() for the next one")
        fence = self._fence
        if fence == 0:
            self._fence = 1  # The next commit updates the row this one inserts.
        previous = self._last_commit
        commit = asyncio.ensure_future(
            self._commit(conn, shard.id, shard.fqn, blob, fence, list(wait_for), previous)
        )
        self._last_commit = commit
        self._commits.add(commit)
        self._waiting.add(commit)
        commit.add_done_callback(self._commits.discard)
        commit.add_done_callback(self._waiting.discard)
        return commit

    async def destroy(self) -> None:
        """Roll back the open transaction, abandon (cancel) commits still waiting for their
        dependencies, wait for a commit already in the database to finish there, and close every
        connection."""
        if self._closed:
            return
        txn = self._txn
        if txn is not None:
            self._abandon(txn, "the store was destroyed")
        self._closed = True
        for commit in list(self._waiting):
            commit.cancel()
        await asyncio.gather(*self._commits, return_exceptions=True)
        self._idle.clear()
        conns, self._all = list(self._all), set()
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)

    # ---- internals ----

    @property
    def _serial(self) -> bool:
        return self._dialect is not None and self._dialect.serial

    def _note_dialect(self, txn: SQLTransaction) -> None:
        if self._dialect is None and txn._conn is not None:
            self._dialect = txn._conn.dialect

    def _acquire(self) -> _Connection:
        if self._closed:
            raise StoreClosedError("the store was destroyed", shard=self._shard_id)
        if self._idle:
            return self._idle.pop()
        conn = _Connection(self._connect, self._paramstyle)
        self._all.add(conn)
        return conn

    def _release(self, conn: _Connection, *, rollback: bool, broken: bool = False) -> None:
        if self._dialect is None:
            self._dialect = conn.dialect
        if rollback:
            conn.submit_rollback()
        if broken or self._closed or len(self._idle) >= _MAX_IDLE:
            self._all.discard(conn)
            conn.close_soon()
        else:
            self._idle.append(conn)

    def _abandon(self, txn: SQLTransaction, reason: str) -> None:
        """Seal `txn` and roll it back; the store's next transaction is a new one."""
        if self._txn is txn:
            self._txn = None
        conn = txn._seal(f"{reason}: this transaction was rolled back")
        if conn is not None:
            self._release(conn, rollback=True)

    async def _await_dependencies(
        self, shard_id: str, wait_for: list[asyncio.Future[Any]], previous: asyncio.Future[None] | None
    ) -> None:
        if previous is not None:
            if not previous.done():
                await asyncio.wait({previous})
            if previous.cancelled():
                raise StoreDependencyError("dependency failed: the previous commit was cancelled", shard=shard_id)
            if (exc := previous.exception()) is not None:
                raise StoreDependencyError(f"dependency failed: the previous commit failed: {exc}", shard=shard_id)
        if not all(op.done() for op in wait_for):
            # asyncio.wait, not await: cancelling this commit must not cancel the caller's operations.
            await asyncio.wait(set(wait_for), return_when=asyncio.FIRST_EXCEPTION)
        for op in wait_for:
            if op.done() and not op.cancelled() and (exc := op.exception()) is not None:
                raise StoreDependencyError(f"dependency failed: {_describe(exc)}", shard=shard_id) from exc
        for op in wait_for:
            if op.cancelled():
                raise StoreDependencyError("dependency failed: an operation was cancelled", shard=shard_id)

    async def _commit(
        self,
        conn: _Connection | None,
        shard_id: str,
        fqn: str,
        blob: bytes,
        fence: int,
        wait_for: list[OpFuture],
        previous: asyncio.Future[None] | None,
    ) -> None:
        try:
            await self._await_dependencies(shard_id, wait_for, previous)
            if conn is None:
                conn = self._acquire()  # The transaction wrote nothing: commit the checkpoint alone.
        except BaseException:
            if conn is not None:
                self._release(conn, rollback=True)
            raise
        task = asyncio.current_task()
        if task is not None:
            self._waiting.discard(task)
        try:
            await conn.call(_commit_checkpoint, self._table, fqn, blob, fence)
        except _Fenced:
            self._release(conn, rollback=True)
            raise FenceError(FENCE_UPDATED, shard=shard_id) from None
        except asyncio.CancelledError:
            self._release(conn, rollback=True)
            raise
        except Exception as exc:
            self._release(conn, rollback=True, broken=True)
            raise ConsumerStoreError(_describe(exc), shard=shard_id) from exc
        self._release(conn, rollback=False)


class _Fenced(Exception):
    """The checkpoint UPDATE matched no row: the fence moved."""


def _commit_checkpoint(c: _Connection, table: str, fqn: str, blob: bytes, fence: int) -> None:
    """In the connection's thread: write the checkpoint, fenced, and commit (or roll back)."""
    try:
        if fence == 0:
            c.store_sql(f"INSERT INTO {table} (shard_fqn, checkpoint, fence) VALUES (?, ?, 1)", (fqn, blob))
        else:
            result = c.store_sql(f"UPDATE {table} SET checkpoint=? WHERE shard_fqn=? AND fence=?", (blob, fqn, fence))
            if result.rowcount == 0:
                raise _Fenced
        c.commit()
    except BaseException:
        c.rollback_quietly()
        raise
