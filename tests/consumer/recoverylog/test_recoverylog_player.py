"""Recorder and Player against a real broker: a recorded directory plays back byte for byte,
hints skip dead files, a tailing player sees new ops, and a hand-off fences the old recorder."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from broker.client import (
    Appender,
    AppendOutcomeUnknown,
    AppendService,
    AsyncAppend,
    JournalClient,
    RegisterMismatch,
)
from broker.protocol import pb as bpb
from consumer.protocol import recoverylog_pb
from consumer.recoverylog.errors import BrokenHistoryError, ContentTypeError, PlaybackError, RecorderFailedError
from consumer.recoverylog.fsm import FSM
from consumer.recoverylog.ops import RecordedOp, author_fence, decode_frames, encode_op, write_op
from consumer.recoverylog.player import FNODE_STAGING_DIR, Player, Resolved
from consumer.recoverylog.recorder import FileRecorder, Recorder
from tests.consumer.recoverylog.conftest import NewLog, read_all

FSMHints = recoverylog_pb.FSMHints
TIMEOUT = 30


class RecordedDir:
    """Changes files under `root` and records each change with `rec`."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.root = Path(rec.dir)
        self.files: dict[str, FileRecorder] = {}

    def create(self, rel: str, data: bytes = b"") -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
        self.files[rel] = FileRecorder(self.rec, self.rec.record_create(path))
        if data:
            self.append(rel, data)

    def append(self, rel: str, data: bytes) -> None:
        with open(self.root / rel, "ab") as f:
            f.write(data)
        self.files[rel].record_write(data)

    def write_at(self, rel: str, data: bytes, offset: int) -> None:
        with open(self.root / rel, "r+b") as f:
            f.seek(offset)
            f.write(data)
        self.files[rel].record_write_at(data, offset)

    def link(self, src: str, dst: str) -> None:
        os.link(self.root / src, self.root / dst)
        self.rec.record_link(self.root / src, self.root / dst)
        self.files[dst] = self.files[src]

    def rename(self, src: str, dst: str) -> None:
        os.rename(self.root / src, self.root / dst)
        self.rec.record_rename(self.root / src, self.root / dst)
        self.files[dst] = self.files.pop(src)

    def remove(self, rel: str) -> None:
        os.remove(self.root / rel)
        self.rec.record_remove(self.root / rel)
        del self.files[rel]


def without_offsets(hints: FSMHints) -> FSMHints:
    out = FSMHints()
    out.CopyFrom(hints)
    for node in out.live_nodes:
        for seg in node.segments:
            seg.first_offset = seg.last_offset = 0
    return out


