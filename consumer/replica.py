"""A shard replica: the lifecycle of one shard assigned to this consumer process (Gazette's
`consumer/shard.go`; its recovery is `consumer/recovery.py`, as Gazette's `recovery.go`).

The `ConsumerService` keeps one `Replica` per local assignment and tells it of every change of its
assignment (`update`). A replica is what the application's handlers see as the `Shard`.

- Every replica of a shard with a recovery log (`recovery_log_prefix` set) begins recovery at once
  (Gazette's beginRecovery, `consumer/recovery.py`): it fetches the shard's hints from etcd, picks
  the primary's, else the first backup, else none (`pick_first_hints`), and plays the log into a
  new temporary directory with a `Player` (which checks the log's content-type).
- At a standby slot (slot > 0) it serves as a standby (Gazette's serveStandby): it reports
  BACKFILL while the player catches up, then STANDBY once the player tails the log's head (a hot
  standby: the player keeps applying what the primary records). A shard without a recovery log
  has nothing to play: it reports STANDBY at once.
- At slot 0 it serves as primary (Gazette's servePrimary): it waits (bounded) until no other
  replica of the shard still reports PRIMARY (an in-place hand-off re-keys the old primary to a
  standby slot, and that replica stops and becomes a standby), then completes recovery (Gazette's
  completeRecovery, `consumer/recovery.py`): a new random author, `inject_handoff` (the no-op fencing the previous
  primary's Recorder out of the log), playback done, `Recorder.open` continuing the player's FSM
  in its directory; a promoted hot standby only reads what was recorded since it last caught up.
  It builds the store (`app.new_store(shard, recorder)`; the recorder is None without a recovery
  log), restores its checkpoint (which fences off older primaries), stores the recovered hints as
  `backup.0` (rotating older backups; retried with backoff), reports PRIMARY, then runs
  transactions: a Publisher on the shard's Clock over an
  AppendService, a MessageChannel that `start_reading_messages` fills from each source at
  max(checkpoint read_through, source.min_offset), and a Sequencer from the checkpoint. When the
  channel closes and drains, the checkpoint is restored again and the loop repeats.
  While primary it stores the Recorder's hints at the primary hints key every `hints_interval`
  seconds (Gazette: 5 minutes) and once more when it stops serving cleanly.
- A slot-0 assignment moving to another slot is a demotion: serving stops (the store is
  destroyed, the recorded directory removed) and the replica serves as a standby at its new slot
  (playing the log anew).
- An error while serving reports FAILED with the error's text (Gazette's prefixes, truncated at
  2048 characters); the replica stays FAILED, doing nothing, until it is unassigned.
- `close()` (unassigned, or the service stops) cancels serving and playback, waits for
  resolutions in use (bounded), destroys the store and removes the playback directory.

Statuses are written to the assignment's key, reduced with its current value (the largest code
wins, as Gazette's ReplicaStatus.Reduce, except that a demoted primary's STANDBY replaces its
PRIMARY), in a transaction guarded by the key's ModRevision that keeps its lease, retried with
Gazette's backoff (50 ms twice, 100 ms twice, 1 s twice, then 5 s) while the key still names this
replica; after writing, the replica waits until the keyspace mirror has read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from broker.client import AppendService, JournalClient
from cluster.keyspace import Assignment, KeySpace, item_key
from cluster.keyspace.keyspace import compare_mod, put_op, txn
from consumer.application import Application
from consumer.channel import DEFAULT_READ_CHANNEL_SIZE, MessageChannel
from consumer.checkpoint import flatten_producer_states, flatten_read_through
from consumer.errors import ReplicaError
from consumer.keyspace import encode_replica_status
from consumer.message import Clock, Publisher, Sequencer
from consumer.progress import ShardProgress
from consumer.protocol import pb as cpb
from consumer.protocol.shard_spec import recovery_log, reduce_replica_status
from consumer.recovery import Recovery, RecoveryStats, begin_recovery, complete_recovery, end_recovery
from consumer.recoverylog import FSMHints, Recorder, store_recorded_hints, store_recovered_hints
from consumer.source_reader import start_reading_messages
from consumer.transaction import DEFAULT_RING_BUFFER_SIZE, run_transactions

if TYPE_CHECKING:
    from consumer.store import Store

log = logging.getLogger(__name__)

Code = cpb.ReplicaStatus.Code

MAX_ETCD_ERR_LEN: Final = 2048
"""A FAILED status's error is truncated to this many characters, then TRUNCATED is appended."""
TRUNCATED: Final = " ...[truncated]"
HANDOFF_TIMEOUT: Final = 30.0
"""Seconds a new primary waits for another replica of its shard to stop reporting PRIMARY, before
it restores the checkpoint anyway (the store's fence keeps the old primary from committing)."""
FLUSH_TIMEOUT: Final = 5.0
"""Seconds a primary that stops waits for its queued appends before dropping them."""
CLOSE_TIMEOUT: Final = 10.0
"""Seconds `close` waits for resolutions of the shard still in use before destroying its store."""
PUBLISH_LINGER: Final = 0.05
"""Seconds a message the application publishes waits for more to join its Append RPC, unless its
transaction's commit (or an await) wants it sooner: read-committed readers see it only after the
commit anyway. One RPC per derived message cost bench_consumer 4% of its throughput."""
HINTS_INTERVAL: Final = 300.0
"""Seconds between two stores of a primary's recorded hints (Gazette's hintsCh tick: 5 minutes)."""
HINTS_TIMEOUT: Final = 5.0
"""Seconds a primary that stops cleanly gives its last recorded hints to be committed and stored."""


