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
txn_step's dispatch; readers hand envelopes over a list at a time (`MessageChannel.send_all`).

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
import collections
import contextlib
import dataclasses
import enum
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Protocol, TypeAlias

from prometheus_client import Counter

from broker.client import AppendService, AsyncAppend, JournalClient, JournalNotFound
from broker.protocol import pb
from consumer.application import Application, DeferToNextTransaction
from consumer.checkpoint import build_checkpoint
from consumer.errors import ConsumerError
from consumer.message import (
    Envelope,
    Publisher,
    QueueOutcome,
    Sequencer,
    fetch_journal_spec,
    read_uncommitted,
    read_uncommitted_batches,
)
from consumer.protocol import pb as cpb
from consumer.shard import Shard
from consumer.store import OpFuture, Store

log = logging.getLogger(__name__)

DEFAULT_READ_CHANNEL_SIZE: Final = 256
"""Capacity of a shard's MessageChannel when its spec's `read_channel_size` is 0. Gazette's is 8192,
for goroutines decoding in parallel; here readers and transactions share one thread, and envelopes
decoded far ahead are cold when consumed: bench_consumer ran 79k msg/s at 8192, 89k at 256."""
DEFAULT_RING_BUFFER_SIZE: Final = 8192
"""Ring size of a shard's Sequencer when its spec's `ring_buffer_size` is 0."""
YIELD_EVERY_STEPS: Final = 256
"""Steps of a transaction between yields to the event loop while input is queued (two steps a
message): in bench_consumer 256 beat 128 by 3-4% (512 starves the readers in-process)."""
SEQUENCER_PRUNE_HORIZON_NS: Final = 24 * 3600 * 10**9
"""Producers idle this long before their journal's newest ACK are dropped from checkpoints."""

SHARD_TXN_TOTAL = Counter("gazette_shard_transactions_total", "Total number of consumer transactions.", ["shard"])
SHARD_READ_MSGS_TOTAL = Counter(
    "gazette_shard_read_messages_total",
    "Total number of messages processed by completed consumer transactions.",
    ["shard"],
)
SHARD_READ_BYTES_TOTAL = Counter(
    "gazette_shard_read_bytes_total",
    "Total byte-length of messages processed by completed consumer transactions.",
    ["shard"],
)
SHARD_PHASE_SECONDS_TOTAL = Counter(
    "gazette_shard_phase_seconds_total", "Cumulative number of seconds processing transactions.",
    ["shard", "phase", "type"],
)


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
# The message channel.


class _Marker(enum.Enum):
    EMPTY = "empty"
    CLOSED = "closed"


EMPTY: Final = _Marker.EMPTY
"""`MessageChannel.poll()`: nothing to receive now."""
CLOSED: Final = _Marker.CLOSED
"""`MessageChannel.poll()`: the channel is closed and drained; nothing will ever come."""

EnvelopeOrError: TypeAlias = "Envelope[Any] | Exception"
"""An item of a MessageChannel: a read-uncommitted envelope, or the error that ended a reader."""


class ChannelClosed(ConsumerError):
    """Sending to a closed MessageChannel."""


class WatchedEvent(asyncio.Event):
    """An asyncio.Event that also resolves the one future watching it (`watch`) when it is set: the
    transaction loop waits for the first of its timer, its channel and the prior barrier on one
    future, where a task per Event and asyncio.wait cost it 37 us a wait against 11. (A TxnTimer's
    `watch` can be this Event's.)"""

    _watcher: asyncio.Future[None] | None = None

    def set(self) -> None:
        super().set()
        _resolve(self._watcher)

    def watch(self, fut: asyncio.Future[None] | None) -> None:
        """Resolve `fut` when set (at once if set already); None stops watching."""
        self._watcher = fut
        if self.is_set():
            _resolve(fut)


def _resolve(fut: asyncio.Future[Any] | None, _done: object = None) -> None:
    if fut is not None and not fut.done():
        fut.set_result(None)