def tree(root: Path) -> dict[str, bytes]:
    """Every regular file under `root`, by relative path."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


async def play_to_head(hints: FSMHints, dir: Path, client: JournalClient, ajc: AppendService) -> Resolved:
    player = Player()
    player.finish_at_write_head()
    return await asyncio.wait_for(player.play(hints, dir, client, ajc), TIMEOUT)


def record_fixture(d: RecordedDir) -> None:
    d.create("a.txt", b"hello, ")
    d.append("a.txt", b"world")
    d.create("dir/sub/b.bin", os.urandom(300_000))  # Larger than a read chunk.
    d.write_at("dir/sub/b.bin", b"PATCHED", 1000)
    d.create("doomed", b"x" * 5000)
    d.link("a.txt", "a-link.txt")
    d.create("tmp-c", b"c content")
    d.rename("tmp-c", "c.txt")
    d.create("over", b"first version")
    d.create("over", b"second")  # Truncates: a new Fnode.
    d.remove("doomed")
    d.create("tmp-identity", b"")
    (d.root / "tmp-identity").write_bytes(b"the-guid")
    os.rename(d.root / "tmp-identity", d.root / "IDENTITY")
    d.rec.record_rename(d.root / "tmp-identity", d.root / "IDENTITY")  # A property.
    d.create("empty")


async def test_playback_reproduces_the_recorded_directory(
    client: JournalClient, ajc: AppendService, new_log: NewLog, tmp_path: Path
) -> None:
    log = await new_log()
    src = tmp_path / "src"
    src.mkdir()
    rec = await Recorder.open(log, FSM(FSMHints(log=log)), 1234, str(src), ajc)
    d = RecordedDir(rec)
    record_fixture(d)
    hints = await rec.build_hints()
    expect = tree(src)
    assert set(expect) == {"a.txt", "a-link.txt", "dir/sub/b.bin", "c.txt", "over", "IDENTITY", "empty"}

    # From the log's start, without hints.
    full = await play_to_head(FSMHints(log=log), tmp_path / "full", client, ajc)
    assert tree(tmp_path / "full") == expect
    assert not (tmp_path / "full" / FNODE_STAGING_DIR).exists()
    assert os.stat(tmp_path / "full" / "a.txt").st_ino == os.stat(tmp_path / "full" / "a-link.txt").st_ino
    assert full.fsm.next_seq_no == rec.fsm.next_seq_no
    assert full.fsm.next_checksum == rec.fsm.next_checksum
    assert full.fsm.links == rec.fsm.links

    # With the recorder's hints: the same files, and the same FSM.
    hinted = await play_to_head(hints, tmp_path / "hinted", client, ajc)
    assert tree(tmp_path / "hinted") == expect
    # Playback knows the ops' exact offsets, where the recorder had lower bounds.
    rebuilt = hinted.fsm.build_hints(log)
    assert without_offsets(rebuilt) == without_offsets(hints)
    for got, want in zip((s for n in rebuilt.live_nodes for s in n.segments),
                         (s for n in hints.live_nodes for s in n.segments), strict=True):
        assert got.first_offset >= want.first_offset and got.last_offset > got.first_offset
    assert (hinted.log, hinted.dir) == (log, str(tmp_path / "hinted"))


async def test_hints_skip_dead_files(client: JournalClient, ajc: AppendService, new_log: NewLog,
                                     tmp_path: Path) -> None:
    log = await new_log()
    src = tmp_path / "src"
    src.mkdir()
    rec = await Recorder.open(log, FSM(FSMHints(log=log)), 1234, str(src), ajc)
    d = RecordedDir(rec)
    d.create("dead", b"d" * 200_000)
    await rec.barrier()
    d.create("live", b"alive")
    d.remove("dead")
    hints = await rec.build_hints()
    assert [n.fnode for n in hints.live_nodes] == [3]
    assert hints.live_nodes[0].segments[0].first_offset > 200_000  # Past the dead file's ops.

    # A player given the hints starts past the dead file; the file never appears.
    player = Player()
    task = asyncio.ensure_future(player.play(hints, tmp_path / "out", client, ajc))
    await asyncio.wait_for(player.tailing.wait(), TIMEOUT)
    assert sorted(os.listdir(tmp_path / "out" / FNODE_STAGING_DIR)) == ["3"]
    player.finish_at_write_head()
    resolved = await asyncio.wait_for(task, TIMEOUT)
    assert tree(tmp_path / "out") == {"live": b"alive"}
    assert resolved.fsm.next_seq_no == rec.fsm.next_seq_no
    assert player.done.is_set() and player.resolved is resolved


async def test_tailing_player_sees_new_ops(client: JournalClient, ajc: AppendService, new_log: NewLog,
                                           tmp_path: Path) -> None:
    log = await new_log()
    src = tmp_path / "src"
    src.mkdir()
    rec = await Recorder.open(log, FSM(FSMHints(log=log)), 1234, str(src), ajc)
    d = RecordedDir(rec)
    d.create("before", b"1")
    await rec.barrier()

    player = Player()
    out = tmp_path / "standby"
    task = asyncio.ensure_future(player.play(FSMHints(log=log), out, client, ajc))
    await asyncio.wait_for(player.tailing.wait(), TIMEOUT)
    staged = out / FNODE_STAGING_DIR

    # Ops recorded now reach the tailing player.
    d.create("after", b"live data")
    await rec.barrier()
    async with asyncio.timeout(TIMEOUT):
        while not ((staged / "3").exists() and (staged / "3").read_bytes() == b"live data"):
            await asyncio.sleep(0.02)
    assert not task.done()

    player.finish_at_write_head()
    await asyncio.wait_for(task, TIMEOUT)
    assert tree(out) == tree(src) == {"before": b"1", "after": b"live data"}


async def test_inject_handoff_fences_the_recorder(client: JournalClient, ajc: AppendService, new_log: NewLog,
                                                  tmp_path: Path) -> None:
    log = await new_log()
    src = tmp_path / "src"
    src.mkdir()
    old = await Recorder.open(log, FSM(FSMHints(log=log)), 1111, str(src), ajc)
    d = RecordedDir(old)
    d.create("one", b"from the old primary")
    hints = await old.build_hints()

    # A standby plays the log and takes it over for author 2222.
    standby = tmp_path / "standby"
    player = Player()
    task = asyncio.ensure_future(player.play(hints, standby, client, ajc))
    await asyncio.wait_for(player.tailing.wait(), TIMEOUT)
    player.inject_handoff(2222)
    resolved = await asyncio.wait_for(task, TIMEOUT)
    assert tree(standby) == {"one": b"from the old primary"}
    with pytest.raises(RuntimeError, match="already called"):
        player.finish_at_write_head()

    # The old recorder is fenced: its next append fails with REGISTER_MISMATCH.
    d.create("zombie", b"lost")
    with pytest.raises(RecorderFailedError) as info:
        await asyncio.wait_for(old.barrier(), TIMEOUT)
    assert isinstance(info.value.__cause__, RegisterMismatch)

    # The new primary records on from the played FSM, in the same log.
    new = await Recorder.open(resolved.log, resolved.fsm, 2222, str(standby), ajc)
    nd = RecordedDir(new)
    nd.files["one"] = FileRecorder(new, new.fsm.links["/one"], len(b"from the old primary"))
    nd.append("one", b", and the new one")
    nd.create("two", b"new")
    hints2 = await new.build_hints()

    # Playing the whole log, or the new hints, gives the new primary's view: no zombie write.
    expect = {"one": b"from the old primary, and the new one", "two": b"new"}
    assert tree(standby) == expect
    whole = await play_to_head(FSMHints(log=log), tmp_path / "all", client, ajc)
    assert tree(Path(whole.dir)) == expect
    hinted = await play_to_head(hints2, tmp_path / "hinted", client, ajc)
    assert tree(Path(hinted.dir)) == expect
    assert whole.fsm.next_checksum == hinted.fsm.next_checksum == new.fsm.next_checksum


async def test_playback_follows_hints_across_logs(client: JournalClient, ajc: AppendService, new_log: NewLog,
                                                  tmp_path: Path) -> None:
    first, second = await new_log(), await new_log()
    src = tmp_path / "src"
    src.mkdir()
    rec = await Recorder.open(first, FSM(FSMHints(log=first)), 1, str(src), ajc)
    d = RecordedDir(rec)
    d.create("old", b"in the first log")
    # A new primary recovers from the first log, then records to the second (a log change).
    played = await play_to_head(await rec.build_hints(), tmp_path / "played", client, ajc)
    rec2 = await Recorder.open(second, played.fsm, 2, played.dir, ajc)
    d2 = RecordedDir(rec2)
    d2.files["old"] = FileRecorder(rec2, rec2.fsm.links["/old"], len(b"in the first log"))
    d2.append("old", b", continued in the second")
    d2.create("new", b"in the second log")
    hints = await rec2.build_hints()
    assert {s.log for n in hints.live_nodes for s in n.segments} == {first, ""}
    resolved = await play_to_head(hints, tmp_path / "out", client, ajc)
    assert tree(tmp_path / "out") == tree(tmp_path / "played") == {
        "old": b"in the first log, continued in the second", "new": b"in the second log"}
    assert resolved.fsm.last_log == second
    assert tree(src) == {"old": b"in the first log"}


async def test_playback_refuses_a_log_without_the_content_type(
    client: JournalClient, ajc: AppendService, new_log: NewLog, tmp_path: Path
) -> None:
    log = await new_log(content_type="application/x-ndjson")
    player = Player()
    player.finish_at_write_head()
    with pytest.raises(ContentTypeError, match=r"^expected label content-type value "
                                               r"application/x-gazette-recoverylog \(got application/x-ndjson\)"):
        await player.play(FSMHints(log=log), tmp_path / "out", client, ajc)
    assert not (tmp_path / "out").exists()
    with pytest.raises(PlaybackError, match="named journal does not exist"):
        await Player().play(FSMHints(log="does/not/exist"), tmp_path / "out", client, ajc)


async def test_playback_with_unusable_hints_fails(client: JournalClient, ajc: AppendService, new_log: NewLog,
                                                 tmp_path: Path) -> None:
    log = await new_log()
    src = tmp_path / "src"
    src.mkdir()
    rec = await Recorder.open(log, FSM(FSMHints(log=log)), 1, str(src), ajc)
    RecordedDir(rec).create("f", b"data")
    hints = await rec.build_hints()
    # Hints pointing past the write head: possible data loss.
    hints.live_nodes[0].segments[0].first_offset = 1 << 20
    player = Player()
    player.finish_at_write_head()
    with pytest.raises(PlaybackError,
                       match=rf"^max write-head of {log} is \d+, vs hinted segment .*; possible data loss"):
        await player.play(hints, tmp_path / "out", client, ajc)
    assert not (tmp_path / "out").exists()
    # Hints of a history the log does not hold (another author): they are never used up.
    hints = await rec.build_hints()
    hints.live_nodes[0].segments[0].author = 99
    with pytest.raises(PlaybackError, match=rf"^offset {log}:\d+ >= readThrough \d+, but FSM has unused hints; "
                                            "possible data loss"):
        await asyncio.wait_for(Player().play(hints, tmp_path / "out", client, ajc), TIMEOUT)


async def test_cancelled_playback_removes_the_directory(client: JournalClient, ajc: AppendService,
                                                        new_log: NewLog, tmp_path: Path) -> None:
    log = await new_log()
    player = Player()
    task = asyncio.ensure_future(player.play(FSMHints(log=log), tmp_path / "out", client, ajc))
    await asyncio.wait_for(player.tailing.wait(), TIMEOUT)
    assert (tmp_path / "out" / FNODE_STAGING_DIR).is_dir()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not (tmp_path / "out").exists()
    assert player.done.is_set() and player.resolved is None


async def test_raced_inject_handoff(client: JournalClient, ajc: AppendService, new_log: NewLog,
                                    tmp_path: Path) -> None:
    """Gazette's TestPlayWithInjectHandoff: garbage in the log, a recorder that ignores the fence,
    and a write racing the hand-off's first no-op; both players see the same history."""
    log = await new_log()
    await ajc.append(log, b"irrelevant preceding content")
    src = tmp_path / "src"
    src.mkdir()
    rec = await Recorder.open(log, FSM(FSMHints(log=log)), 1234, str(src), ajc)
    f = FileRecorder(rec, rec.record_create(src / "foo" / "bar"))
    hints = await rec.build_hints()

    handoff_player, tail_player = Player(), Player()
    handoff_task = asyncio.ensure_future(handoff_player.play(hints, tmp_path / "one", client, ajc))
    tail_task = asyncio.ensure_future(tail_player.play(hints, tmp_path / "two", client, ajc))

    f.record_write(b"hello")
    await rec.barrier()
    await ajc.append(log, b"... bad interleaved raw data ...")
    FileRecorder(rec, rec.record_create(src / "baz")).record_write(b"bing")
    await rec.barrier()

    # Break the fence on purpose: |rec| writes on after the hand-off.
    rec.disable_register_checks()

    # A raw append of garbage and a sequenced write, held open to race the first injection.
    op = write_op(f.fnode, f.offset, 6)
    op.author, op.seq_no, op.checksum = rec.author, rec.fsm.next_seq_no, rec.fsm.next_checksum
    frame, op_bytes = encode_op(op)
    op.log, op.first_offset = log, rec.write_head
    rec.fsm.apply(op, op_bytes)
    f.offset += 6
    appender = Appender(client, log)
    await appender.write(b"... more garbage ..." + frame + b" world")

    async def release() -> None:
        await asyncio.sleep(0.02)
        await appender.commit()

    releasing = asyncio.ensure_future(release())
    handoff_player.inject_handoff(1337)
    one = await asyncio.wait_for(handoff_task, TIMEOUT)
    await releasing

    f.record_write(b"final write of rec, ignored because the hand-off was injected")
    await rec.barrier()
    tail_player.finish_at_write_head()
    two = await asyncio.wait_for(tail_task, TIMEOUT)

    # Both players saw the same history, and recovered the same content.
    expect = {"foo/bar": b"hello world", "baz": b"bing"}
    assert tree(Path(one.dir)) == tree(Path(two.dir)) == expect
    assert one.fsm.build_hints(log) == two.fsm.build_hints(log)
    # They branched from |rec|'s view of history.
    assert (await rec.build_hints()) != two.fsm.build_hints(log)
    # The hand-off put its author's fence in the log's registers.
    assert (await rec.barrier()).registers == author_fence(1337)


