"""Player: plays a recovery log back into a local directory (Gazette's `consumer/recoverylog/playback.go`).

`Player.play(hints, dir, client)` rebuilds the FSM of the hints and the files it describes:

1. The FSM is made from the hints; `dir` is wiped, and Fnodes are staged in `dir/.fnodes/<fnode>`.
2. A zero-byte append to the hints' log and to every log a hinted segment names gives each log's
   `read_through` (its write head); a hinted offset at or past it means possible data loss.
3. Ops are read from each hinted segment's first offset (skipping dead stretches of the log), or
   from offset 0 without hints, and applied to the FSM. Ops the FSM refuses in the ordinary course
   (an untracked Fnode, an author not hinted, a seq_no already passed, a branch of another author
   that lost a race to a hand-off) are skipped, write payloads included. An op that can only be
   the history's next one and is not (the last applied op's author's, with a later seq_no or
   another checksum) means corrupt or missing content: BrokenHistoryError, not an older store.
   Applied creates, writes and last unlinks act on the staged files.
4. At the head (a non-blocking read finds no more content) the `tailing` event is set, then:
   - with neither signal yet, the Player tails the log (blocking reads): a hot standby;
   - after `finish_at_write_head()`, it makes the files live and returns;
   - after `inject_handoff(author)`, it appends a no-op sequenced after the last op read, with
     `union_registers = {author: ...}` (fencing out the current Recorder), reads on to it, and if
     the FSM applied it, makes the files live and returns; if another writer got in first, it
     injects again at the new head.
5. Making live hard-links each staged Fnode at its paths, removes `.fnodes`, and writes the
   property files. On an error or cancellation the directory is removed.

The result (`Resolved`: the log, the FSM and the directory) is what a Recorder continues from:
`Recorder.open(log, resolved.fsm, author, dir, ajc)` with the author given to `inject_handoff`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import shutil
from dataclasses import dataclass
from typing import IO, Any

from broker.client import (
    AppendOutcomeUnknown,
    AppendService,
    JournalClient,
    OffsetJump,
    OffsetNotYetAvailable,
    RetryReader,
)
from broker.protocol import labels
from broker.protocol import pb as bpb
from consumer.message.framing.proto_fixed import FIXED_FRAME_HEADER_LENGTH, FIXED_FRAME_WORD
from consumer.message.readers import fetch_journal_spec
from consumer.recoverylog.errors import (
    BrokenHistoryError,
    ChecksumMismatchError,
    ContentTypeError,
    FnodeNotTrackedError,
    FSMError,
    NotHintedAuthorError,
    OpDecodeError,
    PlaybackError,
    RecoveryLogError,
    WrongSeqNoError,
)
from consumer.recoverylog.fsm import FSM, FSMHints
from consumer.recoverylog.ops import RecordedOp, author_fence, decode_op, encode_op, parse_frame_header
from consumer.recoverylog.segments import segment_repr

log = logging.getLogger(__name__)

FNODE_STAGING_DIR = ".fnodes"
"""Subdirectory of the playback directory where Fnodes are staged until made live."""

_COPY_CHUNK = 1 << 20


@dataclass(frozen=True)
class Resolved:
    """What a completed playback recovered."""

    log: str
    """The log played back (the hints' log): the one to continue recording to."""
    fsm: FSM
    """The FSM at the end of playback."""
    dir: str
    """The directory holding the recovered files."""


class _State(enum.Enum):
    BACKFILL = "backfill"  # Reading historical content.
    TAIL = "tail"  # Reading new content as it is written (hot standby).
    EXIT_AT_HEAD = "exit-at-head"  # Finish on reaching the head.
    INJECT_HANDOFF_AT_HEAD = "inject-handoff-at-head"  # Inject a no-op at the head.
    READ_HANDOFF_BARRIER = "read-handoff-barrier"  # Read on to the injected no-op.
    COMPLETE = "complete"


async def check_log_content_type(client: JournalClient, journal: str) -> None:
    """Raise ContentTypeError unless the journal is labelled `application/x-gazette-recoverylog`
    (PlaybackError if it does not exist)."""
    try:
        spec = await fetch_journal_spec(client, journal)
    except Exception as exc:
        raise PlaybackError(str(exc), log=journal) from exc
    got = labels.value_of(spec.labels, labels.CONTENT_TYPE) or ""
    if got != labels.CONTENT_TYPE_RECOVERY_LOG:
        raise ContentTypeError(
            f"expected label {labels.CONTENT_TYPE} value {labels.CONTENT_TYPE_RECOVERY_LOG} (got {got})", log=journal
        )


class _LogReader:
    """A RetryReader with a buffer, that seeks across logs and switches between blocking and not."""

    def __init__(self, client: JournalClient) -> None:
        self.client = client
        self.journal = ""
        self.block = True
        self.rr: RetryReader | None = None
        self.buf = bytearray()

    @property
    def offset(self) -> int:
        """The offset of the next unconsumed byte (the buffer's first)."""
        return (self.rr.offset if self.rr is not None else 0) - len(self.buf)

    async def seek(self, journal: str, offset: int) -> None:
        if self.rr is not None and journal == self.journal:
            current = self.offset
            if current <= offset <= current + len(self.buf):
                del self.buf[: offset - current]
                return
        await self._restart(journal, offset)

    async def _restart(self, journal: str, offset: int) -> None:
        if self.rr is not None:
            await self.rr.close()
        self.buf.clear()
        self.journal = journal
        self.rr = RetryReader(self.client, journal, offset=offset, block=self.block)

    async def set_blocking(self, block: bool) -> None:
        if block == self.block:
            return
        self.block = block
        if self.rr is not None:
            buffered = bytes(self.buf)
            await self._restart(self.journal, self.rr.offset)
            self.buf += buffered

    async def fill(self, n: int) -> None:
        """Buffer at least `n` bytes. Raises OffsetNotYetAvailable (non-blocking, at the head), or
        OffsetJump (having dropped the buffered bytes, which the jump cut short)."""
        assert self.rr is not None
        while len(self.buf) < n:
            try:
                data = await self.rr.read()
            except OffsetJump:
                self.buf.clear()
                raise
            if not data:
                raise PlaybackError("read of the log ended", log=self.journal, offset=self.offset)
            self.buf += data

    def take(self, n: int) -> bytes:
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def close(self) -> None:
        if self.rr is not None:
            await self.rr.close()
            self.rr = None


class Player:
    """Plays a log back into a directory; see the module doc. One `play` per Player."""

    def __init__(self) -> None:
        self.tailing = asyncio.Event()
        """Set once playback reached the log's write head (and is tailing it, unless finishing)."""
        self.done = asyncio.Event()
        """Set once `play` returned (successfully or not)."""
        self.resolved: Resolved | None = None
        """The playback's result, once `play` succeeded."""
        self._handoff = asyncio.Event()
        self._handoff_author: int | None = None

    def finish_at_write_head(self) -> None:
        """Finish playback on reaching the write head. Call this or inject_handoff, once."""
        self._signal(0)

    def inject_handoff(self, author: int) -> None:
        """Finish playback by injecting a no-op of `author` (non-zero) at the head, fencing the log
        to it. Call this or finish_at_write_head, once."""
        if not 0 < author <= 0xFFFFFFFF:
            raise ValueError(f"author must be a non-zero uint32 (got {author})")
        self._signal(author)

    def _signal(self, author: int) -> None:
        if self._handoff_author is not None:
            raise RuntimeError("finish_at_write_head or inject_handoff was already called")
        self._handoff_author = author
        self._handoff.set()

    async def play(
        self,
        hints: FSMHints,
        dir: str | os.PathLike[str],
        client: JournalClient,
        ajc: AppendService | None = None,
        *,
        check_content_type: bool = True,
    ) -> Resolved:
        """Play `hints` into `dir` (wiped first) until finished or handed off; see the module doc.

        `ajc` makes the barrier and hand-off appends (a private AppendService of `client` if None).
        With `check_content_type`, every log read must be labelled as a recovery log.
        Raises a RecoveryLogError (HintsError, PlaybackError, ContentTypeError) and removes `dir`.
        """
        own_ajc = ajc is None
        svc = AppendService(client) if ajc is None else ajc
        try:
            resolved = await _play(self, hints, os.fspath(dir), client, svc, check_content_type)
            self.resolved = resolved
            return resolved
        finally:
            if own_ajc:
                await svc.close(cancel=True)
            self.done.set()


async def _play(
    player: Player, hints: FSMHints, dir: str, client: JournalClient, ajc: AppendService, check_content_type: bool
) -> Resolved:
    fsm = FSM(hints)
    files: dict[int, IO[bytes]] = {}
    reader = _LogReader(client)
    peek: asyncio.Task[None] | None = None
    handoff_wait: asyncio.Task[Any] = asyncio.ensure_future(player._handoff.wait())
    state = _State.BACKFILL
    ok = False
    try:
        _prepare(dir)
        # Write barriers give the transactional write head of every log the hints name.
        logs = [hints.log, *sorted({s.log for s in fsm.hinted_segments} - {hints.log})]
        heads: dict[str, int] = {}
        for name in logs:
            if check_content_type:
                await check_log_content_type(client, name)
            heads[name] = await _write_head(ajc, name)
        for seg in fsm.hinted_segments:
            head = heads[seg.log]
            if seg.first_offset >= head or seg.last_offset > head:
                raise PlaybackError(
                    f"max write-head of {seg.log} is {head}, vs hinted segment {segment_repr(seg)}; possible data loss",
                    log=seg.log, offset=seg.first_offset, seq_no=seg.first_seq_no,
                )

        async def cancel_peek() -> None:
            nonlocal peek
            if peek is not None:
                peek.cancel()
                await asyncio.gather(peek, return_exceptions=True)
                peek = None

        read_log = ""  # Log being read.
        offset = 0  # Next offset to read.
        read_through = 0  # Write head of read_log, as of its barrier (or the injected no-op).
        handoff = 0  # Author to hand off to, once signalled.
        signalled = False
        noop_unknown = False  # Whether the hand-off no-op's append had an unknown outcome.

        while True:
            if fsm.hinted_segments:
                seg = fsm.hinted_segments[0]
                if read_log != seg.log or offset < seg.first_offset:
                    # Seek to the next hinted segment, skipping dead stretches of the log.
                    await cancel_peek()
                    read_log, offset, read_through = seg.log, seg.first_offset, heads[seg.log]
                    await reader.seek(read_log, offset)
                elif offset >= read_through:
                    raise PlaybackError(
                        f"offset {read_log}:{offset} >= readThrough {read_through}, but FSM has unused hints; "
                        "possible data loss", log=read_log, offset=offset,
                    )
            elif read_log == "":
                # No hints: read the log from its start.
                read_log, offset, read_through = hints.log, 0, heads[hints.log]
                await reader.seek(read_log, 0)
            elif read_log != hints.log:
                raise PlaybackError(f"reading {read_log}, but expected {hints.log} once hints are consumed",
                                    log=read_log, offset=offset)

            # Block while tailing, or while behind the head; else find the head without blocking.
            # (After a no-op of unknown outcome, the head shows whether it landed.)
            block = (
                state is _State.TAIL
                or (state is _State.READ_HANDOFF_BARRIER and not noop_unknown)
                or offset < read_through
            )
            if block != reader.block:
                await cancel_peek()
                await reader.set_blocking(block)
            if peek is None:
                peek = asyncio.ensure_future(reader.fill(FIXED_FRAME_HEADER_LENGTH))

            waiting: set[asyncio.Future[Any]] = {peek}
            if not signalled:
                waiting.add(handoff_wait)
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)

            if not signalled and handoff_wait.done():
                signalled = True
                handoff = player._handoff_author or 0
                if state not in (_State.BACKFILL, _State.TAIL):
                    raise PlaybackError(f"unexpected hand-off signal in state {state.value}", log=read_log)
                state = _State.EXIT_AT_HEAD if handoff == 0 else _State.INJECT_HANDOFF_AT_HEAD
            if not peek.done():
                continue
            error = peek.exception()
            peek = None

            if isinstance(error, OffsetNotYetAvailable):
                if offset < read_through:
                    raise PlaybackError(f"unexpected OFFSET_NOT_YET_AVAILABLE below readThrough {read_through}",
                                        log=read_log, offset=offset)
                player.tailing.set()  # At the (approximate) write head.
                if state == _State.BACKFILL:
                    state = _State.TAIL
                    continue
                if state == _State.EXIT_AT_HEAD:
                    _make_live(dir, fsm, files)
                    state = _State.COMPLETE
                    ok = True
                    return Resolved(hints.log, fsm, dir)
                if state == _State.INJECT_HANDOFF_AT_HEAD:
                    read_through, noop_unknown = await _inject_noop(ajc, hints.log, fsm, handoff)
                    state = _State.READ_HANDOFF_BARRIER
                    continue
                if state == _State.READ_HANDOFF_BARRIER and noop_unknown:
                    # The head, and no sign of the no-op whose append's outcome was unknown: it did not land.
                    state = _State.INJECT_HANDOFF_AT_HEAD
                    continue
                raise PlaybackError(f"unexpected head of log in state {state.value}", log=read_log, offset=offset)
            if isinstance(error, OffsetJump):
                jump_to = error.to
                segs = fsm.hinted_segments
                if segs and segs[0].last_offset != 0 and segs[0].last_offset < jump_to:
                    raise PlaybackError(
                        f"offset jumps over hinted segment of {read_log} (from: {offset}, to: {jump_to}, hinted "
                        f"range: {segs[0].first_offset}-{segs[0].last_offset}); possible data loss",
                        log=read_log, offset=offset,
                    ) from error
                log.warning("recoverylog offset jump", extra={"log": read_log, "from": offset, "to": jump_to})
                offset = jump_to
                continue
            if isinstance(error, RecoveryLogError):
                raise error
            if error is not None:
                raise PlaybackError(f"reading the log: {error}", log=read_log, offset=offset) from error

            if reader.offset != offset:
                raise PlaybackError(f"reader at {reader.offset}, expected {offset}", log=read_log, offset=offset)

            # A frame header is buffered: decode the op.
            if bytes(reader.buf[:4]) != FIXED_FRAME_WORD:
                found = reader.buf.find(FIXED_FRAME_WORD, 1)
                skip = found if found != -1 else len(reader.buf) - (len(FIXED_FRAME_WORD) - 1)
                log.warning("detected de-synchronization", extra={"log": read_log, "offset": offset, "skip": skip})
                reader.take(skip)
                offset = reader.offset
                continue
            op, op_bytes = await _read_op(reader, read_log, offset)

            applied = _apply(fsm, op, op_bytes)
            if applied:
                await _reenact(op, fsm, reader, dir, files)
            elif op.HasField("write"):
                await _copy(reader, op.write.length, None)

            if handoff and op.author == handoff:
                if state != _State.READ_HANDOFF_BARRIER:
                    raise PlaybackError(f"read an op of the hand-off author in state {state.value}", log=read_log,
                                        offset=offset, seq_no=op.seq_no, author=handoff)
                if applied:
                    # The no-op is sequenced: the log is ours.
                    _make_live(dir, fsm, files)
                    state = _State.COMPLETE
                    ok = True
                    return Resolved(hints.log, fsm, dir)
                # Another writer won the race: inject again at the new head.
                log.info("hand-off no-op lost a race; injecting again",
                         extra={"log": read_log, "offset": offset, "seq_no": op.seq_no, "author": handoff})
                state = _State.INJECT_HANDOFF_AT_HEAD
            offset = op.last_offset
    finally:
        handoff_wait.cancel()
        if peek is not None:
            peek.cancel()
            await asyncio.gather(peek, return_exceptions=True)
        await reader.close()
        if not ok:
            _cleanup_on_abort(dir, files)


