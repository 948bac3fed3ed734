"""The engine of `gazctl journals read`: read many journals at once into one output, whole appends at a time.

Each journal is read by its own RetryReader. Content is collected per journal and written only at
append boundaries: the end of a fragment (fragments hold only whole appends, and a read's
metadata frame names the fragment whose end the broker streams up to). So appends of different
journals never interleave in the output. A journal whose pending content grows past
`STREAM_THRESHOLD` takes the output for itself and streams straight to it until its next
boundary, so memory stays bounded.

`offsets` records, per journal, the offset through which content was written: what
`--offsets-out` saves, and where a later `--offsets` read resumes without a gap or a repeat.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from broker.client import (
    JournalClient,
    JournalNotFound,
    JournalWatcher,
    OffsetJump,
    OffsetNotYetAvailable,
    RetryReader,
    Suspended,
    list_journals,
)
from broker.protocol import pb
from gazctl.errors import GazctlError
from gazctl.protojson import go_string

log = logging.getLogger("gazctl")

STREAM_THRESHOLD = 4 << 20
"""Pending bytes of one journal beyond which it streams to the output instead of buffering (see module doc)."""

Journal = pb.ListResponse.Journal


@dataclass(frozen=True)
class ReadOptions:
    """What to read and how (the flags of `journals read`)."""

    selector: pb.LabelSelector
    block: bool = False
    tail: bool = False
    begin_offsets: Mapping[str, int] = field(default_factory=dict)
    do_not_proxy: bool = False
    begin_mod_time: int = 0


def load_offsets(path: str) -> dict[str, int]:
    """The `--offsets` file: a JSON object of journal name to non-negative offset; GazctlError otherwise."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise GazctlError(f"cannot read --offsets {path}: {err}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise GazctlError(f"--offsets {path} is not JSON: {err}") from None
    if not isinstance(doc, dict):
        raise GazctlError(f"--offsets {path} must be a JSON object of journal name to offset")
    for name, offset in doc.items():
        # bool is an int in Python, but `true` is no offset.
        if not name or not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise GazctlError(
                f"--offsets {path}: journal {name!r} has offset {json.dumps(offset)}; expected a non-negative integer"
            )
    return dict(doc)


async def check_journals_exist(client: JournalClient, offsets: Mapping[str, int], path: str) -> None:
    """Fail naming the first journal of `offsets` (from file `path`) which does not exist."""
    if not offsets:
        return
    names = sorted(offsets)
    selector = pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name="name", value=n) for n in names]))
    found = {j.spec.name for j in (await list_journals(client, selector)).journals}
    missing = [n for n in names if n not in found]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise GazctlError(f"--offsets {path} names journal {missing[0]} which does not exist{more}")


def write_offsets(path: str, offsets: Mapping[str, int]) -> None:
    """Write `offsets` as JSON to `path` atomically (a temporary file renamed over it), as Gazette's
    json.Encoder writes its map (`cmd/gazctl/gazctlcmd/journals_read.go`): sorted keys, Go's escaping."""
    temp = f"{path}.temp"
    text = "{" + ",".join(f"{go_string(name)}:{offset}" for name, offset in sorted(offsets.items())) + "}\n"
    with open(temp, "w", encoding="utf-8") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temp, path)