def status_backoff(attempt: int) -> float:
    """Seconds to wait before retrying status update `attempt` (0-based), as Gazette's backoff."""
    if attempt < 2:
        return 0.05
    if attempt < 4:
        return 0.1
    if attempt < 6:
        return 1.0
    return 5.0


def failed_status(error: BaseException | str) -> cpb.ReplicaStatus:
    """A FAILED ReplicaStatus carrying `error`'s text, truncated at MAX_ETCD_ERR_LEN characters."""
    text = str(error) or type(error).__name__
    if len(text) > MAX_ETCD_ERR_LEN:
        text = text[:MAX_ETCD_ERR_LEN] + TRUNCATED
    return cpb.ReplicaStatus(code=Code.FAILED, errors=[text])


class Replica:
    """One shard assigned to this process: a `consumer.shard.Shard` for the application."""

    def __init__(
        self,
        *,
        keyspace: KeySpace,
        etcd: Any,
        journal_client: JournalClient,
        app: Application,
        assignment: Assignment,
        spec: cpb.ShardSpec,
        handoff_timeout: float = HANDOFF_TIMEOUT,
        hints_interval: float = HINTS_INTERVAL,
    ) -> None:
        self._keyspace = keyspace
        self._etcd = etcd
        self._journal_client = journal_client
        self.app = app
        self.assignment = assignment
        # The same for every assignment the replica is given. An attribute, not a property:
        # applications read it once per message (e.g. to find the shard's state).
        self.id: Final[str] = assignment.item_id
        self._fqn = item_key(keyspace.root, assignment.item_id)
        self._spec = spec
        self.handoff_timeout = handoff_timeout
        self.hints_interval = hints_interval
        self.clock = Clock()
        """The shard's publishing clock (Gazette's shard.clock), kept across transactions."""
        self.progress = ShardProgress()
        """Offsets read through (by source) and published at (by ACKed journal) so far."""
        self.store: Store | None = None
        """The primary's store, once restored; None otherwise."""
        self.store_ready = asyncio.Event()
        """Set once the primary's store has restored its checkpoint and the replica reports PRIMARY."""
        self.done = asyncio.Event()
        """Set when the replica stops being primary: closed, demoted or FAILED."""
        self.error: str | None = None
        """The error of a FAILED replica."""
        self.recorder: Recorder | None = None
        """The primary's Recorder (shards with a recovery log), once recovery completed."""
        self.recovery_stats: RecoveryStats | None = None
        """How the last completed recovery went."""
        self.recovered_hints: FSMHints | None = None
        """The hints of the state recovery ended with (stored as backup.0)."""
        self._recovery: Recovery | None = None
        self._standby = False  # The current recovery served a STANDBY.
        self._graceful = True
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._uses = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # -- the Shard protocol ---------------------------------------------------------------------

    @property
    def fqn(self) -> str:
        """The shard's etcd item key, `<root>/items/<id>` (Gazette's `consumer/key_space.go` FQN)."""
        return self._fqn

    @property
    def spec(self) -> cpb.ShardSpec:
        return self._spec

    @property
    def journal_client(self) -> JournalClient:
        return self._journal_client

    # -- state ----------------------------------------------------------------------------------

    @property
    def slot(self) -> int:
        return self.assignment.slot

    @property
    def is_primary(self) -> bool:
        """Whether the replica is at slot 0 (assigned as primary; it may not be serving yet)."""
        return self.assignment.slot == 0

    @property
    def serving(self) -> bool:
        """Whether the replica serves as primary: its store is restored, it reports PRIMARY."""
        return self.store_ready.is_set() and not self.done.is_set()

    def acquire(self) -> Callable[[], None]:
        """Hold the shard's store in use (a resolution); returns the function that releases it."""
        self._uses += 1
        self._idle.clear()
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self._uses -= 1
            if self._uses == 0:
                self._idle.set()

        return release

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Begin serving the assignment's slot."""
        self._begin()

    def update(self, assignment: Assignment, spec: cpb.ShardSpec) -> None:
        """The keyspace changed: note the current assignment and spec, and promote or demote."""
        was_primary = self.assignment.slot == 0
        self.assignment = assignment
        self._spec = spec
        if self._closed:
            return
        if assignment.slot == 0 and not was_primary:
            log.info("shard promoted to primary", extra={"shard": self.id})
            self._restart()
        elif assignment.slot != 0 and was_primary:
            log.info("shard demoted to standby", extra={"shard": self.id, "slot": assignment.slot})
            self._restart()

    def _restart(self) -> None:
        previous = self._task
        self._task = None
        if previous is not None:
            previous.cancel()
        self._begin(after=previous)

    def _begin(self, after: asyncio.Task[None] | None = None) -> None:
        # Each serving has its own events: a cancelled one finishing late must not touch the next's.
        ready, done = asyncio.Event(), asyncio.Event()
        self.store_ready, self.done = ready, done
        self.error = None
        self._task = asyncio.create_task(self._serve(after, ready, done), name=f"shard {self.id}")

    async def close(self, *, graceful: bool = True) -> None:
        """Stop serving (cancel), wait for resolutions in use (bounded), destroy the store, stop
        playback and remove its directory. Without `graceful` (a crash, see ConsumerService.abort)
        nothing more is written to etcd (no last recorded hints)."""
        self._closed = True
        self._graceful = graceful
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._end_recovery()
        self.done.set()

    async def wait_closed(self) -> None:
        """Wait for the serving task (for tests and the service)."""
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._task)

    # -- recovery -------------------------------------------------------------------------------

    @property
    def recovery_log(self) -> str:
        """The shard's recovery log, or "" when it has none."""
        return recovery_log(self._spec)

    @property
    def tailing(self) -> bool:
        """Whether a playback of the recovery log has caught up with its head (a hot standby)."""
        return self._recovery is not None and self._recovery.tailing

    def _begin_recovery(self) -> Recovery:
        """Gazette's beginRecovery (`consumer.recovery.begin_recovery`), once per serving."""
        if self._recovery is None:
            self._recovery = begin_recovery(self.id, self._etcd, self._spec, self._journal_client)
        return self._recovery

    async def _end_recovery(self) -> None:
        """Cancel any playback and remove its directory."""
        recovery, self._recovery = self._recovery, None
        self._standby = False
        if recovery is not None:
            await end_recovery(recovery)

    async def _complete_recovery(self, ajc: AppendService) -> Recorder:
        """Gazette's completeRecovery up to the Recorder (`consumer.recovery.complete_recovery`)."""
        recovery = self._recovery if self._recovery is not None else self._begin_recovery()

        def recovered(hints: FSMHints) -> None:
            self.recovered_hints = hints

        recorder, self.recovery_stats = await complete_recovery(
            recovery, shard_id=self.id, fqn=self.fqn, log_name=self.recovery_log, was_standby=self._standby,
            ajc=ajc, recovered=recovered,
        )
        return recorder

    async def _store_recovered_hints(self, recorder: Recorder) -> None:
        """Store the hints recovery ended with as `backup.0`, retried with backoff (Gazette's
        storeRecoveredHints); skipped if they are of another log than the shard's."""
        hints = self.recovered_hints
        if hints is None or hints.log != self.recovery_log:
            return
        attempt = 0
        while True:
            a = self.assignment
            try:
                await store_recovered_hints(self._etcd, self._spec, hints, a.key, a.create_revision)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("storing recovered hints failed (will retry): %s", exc, extra={"shard": self.id})
            await asyncio.sleep(status_backoff(attempt))
            attempt += 1

    async def store_hints_before_exit(self) -> None:
        """As the process begins to exit, store a primary's recorded hints while its assignment
        still fences them (a hand-off removes it, and the store at the replica's stop is then
        skipped): the next primary, and `gazctl shards prune`, see what this one recorded."""
        recorder = self.recorder
        if recorder is None or recorder.failed is not None or not self.is_primary:
            return
        try:
            async with asyncio.timeout(HINTS_TIMEOUT):
                stored = await self._store_recorded_hints(recorder)
            log.debug("stored recorded hints before exiting", extra={"shard": self.id, "stored": stored})
        except Exception as exc:
            log.info("storing recorded hints before exiting failed: %s", exc, extra={"shard": self.id})

    async def _store_recorded_hints(self, recorder: Recorder) -> bool:
        """Store the Recorder's current hints at the primary hints key (Gazette's storeRecordedHints)."""
        hints = await recorder.build_hints()
        a = self.assignment
        return await store_recorded_hints(self._etcd, self._spec, hints, a.key, a.create_revision)

    async def _tick_hints(self, tick: asyncio.Event) -> None:
        """Set `tick` every hints_interval: the transaction loop stores recorded hints between two
        transactions (Gazette's hintsCh)."""
        while True:
            await asyncio.sleep(self.hints_interval)
            tick.set()

    # -- serving --------------------------------------------------------------------------------

    async def _serve(self, after: asyncio.Task[None] | None, ready: asyncio.Event, done: asyncio.Event) -> None:
        if after is not None:
            await asyncio.wait({after})  # The previous serving's teardown (store destroyed).
        try:
            if self.assignment.slot != 0:
                await self._serve_standby()
                return
            await self._serve_primary(ready, done)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = failed_status(exc).errors[0]
            if self.done is done:
                self.error = error
            log.warning("shard failed", extra={"shard": self.id, "error": error})
            with contextlib.suppress(Exception):
                await self._update_status(failed_status(exc))
        finally:
            done.set()

    async def _serve_standby(self) -> None:
        """Gazette's serveStandby: BACKFILL while the log plays, STANDBY once it tails the head
        (at once without a recovery log); then keep playing, failing if playback fails."""
        if not self.recovery_log:
            await self._update_status(cpb.ReplicaStatus(code=Code.STANDBY), replace=True)
            return
        recovery = self._begin_recovery()
        # Replaces a demoted primary's PRIMARY (the largest code would win otherwise).
        await self._update_status(cpb.ReplicaStatus(code=Code.BACKFILL), replace=True)
        tailing = asyncio.ensure_future(recovery.player.tailing.wait())
        try:
            # asyncio.wait cancels neither: a promotion cancels this task, never the playback.
            await asyncio.wait({tailing, recovery.task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            tailing.cancel()
        if recovery.player.tailing.is_set() and not recovery.task.done():
            log.info("shard standby is tailing its recovery log", extra={"shard": self.id})
            # Before the write returns: the promotion its landing allows cancels this task, and may
            # come first (as soon as the watch shows it, within the consumer's 5 ms watch delay).
            self._standby = True
            await self._update_status(cpb.ReplicaStatus(code=Code.STANDBY))
        await asyncio.wait({recovery.task})
        exc = recovery.task.exception() if not recovery.task.cancelled() else None
        if exc is not None:
            raise exc
        if recovery.task.cancelled():
            raise ReplicaError("playLog: playback was cancelled")
        raise ReplicaError("playLog: playback ended while serving as a standby")

    async def _serve_primary(self, ready: asyncio.Event, done: asyncio.Event) -> None:
        if self.recovery_log and self._recovery is None:
            # A new primary plays the log from the start of its assignment (while the previous
            # primary, if any, stops), reporting BACKFILL: it never tails as a standby, it hands
            # off at the head.
            self._begin_recovery()
            await self._update_status(cpb.ReplicaStatus(code=Code.BACKFILL))
        await self._await_handoff()
        # Messages and ACKs carry UUIDs that read-committed readers deduplicate, so an append whose
        # outcome is unknown (a broker died mid-commit) is retried, as Gazette's AppendService does.
        # A recovery log's duplicated ops are skipped by players (their seq_no is already applied).
        ajc = AppendService(self._journal_client, retry_unknown_outcome=True, linger=PUBLISH_LINGER)
        recorder: Recorder | None = None
        store: Store | None = None
        hints_task: asyncio.Task[None] | None = None
        hints_tick: asyncio.Event | None = None
        try:
            if self.recovery_log:
                recorder = await self._complete_recovery(ajc)
                self.recorder = recorder
            try:
                store = await self.app.new_store(self, recorder)
            except Exception as exc:
                raise ReplicaError(f"completeRecovery: app.NewStore: {exc}") from exc
            self.store = store
            try:
                checkpoint = await store.restore_checkpoint(self)
            except Exception as exc:
                raise ReplicaError(f"completeRecovery: store.RestoreCheckpoint: {exc}") from exc
            if recorder is not None:
                await self._store_recovered_hints(recorder)
                hints_tick = asyncio.Event()
                hints_task = asyncio.create_task(self._tick_hints(hints_tick), name=f"hints {self.id}")
            await self._update_status(cpb.ReplicaStatus(code=Code.PRIMARY))
            ready.set()
            log.info("shard serving as primary", extra={"shard": self.id})
            await self._run(store, checkpoint, ajc, hints_tick)
        finally:
            if hints_task is not None:
                hints_task.cancel()
                await asyncio.gather(hints_task, return_exceptions=True)
            if self.store is store:
                self.store = None
            done.set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await self._idle.wait()
            if store is not None:
                try:
                    await store.destroy()
                except Exception:
                    log.exception("destroying the store of shard %s failed", self.id)
            if recorder is not None:
                if self._graceful and recorder.failed is None:
                    # A clean stop: the last recorded hints (fenced by the assignment: skipped
                    # once it is gone, and failing once a new primary took the log).
                    try:
                        async with asyncio.timeout(HINTS_TIMEOUT):
                            await self._store_recorded_hints(recorder)
                    except Exception as exc:
                        log.info("storing recorded hints at stop failed: %s", exc, extra={"shard": self.id})
                await recorder.close()
                if self.recorder is recorder:
                    self.recorder = None
            # Let queued appends finish for a while (ACKs of committed transactions help readers;
            # the next primary writes them again anyway), then drop the rest: uncommitted.
            try:
                async with asyncio.timeout(FLUSH_TIMEOUT):
                    await ajc.close()
            except BaseException:
                with contextlib.suppress(Exception):
                    await ajc.close(cancel=True)
            await self._end_recovery()

    async def _run(
        self, store: Store, checkpoint: cpb.Checkpoint, ajc: AppendService, hints_tick: asyncio.Event | None
    ) -> None:
        publisher = Publisher(ajc, self.clock)
        recorder = self.recorder

        async def store_hints() -> None:
            if recorder is not None:
                await self._store_recorded_hints(recorder)

        while True:
            spec = self._spec
            channel = MessageChannel(spec.read_channel_size or DEFAULT_READ_CHANNEL_SIZE)
            readers = start_reading_messages(self, self.app, checkpoint, channel)
            sequencer = Sequencer(
                flatten_read_through(checkpoint),
                flatten_producer_states(checkpoint),
                spec.ring_buffer_size or DEFAULT_RING_BUFFER_SIZE,
            )
            try:
                await run_transactions(
                    self, self.app, store, checkpoint, channel, sequencer, publisher, progress=self.progress,
                    hints=hints_tick, store_hints=store_hints,
                )
            except Exception as exc:
                raise ReplicaError(f"runTransactions: {exc}") from exc
            finally:
                channel.close()
                for task in readers:
                    task.cancel()
                await asyncio.gather(*readers, return_exceptions=True)
            # The channel closed and drained: start again from the committed checkpoint.
            try:
                checkpoint = await store.restore_checkpoint(self)
            except Exception as exc:
                raise ReplicaError(f"store.RestoreCheckpoint: {exc}") from exc

    async def _await_handoff(self) -> None:
        """Wait until no other replica of the shard reports PRIMARY (bounded by handoff_timeout)."""

        def others_primary() -> bool:
            mine = self.assignment.key
            return any(
                a.key != mine and a.value.code == Code.PRIMARY for a in self._keyspace.assignments(self.id)
            )

        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.handoff_timeout
        while others_primary():
            remaining = deadline - loop.time()
            if remaining <= 0:
                log.warning("another replica still reports PRIMARY; taking over", extra={"shard": self.id})
                return
            await self._keyspace.wait_for_change_within(remaining)

    # -- status ---------------------------------------------------------------------------------

    async def _update_status(self, status: cpb.ReplicaStatus, *, replace: bool = False) -> None:
        """Write `status` to the current assignment's key (see the module's doc); returns quietly
        once the key no longer names this replica at the slot it was written for."""
        slot = self.assignment.slot
        attempt = 0
        while True:
            a = self.assignment
            if a.slot != slot or self._current(a) is None:
                return  # Re-keyed or removed: a transition or close follows.
            value = cpb.ReplicaStatus()
            if replace:
                value.CopyFrom(status)
            else:
                value.CopyFrom(reduce_replica_status(_copy(a.value), status))
            if value == a.value:
                return
            try:
                ok, revision = await txn(
                    self._etcd,
                    [compare_mod(a.key, a.mod_revision)],
                    [put_op(a.key, encode_replica_status(value), ignore_lease=True)],
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("updating shard status failed: %s", exc, extra={"shard": self.id})
                ok, revision = False, 0
            if ok:
                await self._keyspace.wait_for_revision(revision)
                return
            await asyncio.sleep(status_backoff(attempt))
            attempt += 1

    def _current(self, a: Assignment) -> Assignment | None:
        for found in self._keyspace.assignments(self.id):
            if found.key == a.key:
                return found
        return None


def _copy(status: cpb.ReplicaStatus) -> cpb.ReplicaStatus:
    out = cpb.ReplicaStatus()
    out.CopyFrom(status)
    return out


__all__ = [
    "CLOSE_TIMEOUT",
    "HANDOFF_TIMEOUT",
    "HINTS_INTERVAL",
    "MAX_ETCD_ERR_LEN",
    "Replica",
    "failed_status",
    "status_backoff",
]