def test_make_live_refuses_paths_leaving_the_directory(tmp_path: Path) -> None:
    """A log naming `/../x` (never written by a Recorder, which cleans paths) cannot escape `dir`."""
    from consumer.recoverylog.player import _make_live  # The step under test has no public entry.

    fsm = FSM(FSMHints(log="a/log"))
    op = RecordedOp(seq_no=1, author=1, create=RecordedOp.Create(path="/../escape"), log="a/log")
    _, op_bytes = encode_op(op)
    fsm.apply(op, op_bytes)
    (tmp_path / "dir" / FNODE_STAGING_DIR).mkdir(parents=True)
    staged = tmp_path / "dir" / FNODE_STAGING_DIR / "1"
    files = {1: open(staged, "xb")}
    with pytest.raises(PlaybackError, match="leaves the playback directory"):
        _make_live(str(tmp_path / "dir"), fsm, files)
    files.pop(1).close()  # Still held for the abort's cleanup.
    assert not (tmp_path / "escape").exists()


# --- Corrupt and missing log content: BrokenHistoryError, never an older store ------------------

Frame = tuple[RecordedOp, bytes, bytes]


async def recorded_frames(log: str, client: JournalClient, ajc: AppendService, tmp_path: Path) -> list[Frame]:
    """Record the fixture directory to `log` (author 1234) and return the log's frames."""
    src = tmp_path / "src"
    src.mkdir()
    rec = await Recorder.open(log, FSM(FSMHints(log=log)), 1234, str(src), ajc)
    record_fixture(RecordedDir(rec))
    await rec.barrier()
    return decode_frames(await read_all(client, log), log=log)


