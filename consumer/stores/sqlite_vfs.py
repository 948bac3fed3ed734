"""`SQLiteStore`: a shard's SQLite database on local disk, every file operation recorded to the
shard's recovery log through a SQLite VFS (Gazette's `consumer/store-sqlite/store.go`).

The VFS (`RecordedVFS`, implemented with `apsw`, which lets Python implement one) inherits the
operating system's VFS, so the database is an ordinary SQLite file under the Recorder's
directory, and records what SQLite does to it:

=========================================  =====================================================
SQLite call                                 recorded
=========================================  =====================================================
open of the main db, journal, WAL or        `record_open_file(path, O_RDWR [|O_CREAT] [|O_EXCL])`
super-journal, for writing                  (a create op for a new file; nothing for a known one)
write                                       `record_write_at(fnode, data, offset)`; contiguous
                                            writes to one file are coalesced (up to 256 KiB)
journal/WAL write at offset 0 whose first   a *truncation*: `O_RDWR|O_TRUNC` (an unlink of the
4 bytes are 00000000 or a WAL magic         old Fnode, a create of a new one), then the write
(377f0682, 377f0683), once the file has
content
truncate to 0                               a truncation (a new, empty Fnode)
truncate to n, longer than recorded         a write of one zero byte at n - 1
truncate to n > 0, shorter than recorded    nothing (see below)
delete                                      `record_remove(path)`
sync                                        coalesced writes are flushed into the Recorder (the
                                            local file is not synced: the log is what's durable)
=========================================  =====================================================

Temporary files (statement journals, temp databases: nameless or delete-on-close) and read-only
opens are not recorded.

The truncation rule keeps the journal's share of the log's live horizon small: each
transaction's rollback journal is a new Fnode, dead once the next transaction begins, so hints
need no more of the log than the main database's writes and the current journal. The database
file itself is recorded as written (Gazette instead stores it as "page files" in a recorded
RocksDB, whose compactions bound its horizon): every page write since the file's creation stays
live. `request_compaction()` (or `compact_after=`) bounds that: at a commit, `VACUUM INTO` a new
file and rename it over the database, whose old Fnode, and all the log behind it, is then dead.

A database file that shrinks (a `VACUUM`, `auto_vacuum`, or the rollback of a transaction that
grew it) keeps its old length in the log: a played-back file may have bytes past the database's
size, which SQLite ignores (the size in the database header is what counts, and later writes
overwrite them). Recording a shrink as a rewrite under a new Fnode would leave log prefixes, cut
between the appends of a large rewrite, holding a partial database. A journal is only ever shrunk
to zero, or after its header was zeroed.

Durability and ordering. A Recorder sequences ops in the order they are recorded, and a log
is read back as a prefix of whole ops; so a playback of any prefix of the log is a directory
SQLite could have left on a crash with writes reaching the disk in order, which its rollback
journal (or WAL) recovers from. `synchronous=FULL` is set so that SQLite syncs (flushes
coalesced writes) before each step that depends on earlier ones. An `xSync` neither syncs the local
file (a shard never recovers from its old directory, only from the log) nor waits for the log
(Gazette's blocks on `Barrier`): the store's durability point is its commit, whose future is a
Recorder barrier after the COMMIT.

Journal mode. `TRUNCATE` by default (as Gazette, when it can), with `locking_mode=EXCLUSIVE`:
the journal of a committed transaction is truncated to zero, so each transaction's journal is a
new Fnode and the commit point is that truncation. `DELETE` and `PERSIST` work as well (in
exclusive locking mode SQLite zeroes the journal header rather than deleting it: the truncation
rule catches that). `WAL` works too (exclusive locking keeps its index in heap memory, so there is
no `-shm` file to record); each checkpoint's WAL restart, a header written at offset 0, starts a
new Fnode. `OFF` and `MEMORY` are refused: a crash mid-transaction would corrupt the database.

Threads. SQLite runs on the event loop's thread: the Recorder's recording calls are synchronous
and queue bytes for its asyncio append task, so VFS callbacks record directly, in order, with no
hand-off between threads; a store's statements are short, local-disk work (a consumer
transaction's statements run between awaits, as any handler code does). A long statement
(a bulk load, a compaction) blocks the loop for its duration; run such work in smaller
transactions.

Use from an application
-----------------------
::

    async def new_store(self, shard, recorder):
        store = await SQLiteStore.open(recorder)                 # <recorder dir>/store.db
        store.execute("CREATE TABLE IF NOT EXISTS counts (word TEXT PRIMARY KEY, n INTEGER)")
        return store

    async def consume_message(self, shard, store, envelope, publisher):
        store.execute("INSERT INTO counts VALUES (?, 1) ON CONFLICT(word) DO UPDATE SET n = n + 1",
                      (envelope.message.word,))

The store's one connection (`store.connection`, an `apsw.Connection`) is always inside a
transaction: `start_commit` writes the checkpoint into it and commits it, and the next one begins
at once. Don't run BEGIN, COMMIT or ROLLBACK yourself (SAVEPOINTs are fine). The checkpoint lives
in `gazette_checkpoint(rowid INTEGER PRIMARY KEY DEFAULT 0 CHECK(rowid=0), checkpoint BLOB)`.

Commits: `start_commit` = `recorder.barrier(wait_for)`; `UPDATE gazette_checkpoint`; `COMMIT`;
a future of `recorder.barrier()`. Failures are those of `JSONFileStore`: `StoreDependencyError`
when a `wait_for` operation failed, `FenceError` when a new primary took the log, `ConsumerStoreError`
otherwise; after any of them the Recorder, and the store, are failed for good: a statement that
writes to a file then raises the Recorder's `RecorderFailedError` (SQLite sees an I/O error).

Other limits: the store's transaction is always open, so statements SQLite refuses inside one
(`ATTACH`, `VACUUM`, changing `journal_mode`, `locking_mode` or `page_size`) can't be run through
it; `open` sets the modes, and `request_compaction` does the vacuuming. A database file SQLite opens
outside the recorder's directory is refused (it would not be recorded).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import apsw
from google.protobuf.message import DecodeError

from consumer.protocol import pb
from consumer.recoverylog.errors import RecoveryLogError
from consumer.recoverylog.recorder import Recorder
from consumer.store import OpFuture
from consumer.stores.errors import ConsumerStoreError, StoreClosedError
from consumer.stores.json_file import await_recorded_commit, commit_error, failed_future
from consumer.stores.layout import check_recorded_layout

if TYPE_CHECKING:
    from consumer.shard import Shard

DEFAULT_DB = "store.db"
CHECKPOINT_TABLE = "gazette_checkpoint"
JOURNAL_MODES = frozenset({"TRUNCATE", "DELETE", "PERSIST", "WAL"})

TRUNCATING_HEADERS = (b"\x00\x00\x00\x00", b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83")
"""First 4 bytes of a journal or WAL write at offset 0 that start the file afresh: a zeroed journal
header (PERSIST, or exclusive locking) or a WAL header. (The hot journal magic d9d505f9 is not one.)"""

COMPACT_SUFFIX = ".compact"
"""The temporary name of a compacted database, beside it."""

MAX_COALESCED_WRITE = 256 << 10
"""Contiguous writes to one file are recorded as one write op of at most this many bytes."""

_RECORDED_KINDS = (
    apsw.SQLITE_OPEN_MAIN_DB | apsw.SQLITE_OPEN_MAIN_JOURNAL | apsw.SQLITE_OPEN_WAL | apsw.SQLITE_OPEN_SUPER_JOURNAL
)
_LOG_KINDS = apsw.SQLITE_OPEN_MAIN_JOURNAL | apsw.SQLITE_OPEN_WAL
_vfs_ids = itertools.count(1)


@dataclass
class VFSStats:
    """What a RecordedVFS recorded, for tests and metrics."""

    writes: int = 0
    """Write ops recorded (after coalescing)."""
    bytes: int = 0
    """Bytes of recorded writes."""
    truncations: int = 0
    """New Fnodes started by the truncation rule or a truncate."""
    syncs: int = 0
    db_bytes: int = 0
    """Bytes of recorded writes to main database files (since the last compaction)."""


@dataclass
class _Pending:
    path: str
    fnode: int
    offset: int
    data: bytearray
    main_db: bool


class RecordedVFS(apsw.VFS):
    """A SQLite VFS inheriting the default one, recording file operations under the Recorder's dir
    (see the module doc). Registered under a unique `name` until `unregister()`."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.name = f"gazette-recorded-{time.time_ns()}-{next(_vfs_ids)}"
        self.stats = VFSStats()
        self._pending: _Pending | None = None
        self._sizes: dict[str, int] = {}
        """Recorded length of each open recorded file (by recorded path)."""
        self.detached = False
        """Set by `detach()`: file operations are no longer recorded."""
        super().__init__(self.name, "")

    def detach(self) -> None:
        """Record nothing more (a store being destroyed: what SQLite does to its files as it
        closes, such as rolling back an open transaction, is of no interest to the log)."""
        self._pending = None
        self.detached = True

    def recorded_path(self, filename: str | None, flags: int) -> str | None:
        """The recorded path of a file SQLite opens with `flags`, or None if it isn't recorded."""
        if self.detached or filename is None or not flags & _RECORDED_KINDS or \
                flags & apsw.SQLITE_OPEN_DELETEONCLOSE:
            return None
        if not flags & apsw.SQLITE_OPEN_READWRITE:
            return None
        return self.recorder.normalize_path(filename)

    def xFullPathname(self, name: str) -> str:
        # Absolute, without resolving symbolic links: the inherited unix VFS resolves them and
        # reports SQLITE_OK_SYMLINK, which apsw takes for an error; and the files are recorded
        # by their paths under the recorder's dir.
        return os.path.abspath(name)

    def xOpen(self, name: str | apsw.URIFilename | None, flags: list[int]) -> RecordedFile:
        return RecordedFile(self, name, flags)

    def xDelete(self, filename: str, syncdir: bool) -> None:
        self.flush()
        super().xDelete(filename, syncdir)
        if self.detached:
            return
        try:
            path = self.recorder.normalize_path(filename)
        except RecoveryLogError:
            return  # Not under the recorder's dir: not recorded.
        if path in self.recorder.fsm.links:
            self.recorder.record_remove(filename)
            self._sizes.pop(path, None)

    # -- recording -----------------------------------------------------------------------------

    def flush(self) -> None:
        """Record the coalesced write, if any."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self.recorder.record_write_at(pending.fnode, pending.data, pending.offset)
            self.stats.writes += 1
            self.stats.bytes += len(pending.data)
            if pending.main_db:
                self.stats.db_bytes += len(pending.data)

    def _write(self, path: str, data: bytes, offset: int, main_db: bool) -> None:
        p = self._pending
        if p is not None and p.path == path and p.offset + len(p.data) == offset and \
                len(p.data) + len(data) <= MAX_COALESCED_WRITE:
            p.data += data
        else:
            self.flush()
            self._pending = _Pending(path, self.recorder.fsm.links[path], offset, bytearray(data), main_db)
        end = offset + len(data)
        if end > self._sizes.get(path, 0):
            self._sizes[path] = end

    def _truncation(self, filename: str, path: str) -> None:
        """Start `path` afresh: a new, empty Fnode."""
        self.flush()
        self.recorder.record_open_file(filename, os.O_RDWR | os.O_TRUNC)
        self._sizes[path] = 0
        self.stats.truncations += 1


class RecordedFile(apsw.VFSFile):
    """A file opened through a RecordedVFS."""

    def __init__(self, vfs: RecordedVFS, name: str | apsw.URIFilename | None, flags: list[int]) -> None:
        super().__init__("", name, flags)
        self.vfs = vfs
        filename = name.filename() if isinstance(name, apsw.URIFilename) else name
        self.filename = filename
        self.path = vfs.recorded_path(filename, flags[0])
        self.is_log = bool(flags[0] & _LOG_KINDS)
        self.is_main_db = bool(flags[0] & apsw.SQLITE_OPEN_MAIN_DB)
        if self.path is not None and filename is not None:
            vfs.flush()
            os_flags = os.O_RDWR
            if flags[0] & apsw.SQLITE_OPEN_CREATE:
                os_flags |= os.O_CREAT
            if flags[0] & apsw.SQLITE_OPEN_EXCLUSIVE:
                os_flags |= os.O_EXCL
            vfs.recorder.record_open_file(filename, os_flags)
            vfs._sizes[self.path] = super().xFileSize()

    def xWrite(self, data: Any, offset: int) -> None:
        super().xWrite(data, offset)
        path = self.path
        if path is None or self.filename is None or self.vfs.detached:
            return
        chunk = bytes(data)
        vfs = self.vfs
        if self.is_log and offset == 0 and chunk[:4] in TRUNCATING_HEADERS and vfs._sizes.get(path, 0) > 0:
            vfs._truncation(self.filename, path)
        vfs._write(path, chunk, offset, self.is_main_db)

    def xTruncate(self, newsize: int) -> None:
        super().xTruncate(newsize)
        path = self.path
        if path is None or self.filename is None or self.vfs.detached:
            return
        vfs = self.vfs
        recorded = vfs._sizes.get(path, 0)
        if newsize == 0:
            if recorded:
                vfs._truncation(self.filename, path)
        elif newsize > recorded:
            vfs._write(path, b"\x00", newsize - 1, self.is_main_db)
        # A shrink to newsize > 0 is not recorded (there is no truncate op, and rewriting the file
        # as a new Fnode would leave a log prefix with a partial database): see the module doc.

    def xSync(self, flags: int) -> None:
        if self.path is None:
            super().xSync(flags)
            return
        # A recorded file's sync never reaches the local disk, as in Gazette: the log is what is
        # durable, and a shard recovers by playing it into a new directory, never from this one.
        self.vfs.stats.syncs += 1
        self.vfs.flush()

    def xClose(self) -> None:
        try:
            if self.path is not None:
                self.vfs.flush()
                self.vfs._sizes.pop(self.path, None)
        finally:
            super().xClose()


def _connect(vfs: RecordedVFS, path: str, mode: str, page_size: int | None) -> apsw.Connection:
    """The store's connection to `path` through `vfs`, its pragmas set and checkpoint table made."""
    conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE, vfs=vfs.name)
    try:
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        if page_size is not None:
            conn.execute(f"PRAGMA page_size={int(page_size)}")
        got = conn.execute(f"PRAGMA journal_mode={mode}").fetchall()
        if not got or str(got[0][0]).upper() != mode:
            raise ConsumerStoreError(f"SQLite refused journal_mode={mode} (got {got})")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {CHECKPOINT_TABLE} ("
            "rowid INTEGER PRIMARY KEY DEFAULT 0 CHECK (rowid=0), checkpoint BLOB)"
        )
        conn.execute(f"INSERT OR IGNORE INTO {CHECKPOINT_TABLE} (rowid, checkpoint) VALUES (0, X'')")
        vfs.flush()
    except BaseException:
        conn.close()
        raise
    return conn


