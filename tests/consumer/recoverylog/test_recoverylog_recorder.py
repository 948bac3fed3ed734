"""Recorder against a real broker: Gazette's recorder_test.go cases, fencing and log changes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from broker.client import AppendService, JournalClient, RegisterMismatch
from broker.protocol import pb as bpb
from consumer.protocol import recoverylog_pb
from consumer.recoverylog.errors import RecorderError, RecorderFailedError
from consumer.recoverylog.fsm import FSM
from consumer.recoverylog.ops import RecordedOp, author_fence, author_selector, decode_frames
from consumer.recoverylog.recorder import FileRecorder, Recorder
from tests.consumer.recoverylog.conftest import NewLog, read_all

FSMHints = recoverylog_pb.FSMHints
Seg = recoverylog_pb.Segment
Node = recoverylog_pb.FnodeSegments
AUTHOR, OTHER = 1234, 5678


async def ops_of(client: JournalClient, log: str, offset: int = 0) -> list[tuple[RecordedOp, bytes]]:
    return [(op, payload) for op, _, payload in decode_frames(await read_all(client, log, offset), log=log,
                                                              offset=offset)]


async def start(log: str, ajc: AppendService, dir: str = "/strip", author: int = AUTHOR) -> Recorder:
    return await Recorder.open(log, FSM(FSMHints(log=log)), author, dir, ajc)


async def test_new_file(client: JournalClient, ajc: AppendService, new_log: NewLog) -> None:
    log = await new_log()
    await ajc.append(log, b"x" * 10)  # The log need not begin at offset 0.
    rec = await start(log, ajc)
    offset = rec.write_head
    assert offset == 10
    assert rec.record_create("/strip/path/to/file") == 1
    await rec.barrier()  # The Recorder observes the commit.
    assert rec.check_registers == author_selector(AUTHOR)
    assert rec.record_create("/strip/other/file") == 2
    hints = await rec.build_hints()
    ops = await ops_of(client, log, 10)
    assert [(o.seq_no, o.author, o.create.path) for o, _ in ops] == [(1, AUTHOR, "/path/to/file"),
                                                                    (2, AUTHOR, "/other/file")]
    assert hints == FSMHints(log=log, live_nodes=[
        Node(fnode=1, segments=[Seg(author=AUTHOR, first_seq_no=1, first_offset=offset, last_seq_no=1)]),
        Node(fnode=2, segments=[Seg(author=AUTHOR, first_seq_no=2, first_offset=offset + 32,
                                    first_checksum=0x568E8E4E, last_seq_no=2)]),
    ])


async def test_delete_overwrite_and_link(client: JournalClient, ajc: AppendService, new_log: NewLog) -> None:
    log = await new_log()
    rec = await start(log, ajc)
    rec.record_create("/strip/path/to/file")
    await rec.barrier()
    rec.record_create("/strip/path/to/file")  # Overwrites: unlink of Fnode 1, create of Fnode 3.
    rec.record_link("/strip/path/to/file", "/strip/linked")
    rec.record_create("/strip/gone")
    rec.record_remove("/strip/gone")
    hints = await rec.build_hints()
    ops = [o for o, _ in await ops_of(client, log)]
    assert (ops[1].seq_no, ops[1].unlink.fnode, ops[1].unlink.path) == (2, 1, "/path/to/file")
    assert (ops[2].seq_no, ops[2].create.path) == (3, "/path/to/file")
    assert (ops[3].link.fnode, ops[3].link.path) == (3, "/linked")
    assert (ops[5].unlink.fnode, ops[5].unlink.path) == (5, "/gone")
    assert hints == FSMHints(log=log, live_nodes=[
        Node(fnode=3, segments=[Seg(author=AUTHOR, first_seq_no=3, first_offset=32, first_checksum=0x8EE45505,
                                    last_seq_no=4)]),
    ])


async def test_rename_target_exists_and_is_new(client: JournalClient, ajc: AppendService, new_log: NewLog) -> None:
    log = await new_log()
    rec = await start(log, ajc)
    rec.record_create("/strip/target/path")
    await rec.barrier()
    rec.record_create("/strip/source/path")
    rec.record_rename("/strip//source/path", "/strip/target/path")  # Duplicate '/' are cleaned.
    hints = await rec.build_hints()
    ops = [o for o, _ in await ops_of(client, log)]
    assert (ops[0].seq_no, ops[1].seq_no) == (1, 2)
    assert (ops[2].unlink.fnode, ops[2].unlink.path) == (1, "/target/path")
    assert (ops[3].link.fnode, ops[3].link.path) == (2, "/target/path")
    assert (ops[4].unlink.fnode, ops[4].unlink.path) == (2, "/source/path")
    assert hints == FSMHints(log=log, live_nodes=[
        Node(fnode=2, segments=[Seg(author=AUTHOR, first_seq_no=2, first_offset=31, first_checksum=0x5CCBEEAA,
                                    last_seq_no=5)]),
    ])
    rec.record_rename("/strip/target/path", "/strip//new/path")
    assert rec.fsm.links == {"/new/path": 2}


async def test_file_appends(client: JournalClient, ajc: AppendService, new_log: NewLog) -> None:
    log = await new_log()
    rec = await start(log, ajc)
    f = FileRecorder(rec, rec.record_create("/strip/source/path"))
    f.record_write(b"first-write")
    f.record_write(b"")
    f.record_write(b"second-write")
    hints = await rec.build_hints()
    ops = await ops_of(client, log)
    assert [(o.seq_no, o.write.fnode, o.write.length, o.write.offset, p) for o, p in ops[1:]] == [
        (2, 1, 11, 0, b"first-write"), (3, 1, 0, 11, b""), (4, 1, 12, 11, b"second-write"),
    ]
    assert hints == FSMHints(log=log, live_nodes=[
        Node(fnode=1, segments=[Seg(author=AUTHOR, first_seq_no=1, first_offset=0, last_seq_no=4)]),
    ])


async def test_property_update(client: JournalClient, ajc: AppendService, new_log: NewLog, tmp_path: Path) -> None:
    log = await new_log()
    rec = await start(log, ajc, str(tmp_path))
    rec.record_create(tmp_path / "tmp_file")
    (tmp_path / "IDENTITY").write_text("value")
    rec.record_rename(tmp_path / "tmp_file", tmp_path / "IDENTITY")
    hints = await rec.build_hints()
    ops = [o for o, _ in await ops_of(client, log)]
    assert (ops[1].seq_no, ops[1].property.path, ops[1].property.content) == (2, "/IDENTITY", "value")
    assert (ops[2].seq_no, ops[2].unlink.fnode, ops[2].unlink.path) == (3, 1, "/tmp_file")
    assert hints == FSMHints(log=log, properties=[recoverylog_pb.Property(path="/IDENTITY", content="value")])


async def test_mixed_new_file_write_and_delete(client: JournalClient, ajc: AppendService, new_log: NewLog) -> None:
    log = await new_log()
    rec = await start(log, ajc)
    rec.record_create("/strip/delete/path")
    await rec.barrier()
    FileRecorder(rec, rec.record_create("/strip/a/path")).record_write(b"file-write")
    rec.record_remove("/strip/delete/path")
    hints = await rec.build_hints()
    assert hints == FSMHints(log=log, live_nodes=[
        Node(fnode=2, segments=[Seg(author=AUTHOR, first_seq_no=2, first_checksum=0x950C2859, first_offset=31,
                                    last_seq_no=3)]),
    ])


async def test_inconsistent_operations_are_refused(ajc: AppendService, new_log: NewLog) -> None:
    log = await new_log()
    with pytest.raises(RecorderError, match="not an absolute, clean path"):
        Recorder(log, FSM(FSMHints(log=log)), AUTHOR, "/strip/", ajc)
    rec = await start(log, ajc)
    rec.record_create("/strip/a")
    for call, match in [
        (lambda: rec.record_remove("/strip/b"), "delete of unknown path /b"),
        (lambda: rec.record_open_file("/strip/b", os.O_RDWR), "without O_CREAT"),
        (lambda: rec.record_open_file("/strip/a", os.O_RDWR | os.O_CREAT | os.O_EXCL), "with O_EXCL"),
        (lambda: rec.record_open_file("/strip/a", os.O_RDONLY), "read-only"),
        (lambda: rec.record_create("/strip/IDENTITY"), "property path"),
        (lambda: rec.record_link("/strip/b", "/strip/c"), "link of unknown path"),
        (lambda: rec.record_rename("/strip/b", "/strip/c"), "rename of unknown path"),
        (lambda: rec.record_write_at(99, b"x", 0), "unknown fnode 99"),
        (lambda: rec.record_create("/elsewhere/a"), "not under the recorder dir"),
    ]:
        with pytest.raises(RecorderError, match=match):
            call()
    assert rec.fsm.next_seq_no == 2  # Nothing was sequenced.
    # Open without truncation keeps the Fnode.
    assert rec.record_open_file("/strip/a", os.O_RDWR) == 1
    await rec.flush()
    assert rec.failed is None


async def test_updating_recorded_log(client: JournalClient, ajc: AppendService, new_log: NewLog) -> None:
    log, other = await new_log(), await new_log()
    rec = await start(log, ajc)
    rec.record_create("/strip/file1")
    await rec.barrier()
    rec2 = await Recorder.open(other, rec.fsm, OTHER, "/strip", ajc)
    rec2.record_create("/strip/file2")
    resp = await rec2.barrier()
    # The no-op took the other log's registers for OTHER.
    assert resp.registers == author_fence(OTHER)
    hints = await rec2.build_hints()
    assert hints == FSMHints(log=other, live_nodes=[
        Node(fnode=1, segments=[Seg(author=AUTHOR, first_seq_no=1, last_seq_no=1, log=log)]),
        # Op 2 is the sequenced hand-off no-op.
        Node(fnode=3, segments=[Seg(author=OTHER, first_seq_no=3, first_checksum=0x61669370, last_seq_no=3)]),
    ])
    ops = [o for o, _ in await ops_of(client, other)]
    assert [(o.seq_no, o.author) for o in ops] == [(2, OTHER), (3, OTHER)]


async def test_fenced_recorder_fails(client: JournalClient, ajc: AppendService, new_log: NewLog) -> None:
    log = await new_log()
    rec = await start(log, ajc)
    rec.record_create("/strip/file1")
    await rec.barrier()
    # Another author takes the log's registers, as a Player's hand-off does.
    await ajc.append(bpb.AppendRequest(journal=log, union_registers=author_fence(OTHER)), b"hand-off")
    rec.record_create("/strip/file2")
    barrier = rec.barrier()
    with pytest.raises(RecorderFailedError) as info:
        await asyncio.wait_for(barrier, 30)
    assert isinstance(info.value.__cause__, RegisterMismatch)
    with pytest.raises(RecorderFailedError):
        rec.record_create("/strip/file3")
    with pytest.raises(RecorderFailedError):
        await rec.build_hints()


async def test_failed_dependency_fails_the_recorder(ajc: AppendService, new_log: NewLog) -> None:
    log = await new_log()
    rec = await start(log, ajc)
    dep: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    first = rec.barrier([dep])
    rec.record_create("/strip/after")
    second = rec.barrier()
    await asyncio.sleep(0.05)
    assert not first.done() and not second.done()  # Held back by the dependency.
    dep.set_exception(RuntimeError("boom"))
    with pytest.raises(RecorderFailedError, match="a barrier dependency failed: boom"):
        await second
    with pytest.raises(RecorderFailedError):
        await first


async def test_closed_append_service_fails_barriers(client: JournalClient, new_log: NewLog) -> None:
    log = await new_log()
    svc = AppendService(client)
    rec = await start(log, svc)
    await svc.close()
    rec.record_create("/strip/file")
    with pytest.raises(RecorderFailedError, match="append failed"):
        await rec.barrier()
    await rec.close()


async def test_pending_bytes_and_close(ajc: AppendService, new_log: NewLog) -> None:
    log = await new_log()
    rec = await start(log, ajc)
    FileRecorder(rec, rec.record_create("/strip/f")).record_write(b"x" * 1000)
    assert rec.pending_bytes > 1000
    await rec.flush()
    assert rec.pending_bytes == 0
    await rec.close()
    with pytest.raises(RecorderFailedError, match="recorder closed"):
        rec.record_create("/strip/g")
    with pytest.raises(RecorderFailedError, match="recorder closed"):
        await rec.barrier()