def reframed(frames: list[Frame]) -> bytes:
    """Log content of `frames`, each op re-marshalled from its (perhaps altered) fields."""
    return b"".join(encode_op(op)[0] + payload for op, _, payload in frames)


async def rewritten_log(new_log: NewLog, ajc: AppendService, frames: list[Frame]) -> tuple[str, list[int]]:
    """A new log holding `frames` (one append), and the offset of each frame in it."""
    log = await new_log()
    offsets, at = [], 0
    for op, _, payload in frames:
        offsets.append(at)
        at += len(encode_op(op)[0]) + len(payload)
    await ajc.append(log, reframed(frames))
    return log, offsets


async def broken_history(log: str, hints: FSMHints, client: JournalClient, ajc: AppendService,
                         out: Path) -> BrokenHistoryError:
    with pytest.raises(BrokenHistoryError) as info:
        await play_to_head(hints, out, client, ajc)
    assert not out.exists()  # Nothing half-played is left behind.
    assert info.value.log == log
    assert "possible data loss" in str(info.value)
    return info.value


def index_of(frames: list[Frame], kind: str, nth: int = 0) -> int:
    return [i for i, (op, _, _) in enumerate(frames) if op.HasField(kind)][nth]


async def test_an_intact_rewritten_log_plays_back(client: JournalClient, ajc: AppendService, new_log: NewLog,
                                                  tmp_path: Path) -> None:
    """The control of the tests below: re-framing the recorded ops changes nothing."""
    frames = await recorded_frames(await new_log(), client, ajc, tmp_path)
    log, _ = await rewritten_log(new_log, ajc, frames)
    await play_to_head(FSMHints(log=log), tmp_path / "out", client, ajc)
    assert tree(tmp_path / "out") == tree(tmp_path / "src")