async def _inject_noop(ajc: AppendService, log_name: str, fsm: FSM, author: int) -> tuple[int, bool]:
    """Append the hand-off no-op of `author`, sequenced after the ops read, with the author's fence.

    Returns the offset to read through to find it, and whether its outcome is unknown (a broker
    was lost after the append began): then the offset is the head learned by an empty append, and
    the reader looks for the no-op up to it, injecting again if it is not there (a second copy of
    a landed no-op is an op already passed, skipped).
    """
    frame, _ = encode_op(RecordedOp(seq_no=fsm.next_seq_no, checksum=fsm.next_checksum, author=author))
    request = bpb.AppendRequest(journal=log_name, union_registers=author_fence(author))
    try:
        aa = ajc.append(request, frame)
        await aa
        return aa.end, False
    except AppendOutcomeUnknown as exc:
        log.warning("hand-off no-op's outcome is unknown; reading the log to find out",
                    extra={"log": log_name, "seq_no": fsm.next_seq_no, "error": str(exc)})
    except Exception as exc:
        raise PlaybackError(f"injecting no-op: {exc}", log=log_name, seq_no=fsm.next_seq_no, author=author) from exc
    return await _write_head(ajc, log_name), True


async def _write_head(ajc: AppendService, log_name: str) -> int:
    """The log's write head, as the end of an empty append (a write barrier)."""
    try:
        barrier = ajc.append(log_name, b"")
        await barrier
    except Exception as exc:
        raise PlaybackError(f"determining head of {log_name}: {exc}", log=log_name) from exc
    return barrier.end


