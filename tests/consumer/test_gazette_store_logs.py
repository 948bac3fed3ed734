"""Recovery logs as Gazette's own stores record them (consumer/store-rocksdb: a RocksDB through a
recorded Env; consumer/store-sqlite: SQLite pages in a recorded RocksDB at /pageDB, beside the
recorded SQLite journals), written op by op to a real journal on a real broker with the Recorder
(Gazette's wire format), in the order Gazette's recorder would write them. Our Player plays them
byte for byte; our stores refuse them with ForeignStoreError, in-process and as a real `gazette
consume` shard (FAILED, naming the log, the files, the offset and what to do; no traceback)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.client import AppendService, JournalClient
from broker.errors import GazetteError
from consumer.recoverylog import FSM, FSMHints, Player, Recorder
from consumer.stores import ForeignStoreError, JSONFileStore, SQLiteStore
from consumer.stores.layout import (
    GAZETTE_ROCKSDB,
    GAZETTE_SQLITE,
    JSON_FILE,
    SQLITE_DB,
    SQLITE_HEADER,
    recorded_layouts,
)
from tests.consumer import test_recovery_cli as recovery
from tests.consumer.test_recovery_cli import Cluster

cluster = recovery.cluster


class RecordedEnv:
    """Gazette's recordedDB Env observer (consumer/store-rocksdb/recorder_rocksdb.go) over a real
    directory: each call is made on disk, then recorded as Gazette's observer records it."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder, self.dir = recorder, Path(recorder.dir)
        self.fnodes: dict[str, int] = {}
        self.offsets: dict[str, int] = {}

    def new_writable_file(self, path: str) -> None:  # RecordCreate
        (self.dir / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (self.dir / path.lstrip("/")).write_bytes(b"")
        self.fnodes[path], self.offsets[path] = self.recorder.record_create(self.dir / path.lstrip("/")), 0

    def append(self, path: str, data: bytes) -> None:  # FileRecorder.RecordWrite
        with open(self.dir / path.lstrip("/"), "ab") as f:
            f.write(data)
        self.recorder.record_write_at(self.fnodes[path], data, self.offsets[path])
        self.offsets[path] += len(data)

    def write_file(self, path: str, data: bytes) -> None:
        self.new_writable_file(path)
        self.append(path, data)

    def rename(self, src: str, target: str) -> None:  # RecordRename (a property path's content inline)
        os.replace(self.dir / src.lstrip("/"), self.dir / target.lstrip("/"))
        self.recorder.record_rename(self.dir / src.lstrip("/"), self.dir / target.lstrip("/"))

    def delete(self, path: str) -> None:  # RecordRemove
        os.remove(self.dir / path.lstrip("/"))
        self.recorder.record_remove(self.dir / path.lstrip("/"))

    def truncate(self, path: str) -> None:  # store-sqlite's journal restart: RecordOpenFile(O_RDWR|O_TRUNC)
        (self.dir / path.lstrip("/")).write_bytes(b"")
        self.fnodes[path] = self.recorder.record_open_file(self.dir / path.lstrip("/"), os.O_RDWR | os.O_TRUNC)
        self.offsets[path] = 0


def record_rocksdb(env: RecordedEnv, root: str) -> None:
    """A RocksDB's files as it opens, writes, flushes and rolls its WAL (paths under `root`)."""
    env.write_file(f"{root}/000001.dbtmp", b"5d7c1c52-3a41-4c7e-9d1b-2f3a8e2b7c10")
    env.rename(f"{root}/000001.dbtmp", f"{root}/IDENTITY")
    env.write_file(f"{root}/MANIFEST-000001", b"\x0e\x9f\x01\x00" + b"leveldb.BytewiseComparator" * 3)
    env.write_file(f"{root}/000001.dbtmp", b"MANIFEST-000001\n")
    env.rename(f"{root}/000001.dbtmp", f"{root}/CURRENT")
    env.new_writable_file(f"{root}/000003.log")
    for i in range(20):
        env.append(f"{root}/000003.log", b"\x01" * 7 + f"key-{i}=value-{i}".encode() * 5)
    env.write_file(f"{root}/OPTIONS-000005.dbtmp", b"[Version]\n  rocksdb_version=6.22.1\n")
    env.rename(f"{root}/OPTIONS-000005.dbtmp", f"{root}/OPTIONS-000005")
    env.write_file(f"{root}/000007.sst", bytes(range(256)) * 40)
    env.append(f"{root}/MANIFEST-000001", b"\x01\x02edit: add 000007.sst, log 000008")
    env.new_writable_file(f"{root}/000008.log")
    env.delete(f"{root}/000003.log")
    env.append(f"{root}/000008.log", b"\x01" * 7 + b"key-20=value-20")


def record_store_sqlite(env: RecordedEnv) -> None:
    """Gazette's store-sqlite: its pages' RocksDB at /pageDB, and primary.db's rollback journal
    (restarted by a truncation at each transaction); primary.db itself is never a file."""
    record_rocksdb(env, "/pageDB")
    env.new_writable_file("/primary.db-journal")
    env.append("/primary.db-journal", b"\xd9\xd5\x05\xf9\x20\xa1\x63\xd7" + b"\x00" * 504)
    env.truncate("/primary.db-journal")
    env.append("/primary.db-journal", b"\xd9\xd5\x05\xf9\x20\xa1\x63\xd7" + b"\x01" * 504)


RECORD = {"store-rocksdb": lambda env: record_rocksdb(env, ""), "store-sqlite": record_store_sqlite}


async def record_gazette_log(tmp: Path, log: str, appender: AppendService, kind: str) -> dict[str, bytes]:
    """Record `kind`'s files into `log`; the recorded directory's files, by relative path."""
    written = tmp / f"written-{kind}"
    written.mkdir()
    recorder = await Recorder.open(log, FSM(FSMHints(log=log)), 0x5EED, str(written), appender)
    RECORD[kind](RecordedEnv(recorder))
    await recorder.flush()
    await recorder.close()
    return tree(written)


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("kind", sorted(RECORD))
async def test_gazette_store_logs_play_byte_for_byte_and_our_stores_refuse_them(
    cluster: Cluster, client: JournalClient, appender: AppendService, tmp_path: Path, kind: str
) -> None:
    log = cluster.recovery_log
    written = await record_gazette_log(tmp_path, log, appender, kind)
    assert "CURRENT" in written if kind == "store-rocksdb" else "pageDB/CURRENT" in written

    player = Player()
    player.finish_at_write_head()
    played = await player.play(FSMHints(log=log), str(tmp_path / "played"), client)
    assert tree(tmp_path / "played") == written, "the Player plays Gazette's store logs as recorded"
    if kind == "store-rocksdb":
        assert played.fsm.properties == {"/IDENTITY": "5d7c1c52-3a41-4c7e-9d1b-2f3a8e2b7c10"}

    recorder = await Recorder.open(log, played.fsm, 0xB0B, played.dir, appender)
    try:
        for open_store in (lambda: JSONFileStore(recorder, {}), lambda: SQLiteStore.open(recorder)):
            with pytest.raises(ForeignStoreError) as caught:
                result = open_store()
                if not isinstance(result, JSONFileStore):
                    await result
            err = caught.value
            assert isinstance(err, GazetteError) and err.log == log and err.offset is not None
            assert f"Gazette's {kind}" in str(err) and log in str(err) and f"offset {err.offset}" in str(err)
            assert "new recovery log" in str(err)
        assert tree(Path(played.dir)) == written, "nothing was opened over the played files"
    finally:
        await recorder.close()


@pytest.mark.parametrize(("kind", "store"), [("store-rocksdb", "sqlite"), ("store-sqlite", "json")])
async def test_a_consume_shard_on_a_gazette_store_log_fails_naming_it(
    cluster: Cluster, appender: AppendService, tmp_path: Path, kind: str, store: str
) -> None:
    await record_gazette_log(tmp_path, cluster.recovery_log, appender, kind)
    cluster.store = store
    error = await cluster.fail_on_start("foreign-a")
    assert f"Gazette's {kind}" in error and cluster.recovery_log in error and "offset" in error, error
    assert "new recovery log" in error and cluster.state("recovered") is None, error
    assert "Traceback" not in cluster.consumers["foreign-a"].logs()


def test_recorded_layouts_tell_the_stores_apart(tmp_path: Path) -> None:
    (tmp_path / "store.db").write_bytes(SQLITE_HEADER + b"\x10\x00")
    (tmp_path / "notes.txt").write_bytes(b"an application's own file")
    assert recorded_layouts(str(tmp_path), {"/store.db", "/store.db-journal", "/notes.txt"}) == {
        SQLITE_DB: ["/store.db"]}, "our SQLiteStore's journal has its database beside it"
    assert recorded_layouts(str(tmp_path), {"/state.json"}) == {JSON_FILE: ["/state.json"]}
    assert recorded_layouts(str(tmp_path), {"/primary.db-wal", "/pageDB/CURRENT", "/pageDB/000007.sst"}) == {
        GAZETTE_SQLITE: ["/pageDB/000007.sst", "/pageDB/CURRENT", "/primary.db-wal"]}
    assert recorded_layouts(str(tmp_path), {"/IDENTITY", "/MANIFEST-000001", "/000012.log"}) == {
        GAZETTE_ROCKSDB: ["/000012.log", "/IDENTITY", "/MANIFEST-000001"]}
    assert recorded_layouts(str(tmp_path), {"/notes.txt"}) == {}