async def test_a_corrupt_op_fails_playback_at_the_next_op_of_its_author(
    client: JournalClient, ajc: AppendService, new_log: NewLog, tmp_path: Path
) -> None:
    """A write op whose offset field was scribbled on still decodes and applies; the next op of the
    same author no longer chains from it, and playback fails there instead of going on."""
    frames = await recorded_frames(await new_log(), client, ajc, tmp_path)
    i = index_of(frames, "write", 2)  # The PATCHED write into dir/sub/b.bin.
    frames[i][0].write.offset += 7
    log, offsets = await rewritten_log(new_log, ajc, frames)
    err = await broken_history(log, FSMHints(log=log), client, ajc, tmp_path / "out")
    assert (err.offset, err.seq_no, err.author) == (offsets[i + 1], frames[i + 1][0].seq_no, 1234)
    assert f"expected seq_no {frames[i + 1][0].seq_no} and checksum" in err.reason


async def test_a_corrupt_checksum_fails_playback_at_that_op(
    client: JournalClient, ajc: AppendService, new_log: NewLog, tmp_path: Path
) -> None:
    frames = await recorded_frames(await new_log(), client, ajc, tmp_path)
    i = index_of(frames, "link")
    frames[i][0].checksum ^= 0x10
    log, offsets = await rewritten_log(new_log, ajc, frames)
    err = await broken_history(log, FSMHints(log=log), client, ajc, tmp_path / "out")
    assert (err.offset, err.seq_no) == (offsets[i], frames[i][0].seq_no)