def _remove_stale(recorder: Recorder, path: str) -> None:
    """Remove `path` (the temporary file of an interrupted compaction), recording its removal."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    if recorder.normalize_path(path) in recorder.fsm.links:
        recorder.record_remove(path)


def _find_recovery_error(exc: BaseException) -> RecoveryLogError | None:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, RecoveryLogError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


class SQLiteStore:
    """A shard's SQLite database in its Recorder's directory, recorded through a `RecordedVFS`.
    Make one with `await SQLiteStore.open(recorder)`; see the module doc."""

    def __init__(
        self, recorder: Recorder, vfs: RecordedVFS, connection: apsw.Connection, path: str, journal_mode: str,
        compact_after: int | None,
    ) -> None:
        """Use `SQLiteStore.open`."""
        self.recorder = recorder
        self.vfs = vfs
        self.connection = connection
        """The store's one connection, always in the current transaction (use it on the loop's thread).
        A compaction replaces it: don't keep it across commits."""
        self.path = path
        self.journal_mode = journal_mode
        self.compact_after = compact_after
        """Compact at the commit after this many bytes of database-file writes were recorded."""
        self.compactions = 0
        self._compact = False
        self._closed = False
        self._shard_id: str | None = None

    @classmethod
    async def open(
        cls,
        recorder: Recorder,
        path: str = DEFAULT_DB,
        *,
        journal_mode: str = "TRUNCATE",
        page_size: int | None = None,
        compact_after: int | None = None,
    ) -> SQLiteStore:
        """Open (or create) the database `path` (relative to the recorder's dir), with its
        checkpoint table, and begin its first transaction. Call it in the event loop's thread.

        `compact_after`: compact the database (`request_compaction`) at the first commit after
        this many bytes of database-file writes were recorded (since it was opened, or last
        compacted); a few times the database's size is a good value. None: only on request.
        ForeignStoreError if the directory holds another store's files (`consumer.stores.layout`)."""
        if recorder is None:
            raise ConsumerStoreError("SQLiteStore needs a recovery log: the shard's spec has no recovery_log_prefix")
        mode = journal_mode.upper()
        if mode not in JOURNAL_MODES:
            raise ConsumerStoreError(f"journal_mode {journal_mode!r} is not one of {sorted(JOURNAL_MODES)}")
        full = os.path.join(recorder.dir, path)
        db = recorder.normalize_path(full)  # Raises if `path` escapes the directory.
        own = (db, db + COMPACT_SUFFIX)
        check_recorded_layout(recorder, "a SQLiteStore", lambda p: p in own or p.startswith(db + "-"))
        _remove_stale(recorder, full + COMPACT_SUFFIX)
        vfs = RecordedVFS(recorder)
        try:
            conn = _connect(vfs, full, mode, page_size)
        except BaseException:
            vfs.unregister()
            raise
        store = cls(recorder, vfs, conn, full, mode, compact_after)
        store._begin()
        return store

    # ---- application SQL ----

    def execute(self, sql: str, bindings: Sequence[Any] | dict[str, Any] | None = None) -> apsw.Cursor:
        """Run `sql` in the current transaction (`connection.execute`); iterate the cursor for rows."""
        self._check_usable()
        return self.connection.execute(sql, bindings)

    def executemany(self, sql: str, seq_of_bindings: Iterable[Sequence[Any] | dict[str, Any]]) -> apsw.Cursor:
        """Run `sql` for each bindings in the current transaction."""
        self._check_usable()
        return self.connection.executemany(sql, seq_of_bindings)

    def query(self, sql: str, bindings: Sequence[Any] | dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """The rows of `sql`, as a list."""
        return [tuple(row) for row in self.execute(sql, bindings)]

    def _check_usable(self) -> None:
        if self._closed:
            raise StoreClosedError("the store was destroyed", shard=self._shard_id)

    # ---- the Store protocol ----

    async def restore_checkpoint(self, shard: Shard) -> pb.Checkpoint:
        """The checkpoint of `gazette_checkpoint` (empty for a new database). (The log's register
        fence, taken by the Player's hand-off, fences older primaries.)"""
        self._shard_id = shard.id
        self._check_usable()
        rows = self.query(f"SELECT checkpoint FROM {CHECKPOINT_TABLE} WHERE rowid=0")
        cp = pb.Checkpoint()
        if rows and rows[0][0]:
            try:
                cp.ParseFromString(bytes(rows[0][0]))
            except DecodeError as exc:
                raise ConsumerStoreError(
                    f"the checkpoint in {self.path} does not decode: {exc}", shard=shard.id
                ) from exc
        return cp

    def start_commit(
        self, shard: Shard, checkpoint: pb.Checkpoint, wait_for: Sequence[asyncio.Future[Any]]
    ) -> OpFuture:
        """Commit the current transaction with `checkpoint`, its recorded ops appended once
        `wait_for` committed; returns at once, and the next transaction has begun."""
        self._shard_id = shard.id
        self._check_usable()
        deps = list(wait_for)
        conn = self.connection
        if not conn.in_transaction:
            self._begin()
            return failed_future(ConsumerStoreError(
                "the transaction was rolled back by an earlier error (or a COMMIT or ROLLBACK the "
                "application ran): nothing to commit", shard=shard.id))
        try:
            if deps:
                self.recorder.barrier(deps)
            conn.execute(f"UPDATE {CHECKPOINT_TABLE} SET checkpoint=? WHERE rowid=0",
                         (checkpoint.SerializeToString(deterministic=True),))
            conn.execute("COMMIT")
            self.vfs.flush()
            if self._compact or (self.compact_after is not None and self.vfs.stats.db_bytes >= self.compact_after):
                self._compact_now()
        except Exception as exc:
            self._rollback_quietly()
            rec_err = _find_recovery_error(exc)
            if rec_err is not None:
                return failed_future(commit_error(rec_err, deps, shard.id))
            return failed_future(ConsumerStoreError(f"committing {self.path}: {exc}", shard=shard.id))
        finally:
            self._begin()
        return asyncio.ensure_future(await_recorded_commit(self.recorder.barrier(), deps, shard.id))

    def request_compaction(self) -> None:
        """Compact the database at the next commit, right after its COMMIT: `VACUUM INTO` a new
        file (recorded as a new Fnode), then rename it over the database. The old database's
        Fnode is then dead, and with it every write the log holds for it: hints need the log only
        from the compaction on, and pruning can reclaim what came before."""
        self._compact = True

    def _compact_now(self) -> None:
        """Compact, between transactions (see `request_compaction`)."""
        self._compact = False
        tmp = self.path + COMPACT_SUFFIX
        _remove_stale(self.recorder, tmp)
        conn = self.connection
        conn.execute("VACUUM INTO ?", (tmp,))
        if self.journal_mode == "WAL":
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.vfs.flush()
        conn.close()
        for suffix in ("-wal", "-journal"):
            # An empty journal or WAL (or one with a zeroed header) is no hot journal of the new
            # database; anything else would be applied to it: refuse.
            try:
                with open(self.path + suffix, "rb") as f:
                    head = f.read(4)
            except FileNotFoundError:
                continue
            if head and head not in TRUNCATING_HEADERS[:1]:
                raise ConsumerStoreError(f"compaction: {self.path + suffix} is not empty after the database was closed")
        # The rename's three ops (unlink the old database, link the new one, unlink its temporary
        # name) go in one append, after a barrier: no log prefix ends between them.
        self.recorder.barrier()
        os.replace(tmp, self.path)
        self.recorder.record_rename(tmp, self.path)
        self.connection = _connect(self.vfs, self.path, self.journal_mode, None)
        self.vfs.stats.db_bytes = 0
        self.compactions += 1

    def _begin(self) -> None:
        if not self.connection.in_transaction:
            try:
                self.connection.execute("BEGIN")
            except apsw.Error:
                pass  # The store's Recorder or file failed: the next statement reports why.

    def _rollback_quietly(self) -> None:
        if self.connection.in_transaction:
            try:
                self.connection.execute("ROLLBACK")
            except Exception:
                pass

    async def destroy(self) -> None:
        """Close the connection (rolling back the open transaction, unrecorded), unregister the
        VFS, and remove the directory (as Gazette's local stores do)."""
        if self._closed:
            return
        self._closed = True
        self.vfs.detach()
        try:
            self.connection.close()
        except Exception:
            pass
        finally:
            self.vfs.unregister()
        await asyncio.to_thread(shutil.rmtree, self.recorder.dir, True)


__all__ = [
    "CHECKPOINT_TABLE",
    "COMPACT_SUFFIX",
    "DEFAULT_DB",
    "JOURNAL_MODES",
    "MAX_COALESCED_WRITE",
    "TRUNCATING_HEADERS",
    "RecordedFile",
    "RecordedVFS",
    "SQLiteStore",
    "VFSStats",
]
