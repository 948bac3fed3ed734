"""The consumer transaction state machine: Gazette's consumer/transaction.go, in asyncio.

A primary shard runs transactions back to back (`run_transactions`). Each transaction reads
read-uncommitted envelopes from a `MessageChannel`, sequences them (`Sequencer`) into
read-committed messages, and hands those to the Application; then it starts to commit: the
Store commits a Checkpoint (offsets, producer states, ACK intents) once the transaction's
appends have resolved, and the transaction's ACK intents are appended once that commit has
resolved. Transaction N+1 consumes while N commits, but cannot itself start to commit until N's
commit and all of N's ACKs have resolved (the barrier chain).

Phases of a transaction (`TxnPhase`, Gazette's phase metrics): NOT_RUNNING until its first
message, CONSUMING, STALLED (max duration reached while the prior transaction is still
committing), PREPARING (FinalizeTxn, building the checkpoint, StartCommit), then asynchronously
COMMITTING and ACKNOWLEDGING, and DONE.

One step (`Transactions.txn_step`) is one event:

1. a dequeued, committed message is ready and the channel is open: poll the timer without
   blocking (a tick is handled by `txn_tick`), else consume the message (`txn_consume`);
2. else, if `txn_blocks()`: block until the timer fires (`txn_tick`), the prior transaction's
   next barrier resolves (`txn_barrier_resolved`), or the channel has an envelope, an error or
   its close (`txn_read`);
3. else poll the timer and the channel without blocking; if neither is ready, the input has
   stalled and the transaction starts to commit (`txn_start_commit`, `txn_acknowledge`), or,
   if it consumed nothing (the channel closed and drained), the run is over.

`txn_run` takes the steps that need no waiting (1, and 2 or 3 with an envelope queued and no
barrier resolved) by `txn_steps_ready`, a loop of the same transitions in the same order without
txn_step's dispatch, calling the same handlers (`txn_tick`, `txn_read_sync`, `txn_consume`,
`txn_consume_message`); readers hand envelopes over a list at a time (`MessageChannel.send_all`).

Beside it: `consumer/channel.py` (the `MessageChannel`), `consumer/timer.py` (`TxnTimer`,
`LoopTimer`), `consumer/progress.py` (`ShardProgress`), `consumer/txn_metrics.py` (`TxnPhase` and
the metrics) and `consumer/source_reader.py` (the default reader of a shard's sources).

Injected inputs: the Shard, its Application and Store, the `MessageChannel`, the Sequencer,
the Publisher (whose AppendService also carries the ACK appends), a `TxnTimer` (`LoopTimer`
on the event loop; tests drive their own), and a progress callback (`ShardProgress`). Times and
durations are integer nanoseconds; the timer's `now()` is wall-clock time (it feeds the shard's
publishing Clock).

Where this differs from Gazette: when several events are ready at once, Go's select picks one at
random; here the timer goes first, then the prior transaction's barrier, then the channel (the
timer and barrier fire once each, so reads cannot starve them). A replayed range
(QUEUE_ACK_COMMIT_REPLAY) is read whole before the Sequencer steps through it, since its
`start_replay` takes a synchronous iterator. Recovered ACK intents are appended through the
AppendService, so later appends to their journals queue behind them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeAlias

from broker.client import AppendService, AsyncAppend, JournalNotFound
from broker.protocol import pb
from consumer.application import Application, DeferToNextTransaction
from consumer.channel import CLOSED, EMPTY, Marker, MessageChannel, resolve_watcher
from consumer.checkpoint import build_checkpoint
from consumer.errors import ConsumerError
from consumer.message import (
    Envelope,
    Publisher,
    QueueOutcome,
    Sequencer,
    fetch_journal_spec,
    read_uncommitted,
)
from consumer.progress import ProgressFunc
from consumer.protocol import pb as cpb
from consumer.shard import Shard
from consumer.source_reader import message_factory
from consumer.store import OpFuture, Store
from consumer.timer import LoopTimer, TxnTimer
from consumer.txn_metrics import ShardCounters, TxnPhase, record_metrics

log = logging.getLogger(__name__)

DEFAULT_RING_BUFFER_SIZE: Final = 8192
"""Ring size of a shard's Sequencer when its spec's `ring_buffer_size` is 0."""
YIELD_EVERY_STEPS: Final = 256
"""Steps of a transaction between yields to the event loop while input is queued (two steps a
message): in bench_consumer 256 beat 128 by 3-4% (512 starves the readers in-process)."""
SEQUENCER_PRUNE_HORIZON_NS: Final = 24 * 3600 * 10**9
"""Producers idle this long before their journal's newest ACK are dropped from checkpoints."""

