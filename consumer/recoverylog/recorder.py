"""Recorder: file operations of a local directory, appended as RecordedOps to a log
(Gazette's `consumer/recoverylog/recorder.go`).

A Recorder observes operations that already happened to files under its directory and records
them, in order, into its log journal through an `AppendService`; its FSM tracks what was recorded,
so `build_hints` can tell a Player how to rebuild the directory. Paths are recorded relative to
the directory (`/dir/a//b` is recorded as `/a/b`), so a log can be played into any directory.

Fencing: every append carries `check_registers = {author: <this author>}`. `Recorder.open` first
appends an empty barrier to learn the log's write head; when the FSM was recovered from another
log, it then appends a sequenced no-op with `union_registers = {author: <this author>}`, taking the
log. A Player's `inject_handoff` does the same for a new author, after which this Recorder's
appends fail with REGISTER_MISMATCH.

Appends are ordered, batched, and never leave a gap: one batch is in flight at a time, and the
first failure (a register mismatch, a failed barrier dependency, a closed AppendService) fails
the Recorder for good: later calls raise RecorderFailedError, and pending barriers fail with it.
(Gazette's Recorder instead retries a fenced append until its context is cancelled; either way a
fenced write is never reported durable.)

Recording calls are synchronous (they run in the event loop and queue bytes); `barrier()` returns
a future resolving once everything recorded before it is committed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import posixpath
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from broker.client import AppendService, AsyncAppend
from broker.protocol import pb as bpb
from consumer.recoverylog.errors import FSMError, RecorderError, RecorderFailedError
from consumer.recoverylog.fsm import FSM, FSMHints
from consumer.recoverylog.ops import (
    RecordedOp,
    author_fence,
    author_selector,
    create_op,
    encode_op,
    link_op,
    property_op,
    unlink_op,
    write_op,
)

log = logging.getLogger(__name__)

PROPERTY_FILES = frozenset({"/IDENTITY"})
"""Well-known paths recorded as properties (content inline) rather than as Fnodes: RocksDB's GUID."""

MAX_BATCH_BYTES = 4 << 20
"""A batch of recorded bytes grows to at most this (or one op, if larger) before a new one starts."""

Dependency = AsyncAppend | asyncio.Future[Any]


@dataclass(eq=False)
class _Batch:
    """Recorded bytes appended by one RPC, after `dependencies`; `waiters` resolve with its response."""

    request: bpb.AppendRequest
    dependencies: tuple[asyncio.Future[Any], ...] = ()
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    waiters: list[asyncio.Future[bpb.AppendResponse]] = field(default_factory=list)
    open: bool = True


def _quiet(future: asyncio.Future[Any]) -> None:
    """Mark a failed future's exception as retrieved: nobody need await a barrier."""
    if not future.cancelled():
        future.exception()