async def _read_op(reader: _LogReader, read_log: str, offset: int) -> tuple[RecordedOp, bytes]:
    """The op whose frame header is buffered, and its marshalled bytes."""
    length = parse_frame_header(reader.buf[:FIXED_FRAME_HEADER_LENGTH], log=read_log, offset=offset)
    await _fill_op(reader, FIXED_FRAME_HEADER_LENGTH + length, read_log, offset)
    reader.take(FIXED_FRAME_HEADER_LENGTH)
    op_bytes = reader.take(length)
    return decode_op(op_bytes, log=read_log, offset=offset), op_bytes


async def _fill_op(reader: _LogReader, n: int, read_log: str, offset: int) -> None:
    try:
        await reader.fill(n)
    except (OffsetNotYetAvailable, OffsetJump) as exc:
        raise OpDecodeError(f"truncated frame: {exc}", log=read_log, offset=offset) from exc


def _apply(fsm: FSM, op: RecordedOp, op_bytes: bytes) -> bool:
    """Apply `op`; whether it applied. Expected refusals are quiet, others are logged, and an op
    that breaks the history it must continue raises BrokenHistoryError."""
    try:
        fsm.apply(op, op_bytes)
        return True
    except (FnodeNotTrackedError, NotHintedAuthorError):
        # A file hinted as deleted later, or a dead branch of the log's history.
        return False
    except (WrongSeqNoError, ChecksumMismatchError) as exc:
        if op.seq_no < fsm.next_seq_no:
            return False  # Read from a lower bound of the hinted offset, or a duplicated append.
        if _must_continue(fsm, op):
            raise BrokenHistoryError(
                f"op does not continue the log's history (expected seq_no {fsm.next_seq_no} and checksum "
                f"{fsm.next_checksum:#x}, got checksum {op.checksum:#x}): the log is corrupt or a stretch of it is "
                "missing; possible data loss",
                log=op.log, offset=op.first_offset, seq_no=op.seq_no, author=op.author,
            ) from None
        # A branch of another author (a recorder racing a hand-off): its ops are not the history.
        log.info("did not apply FSM operation",
                 extra={"log": op.log, "offset": op.first_offset, "seq_no": op.seq_no, "error": exc.reason})
        return False
    except FSMError as exc:
        # Rare, but possible in normal operation (e.g. during a hand-off, or branched histories).
        log.info("did not apply FSM operation",
                 extra={"log": op.log, "offset": op.first_offset, "seq_no": op.seq_no, "error": str(exc)})
        return False