async def test_a_missing_stretch_fails_playback_with_or_without_hints(
    client: JournalClient, ajc: AppendService, new_log: NewLog, tmp_path: Path
) -> None:
    """Ops lost from the middle of the log (here the create of `c.txt`'s file and its write)."""
    original = await new_log()
    frames = await recorded_frames(original, client, ajc, tmp_path)
    i = index_of(frames, "create", 3)
    assert frames[i][0].create.path == "/tmp-c"
    gone = frames[i : i + 2]
    del frames[i : i + 2]
    log, offsets = await rewritten_log(new_log, ajc, frames)
    err = await broken_history(log, FSMHints(log=log), client, ajc, tmp_path / "out")
    assert (err.offset, err.seq_no) == (offsets[i], gone[-1][0].seq_no + 1)
    assert f"expected seq_no {gone[0][0].seq_no} " in err.reason

    # Hints of the intact log's live files, moved to the rewritten log (the bytes before the
    # missing stretch are the same): the hinted history cannot be played either.
    played = await play_to_head(FSMHints(log=original), tmp_path / "intact", client, ajc)
    hints = played.fsm.build_hints(log)
    for node in hints.live_nodes:
        for seg in node.segments:
            seg.log = ""
            seg.first_offset = min(seg.first_offset, offsets[i])
            seg.last_offset = 0
    await broken_history(log, hints, client, ajc, tmp_path / "hinted")


async def test_a_log_missing_its_beginning_fails_playback_from_its_start(
    client: JournalClient, ajc: AppendService, new_log: NewLog, tmp_path: Path
) -> None:
    frames = await recorded_frames(await new_log(), client, ajc, tmp_path)
    log, _ = await rewritten_log(new_log, ajc, frames[3:])
    err = await broken_history(log, FSMHints(log=log), client, ajc, tmp_path / "out")
    assert (err.offset, err.seq_no) == (0, frames[3][0].seq_no)
    assert "expected seq_no 1 " in err.reason


async def test_garbage_over_an_op_fails_playback(client: JournalClient, ajc: AppendService, new_log: NewLog,
                                                  tmp_path: Path) -> None:
    """Bytes scribbled over a frame: the reader resynchronizes at the next frame, whose op no longer
    follows the last one applied."""
    frames = await recorded_frames(await new_log(), client, ajc, tmp_path)
    i = index_of(frames, "unlink")
    content = bytearray(reframed(frames))
    _, offsets = await rewritten_log(new_log, ajc, frames)  # Only for the offsets.
    content[offsets[i] : offsets[i] + 6] = b"\xde\xad\xbe\xef\x00\x01"
    log = await new_log()
    await ajc.append(log, bytes(content))
    err = await broken_history(log, FSMHints(log=log), client, ajc, tmp_path / "out")
    assert (err.offset, err.seq_no) == (offsets[i + 1], frames[i + 1][0].seq_no)