class TransactionError(ConsumerError):
    """A transaction failed; the message carries Gazette's error prefixes, e.g.
    `txnStartCommit: app.FinalizeTxn: finalize error`. The original error is the `__cause__`."""


def _wrap(prefix: str, err: BaseException) -> TransactionError:
    return TransactionError(f"{prefix}: {err}")


def _cause(err: BaseException) -> BaseException:
    """The original error under TransactionErrors (raise wrapped errors `from` it)."""
    while isinstance(err, TransactionError) and err.__cause__ is not None:
        err = err.__cause__
    return err


# ---------------------------------------------------------------------------------------------
# Transactions.


Ack: TypeAlias = "AsyncAppend | asyncio.Future[Any]"
"""An ACK append of a transaction: an AsyncAppend, or (recovered intents) a future of one."""


def _ack_future(ack: Ack) -> asyncio.Future[Any]:
    return ack.future if isinstance(ack, AsyncAppend) else ack


def _failure(fut: asyncio.Future[Any]) -> BaseException | None:
    """The error of a done future (a cancellation counts as one)."""
    if fut.cancelled():
        return asyncio.CancelledError("cancelled")
    return fut.exception()


def finished_operation(err: BaseException | None = None) -> OpFuture:
    """A resolved OpFuture (Gazette's client.FinishedOperation): done, failed with `err` if given."""
    fut: OpFuture = asyncio.get_running_loop().create_future()
    if err is None:
        fut.set_result(None)
    elif isinstance(err, Exception):
        fut.set_exception(err)
        fut.add_done_callback(lambda f: f.exception())  # Retrieved: a caller may never look.
    else:
        fut.cancel()
    return fut


@dataclasses.dataclass(eq=False)
class Transaction:
    """One consumer transaction (Gazette's `transaction`). Durations are -1 once elapsed."""

    min_dur: int = 0
    max_dur: int = 0
    wait_for_ack: bool = True
    """Keep reading, before max_dur, while a sequence begun in this transaction awaits its ACK."""
    barrier: asyncio.Future[Any] | None = None
    """The prior transaction's next barrier to resolve (commit, then each ACK); None once it is done."""
    channel: MessageChannel | None = None
    """Where envelopes come from; None once closed, once max_dur elapsed, or after a deferral."""
    consumed_count: int = 0
    consumed_bytes: int = 0
    checkpoint: cpb.Checkpoint = dataclasses.field(default_factory=cpb.Checkpoint)
    """The checkpoint this transaction commits (set by txn_start_commit)."""
    commit_barrier: OpFuture | None = None
    acks: list[Ack] = dataclasses.field(default_factory=list)

    prev_prepare_done_at: int | None = None
    began_at: int | None = None
    """When its first message was consumed."""
    stalled_at: int | None = None
    """When max_dur elapsed with the prior transaction unfinished (else = prepare_began_at)."""
    prepare_began_at: int | None = None
    prepare_done_at: int | None = None
    committed_at: int | None = None
    acked_at: int | None = None

    @property
    def phase(self) -> TxnPhase:
        if self.acked_at is not None:
            return TxnPhase.DONE
        if self.committed_at is not None:
            return TxnPhase.ACKNOWLEDGING
        if self.prepare_done_at is not None:
            return TxnPhase.COMMITTING
        if self.prepare_began_at is not None:
            return TxnPhase.PREPARING
        if self.stalled_at is not None:
            return TxnPhase.STALLED
        if self.began_at is not None:
            return TxnPhase.CONSUMING
        return TxnPhase.NOT_RUNNING