def _must_continue(fsm: FSM, op: RecordedOp) -> bool:
    """Whether `op` (seq_no at or past the FSM's next) can only be the history's next op.

    One author's ops are appended in order, each chained from the last: an op of the author whose
    op applied last must be the next one. So must an op of the next hinted segment's author (the
    FSM checked the author already) before that segment is exhausted, and the first op of a log
    read from its start. Ops of any other author are a branch that lost a race to a hand-off.
    """
    if fsm.hinted_segments:
        return True
    if fsm.last_author == 0:
        return fsm.next_seq_no == 1  # Nothing applied, reading from the log's first op.
    return op.author == fsm.last_author


def _staged_path(dir: str, fnode: int) -> str:
    return os.path.join(dir, FNODE_STAGING_DIR, str(fnode))


async def _reenact(op: RecordedOp, fsm: FSM, reader: _LogReader, dir: str, files: dict[int, IO[bytes]]) -> None:
    """Act out an applied op on the staged files (links and properties only change the FSM)."""
    try:
        if op.HasField("create"):
            files[op.seq_no] = open(_staged_path(dir, op.seq_no), "xb")
        elif op.HasField("unlink"):
            fnode = op.unlink.fnode
            if fnode not in fsm.live_nodes:  # The last link is gone.
                files.pop(fnode).close()
                os.remove(_staged_path(dir, fnode))
        elif op.HasField("write"):
            f = files[op.write.fnode]
            f.seek(op.write.offset)
            await _copy(reader, op.write.length, f)
            f.flush()  # Staged files are current while tailing (a hot standby's view).
    except OSError as exc:
        raise PlaybackError(f"re-enacting op: {exc}", log=op.log, offset=op.first_offset, seq_no=op.seq_no) from exc