class MessageChannel:
    """A bounded FIFO of envelopes (or reader errors) from readers to the transaction loop, which can close.

    `poll()` never blocks: it returns the next item, `EMPTY`, or `CLOSED` once the channel is
    closed and drained. `wait()` waits until `poll()` would not return `EMPTY`. Senders `send`
    one item or `send_all` a list (a reader's decoded chunk: one hand-off for many envelopes),
    waiting while the channel is full, and `close`. A list is queued whole once there is room,
    so it may fill the channel past its capacity by the list's length less one.
    """

    def __init__(self, capacity: int = DEFAULT_READ_CHANNEL_SIZE) -> None:
        self.capacity = max(capacity, 1)
        # Lists as senders queued them; poll() takes items from the first, from _pos.
        self._lists: collections.deque[Sequence[Envelope[Any] | Exception]] = collections.deque()
        self._pos = 0
        self._len = 0
        self._closed = False
        self._readable = WatchedEvent()
        self._writable = asyncio.Event()
        self._writable.set()

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return self._len

    def send_nowait(self, item: Envelope[Any] | Exception) -> None:
        """Queue `item`; raises ChannelClosed if closed, asyncio.QueueFull if full."""
        if self._closed:
            raise ChannelClosed("send on a closed MessageChannel")
        if self._len >= self.capacity:
            raise asyncio.QueueFull
        self._queue([item])

    async def send(self, item: Envelope[Any] | Exception) -> None:
        """Queue `item`, waiting while the channel is full; raises ChannelClosed if it is (or becomes) closed."""
        await self.send_all([item])

    async def send_all(self, items: Sequence[Envelope[Any] | Exception]) -> None:
        """Queue `items` (which the channel then owns), waiting while it is full; raises ChannelClosed
        if it is (or becomes) closed."""
        while not self._closed and self._len >= self.capacity:
            await self._writable.wait()
        if self._closed:
            raise ChannelClosed("send on a closed MessageChannel")
        if items:
            self._queue(items)

    def _queue(self, items: Sequence[Envelope[Any] | Exception]) -> None:
        self._lists.append(items)
        self._len += len(items)
        self._readable.set()
        if self._len >= self.capacity:
            self._writable.clear()

    def close(self) -> None:
        """No more items: once the queued ones are received, `poll()` returns CLOSED."""
        self._closed = True
        self._readable.set()
        self._writable.set()

    def take(self, limit: int) -> list[Envelope[Any] | Exception]:
        """Up to `limit` of the next items, without waiting (fewer when the first queued list has
        fewer; none when empty). `put_back` returns those left unprocessed to the front."""
        lists = self._lists
        if not lists or limit < 1:
            return []
        first, pos = lists[0], self._pos
        if pos == 0 and len(first) <= limit and type(first) is list:
            items = first  # The channel owns a list sent to it: handed on whole, not copied.
        else:
            items = list(first[pos : pos + limit])
        if pos + len(items) == len(first):
            lists.popleft()
            self._pos = 0
        else:
            self._pos = pos + len(items)
        self._on_taken(len(items))
        return items

    def put_back(self, items: list[Envelope[Any] | Exception]) -> None:
        """Return the last items the last `take` gave, unprocessed, to the front of the channel
        (with no take or poll between)."""
        if not items:
            return
        if self._pos >= len(items):
            self._pos -= len(items)  # They are still in the first list, just before _pos.
        else:
            self._lists.appendleft(items)
            self._pos = 0
        self._len += len(items)
        self._readable.set()
        if self._len >= self.capacity:
            self._writable.clear()

    def _on_taken(self, count: int) -> None:
        # Only the events this can change.
        size = self._len = self._len - count
        if size == 0 and not self._closed:
            self._readable.clear()
        if size < self.capacity <= size + count:
            self._writable.set()

    def poll(self) -> Envelope[Any] | Exception | _Marker:
        """The next item, EMPTY if none is queued, or CLOSED if none ever will be."""
        lists = self._lists
        if lists:
            first = lists[0]
            pos = self._pos
            item = first[pos]
            if pos + 1 == len(first):
                lists.popleft()
                self._pos = 0
            else:
                self._pos = pos + 1
            self._on_taken(1)
            return item
        return CLOSED if self._closed else EMPTY

    async def wait(self) -> None:
        """Wait until `poll()` would return an item or CLOSED."""
        await self._readable.wait()

    def watch(self, fut: asyncio.Future[None] | None) -> None:
        """Resolve `fut` once `poll()` would return an item or CLOSED (at once if it would now);
        None stops watching."""
        self._readable.watch(fut)


# ---------------------------------------------------------------------------------------------
# Timers.


class TxnTimer(Protocol):
    """Gazette's txnTimer {C, Reset, Stop, Now}: the one timer a transaction loop arms.

    It fires once per `reset`, delivering the time it fired at ("tick") to one `poll()`.
    """

    def reset(self, duration_ns: int) -> None:
        """Arm the timer to fire `duration_ns` from now (discarding an unreceived tick)."""
        ...

    def stop(self) -> bool:
        """Disarm the timer and discard an unreceived tick; True if it was armed and had not fired."""
        ...

    def poll(self) -> int | None:
        """Receive the tick (its time, ns) if the timer fired; None otherwise. Never blocks."""
        ...

    def watch(self, fut: asyncio.Future[None] | None) -> None:
        """Resolve `fut` once `poll()` would return a tick (at once if it would now); None stops watching."""
        ...

    def now(self) -> int:
        """The current wall-clock time, in Unix nanoseconds."""
        ...


