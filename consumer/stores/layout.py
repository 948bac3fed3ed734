"""Which store's files a recovered directory holds, so that a store never opens another's as empty.

A Player plays any recovery log faithfully (Gazette's wire format is store-agnostic): a log that
Gazette's `store-rocksdb` recorded plays into a RocksDB directory (`CURRENT`, `MANIFEST-*`,
`*.log`, `*.sst`, `OPTIONS-*`, and `/IDENTITY` as a property), and one of Gazette's
`store-sqlite` into `/pageDB/` (a RocksDB holding the SQLite pages of each database as a column
family) beside the databases' rollback journals or WALs (`/primary.db-journal`, `-wal`): the main
database file itself is never a file there (consumer/store-sqlite/store.go, doc.go). None of these
is a file our stores could open: this project has no RocksDB. A JSONFileStore (`state.json`) and a
SQLiteStore (an SQLite database file) hold each other's files just as unreadably.

`check_recorded_layout` is what each store runs on the recorded directory before opening it: if
the recovered files are another store's, it raises ForeignStoreError naming the log, the files,
the offset they were first recorded at, and what to do, rather than starting an empty store over
them (and recording over the log).
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Collection

from consumer.recoverylog.recorder import Recorder
from consumer.stores.errors import ForeignStoreError

_ROCKSDB_FILE = re.compile(r"^(CURRENT|IDENTITY|MANIFEST-\d+|OPTIONS-\d+|\d+\.(sst|log|blob))$")
"""Files a RocksDB keeps in its directory (its info LOG is not recorded)."""
SQLITE_HEADER = b"SQLite format 3\x00"

GAZETTE_ROCKSDB = "files of Gazette's store-rocksdb (a RocksDB)"
GAZETTE_SQLITE = "files of Gazette's store-sqlite (SQLite pages in a RocksDB at /pageDB, and SQLite journals)"
JSON_FILE = "a JSONFileStore's state.json"
SQLITE_DB = "a SQLite database file (a SQLiteStore's)"


def _is_sqlite_db(dir: str, path: str) -> bool:
    try:
        with open(os.path.join(dir, path.lstrip("/")), "rb") as f:
            return f.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False


def _journal_without_db(path: str, paths: Collection[str]) -> bool:
    """A SQLite rollback journal or WAL whose database is not a recorded file (store-sqlite's)."""
    for suffix in ("-journal", "-wal"):
        if path.endswith(suffix) and path[: -len(suffix)] not in paths:
            return True
    return False


def recorded_layouts(dir: str, paths: Collection[str]) -> dict[str, list[str]]:
    """The store layouts the recorded `paths` (of files under `dir`) belong to, each with its paths."""
    out: dict[str, list[str]] = {}
    for path in sorted(paths):
        if path.startswith("/pageDB/") or _journal_without_db(path, paths):
            kind = GAZETTE_SQLITE
        elif _ROCKSDB_FILE.match(posixpath.basename(path)):
            kind = GAZETTE_ROCKSDB
        elif path in ("/state.json", "/next.json"):
            kind = JSON_FILE
        elif _is_sqlite_db(dir, path):
            kind = SQLITE_DB
        else:
            continue
        out.setdefault(kind, []).append(path)
    if GAZETTE_SQLITE in out and GAZETTE_ROCKSDB in out:
        out[GAZETTE_SQLITE].extend(out.pop(GAZETTE_ROCKSDB))  # store-sqlite's pageDB is a RocksDB too.
    return out


def check_recorded_layout(recorder: Recorder, store: str, own: Callable[[str], bool]) -> None:
    """Raise ForeignStoreError if the recorded directory holds another store's files and none of
    `store`'s own (`own(path)`); a directory of this store's files (or none) passes."""
    fsm = recorder.fsm
    paths = {link: fnode for fnode, node in fsm.live_nodes.items() for link in node.links}
    paths.update({p: 0 for p in fsm.properties})
    if any(own(p) for p in paths):
        return
    layouts = recorded_layouts(recorder.dir, paths)
    if not layouts:
        return
    what, found = next(iter(layouts.items()))
    offsets = [fsm.live_nodes[paths[p]].segments[0].first_offset for p in found if paths[p] in fsm.live_nodes]
    shown = ", ".join(p.lstrip("/") for p in found[:6]) + (", ..." if len(found) > 6 else "")
    at = f", first recorded at offset {min(offsets)}" if offsets else ""
    raise ForeignStoreError(
        f"recovery log {recorder.log} holds {what} ({shown}{at}), which {store} cannot open: serve the shard"
        " with the application (and store) that recorded this log, or give it a new recovery log and delete"
        " its hints to start over empty",
        log=recorder.log, offset=min(offsets) if offsets else None,
    )


__all__ = [
    "GAZETTE_ROCKSDB",
    "GAZETTE_SQLITE",
    "JSON_FILE",
    "SQLITE_DB",
    "check_recorded_layout",
    "recorded_layouts",
]