async def _copy(reader: _LogReader, length: int, out: IO[bytes] | None) -> None:
    """Move `length` payload bytes from the reader to `out` (or discard them)."""
    while length:
        if not reader.buf:
            try:
                await reader.fill(1)
            except (OffsetNotYetAvailable, OffsetJump) as exc:
                raise OpDecodeError(f"truncated write payload: {exc}", log=reader.journal,
                                    offset=reader.offset) from exc
        chunk = reader.take(min(length, len(reader.buf), _COPY_CHUNK))
        if out is not None:
            out.write(chunk)
        length -= len(chunk)


def _prepare(dir: str) -> None:
    try:
        if os.path.lexists(dir):
            shutil.rmtree(dir)
        os.makedirs(os.path.join(dir, FNODE_STAGING_DIR))
    except OSError as exc:
        raise PlaybackError(f"preparePlayback({dir}): {exc}") from exc


def _target(dir: str, path: str) -> str:
    """`path` of the log (e.g. `/a/b`) under `dir`; refuses one that would leave `dir`."""
    target = os.path.normpath(os.path.join(dir, path.lstrip("/")))
    if os.path.commonpath([os.path.abspath(dir), os.path.abspath(target)]) != os.path.abspath(dir):
        raise PlaybackError(f"recorded path {path!r} leaves the playback directory")
    return target


