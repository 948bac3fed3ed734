"""A shard's recovery from its recovery log (Gazette's `consumer/recovery.go`): `begin_recovery`
fetches the shard's hints from etcd, picks the primary's, else the first backup, else none, and
plays the log into a new temporary directory (a standby keeps playing: a hot standby);
`complete_recovery` hands the log off to a new author (the no-op fencing the previous primary's
Recorder out), finishes playback and opens a `Recorder` continuing the player's FSM in its
directory; `end_recovery` cancels playback and removes the directory. The `Replica` (consumer/
replica.py, Gazette's `shard.go`) runs them as its assignment asks.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from broker.client import AppendService, JournalClient
from consumer.errors import ReplicaError
from consumer.protocol import pb as cpb
from consumer.protocol.shard_spec import recovery_log
from consumer.recoverylog import (
    FSMHints,
    Player,
    Recorder,
    RecoveryLogError,
    Resolved,
    fetch_hints,
    new_random_author,
    pick_first_hints,
)

SHARD_RECOVERIES_TOTAL = Counter(
    "gazette_shard_recoveries_total",
    "Completed recoveries of shards from their recovery logs, by whether a hot standby (already tailing the "
    "log as STANDBY) was promoted.",
    ["shard", "standby"],
)
SHARD_RECOVERY_SECONDS_TOTAL = Counter(
    "gazette_shard_recovery_seconds_total",
    "Cumulative seconds from a replica's promotion to the end of its playback (the hand-off no-op read back).",
    ["shard", "standby"],
)

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Recovery:
    """A playback of the shard's recovery log (Gazette's beginRecovery), for a standby or a primary."""

    player: Player
    dir: str
    task: asyncio.Task[Resolved]
    hints: FSMHints | None = None
    """The hints playback started from, once fetched."""

    @property
    def tailing(self) -> bool:
        return self.player.tailing.is_set()


@dataclass
class RecoveryStats:
    """How the replica's last completed recovery went (for logs, metrics and tests)."""

    log: str
    was_standby: bool
    """Whether the replica served as a hot standby (tailing the log, STANDBY) before its promotion:
    then it only read what the previous primary recorded since it last caught up."""
    was_tailing: bool
    """Whether the player had already caught up with the log when the hand-off began."""
    playback_seconds: float
    """Seconds from the promotion to the end of playback (the hand-off no-op read back)."""
    live_files: int
    hinted: bool
    """Whether playback started from stored hints (else from the start of the log)."""


def begin_recovery(shard_id: str, etcd: Any, spec: cpb.ShardSpec, journal_client: JournalClient) -> Recovery:
    """Gazette's beginRecovery: fetch the shard's hints, then play its log into a new temporary directory."""
    player = Player()
    dir = tempfile.mkdtemp(prefix=shard_id.replace("/", "_") + "-")

    async def play() -> Resolved:
        try:
            fetched = await fetch_hints(etcd, spec)
        except Exception as exc:
            raise ReplicaError(f"beginRecovery: fetching hints: {exc}") from exc
        hints = pick_first_hints(fetched.hints, recovery_log(spec))
        recovery.hints = hints
        log.info("playing the recovery log", extra={
            "shard": shard_id, "log": hints.log, "dir": dir, "hinted_nodes": len(hints.live_nodes)})
        try:
            return await player.play(hints, dir, journal_client)
        except RecoveryLogError as exc:
            raise ReplicaError(f"playLog: {exc}") from exc

    recovery = Recovery(player, dir, asyncio.ensure_future(play()))
    recovery.task.add_done_callback(_quiet)
    return recovery


async def end_recovery(recovery: Recovery) -> None:
    """Cancel the playback and remove its directory."""
    recovery.task.cancel()
    await asyncio.gather(recovery.task, return_exceptions=True)
    await asyncio.to_thread(shutil.rmtree, recovery.dir, True)


async def complete_recovery(
    recovery: Recovery, *, shard_id: str, fqn: str, log_name: str, was_standby: bool, ajc: AppendService,
    recovered: Callable[[FSMHints], None],
) -> tuple[Recorder, RecoveryStats]:
    """Gazette's completeRecovery up to the Recorder: hand the log `log_name` off to a new author,
    finish playback, and record from there on. `recovered` is given the hints of the state recovery
    ended with (before the Recorder opens); `was_standby` is whether the replica served a STANDBY
    of this playback. Counts the recovery in the metrics (labelled by the shard's `fqn`)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    was_tailing = recovery.tailing
    author = new_random_author()
    recovery.player.inject_handoff(author)
    try:
        resolved = await asyncio.shield(recovery.task)
    except ReplicaError as exc:
        raise ReplicaError(f"completeRecovery: {exc}") from exc
    fsm = resolved.fsm
    recovered(fsm.build_hints(fsm.last_log))
    try:
        recorder = await Recorder.open(log_name, fsm, author, resolved.dir, ajc)
    except Exception as exc:
        raise ReplicaError(f"completeRecovery: NewRecorder: {exc}") from exc
    hints = recovery.hints
    stats = RecoveryStats(
        log=resolved.log, was_standby=was_standby, was_tailing=was_tailing, playback_seconds=loop.time() - started,
        live_files=len(fsm.live_nodes), hinted=bool(hints is not None and hints.live_nodes),
    )
    labels = (fqn, "true" if was_standby else "false")
    SHARD_RECOVERIES_TOTAL.labels(*labels).inc()
    SHARD_RECOVERY_SECONDS_TOTAL.labels(*labels).inc(stats.playback_seconds)
    log.info(
        "completed recovery of shard %s from %s (%s; hand-off in %.3fs, %d live files)",
        shard_id, resolved.log, "promoted from a hot standby" if was_standby else "played as a new primary",
        stats.playback_seconds, len(fsm.live_nodes),
        extra={"shard": shard_id, "author": author, "was_standby": was_standby, "was_tailing": was_tailing},
    )
    return recorder, stats


def _quiet(future: asyncio.Future[Any]) -> None:
    """Mark a failed playback's exception as retrieved (the serving task reports it)."""
    if not future.cancelled():
        future.exception()


__all__ = ["Recovery", "RecoveryStats", "begin_recovery", "complete_recovery", "end_recovery"]
