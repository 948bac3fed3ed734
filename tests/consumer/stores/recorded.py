"""Helpers of the local-store tests: a recovery log of the module's real broker, a Recorder of a
fresh directory, and playback of a log into another directory (as a new primary does)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from broker.client import AppendService, JournalClient, Reader
from broker.protocol import labels
from consumer.protocol import pb
from consumer.recoverylog import FSM, FSMHints, Player, Recorder, Resolved
from tests.support.harness import journal_spec
from tests.support.journals import create_journal, unique

__all__ = [
    "TIMEOUT", "FakeShard", "Log", "checkpoint", "failed", "new_log_with", "read_log", "recorded",
    "tree",
]

TIMEOUT = 30


@dataclass
class FakeShard:
    """The part of a shard a store sees."""

    id: str = "shard-A"
    fqn: str = ""
    spec: pb.ShardSpec = field(default_factory=pb.ShardSpec)

    def __post_init__(self) -> None:
        self.fqn = self.fqn or f"/consumer.test/items/{self.id}"


def checkpoint(n: int) -> pb.Checkpoint:
    """A checkpoint telling `n` apart: read-through offsets, a producer and an ACK intent."""
    cp = pb.Checkpoint()
    cp.sources["a/journal"].read_through = n * 100
    entry = cp.sources["a/journal"].producers.add()
    entry.id = b"\x01\x02\x03\x04\x05\x06"
    entry.state.last_ack = n << 40
    entry.state.begin = -1
    cp.ack_intents["ack/journal"] = f"ack {n}".encode()
    return cp


def failed(exc: BaseException) -> asyncio.Future[None]:
    """A future already failed with `exc`: a `wait_for` operation that failed."""
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    fut.set_exception(exc)
    return fut


@dataclass
class Log:
    """A recovery log and the services to record it and play it back."""

    name: str
    client: JournalClient
    ajc: AppendService
    tmp: Path
    recorders: list[Recorder] = field(default_factory=list)
    cleanups: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    """Run after the test, before the Recorders close (e.g. destroying stores)."""

    async def recorder(self, dir: Path, author: int, fsm: FSM | None = None) -> Recorder:
        """A Recorder of `dir` (created), continuing `fsm` (a new log's FSM by default)."""
        dir.mkdir(parents=True, exist_ok=True)
        rec = await Recorder.open(self.name, fsm or FSM(FSMHints(log=self.name)), author, str(dir), self.ajc)
        self.recorders.append(rec)
        return rec

    async def play(self, dir: Path, handoff_author: int | None = None, hints: FSMHints | None = None) -> Resolved:
        """Play the log into `dir`, to its write head, or injecting a hand-off of `handoff_author`."""
        player = Player()
        if handoff_author is None:
            player.finish_at_write_head()
        else:
            player.inject_handoff(handoff_author)
        return await asyncio.wait_for(
            player.play(hints or FSMHints(log=self.name), dir, self.client, self.ajc), TIMEOUT
        )

    async def take_over(self, dir: Path, author: int, hints: FSMHints | None = None) -> Recorder:
        """As a new primary: play the log into `dir`, fencing it to `author`, and record on."""
        resolved = await self.play(dir, author, hints)
        return await self.recorder(Path(resolved.dir), author, resolved.fsm)


@pytest.fixture
async def recorded(client: JournalClient, ajc: AppendService, tmp_path: Path) -> AsyncIterator[Log]:
    """A new recovery log journal; its Recorders are closed after the test."""
    spec = journal_spec(unique("recovery/stores"), content_type=labels.CONTENT_TYPE_RECOVERY_LOG)
    await create_journal(client, spec)
    log = Log(spec.name, client, ajc, tmp_path)
    try:
        yield log
    finally:
        for cleanup in log.cleanups:
            await cleanup()
        for rec in log.recorders:
            await rec.close()


def tree(root: Path) -> dict[str, Any]:
    """Every regular file under `root`, by relative path."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


async def read_log(client: JournalClient, journal: str) -> bytes:
    """The journal's content, from offset 0 to its write head."""
    out = bytearray()
    async with Reader(client, journal, offset=0, block=False) as reader:
        async for chunk in reader:
            out += chunk
    return bytes(out)


async def new_log_with(client: JournalClient, ajc: AppendService, content: bytes) -> str:
    """A new recovery log journal holding `content`."""
    spec = journal_spec(unique("recovery/prefix"), content_type=labels.CONTENT_TYPE_RECOVERY_LOG)
    await create_journal(client, spec)
    if content:
        await ajc.append(spec.name, content)
    return spec.name