ReplayFunc: TypeAlias = Callable[[str, int, int], Awaitable[Sequence[Envelope[Any]]]]
"""Reads the read-uncommitted envelopes of journal bytes [begin, end) (Gazette's
MessageProducer.ReplayRange); the default reads them from the broker."""

HintsFunc: TypeAlias = Callable[[], Awaitable[None]]
"""Builds and stores the recovery log's recorded hints (BuildHints + storeRecordedHints)."""


def recovery_log(spec: cpb.ShardSpec) -> str:
    """The shard's recovery log journal (ShardSpec.RecoveryLog()), or "" if it has none."""
    return f"{spec.recovery_log_prefix}/{spec.id}" if spec.recovery_log_prefix else ""


class Transactions:
    """Runs a primary shard's transactions. Each step is a method a test can drive alone.

    `publish_clock_delta_ns` is added to the wall-clock time the publisher's Clock is moved to
    when a transaction begins (Gazette's Service.PublishClockDelta); it may be changed at any time.
    """

    def __init__(
        self,
        shard: Shard,
        app: Application,
        store: Store,
        sequencer: Sequencer,
        publisher: Publisher,
        timer: TxnTimer,
        progress: ProgressFunc | None = None,
        *,
        append_service: AppendService | None = None,
        replay: ReplayFunc | None = None,
        publish_clock_delta_ns: int = 0,
    ) -> None:
        self.shard = shard
        self.app = app
        self.store = store
        self.sequencer = sequencer
        self.publisher = publisher
        self.timer = timer
        self.progress: ProgressFunc = progress if progress is not None else (lambda _r, _p: None)
        self.append_service = publisher.append_service if append_service is None else append_service
        self.replay: ReplayFunc = replay if replay is not None else self._read_replay
        self.publish_clock_delta_ns = publish_clock_delta_ns
        self._specs: dict[str, pb.JournalSpec] = {}
        self._counters: ShardCounters | None = None

    # -- the loop ---------------------------------------------------------------------------

    async def run(
        self,
        checkpoint: cpb.Checkpoint,
        channel: MessageChannel,
        hints: asyncio.Event | None = None,
        store_hints: HintsFunc | None = None,
    ) -> None:
        """Run transactions until `channel` closes and drains (then the last one is fully
        committed and acknowledged, and this returns), or one fails (TransactionError).

        `checkpoint` was recovered from the store: its ACK intents are appended first. When
        `hints` is set (by a ticker), it is cleared and `store_hints` runs between transactions.
        """
        started = self.timer.now()
        prev = Transaction(
            checkpoint=checkpoint,
            commit_barrier=finished_operation(),
            prev_prepare_done_at=started,
            began_at=started,
            stalled_at=started,
            prepare_began_at=started,
            prepare_done_at=started,
        )
        self.acknowledge_recovered(prev, checkpoint)

        while True:
            if hints is not None and hints.is_set():
                hints.clear()
                if store_hints is not None:
                    try:
                        await store_hints()
                    except Exception as e:
                        raise _wrap("storeRecordedHints", e) from _cause(e)
                continue
            txn = self.txn_init(prev, channel)
            await self.txn_run(txn, prev)
            if txn.consumed_count == 0:
                return  # The channel closed and drained.
            prev = txn

    def acknowledge_recovered(self, prev: Transaction, checkpoint: cpb.Checkpoint) -> None:
        """Append (again) the ACK intents of a recovered checkpoint, as `prev`'s ACKs.

        An intent for a journal that no longer exists is logged and discarded; another failure
        fails the first transaction with `prev.ack: writing recovered ACK intent for journal J: ...`.
        """
        for journal, intent in checkpoint.ack_intents.items():
            try:
                aa: AsyncAppend | BaseException = self.append_service.append(journal, bytes(intent))
            except Exception as e:
                aa = e  # E.g. an invalid journal name: fails like a failed append.
            prev.acks.append(asyncio.ensure_future(self._recovered_ack(journal, aa)))

    @staticmethod
    async def _recovered_ack(journal: str, aa: AsyncAppend | BaseException) -> None:
        try:
            if isinstance(aa, BaseException):
                raise aa
            await aa
        except JournalNotFound:
            log.warning("discarding recovered ACK-intent of non-existent journal", extra={"journal": journal})
        except Exception as e:
            raise TransactionError(f"writing recovered ACK intent for journal {journal}: {e}") from e

    def txn_init(self, prev: Transaction, channel: MessageChannel | None) -> Transaction:
        """A new transaction following `prev`, reading `channel`, with the spec's durations."""
        spec = self.shard.spec
        assert prev.commit_barrier is not None, "the prior transaction never started to commit"
        return Transaction(
            min_dur=spec.min_txn_duration.ToNanoseconds(),
            max_dur=spec.max_txn_duration.ToNanoseconds(),
            wait_for_ack=not spec.disable_wait_for_ack,
            barrier=prev.commit_barrier,
            channel=channel,
            prev_prepare_done_at=prev.prepare_done_at,
        )

    async def txn_run(self, txn: Transaction, prev: Transaction) -> None:
        """Step `txn` until it starts to commit (or, having consumed nothing, its channel drained).

        If it began, the application's `finished_txn` gets its commit barrier, or a failed
        future of its error.
        """
        error: BaseException | None = None
        try:
            steps = 0
            while True:
                # The steps that need no waiting go by txn_steps_ready; txn_step takes the others.
                limit = YIELD_EVERY_STEPS - steps % YIELD_EVERY_STEPS
                taken = await self.txn_steps_ready(txn, prev, limit)
                steps += taken
                if taken != limit:
                    if await self.txn_step(txn, prev):
                        break
                    steps += 1
                if steps % YIELD_EVERY_STEPS == 0:
                    # A step suspends only when it waits for an event, so while input is queued
                    # the loop would starve the readers, the store's commit and the ACK appends.
                    await asyncio.sleep(0)
        except BaseException as e:
            error = e
            raise
        finally:
            finished = getattr(self.app, "finished_txn", None)
            if finished is not None and txn.began_at is not None:
                if error is None and txn.commit_barrier is not None:
                    finished(self.shard, self.store, txn.commit_barrier)
                else:
                    finished(self.shard, self.store, finished_operation(error))

    # -- one step ---------------------------------------------------------------------------

    async def txn_steps_ready(self, txn: Transaction, prev: Transaction, limit: int) -> int:
        """Take up to `limit` steps of `txn` while each is one txn_step would take without waiting,
        consuming or reading an envelope (or handling a tick). Returns the steps taken.

        The same transitions as txn_step's, in the same order (the timer, then a resolved barrier
        of the prior transaction, then the channel), without its dispatch: the loop of a shard
        reading as fast as it can is mostly these, also while the prior transaction commits.
        """
        sequencer = self.sequencer
        steps = 0
        while steps < limit and (channel := txn.channel) is not None:
            if sequencer.dequeued is not None:
                steps += 1
                tick = self.timer.poll()
                if tick is not None:
                    self.txn_tick(txn, tick)
                else:
                    await self.txn_consume(txn)
                continue
            if not channel._len or ((barrier := txn.barrier) is not None and barrier.done()):
                break  # To wait, to commit, or to resolve the barrier: txn_step's part.
            items = channel.take(limit - steps)
            try:
                steps += await self._txn_read_run(txn, prev, items, limit - steps)
            finally:
                channel.put_back(items)  # What the run left unread (usually nothing).
        return steps

    async def _txn_read_run(self, txn: Transaction, prev: Transaction, items: list[Any], limit: int) -> int:
        """txn_steps_ready's steps over `items`, taken from the channel: read each (with the timer
        polled first), and consume it in the same pass when the sequencer commits it alone (the
        usual message); otherwise, and at a tick or the transaction's first message, stop for
        txn_steps_ready to go on. Each item read is removed from `items`; the rest go back."""
        dequeue_lone, poll_timer = self.sequencer.dequeue_lone, self.timer.poll
        steps = read = 0
        try:
            for item in items:
                if steps == limit or ((barrier := txn.barrier) is not None and barrier.done()):
                    break
                steps += 1
                tick = poll_timer()
                if tick is not None:
                    self.txn_tick(txn, tick)
                    break
                read += 1
                if type(item) is not Envelope or not dequeue_lone(item):
                    # Anything but the usual message: txn_read's, in full.
                    if self.txn_read_sync(txn, prev, item):
                        await self.txn_replay()
                    break
                if not txn.consumed_count or steps == limit:
                    break  # The transaction's first message is txn_consume's part, next.
                # Consumed at once, as the next step: nothing was awaited since the timer was
                # polled, so it cannot have fired since (txn_consume less its first-message part).
                steps += 1
                if not await self.txn_consume_message(txn, item) or txn.channel is None:
                    break
        finally:
            del items[:read]
        return steps

    def txn_blocks(self, txn: Transaction) -> bool:
        """Whether the next step waits for an event rather than committing on an input stall."""
        if txn.barrier is not None:
            return True  # The prior transaction hasn't committed and acknowledged.
        if txn.channel is None and txn.consumed_count == 0:
            return False  # Drained, and nothing began: nothing ever will.
        return (
            txn.consumed_count == 0
            or txn.min_dur != -1
            # A sequence begun in this transaction awaits an ACK which will hopefully come.
            or (txn.wait_for_ack and txn.channel is not None and txn.max_dur != -1 and self.sequencer.has_pending())
        )

    async def txn_step(self, txn: Transaction, prev: Transaction) -> bool:
        """Step `txn` by one event; True once it has started to commit (or has drained, empty)."""
        if txn.channel is not None and self.sequencer.dequeued is not None:
            tick = self.timer.poll()
            if tick is not None:
                self.txn_tick(txn, tick)
            else:
                await self.txn_consume(txn)
            return False

        if self.txn_blocks(txn):
            while (event := self._poll_events(txn, barrier=True)) is None:
                await self._wait_any(txn)
        else:
            event = self._poll_events(txn, barrier=False)

        if event is not None:
            kind, value = event
            if kind is _TICK:
                assert isinstance(value, int)
                self.txn_tick(txn, value)
            elif kind is _BARRIER:
                self.txn_barrier_resolved(txn, prev)
            else:
                assert not isinstance(value, int)
                await self.txn_read(txn, prev, value)
            return False

        # The input stalled.
        if txn.consumed_count == 0:
            return True  # The channel closed and drained.
        try:
            checkpoint = await self.txn_start_commit(txn)
        except Exception as e:
            raise _wrap("txnStartCommit", e) from _cause(e)
        try:
            self.txn_acknowledge(txn, checkpoint)
        except Exception as e:
            raise _wrap("txnAcknowledge", e) from _cause(e)
        if txn.max_dur != -1:
            self.timer.stop()  # Still running: stop it (and drop a tick not yet received).
        return True

    def _poll_events(
        self, txn: Transaction, *, barrier: bool
    ) -> tuple[_Event, int | Envelope[Any] | Exception | Marker] | None:
        """The first ready event, without blocking: the timer, the prior barrier, then the channel."""
        tick = self.timer.poll()
        if tick is not None:
            return _TICK, tick
        if barrier and txn.barrier is not None and txn.barrier.done():
            return _BARRIER, CLOSED
        if txn.channel is not None:
            item = txn.channel.poll()
            if item is not EMPTY:
                return _READ, item
        return None

    async def _wait_any(self, txn: Transaction) -> None:
        """Block until the timer fired, the prior barrier resolved, or the channel is readable."""
        if (txn.barrier is not None and txn.barrier.done()) or (
            txn.channel is not None and (len(txn.channel) or txn.channel.closed)
        ):
            return
        await self._wait_watching(txn, self.timer.watch)

    @staticmethod
    async def _wait_watching(txn: Transaction, watch_timer: Callable[[asyncio.Future[None] | None], None]) -> None:
        """_wait_any on one future, which the timer, the channel and the barrier resolve."""
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        wake = functools.partial(resolve_watcher, woken)
        channel, barrier = txn.channel, txn.barrier
        watch_timer(woken)
        if channel is not None:
            channel.watch(woken)
        if barrier is not None:
            barrier.add_done_callback(wake)
        try:
            await woken
        finally:
            watch_timer(None)
            if channel is not None:
                channel.watch(None)
            if barrier is not None:
                barrier.remove_done_callback(wake)

    # -- handlers ---------------------------------------------------------------------------

    async def txn_read(
        self, txn: Transaction, prev: Transaction, item: Envelope[Any] | Exception | Marker
    ) -> None:
        """Handle what the channel gave: its close, a reader's error, or an envelope to sequence."""
        if self.txn_read_sync(txn, prev, item):
            await self.txn_replay()

    def txn_read_sync(self, txn: Transaction, prev: Transaction, item: Envelope[Any] | Exception | Marker) -> bool:
        """txn_read up to a replay: True if the sequencer needs one (`txn_replay`) to step."""
        if item is CLOSED:
            txn.channel = None  # Closed: never select it again.
            return False
        if isinstance(item, Exception):
            raise _wrap("readMessage", item) from _cause(item)
        assert isinstance(item, Envelope)
        return self.txn_sequenced(txn, prev, item, self.sequencer.queue_uncommitted(item))

    def txn_sequenced(self, txn: Transaction, prev: Transaction, env: Envelope[Any], outcome: QueueOutcome) -> bool:
        """Act on the sequencer's `outcome` of `env`: True if it needs a replay (`txn_replay`) to step."""
        if outcome.commits:
            if outcome.needs_replay:
                return True
            return self.txn_step_sequencer()
        if outcome is _CONTINUE_BEGIN_SPAN or outcome is _CONTINUE_EXTEND_SPAN:
            return False  # A commit or a rollback will follow.

        # A duplicate (ACK_ROLLBACK, *_ALREADY_ACKED, CONTINUE_TXN_CLOCK_LARGER): nothing may follow it.
        if txn.consumed_count != 0:
            return False  # The transaction's commit reports the progress.
        if txn.barrier is not None:
            # The prior transaction is still committing: extend its checkpoint, for progress only
            # (the persisted checkpoint is already serialized).
            prev.checkpoint.sources[env.journal].read_through = env.end
        else:
            # Idle: report it now, or a Stat of this offset could wait forever.
            self.progress({env.journal: env.end}, {})
        return False

    def txn_step_sequencer(self) -> bool:
        """Step the sequencer to the first envelope of a committed sequence (minimally the
        committing envelope itself). Returns False: no replay is needed."""
        try:
            self.sequencer.step()
        except Exception as e:
            raise _wrap("initial sequencer.Step", e) from _cause(e)
        return False

    async def txn_replay(self) -> None:
        """Read the sequence whose start left the sequencer's ring, and step to its first envelope."""
        rng = self.sequencer.replay_range()
        try:
            replayed = await self.replay(rng.journal, rng.begin, rng.end)
        except Exception as e:
            raise _wrap("initial sequencer.Step: replay reader", e) from _cause(e)
        self.sequencer.start_replay(iter(replayed))
        self.txn_step_sequencer()

    async def txn_consume(self, txn: Transaction) -> None:
        """Consume the dequeued message; the transaction begins with its first."""
        env = self.sequencer.dequeued
        assert env is not None
        if txn.consumed_count == 0:
            begin = getattr(self.app, "begin_txn", None)
            if begin is not None:
                try:
                    await begin(self.shard, self.store)
                except Exception as e:
                    raise _wrap("app.BeginTxn", e) from _cause(e)
            txn.began_at = self.timer.now()
            self.timer.reset(txn.min_dur)
            self.publisher.clock.update(txn.began_at + self.publish_clock_delta_ns)

        await self.txn_consume_message(txn, env)

    async def txn_consume_message(self, txn: Transaction, env: Envelope[Any]) -> bool:
        """The application consumes `env`, the dequeued message, in a transaction that began: then
        txn_consumed, else txn_consume_failed. Whether it was consumed."""
        try:
            if (pending := self.app.consume_message(self.shard, self.store, env, self.publisher)) is not None:
                await pending  # A coroutine: consume_message is `async def`.
        except Exception as e:
            self.txn_consume_failed(txn, e)
            return False
        self.txn_consumed(txn, env)
        return True

    def txn_consume_failed(self, txn: Transaction, error: Exception) -> None:
        """The application's consume_message raised `error`: a deferral ends the transaction's reading
        (the message stays dequeued for the next), anything else fails the transaction."""
        if isinstance(error, DeferToNextTransaction):
            if txn.consumed_count == 0:
                raise TransactionError(
                    "consumer transaction is empty, but application deferred the first message"
                ) from error
            txn.channel = None  # Stop reading; the message stays dequeued for the next transaction.
            return
        raise _wrap("app.ConsumeMessage", error) from _cause(error)

    def txn_consumed(self, txn: Transaction, env: Envelope[Any]) -> None:
        """Count the consumed `env` and step the sequencer past it."""
        txn.consumed_count += 1
        txn.consumed_bytes += env.end - env.begin
        try:
            self.sequencer.step()
        except Exception as e:
            raise _wrap("sequencer.Step", e) from _cause(e)

    def txn_tick(self, txn: Transaction, tick: int) -> None:
        """The timer fired at `tick`: min_dur elapsed (re-arm for max_dur), or max_dur did (stop reading)."""
        began_at = txn.began_at
        if began_at is None or tick < began_at + txn.min_dur:
            raise RuntimeError("unexpected tick")
        if txn.min_dur == -1 and tick < began_at + txn.max_dur:
            raise RuntimeError("unexpected tick")

        txn.min_dur = -1
        if tick < began_at + txn.max_dur:
            self.timer.reset(began_at + txn.max_dur - tick)
            return
        txn.max_dur = -1
        txn.channel = None  # Stop reading messages.
        if txn.barrier is not None:
            txn.stalled_at = tick  # Full, but the prior transaction hasn't finished: stalled.

    def txn_barrier_resolved(self, txn: Transaction, prev: Transaction) -> None:
        """The prior transaction's barrier resolved: note its commit, then await each of its ACKs;
        when all have, it is done and its progress is reported."""
        if prev.acked_at is not None:
            raise RuntimeError("unexpected txnBarrierResolved")
        now = self.timer.now()

        if prev.committed_at is None:
            assert prev.commit_barrier is not None
            err = _failure(prev.commit_barrier)
            if err is not None:
                raise _wrap("store.StartCommit", err) from _cause(err)
            prev.committed_at = now

        txn.barrier = None
        for ack in prev.acks:
            fut = _ack_future(ack)
            if not fut.done():
                if txn.barrier is None:
                    txn.barrier = fut
                continue
            err = _failure(fut)
            if err is not None:
                raise _wrap("prev.ack", err) from _cause(err)
        if txn.barrier is not None:
            return  # An ACK is still in flight.

        prev.acked_at = now
        counters = self._counters
        if counters is None or counters.fqn != self.shard.fqn:
            counters = self._counters = ShardCounters(self.shard.fqn)
        record_metrics(counters, self.shard.id, prev)
        read_through = {journal: source.read_through for journal, source in prev.checkpoint.sources.items()}
        publish_at = {ack.journal: ack.result().commit.end for ack in prev.acks if isinstance(ack, AsyncAppend)}
        self.progress(read_through, publish_at)

    async def txn_start_commit(self, txn: Transaction) -> cpb.Checkpoint:
        """Finalize the transaction and start the store's commit of its checkpoint, after its appends."""
        txn.prepare_began_at = self.timer.now()
        if txn.stalled_at is None:
            txn.stalled_at = txn.prepare_began_at  # No time spent stalled.

        try:
            await self.app.finalize_txn(self.shard, self.store, self.publisher)
        except Exception as e:
            raise _wrap("app.FinalizeTxn", e) from _cause(e)

        offsets, states = self.sequencer.checkpoint(SEQUENCER_PRUNE_HORIZON_NS)
        intents = self.publisher.build_ack_intents()
        txn.checkpoint = build_checkpoint(offsets, states, intents)

        # The commit waits for every write of the transaction (but those to the shard's own
        # recovery log): it must not persist ACK intents or offsets past messages not yet written.
        pending = self.append_service.pending_except(recovery_log(self.shard.spec))
        wait_for: list[asyncio.Future[Any]] = [aa.future for aa in pending]
        barrier = self.store.start_commit(self.shard, txn.checkpoint, wait_for)
        # A barrier already failed is a synchronous error: the application must not consume more.
        if barrier.done():
            err = _failure(barrier)
            if err is not None:
                raise _wrap("store.StartCommit", err) from _cause(err)
        txn.commit_barrier = barrier
        txn.prepare_done_at = self.timer.now()
        return txn.checkpoint

    def txn_acknowledge(self, txn: Transaction, checkpoint: cpb.Checkpoint) -> None:
        """Queue the checkpoint's ACK intents, each appended only after the commit barrier resolved."""
        assert txn.commit_barrier is not None
        for journal, intent in checkpoint.ack_intents.items():
            try:
                aa = self.append_service.append(journal, bytes(intent), dependencies=[txn.commit_barrier])
            except Exception as e:
                raise _wrap("writing ACK", e) from _cause(e)
            txn.acks.append(aa)
        self.append_service.release()  # The ACKs go as soon as the commit does, lingering for nothing.

    # -- support ----------------------------------------------------------------------------

    async def _read_replay(self, journal: str, begin: int, end: int) -> list[Envelope[Any]]:
        spec = self._specs.get(journal)
        if spec is None:
            spec = self._specs[journal] = await fetch_journal_spec(self.shard.journal_client, journal)
        factory = message_factory(self.app, spec)
        return [
            env
            async for env in read_uncommitted(
                self.shard.journal_client, journal, begin, factory, block=True, end_offset=end, spec=spec
            )
        ]