class Output:
    """The shared output: whole appends of one journal at a time."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.lock = asyncio.Lock()
        """Held by a journal streaming a large pending span until its next boundary."""

    def write(self, data: bytes) -> None:
        # Flushed at once: a --block reader's consumer (e.g. a pipe) should see each append as it commits.
        self.file.write(data)
        self.file.flush()


class JournalsRead:
    """Reads the journals of `options` into `output` until done (non-blocking), or until `stop` is set."""

    def __init__(
        self,
        client: JournalClient,
        options: ReadOptions,
        output: Output,
        *,
        on_start: Callable[[str], None] | None = None,
        on_done: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.options = options
        self.output = output
        self.on_start = on_start
        self.on_done = on_done
        self.offsets: dict[str, int] = dict(options.begin_offsets)
        """Per journal, the offset through which output was written. Offsets of --offsets not read are kept."""
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._listed_revision = 0  # Of the first listing: journals created after it are new to this read.
        self.stop = asyncio.Event()
        self._failure: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def _start_offset(self, journal: Journal) -> int:
        name = journal.spec.name
        if name in self.offsets:  # From --offsets, or where an earlier read of this run stopped.
            return self.offsets[name]
        if self.options.tail and not (self._listed_revision and journal.create_revision > self._listed_revision):
            # --tail starts at the write head; but every byte of a journal created since we started is new.
            return -1
        return 0

    def _start(self, journal: Journal) -> None:
        name = journal.spec.name
        offset = self._start_offset(journal)
        log.info("read started", extra={"journal": name, "offset": offset})
        if self.on_start is not None:
            self.on_start(name)
        task = asyncio.create_task(self._read(name, offset), name=f"read {name}")
        self._tasks[name] = task
        task.add_done_callback(lambda t: self._reaped(name, t))

    def _reaped(self, name: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(name) is task:
            del self._tasks[name]  # It ended by itself (e.g. the journal was deleted); a later change may restart it.
        if not task.cancelled() and task.exception() is not None and not self._failure.done():
            self._failure.set_exception(task.exception())  # type: ignore[arg-type]

    async def _stop_reading(self, names: set[str]) -> None:
        tasks = [self._tasks.pop(n) for n in names if n in self._tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @staticmethod
    def readable(journals: Mapping[str, Journal]) -> dict[str, Journal]:
        """The journals to read: all but FULL-suspended ones (they have no replicas to read from)."""
        return {n: j for n, j in journals.items() if j.spec.suspend.level != pb.JournalSpec.Suspend.FULL}

    async def run(self) -> None:
        """Read until every journal is read to its write head (non-blocking) or `stop` is set."""
        stopper = asyncio.create_task(self.stop.wait())
        work = asyncio.create_task(self._follow() if self.options.block else self._read_listed())
        try:
            waiting: set[asyncio.Future[Any]] = {stopper, work, self._failure}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if self._failure.done():
                self._failure.result()  # Raise a reader's error.
            if work.done():
                work.result()  # Raise a listing error.
        finally:
            for task in (stopper, work):
                task.cancel()
            await asyncio.gather(stopper, work, return_exceptions=True)
            await self._stop_reading(set(self._tasks))

    async def _read_listed(self) -> None:
        listed = await list_journals(self.client, self.options.selector)
        if not listed.journals:
            log.warning("no journals were matched by the selector")
        for journal in self.readable({j.spec.name: j for j in listed.journals}).values():
            self._start(journal)
        await asyncio.gather(*self._tasks.values())

    async def _follow(self) -> None:
        """Read the journals the selector matches, starting and stopping reads as that set changes."""
        # A first plain listing fails fast on a bad broker address (the watch would retry forever),
        # and dates the start: journals created after it are new to this read.
        listed = await list_journals(self.client, self.options.selector)
        self._listed_revision = listed.header.etcd.revision
        if not listed.journals:
            log.warning("no journals are matched by the selector (yet); waiting for some")
        async for change in JournalWatcher(self.client, self.options.selector):
            wanted = self.readable(change.journals)
            await self._stop_reading(set(self._tasks) - wanted.keys())
            for name in sorted(wanted.keys() - self._tasks.keys()):
                self._start(wanted[name])

    async def _read(self, journal: str, offset: int) -> None:
        """Read `journal` from `offset`, writing whole appends, until its head (non-blocking) or cancelled."""
        opts = self.options
        rr = RetryReader(
            self.client, journal, offset=offset, block=opts.block, do_not_proxy=opts.do_not_proxy,
            begin_mod_time=opts.begin_mod_time, fragment_metadata=True,  # Fragment ends are append boundaries.
        )
        pending = bytearray()  # Read but not yet written; it begins at self.offsets[journal].
        streaming = False  # Whether we hold the output lock, writing straight through to a boundary.
        seen: pb.ReadResponse | None = None  # The metadata frame last logged.
        stop_at: int | None = None  # Non-blocking: the write head when the read began.
        if offset >= 0:
            self.offsets[journal] = offset
        try:
            while True:
                try:
                    data = await rr.read()
                except OffsetJump as jump:
                    if jump.offset != -1:  # -1 resolving to the write head is no loss.
                        log.warning("content was removed (by retention?); skipping it",
                                    extra={"journal": journal, "offset": jump.offset, "to": jump.to})
                    if not pending:
                        self.offsets[journal] = jump.to
                    continue
                except OffsetNotYetAvailable:
                    break  # Non-blocking, and at the write head.
                except Suspended:
                    log.info("journal is suspended; skipping it", extra={"journal": journal})
                    break
                except JournalNotFound:
                    log.warning("journal no longer exists; stopping its read", extra={"journal": journal})
                    break
                resp = rr.reader.response
                if resp is not seen:
                    seen = resp
                    if stop_at is None and not opts.block:
                        stop_at = resp.write_head
                    if log.isEnabledFor(logging.DEBUG):
                        log.debug("read is ready", extra={
                            "fragment.begin": resp.fragment.begin, "fragment.end": resp.fragment.end,
                            "fragment.url": resp.fragment_url, "journal": journal, "offset": resp.offset,
                        })
                fragment = rr.fragment
                boundary = fragment is not None and rr.offset >= fragment.end
                if streaming:
                    self.output.write(data)
                    self.offsets[journal] = rr.offset
                elif boundary and not pending and not self.output.lock.locked():
                    self.output.write(data)  # The common case: a whole fragment's span in one chunk.
                    self.offsets[journal] = rr.offset
                else:
                    pending += data
                    if boundary or len(pending) > STREAM_THRESHOLD:
                        # Wait for a streaming journal's boundary; then write (and maybe keep streaming).
                        await self.output.lock.acquire()
                        self.output.write(bytes(pending))
                        pending.clear()
                        self.offsets[journal] = rr.offset
                        streaming = not boundary
                        if not streaming:
                            self.output.lock.release()
                if boundary and streaming:
                    streaming = False
                    self.output.lock.release()
                if boundary and stop_at is not None and rr.offset >= stop_at:
                    break  # Non-blocking reads end at the write head as of their start.
            if pending:  # The read ended at the write head: a boundary.
                async with self.output.lock:
                    self.output.write(bytes(pending))
                self.offsets[journal] = rr.offset
            if rr.offset >= 0:
                self.offsets[journal] = rr.offset
            log.info("read finished", extra={"journal": journal, "offset": self.offsets.get(journal, -1)})
        finally:
            if streaming:
                self.output.lock.release()
            await rr.close()
            if self.on_done is not None:
                self.on_done(journal)


async def read_journals(
    client: JournalClient,
    options: ReadOptions,
    output: BinaryIO,
    *,
    on_start: Callable[[str], None] | None = None,
    on_done: Callable[[str], None] | None = None,
) -> dict[str, int]:
    """Run a JournalsRead until done, Ctrl-C or SIGTERM; return the offsets through which output was written.

    `on_start` and `on_done` are called with a journal's name as its read starts and ends.
    """
    reading = JournalsRead(client, options, Output(output), on_start=on_start, on_done=on_done)
    loop = asyncio.get_running_loop()
    # A signal ends the read cleanly, so the offsets of what was written can be saved.
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, reading.stop.set)
    try:
        await reading.run()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
    return reading.offsets