def _make_live(dir: str, fsm: FSM, files: dict[int, IO[bytes]]) -> None:
    """Hard-link each staged Fnode at its paths, remove the staging dir, and write the properties."""
    if fsm.has_remaining_hints():
        raise PlaybackError("FSM has remaining hints at the end of playback", log=fsm.last_log)
    log.info("completed playback", extra={"dir": dir, "files": len(files), "next_seq_no": fsm.next_seq_no,
                                          "next_checksum": fsm.next_checksum, "last_log": fsm.last_log})
    try:
        for fnode, node in fsm.live_nodes.items():
            for link in node.links:
                target = _target(dir, link)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.link(_staged_path(dir, fnode), target)
            files.pop(fnode).close()  # Popped once closed: an abort closes those left.
            os.remove(_staged_path(dir, fnode))
        if files:
            raise PlaybackError(f"backing files not in FSM: {sorted(files)}", log=fsm.last_log)
        os.rmdir(os.path.join(dir, FNODE_STAGING_DIR))
        for path, content in fsm.properties.items():
            target = _target(dir, path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "x", encoding="utf-8") as out:
                out.write(content)
    except OSError as exc:
        raise PlaybackError(f"makeLive: {exc}", log=fsm.last_log) from exc


def _cleanup_on_abort(dir: str, files: dict[int, IO[bytes]]) -> None:
    for f in files.values():
        try:
            f.close()
        except OSError as exc:
            log.warning("failed to close fnode during abort", extra={"error": str(exc)})
    files.clear()
    shutil.rmtree(dir, ignore_errors=True)


__all__ = ["FNODE_STAGING_DIR", "Player", "Resolved", "check_log_content_type"]