class LoopTimer:
    """A TxnTimer on the running event loop (`loop.call_later`); `now()` is `time.time_ns()`."""

    def __init__(self, now: Callable[[], int] = time.time_ns) -> None:
        self._now = now
        self._handle: asyncio.TimerHandle | None = None
        self._tick: int | None = None
        self._fired = WatchedEvent()

    def now(self) -> int:
        return self._now()

    def reset(self, duration_ns: int) -> None:
        self.stop()
        self._handle = asyncio.get_running_loop().call_later(max(duration_ns, 0) / 1e9, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._tick = self._now()
        self._fired.set()

    def stop(self) -> bool:
        armed = self._handle is not None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._tick = None
        self._fired.clear()
        return armed

    def poll(self) -> int | None:
        tick, self._tick = self._tick, None
        if tick is not None:
            self._fired.clear()
        return tick

    def watch(self, fut: asyncio.Future[None] | None) -> None:
        self._fired.watch(fut)


# ---------------------------------------------------------------------------------------------
# Progress.

ProgressFunc: TypeAlias = Callable[[Mapping[str, int], Mapping[str, int]], None]
"""Called with updated read-through offsets (by source journal) and publish-at offsets (by
journal ACKed: the end of the ACK's append), when a transaction completes or an idle shard
reads a message that starts none."""


class ShardProgress:
    """A ProgressFunc that accumulates the shard's progress for Stat, and signals each update.

    `signal` is a future resolved at the next update (then replaced), as Gazette's
    `progress.signalCh` is closed and remade.
    """

    def __init__(self) -> None:
        self.read_through: dict[str, int] = {}
        self.publish_at: dict[str, int] = {}
        self.updates = 0
        self._signal: asyncio.Future[None] | None = None

    @property
    def signal(self) -> asyncio.Future[None]:
        """Resolves at the next update."""
        if self._signal is None:
            self._signal = asyncio.get_running_loop().create_future()
        return self._signal

    def __call__(self, read_through: Mapping[str, int], publish_at: Mapping[str, int]) -> None:
        self.read_through.update(read_through)
        self.publish_at.update(publish_at)
        self.updates += 1
        signal, self._signal = self._signal, None
        if signal is not None and not signal.done():
            signal.set_result(None)

    async def wait_for(self, read_through: Mapping[str, int]) -> None:
        """Wait until the shard has read through at least `read_through` (Stat's condition)."""
        while any(self.read_through.get(j, 0) < o for j, o in read_through.items()):
            await self.signal


# ---------------------------------------------------------------------------------------------
# Transactions.


class TxnPhase(enum.Enum):
    """Where a transaction is; values are the labels of Gazette's phase metrics."""

    NOT_RUNNING = "10-not-running"
    """No message consumed yet."""
    CONSUMING = "20-consuming"
    STALLED = "30-stalled"
    """The max duration elapsed while the prior transaction was still committing: no more reads."""
    PREPARING = "40-preparing"
    """FinalizeTxn, the checkpoint, StartCommit."""
    COMMITTING = "50-committing"
    """The store commit is in flight (the next transaction runs meanwhile)."""
    ACKNOWLEDGING = "60-acknowledging"
    """Committed; its ACK appends are in flight."""
    DONE = "done"
    """Committed and acknowledged."""


_PHASE_KINDS: Final = (
    (TxnPhase.NOT_RUNNING, "sync"), (TxnPhase.CONSUMING, "sync"), (TxnPhase.STALLED, "sync"),
    (TxnPhase.PREPARING, "sync"), (TxnPhase.COMMITTING, "async"), (TxnPhase.ACKNOWLEDGING, "async"),
)


class _ShardCounters:
    """A shard's labelled transaction counters, looked up once (`labels()` costs a lock and a
    dict lookup, at every transaction of a shard that commits hundreds a second)."""

    def __init__(self, fqn: str) -> None:
        self.fqn = fqn
        self.txns = SHARD_TXN_TOTAL.labels(fqn)
        self.messages = SHARD_READ_MSGS_TOTAL.labels(fqn)
        self.bytes = SHARD_READ_BYTES_TOTAL.labels(fqn)
        self.phases = [SHARD_PHASE_SECONDS_TOTAL.labels(fqn, phase.value, kind) for phase, kind in _PHASE_KINDS]


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
        self._counters: _ShardCounters | None = None

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
        dequeue_lone, step, poll_timer = self.sequencer.dequeue_lone, self.sequencer.step, self.timer.poll
        consume, shard, store, publisher = self.app.consume_message, self.shard, self.store, self.publisher
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
                try:
                    if (pending := consume(shard, store, item, publisher)) is not None:
                        await pending  # A coroutine: consume_message is `async def`.
                except Exception as e:
                    self.txn_consume_failed(txn, e)
                    break
                # txn_consumed, inline (a call less a message).
                txn.consumed_count += 1
                txn.consumed_bytes += item.end - item.begin
                try:
                    step()
                except Exception as e:
                    raise _wrap("sequencer.Step", e) from _cause(e)
                if txn.channel is None:
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
    ) -> tuple[_Event, int | Envelope[Any] | Exception | _Marker] | None:
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
        wake = functools.partial(_resolve, woken)
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
        self, txn: Transaction, prev: Transaction, item: Envelope[Any] | Exception | _Marker
    ) -> None:
        """Handle what the channel gave: its close, a reader's error, or an envelope to sequence."""
        if self.txn_read_sync(txn, prev, item):
            await self.txn_replay()

    def txn_read_sync(self, txn: Transaction, prev: Transaction, item: Envelope[Any] | Exception | _Marker) -> bool:
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

        try:
            if (pending := self.app.consume_message(self.shard, self.store, env, self.publisher)) is not None:
                await pending  # A coroutine: consume_message is `async def`.
        except Exception as e:
            self.txn_consume_failed(txn, e)
        else:
            self.txn_consumed(txn, env)

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
        self.record_metrics(prev)
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

    def record_metrics(self, txn: Transaction) -> None:
        """Count a completed transaction and the seconds of each of its phases."""
        counters = self._counters
        if counters is None or counters.fqn != self.shard.fqn:
            counters = self._counters = _ShardCounters(self.shard.fqn)
        counters.txns.inc()
        counters.messages.inc(txn.consumed_count)
        counters.bytes.inc(txn.consumed_bytes)
        debug = log.isEnabledFor(logging.DEBUG)
        phases: dict[str, float] = {}
        spans = (
            (txn.prev_prepare_done_at, txn.began_at), (txn.began_at, txn.stalled_at),
            (txn.stalled_at, txn.prepare_began_at), (txn.prepare_began_at, txn.prepare_done_at),
            (txn.prepare_done_at, txn.committed_at), (txn.committed_at, txn.acked_at),
        )
        for phase_seconds, (phase, _), (begin, end) in zip(counters.phases, _PHASE_KINDS, spans, strict=True):
            if begin is not None and end is not None and end > begin:
                phase_seconds.inc((end - begin) / 1e9)
                if debug:
                    phases[f"{phase.name.lower()}_ms"] = round((end - begin) / 1e6, 1)
        if debug:
            log.debug(
                "transaction metrics",
                extra={"shard": self.shard.id, "messages": txn.consumed_count, "bytes": txn.consumed_bytes, **phases},
            )

    async def _read_replay(self, journal: str, begin: int, end: int) -> list[Envelope[Any]]:
        spec = self._specs.get(journal)
        if spec is None:
            spec = self._specs[journal] = await fetch_journal_spec(self.shard.journal_client, journal)
        factory = _factory(self.app, spec)
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