class Recorder:
    """Records file operations under `dir` into `log`. Make one with `await Recorder.open(...)`."""

    def __init__(self, log: str, fsm: FSM, author: int, dir: str, ajc: AppendService) -> None:
        """Use `Recorder.open`, which also learns the write head and takes the log when it changed."""
        if not os.path.isabs(dir) or posixpath.normpath(dir) != dir or dir.startswith("//"):
            raise RecorderError(f"recorder dir is not an absolute, clean path: {dir!r}", log=log)
        if not 0 < author <= 0xFFFFFFFF:
            raise RecorderError(f"invalid author {author}", log=log)
        self.log = log
        self.fsm = fsm
        self.author = author
        self.dir = dir
        self.ajc = ajc
        self.write_head = 0
        """The log's write head as last observed: a lower bound of the offset of ops recorded now."""
        self._request = bpb.AppendRequest(journal=log)
        self._batches: deque[_Batch] = deque()
        self._task: asyncio.Task[None] | None = None
        self._failed: RecorderFailedError | None = None

    @classmethod
    async def open(
        cls, log: str, fsm: FSM, author: int, dir: str, ajc: AppendService, *, check_registers: bool = True
    ) -> Recorder:
        """A Recorder of `dir` into `log`, continuing `fsm` (new, or recovered by a Player).

        Appends an empty barrier to learn the write head; if `log` is not `fsm.last_log`, appends a
        sequenced no-op that puts `author` in the log's registers. Then every append checks them
        (unless `check_registers` is False: only tests of multi-writer histories want that).
        """
        rec = cls(log, fsm, author, dir, ajc)
        await rec.barrier()
        if log != fsm.last_log:
            # Recording to another log than the one recovered from: a no-op sequenced with the FSM
            # and fencing the log to this author.
            rec._request = bpb.AppendRequest(journal=log, union_registers=author_fence(author))
            rec._process(RecordedOp())
        rec._request = bpb.AppendRequest(journal=log)
        if check_registers:
            rec._request.check_registers.CopyFrom(author_selector(author))
        return rec

    # -- state -------------------------------------------------------------------------------------

    @property
    def failed(self) -> RecorderFailedError | None:
        """Why the Recorder can no longer record, or None."""
        return self._failed

    @property
    def pending_bytes(self) -> int:
        """Recorded bytes not yet committed (a caller may wait on `barrier()` to bound them)."""
        return sum(b.size for b in self._batches)

    @property
    def check_registers(self) -> bpb.LabelSelector | None:
        """The register selector each append carries (None when unchecked)."""
        return self._request.check_registers if self._request.HasField("check_registers") else None

    def disable_register_checks(self) -> None:
        """Append without checking the author register from now on. Only tests of branched, multi-
        writer log histories want this: it lets a fenced-out Recorder go on writing."""
        self._request = bpb.AppendRequest(journal=self.log)

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise self._failed

    def normalize_path(self, path: str | os.PathLike[str]) -> str:
        """`path` relative to the recorder's dir, as recorded: `/dir/a//b` -> `/a/b`."""
        p = os.fspath(path)
        if not (p == self.dir or p.startswith(self.dir.rstrip("/") + "/")):
            raise RecorderError(f"path {p!r} is not under the recorder dir {self.dir!r}", log=self.log)
        rel = posixpath.normpath(p[len(self.dir):].replace(os.sep, "/"))
        if rel.startswith("//"):
            rel = "/" + rel.lstrip("/")
        return rel

    # -- recording ---------------------------------------------------------------------------------

    def record_create(self, path: str | os.PathLike[str]) -> int:
        """Record the creation (or truncation) of `path`; returns its Fnode."""
        return self.record_open_file(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)

    def record_open_file(self, path: str | os.PathLike[str], flags: int) -> int:
        """Record an open of `path` with os.open `flags`; returns its Fnode.

        O_TRUNC of a known file records an unlink of its Fnode and a create of a new one. Raises
        RecorderError for a property path, a read-only open, an unknown file without O_CREAT, or a
        known one with O_EXCL.
        """
        self._check_usable()
        p = self.normalize_path(path)
        if p in PROPERTY_FILES:
            raise RecorderError(f"unexpected open of property path {p}", log=self.log)
        if flags & os.O_ACCMODE == os.O_RDONLY:
            raise RecorderError(f"unexpected read-only file open of {p}", log=self.log)
        fnode = self.fsm.links.get(p)
        if fnode is None and not flags & os.O_CREAT:
            raise RecorderError(f"open of unknown file {p} without O_CREAT", log=self.log)
        if fnode is not None and flags & os.O_EXCL:
            raise RecorderError(f"open of known file {p} with O_EXCL", log=self.log)
        if fnode is not None and flags & os.O_TRUNC:
            self._process(unlink_op(fnode, p))
            fnode = None
        if fnode is None:
            self._process(create_op(p))
            fnode = self.fsm.links[p]
        return fnode

    def record_write_at(self, fnode: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Record `data` written at `offset` of the file `fnode`."""
        self._check_usable()
        if fnode not in self.fsm.live_nodes:
            raise RecorderError(f"write of unknown fnode {fnode}", log=self.log)
        if offset < 0:
            raise RecorderError(f"write at negative offset {offset}", log=self.log)
        self._process(write_op(fnode, offset, len(data)), bytes(data))

    def record_remove(self, path: str | os.PathLike[str]) -> None:
        """Record the removal of `path`."""
        self._check_usable()
        p = self.normalize_path(path)
        if p in PROPERTY_FILES:
            raise RecorderError(f"unexpected delete of property path {p}", log=self.log)
        fnode = self.fsm.links.get(p)
        if fnode is None:
            raise RecorderError(f"delete of unknown path {p}", log=self.log)
        self._process(unlink_op(fnode, p))

    def record_link(self, src: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        """Record a hard link of `src` at `target`."""
        self._check_usable()
        s, t = self.normalize_path(src), self.normalize_path(target)
        if t in PROPERTY_FILES:
            raise RecorderError(f"unexpected link of property path {t}", log=self.log)
        fnode = self.fsm.links.get(s)
        if fnode is None:
            raise RecorderError(f"link of unknown path {s}", log=self.log)
        if t in self.fsm.links:
            raise RecorderError(f"link target {t} exists", log=self.log)
        self._process(link_op(fnode, t))

    def record_rename(self, src: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        """Record a rename of `src` to `target`: an unlink of any file at `target`; a link of `src`'s
        Fnode at `target`, or, for a property path, a property op with the content read from
        `target` on disk (so rename first, then record); an unlink of `src`."""
        self._check_usable()
        s, t = self.normalize_path(src), self.normalize_path(target)
        fnode = self.fsm.links.get(s)
        if fnode is None:
            raise RecorderError(f"rename of unknown path {s}", log=self.log)
        content: str | None = None
        if t in PROPERTY_FILES:
            try:
                with open(os.fspath(target), "rb") as f:
                    content = f.read().decode("utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise RecorderError(f"reading property file {os.fspath(target)}: {exc}", log=self.log) from exc
            if self.fsm.properties.get(t, content) != content:
                raise RecorderError(f"property {t} exists with other content", log=self.log)
        prev = self.fsm.links.get(t)
        if prev is not None:
            self._process(unlink_op(prev, t))
        if content is not None:
            self._process(property_op(t, content))
        else:
            self._process(link_op(fnode, t))
        self._process(unlink_op(fnode, s))

    def _process(self, op: RecordedOp, payload: bytes = b"") -> None:
        """Sequence `op` with the FSM, apply it, and queue its frame (and payload) for the log."""
        op.author = self.author
        op.seq_no = self.fsm.next_seq_no
        op.checksum = self.fsm.next_checksum
        frame, op_bytes = encode_op(op)
        # Meta-fields, never written: the write head lower-bounds the op's offset in the hints.
        op.first_offset = self.write_head
        op.log = self.log
        try:
            self.fsm.apply(op, op_bytes)
        except FSMError as exc:
            # The checks above make this a bug; the FSM may have stepped, so nothing more is recorded.
            self._fail(RecorderFailedError(f"recorder FSM error: {exc}", log=self.log, seq_no=op.seq_no,
                                           author=self.author), exc)
            raise self._failed from exc  # type: ignore[misc]
        self._enqueue(frame + payload if payload else frame)

    # -- appending ---------------------------------------------------------------------------------

    def _current(self) -> _Batch:
        batch = self._batches[-1] if self._batches else None
        if batch is None or not batch.open or batch.request is not self._request:
            batch = _Batch(self._request)
            self._batches.append(batch)
        return batch

    def _enqueue(self, data: bytes) -> None:
        batch = self._current()
        if batch.size and batch.size + len(data) > MAX_BATCH_BYTES:
            batch.open = False
            batch = self._current()
        batch.chunks.append(data)
        batch.size += len(data)
        self._start()

    def _start(self) -> None:
        if self._task is None and self._failed is None:
            self._task = asyncio.get_running_loop().create_task(self._pump(), name=f"recorder {self.log}")

    def barrier(self, wait_for: Iterable[Dependency] = ()) -> asyncio.Future[bpb.AppendResponse]:
        """A future of the append committing everything recorded so far; with `wait_for`, nothing
        recorded from now on is appended until those complete (a failed one fails the Recorder)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bpb.AppendResponse] = loop.create_future()
        waiter.add_done_callback(_quiet)
        if self._failed is not None:
            waiter.set_exception(self._failed)
            return waiter
        deps = tuple(d.future if isinstance(d, AsyncAppend) else d for d in wait_for)
        if deps:
            if self._batches:
                self._batches[-1].open = False
            batch = _Batch(self._request, deps)
            self._batches.append(batch)
        else:
            batch = self._current()
        batch.waiters.append(waiter)
        batch.open = False
        self._start()
        return waiter

    async def flush(self) -> None:
        """Wait until everything recorded so far is committed; raises RecorderFailedError if it cannot be."""
        await self.barrier()

    async def build_hints(self) -> FSMHints:
        """FSMHints to rebuild the recorded directory, once every op they reference is committed."""
        self._check_usable()
        hints = self.fsm.build_hints(self.log)
        await self.barrier()
        return hints

    async def _pump(self) -> None:
        try:
            while self._batches:
                batch = self._batches[0]
                batch.open = False
                await self._await_dependencies(batch)
                aa = self.ajc.append(batch.request, b"".join(batch.chunks))
                await aa
                if aa.begin < self.write_head:
                    raise RecorderFailedError(
                        f"invalid write head {self.write_head} vs commit [{aa.begin}, {aa.end}) (broker data loss?)",
                        log=self.log, offset=aa.begin, author=self.author,
                    )
                self.write_head = aa.end
                self._batches.popleft()
                resp = aa.result()
                for waiter in batch.waiters:
                    if not waiter.done():
                        waiter.set_result(resp)
        except asyncio.CancelledError:
            self._fail(RecorderFailedError("recorder closed", log=self.log, author=self.author), None)
            raise
        except RecorderFailedError as exc:
            self._fail(exc, exc.__cause__)
        except Exception as exc:
            self._fail(RecorderFailedError(f"append failed: {exc}", log=self.log, offset=self.write_head,
                                           author=self.author), exc)
        finally:
            self._task = None

    async def _await_dependencies(self, batch: _Batch) -> None:
        if not batch.dependencies:
            return
        await asyncio.wait(batch.dependencies)
        for dep in batch.dependencies:
            if dep.cancelled():
                raise RecorderFailedError("a barrier dependency was cancelled", log=self.log, author=self.author)
            exc = dep.exception()
            if exc is not None:
                raise RecorderFailedError(f"a barrier dependency failed: {exc}", log=self.log,
                                          author=self.author) from exc

    def _fail(self, error: RecorderFailedError, cause: BaseException | None) -> None:
        if self._failed is None:
            if cause is not None and error.__cause__ is None:
                error.__cause__ = cause
            self._failed = error
            log.warning("recorder failed", extra={"log": self.log, "author": self.author, "error": str(error)})
        while self._batches:
            for waiter in self._batches.popleft().waiters:
                if not waiter.done():
                    waiter.set_exception(self._failed)

    async def close(self) -> None:
        """Stop appending: pending barriers fail, and the Recorder can record no more."""
        if self._failed is None:
            self._failed = RecorderFailedError("recorder closed", log=self.log, author=self.author)
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._fail(RecorderFailedError("recorder closed", log=self.log, author=self.author), None)


@dataclass
class FileRecorder:
    """A Recorder, an Fnode, and the offset of the next write to it."""

    recorder: Recorder
    fnode: int
    offset: int = 0

    def record_write(self, data: bytes | bytearray | memoryview) -> None:
        """Record `data` written at the current offset, then advance it."""
        self.recorder.record_write_at(self.fnode, data, self.offset)
        self.offset += len(data)

    def record_write_at(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Record `data` written at `offset` (the current offset is unchanged)."""
        self.recorder.record_write_at(self.fnode, data, offset)


__all__ = ["MAX_BATCH_BYTES", "PROPERTY_FILES", "FileRecorder", "Recorder"]
