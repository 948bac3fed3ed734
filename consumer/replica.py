"""A shard replica: the lifecycle of one shard assigned to this consumer process (consumer digest 4.2, 7).

The `ConsumerService` keeps one `Replica` per local assignment and tells it of every change of its
assignment (`update`). A replica is what the application's handlers see as the `Shard`.

- At a standby slot (slot > 0) it reports STANDBY: a shard without a recovery log has nothing to
  play (recovery logs are not built yet, so a shard that names one is served the same way).
- At slot 0 it serves as primary (Gazette's servePrimary): it waits (bounded) until no other
  replica of the shard still reports PRIMARY (an in-place hand-off re-keys the old primary to a
  standby slot, and that replica stops and reports STANDBY), builds the store
  (`app.new_store(shard, None)`), restores its checkpoint (which fences off older primaries),
  reports PRIMARY, then runs transactions: a Publisher on the shard's Clock over an
  AppendService, a MessageChannel that `start_reading_messages` fills from each source at
  max(checkpoint read_through, source.min_offset), and a Sequencer from the checkpoint. When the
  channel closes and drains, the checkpoint is restored again and the loop repeats.
- A slot-0 assignment moving to another slot is a demotion: serving stops (the store is
  destroyed) and the replica reports STANDBY at its new slot.
- An error while serving reports FAILED with the error's text (Gazette's prefixes, truncated at
  2048 characters); the replica stays FAILED, doing nothing, until it is unassigned.
- `close()` (unassigned, or the service stops) cancels serving, waits for resolutions in use
  (bounded) and destroys the store.

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
from broker.keyspace import Assignment, KeySpace, item_key
from broker.keyspace.keyspace import compare_mod, put_op, txn
from consumer.application import Application
from consumer.checkpoint import flatten_producer_states, flatten_read_through
from consumer.keyspace import encode_replica_status
from consumer.message import Clock, Publisher, Sequencer
from consumer.protocol import pb as cpb
from consumer.protocol.shard_spec import reduce_replica_status
from consumer.transaction import (
    DEFAULT_READ_CHANNEL_SIZE,
    DEFAULT_RING_BUFFER_SIZE,
    MessageChannel,
    ShardProgress,
    run_transactions,
    start_reading_messages,
)

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


class ReplicaError(Exception):
    """Serving a shard failed; the message has Gazette's prefix (`completeRecovery: app.NewStore: ...`)."""


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
    ) -> None:
        self._keyspace = keyspace
        self._etcd = etcd
        self._journal_client = journal_client
        self.app = app
        self.assignment = assignment
        self._spec = spec
        self.handoff_timeout = handoff_timeout
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
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._uses = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # -- the Shard protocol ---------------------------------------------------------------------

    @property
    def id(self) -> str:
        return self.assignment.item_id

    @property
    def fqn(self) -> str:
        """The shard's etcd item key, `<root>/items/<id>` (the digest's FQN)."""
        return item_key(self._keyspace.root, self.id)

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

    async def close(self) -> None:
        """Stop serving (cancel), wait for resolutions in use (bounded), destroy the store."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.done.set()

    async def wait_closed(self) -> None:
        """Wait for the serving task (for tests and the service)."""
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._task)

    # -- serving --------------------------------------------------------------------------------

    async def _serve(self, after: asyncio.Task[None] | None, ready: asyncio.Event, done: asyncio.Event) -> None:
        if after is not None:
            await asyncio.wait({after})  # The previous serving's teardown (store destroyed).
        try:
            if self.assignment.slot != 0:
                # No recovery log to play: a standby is ready at once.
                await self._update_status(cpb.ReplicaStatus(code=Code.STANDBY), replace=True)
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

    async def _serve_primary(self, ready: asyncio.Event, done: asyncio.Event) -> None:
        await self._await_handoff()
        try:
            store = await self.app.new_store(self, None)
        except Exception as exc:
            raise ReplicaError(f"completeRecovery: app.NewStore: {exc}") from exc
        self.store = store
        try:
            try:
                checkpoint = await store.restore_checkpoint(self)
            except Exception as exc:
                raise ReplicaError(f"completeRecovery: store.RestoreCheckpoint: {exc}") from exc
            await self._update_status(cpb.ReplicaStatus(code=Code.PRIMARY))
            ready.set()
            log.info("shard serving as primary", extra={"shard": self.id})
            await self._run(store, checkpoint)
        finally:
            if self.store is store:
                self.store = None
            done.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), CLOSE_TIMEOUT)
            try:
                await store.destroy()
            except Exception:
                log.exception("destroying the store of shard %s failed", self.id)

    async def _run(self, store: Store, checkpoint: cpb.Checkpoint) -> None:
        # Messages and ACKs carry UUIDs that read-committed readers deduplicate, so an append whose
        # outcome is unknown (a broker died mid-commit) is retried, as Gazette's AppendService does.
        ajc = AppendService(self._journal_client, retry_unknown_outcome=True)
        try:
            publisher = Publisher(ajc, self.clock)
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
                        self, self.app, store, checkpoint, channel, sequencer, publisher, progress=self.progress
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
        finally:
            # Let queued appends finish for a while (ACKs of committed transactions help readers;
            # the next primary writes them again anyway), then drop the rest: uncommitted.
            try:
                await asyncio.wait_for(ajc.close(), FLUSH_TIMEOUT)
            except BaseException:
                with contextlib.suppress(Exception):
                    await ajc.close(cancel=True)

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
    "MAX_ETCD_ERR_LEN",
    "Replica",
    "ReplicaError",
    "failed_status",
    "status_backoff",
]