async def test_a_branch_of_another_author_is_skipped_not_an_error(
    client: JournalClient, ajc: AppendService, new_log: NewLog, tmp_path: Path
) -> None:
    """Two authors: after author 5678's hand-off no-op, ops of the fenced-out author 1234 (a zombie
    racing the hand-off) are a dead branch; the history is 5678's, and playback succeeds."""
    frames = await recorded_frames(await new_log(), client, ajc, tmp_path)
    i = index_of(frames, "link")
    cut, tail = frames[:i], frames[i:]
    last = FSM(FSMHints(log="x"))
    for op, op_bytes, _ in cut:
        last.apply(op, op_bytes)
    handoff = RecordedOp(seq_no=last.next_seq_no, checksum=last.next_checksum, author=5678)
    log, _ = await rewritten_log(new_log, ajc, [*cut, (handoff, encode_op(handoff)[1], b""), *tail])
    resolved = await play_to_head(FSMHints(log=log), tmp_path / "out", client, ajc)
    assert resolved.fsm.last_author == 5678 and resolved.fsm.next_seq_no == handoff.seq_no + 1
    expect = await play_to_head(FSMHints(log=(await rewritten_log(new_log, ajc, cut))[0]), tmp_path / "cut",
                                client, ajc)
    assert tree(tmp_path / "out") == tree(Path(expect.dir))


class LosesHandoffReply(AppendService):
    """A real AppendService whose first register-fencing append (the hand-off no-op) reports an
    unknown outcome, after appending it (`lands`) or without appending it: a broker lost mid-append."""

    def __init__(self, client: JournalClient, *, lands: bool) -> None:
        super().__init__(client)
        self.lands = lands
        self.faulted = 0

    def append(self, journal: str | bpb.AppendRequest, data: bytes | bytearray | memoryview = b"",
               **kw: Any) -> AsyncAppend:
        if not isinstance(journal, bpb.AppendRequest) or not journal.union_registers.labels or self.faulted:
            return super().append(journal, data, **kw)
        self.faulted += 1
        outcome: asyncio.Future[bpb.AppendResponse] = asyncio.get_running_loop().create_future()
        landed = super().append(journal, data, **kw) if self.lands else None

        async def lose_reply() -> None:
            if landed is not None:
                await landed
            outcome.set_exception(AppendOutcomeUnknown("injected: connection lost after the commit was asked",
                                                       journal=journal.journal))

        self._lose = asyncio.ensure_future(lose_reply())
        return AsyncAppend(journal.journal, outcome, 0, len(data))


@pytest.mark.parametrize("lands", [True, False], ids=["no-op-landed", "no-op-lost"])
async def test_handoff_noop_of_unknown_outcome_is_found_or_injected_again(
    client: JournalClient, new_log: NewLog, tmp_path: Path, lands: bool
) -> None:
    """A hand-off whose no-op append's reply was lost reads the log to its head: the no-op is there
    (the hand-off is done) or it is not (injected again); either way exactly one no-op applies."""
    log = await new_log()
    src = tmp_path / "src"
    src.mkdir()
    async with AppendService(client) as ajc:
        rec = await Recorder.open(log, FSM(FSMHints(log=log)), 1111, str(src), ajc)
        RecordedDir(rec).create("f", b"recorded")
        await rec.barrier()
    async with LosesHandoffReply(client, lands=lands) as flaky:
        player = Player()
        player.inject_handoff(2222)
        resolved = await asyncio.wait_for(player.play(FSMHints(log=log), tmp_path / "out", client, flaky), TIMEOUT)
    assert flaky.faulted == 1
    assert tree(tmp_path / "out") == {"f": b"recorded"}
    assert resolved.fsm.last_author == 2222
    noops = [op for op, _, _ in decode_frames(await read_all(client, log), log=log) if op.author == 2222]
    assert len(noops) == 1  # Found where it landed, or injected again where it did not.