class _Event(enum.Enum):
    TICK = "tick"
    BARRIER = "barrier"
    READ = "read"


# Module-level aliases: an enum member looked up on its class costs more than the comparison.
_TICK, _BARRIER, _READ = _Event.TICK, _Event.BARRIER, _Event.READ
_CONTINUE_BEGIN_SPAN = QueueOutcome.CONTINUE_BEGIN_SPAN
_CONTINUE_EXTEND_SPAN = QueueOutcome.CONTINUE_EXTEND_SPAN


async def run_transactions(
    shard: Shard,
    app: Application,
    store: Store,
    checkpoint: cpb.Checkpoint,
    channel: MessageChannel,
    sequencer: Sequencer,
    publisher: Publisher,
    *,
    timer: TxnTimer | None = None,
    progress: ProgressFunc | None = None,
    hints: asyncio.Event | None = None,
    store_hints: HintsFunc | None = None,
    replay: ReplayFunc | None = None,
    publish_clock_delta_ns: int = 0,
) -> None:
    """Run the shard's transactions from a recovered `checkpoint` until `channel` closes and drains
    (Gazette's runTransactions). See `Transactions.run`."""
    machine = Transactions(
        shard, app, store, sequencer, publisher, LoopTimer() if timer is None else timer, progress,
        replay=replay, publish_clock_delta_ns=publish_clock_delta_ns,
    )
    await machine.run(checkpoint, channel, hints, store_hints)