def _factory(app: Application, spec: pb.JournalSpec) -> Callable[[str], Any]:
    new_message = app.new_message  # Bound once: this runs once per message read.
    return lambda _journal: new_message(spec)


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


# ---------------------------------------------------------------------------------------------
# The default reader of a shard's sources.


def start_reading_messages(
    shard: Shard, app: Application, checkpoint: cpb.Checkpoint, channel: MessageChannel
) -> list[asyncio.Task[None]]:
    """Read each source of the shard's spec into `channel`, from its checkpointed offset (at
    least the source's `min_offset`), one task per source; a reader's error is sent to the channel
    and ends that reader. Cancel the tasks to stop reading."""
    tasks = []
    for source in shard.spec.sources:
        offset = checkpoint.sources[source.journal].read_through if source.journal in checkpoint.sources else 0
        offset = max(offset, source.min_offset)
        tasks.append(
            asyncio.ensure_future(_read_source(shard.journal_client, app, source.journal, offset, channel))
        )
    return tasks


async def _read_source(
    client: JournalClient, app: Application, journal: str, offset: int, channel: MessageChannel
) -> None:
    try:
        spec = await fetch_journal_spec(client, journal)
        async for batch in read_uncommitted_batches(client, journal, offset, _factory(app, spec), spec=spec):
            await channel.send_all(batch)
    except ChannelClosed:
        return  # Nobody reads any more.
    except Exception as e:
        with contextlib.suppress(ChannelClosed):
            await channel.send(e)
