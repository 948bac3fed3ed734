"""The consumer transaction state machine against a real broker: Gazette's transaction_test.go.

Appends and reads go to a `gazette serve` of this module; the timer, the application and the
store are the test's own (a timer the test fires, an echoing application, a store that commits
in memory once the transaction's appends resolved). makeShard: min 1 ms, max 10 ms.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from broker.client import AppendService, AsyncAppend, JournalClient
from consumer.application import DeferToNextTransaction
from consumer.channel import CLOSED, EMPTY, ChannelClosed, MessageChannel, WatchedEvent
from consumer.checkpoint import flatten_producer_states, flatten_read_through
from consumer.message import (
    ZERO_UUID,
    Clock,
    Envelope,
    Flags,
    JournalProducer,
    ProducerState,
    Publisher,
    QueueOutcome,
    Sequencer,
    build_uuid,
    get_flags,
    new_producer_id,
    read_committed,
    read_uncommitted,
)
from consumer.progress import ShardProgress
from consumer.protocol import pb as cpb
from consumer.source_reader import start_reading_messages
from consumer.store import OpFuture
from consumer.timer import LoopTimer
from consumer.transaction import Transaction, TransactionError, Transactions, finished_operation
from consumer.txn_metrics import TxnPhase
from tests.support.harness import BrokerProcess
from tests.support.journals import append_rpcs, new_journal

NDJSON = "application/x-ndjson"
MS = 1_000_000
SECOND = 1_000_000_000
MIN_DUR, MAX_DUR = 1 * MS, 10 * MS
BASE = 1_700_000_000 * SECOND
STEP_TIMEOUT = 30.0


def faketime(delta_ns: int) -> int:
    return BASE + delta_ns


# --- the test's own timer, application and store ------------------------------------------------


class FakeTimer:
    """Gazette's testTimer: the test sets `timepoint` and fires the timer with `signal()`."""

    def __init__(self) -> None:
        self.timepoint = faketime(0)
        self.reset_to: int | None = None
        self.stopped = False
        self._tick: int | None = None
        self._fired = WatchedEvent()

    def signal(self) -> None:
        self._tick = self.timepoint
        self._fired.set()

    def reset(self, duration_ns: int) -> None:
        self.reset_to = duration_ns
        self.stopped = False
        self._tick = None
        self._fired.clear()

    def stop(self) -> bool:
        self.stopped = True
        self._tick = None
        self._fired.clear()
        return True

    def poll(self) -> int | None:
        tick, self._tick = self._tick, None
        self._fired.clear()
        return tick

    def watch(self, fut: asyncio.Future[None] | None) -> None:
        self._fired.watch(fut)

    def now(self) -> int:
        return self.timepoint


@dataclasses.dataclass
class TestMessage:
    __test__ = False

    UUID: uuid.UUID = ZERO_UUID
    Key: str = ""
    Value: str = ""

    def get_uuid(self) -> uuid.UUID:
        return self.UUID

    def set_uuid(self, value: uuid.UUID) -> None:
        self.UUID = value

    def new_acknowledgement(self, journal: str) -> TestMessage:
        return TestMessage()


@dataclasses.dataclass
class Shard:
    id: str
    fqn: str
    spec: cpb.ShardSpec
    journal_client: JournalClient


class MemoryStore:
    """Commits the application's pending state with the checkpoint, once `wait_for` resolved."""

    def __init__(self) -> None:
        self.pending: dict[str, str] = {}
        self.state: dict[str, str] = {}
        self.checkpoint = cpb.Checkpoint()
        self.commits = 0
        self.start_commit_error: Exception | None = None

    async def restore_checkpoint(self, shard: Any) -> cpb.Checkpoint:
        return self.checkpoint

    def start_commit(self, shard: Any, checkpoint: cpb.Checkpoint, wait_for: Sequence[asyncio.Future[Any]]) -> OpFuture:
        if self.start_commit_error is not None:
            return finished_operation(self.start_commit_error)
        pending = dict(self.pending)

        async def commit() -> None:
            await asyncio.gather(*wait_for)
            self.state.update(pending)
            self.checkpoint = checkpoint
            self.commits += 1

        return asyncio.ensure_future(commit())

    async def destroy(self) -> None:
        pass


class EchoApp:
    """Gazette's testApplication: stores Key=Value and echoes each message to `echo_out`."""

    def __init__(self, echo_out: str) -> None:
        self.echo_out = echo_out
        self.begin_error: Exception | None = None
        self.consume_error: Exception | None = None
        self.finalize_error: Exception | None = None
        self.finished: list[OpFuture] = []

    async def new_store(self, shard: Any, recorder: Any) -> MemoryStore:
        return MemoryStore()

    def new_message(self, spec: Any) -> TestMessage:
        return TestMessage()

    async def begin_txn(self, shard: Any, store: Any) -> None:
        if self.begin_error is not None:
            raise self.begin_error

    async def consume_message(self, shard: Any, store: Any, envelope: Envelope[Any], publisher: Publisher) -> None:
        self.consume(store, envelope, publisher)

    def consume(self, store: Any, envelope: Envelope[Any], publisher: Publisher) -> None:
        if self.consume_error is not None:
            raise self.consume_error
        msg = envelope.message
        if get_flags(msg.UUID) == Flags.ACK_TXN:
            return
        store.pending[msg.Key] = msg.Value
        publisher.publish_uncommitted(lambda _m: (self.echo_out, NDJSON), TestMessage(Key=msg.Key, Value=msg.Value))

    async def finalize_txn(self, shard: Any, store: Any, publisher: Publisher) -> None:
        if self.finalize_error is not None:
            raise self.finalize_error

    def finished_txn(self, shard: Any, store: Any, committed: OpFuture) -> None:
        self.finished.append(committed)


class PlainEchoApp(EchoApp):
    """EchoApp with a plain (not `async def`) consume_message, which the loop calls without a coroutine."""

    def consume_message(  # type: ignore[override]
        self, shard: Any, store: Any, envelope: Envelope[Any], publisher: Publisher
    ) -> None:
        self.consume(store, envelope, publisher)


# --- fixtures ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Fixture:
    client: JournalClient
    source_a: str
    echo_out: str
    shard: Shard
    app: EchoApp
    store: MemoryStore
    pub: Publisher
    """The test's own publisher of source messages."""
    timer: FakeTimer
    progress: ShardProgress
    machine: Transactions
    channel: MessageChannel

    def to_source(self, _msg: object) -> tuple[str, str]:
        return self.source_a, NDJSON

    def write_txn_pub_acks(self) -> list[AsyncAppend]:
        """Commit the test publisher's transaction: append its ACKs."""
        _intents, appends = self.pub.commit()
        return appends

    async def buffered(self, channel: MessageChannel | None = None) -> None:
        """Wait until the reader put an item into the channel (Go's `msgCh <- <-msgCh`)."""
        channel = self.channel if channel is None else channel
        async with asyncio.timeout(STEP_TIMEOUT):
            while not len(channel):
                await asyncio.sleep(0.005)

    def with_loop_timer(self) -> Transactions:
        """The fixture's machine, on a real LoopTimer (as Gazette's runTransactions makes its own)."""
        m = self.machine
        return Transactions(self.shard, self.app, self.store, m.sequencer, m.publisher, LoopTimer(), self.progress)

    async def step(self, txn: Transaction, prev: Transaction) -> bool:
        async with asyncio.timeout(STEP_TIMEOUT):
            return await self.machine.txn_step(txn, prev)

    async def must_step(self, txn: Transaction, prev: Transaction) -> bool:
        """Gazette's mustTxnStep: one step, then consume every message already dequeued."""
        done = await self.step(txn, prev)
        while txn.channel is not None and self.machine.sequencer.dequeued is not None:
            done = await self.step(txn, prev)
        return done

    async def verify_store_and_echo_out(self, txn: Transaction, expect: dict[str, str]) -> None:
        """The store committed `expect`, and echo/out's committed messages say the same."""
        async with asyncio.timeout(STEP_TIMEOUT):
            assert txn.commit_barrier is not None
            await txn.commit_barrier
            for ack in txn.acks:
                await ack
            echoed: dict[str, str] = {}
            async for env in read_committed(self.client, self.echo_out, 0, lambda _j: TestMessage(), block=False):
                if get_flags(env.uuid) != Flags.ACK_TXN:
                    echoed[env.message.Key] = env.message.Value
        assert self.store.state == expect
        assert echoed == expect


def make_shard(client: JournalClient, source: str) -> Shard:
    spec = cpb.ShardSpec(id="shard-A")
    spec.sources.add(journal=source)
    spec.min_txn_duration.FromNanoseconds(MIN_DUR)
    spec.max_txn_duration.FromNanoseconds(MAX_DUR)
    return Shard("shard-A", "/consumer.test/items/shard-A", spec, client)


@pytest.fixture
async def tf(broker: BrokerProcess) -> AsyncIterator[Fixture]:
    async with JournalClient(broker.url) as client, AppendService(client) as svc, AppendService(client) as ajc:
        source_a = await new_journal(client, "source/A", content_type=NDJSON)
        echo_out = await new_journal(client, "echo/out", content_type=NDJSON)
        shard = make_shard(client, source_a)
        app = EchoApp(echo_out)
        store = MemoryStore()
        timer = FakeTimer()
        progress = ShardProgress()
        channel = MessageChannel(1)
        machine = Transactions(
            shard, app, store, Sequencer({}, buffer=12), Publisher(ajc, Clock()), timer, progress
        )
        fixture = Fixture(client, source_a, echo_out, shard, app, store, Publisher(svc), timer, progress, machine,
                          channel)
        readers = start_reading_messages(shard, app, cpb.Checkpoint(), channel)
        try:
            yield fixture
        finally:
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)


def prior_txn(timer: FakeTimer) -> tuple[Transaction, OpFuture, OpFuture]:
    """A prior transaction whose commit and one ACK the test resolves."""
    loop = asyncio.get_running_loop()
    commit: OpFuture = loop.create_future()
    ack: OpFuture = loop.create_future()
    return Transaction(commit_barrier=commit, acks=[ack], prepare_done_at=timer.timepoint), commit, ack


# --- Gazette's transaction tests ----------------------------------------------------------------


async def test_txn_prior_syncs_then_min_dur_elapses(tf: Fixture) -> None:
    timer, m = tf.timer, tf.machine
    prior, prior_commit, prior_ack = prior_txn(timer)
    txn = m.txn_init(prior, tf.channel)
    assert txn.prev_prepare_done_at == prior.prepare_done_at
    assert prior.committed_at is None
    assert txn.phase is TxnPhase.NOT_RUNNING and prior.phase is TxnPhase.COMMITTING

    # |prior| commits.
    timer.timepoint = faketime(500 * MS)
    prior_commit.set_result(None)
    assert not await tf.must_step(txn, prior)
    assert prior.committed_at is not None and prior.acked_at is None
    assert prior.phase is TxnPhase.ACKNOWLEDGING

    # |prior| ACKs: progress is signalled.
    signal = tf.progress.signal
    timer.timepoint = faketime(SECOND)
    prior_ack.set_result(None)
    assert not await tf.must_step(txn, prior)
    assert prior.acked_at is not None and prior.phase is TxnPhase.DONE
    assert signal.done()

    # The publish clock delta flows into the shard clock's update, below.
    m.publish_clock_delta_ns = 3600 * SECOND

    # The initial message opens the txn.
    timer.timepoint = faketime(2 * SECOND)
    tf.pub.publish_committed(tf.to_source, TestMessage(Key="key", Value="1"))
    assert not await tf.must_step(txn, prior)
    assert timer.reset_to == MIN_DUR
    assert txn.began_at is not None
    # The clock was updated, then ticked once by the echo publish.
    assert m.publisher.clock.value == Clock.at(txn.began_at + 3600 * SECOND).value + 160
    assert txn.phase is TxnPhase.CONSUMING

    # It continues to block.
    assert m.txn_blocks(txn)
    tf.pub.publish_committed(tf.to_source, TestMessage(Key="key", Value="2"))
    assert not await tf.must_step(txn, prior)

    # |minDur| elapses.
    timer.timepoint = faketime(2 * SECOND + MIN_DUR)
    timer.signal()
    assert not await tf.must_step(txn, prior)
    assert timer.reset_to == MAX_DUR - MIN_DUR

    # An additional ready message is consumed.
    assert not m.txn_blocks(txn)
    tf.pub.publish_committed(tf.to_source, TestMessage(Key="key", Value="3"))
    await tf.buffered()
    assert not await tf.must_step(txn, prior)

    # The channel stalls, and the transaction starts to commit.
    timer.timepoint = faketime(2 * SECOND + MIN_DUR + 1)
    assert await tf.must_step(txn, prior)

    assert timer.stopped
    assert txn.min_dur == -1
    assert txn.max_dur == MAX_DUR  # Did not reach maxDur.
    assert txn.channel is not None
    assert txn.consumed_count == 3
    assert len(txn.acks) == 1
    assert txn.phase is TxnPhase.COMMITTING

    await tf.verify_store_and_echo_out(txn, {"key": "3"})
    assert tf.store.checkpoint.ack_intents[tf.echo_out]
    assert tf.store.checkpoint.sources[tf.source_a].read_through > 0

    assert prior.prepare_done_at == faketime(0)
    assert prior.committed_at == faketime(500 * MS)
    assert prior.acked_at == faketime(SECOND)
    assert txn.prev_prepare_done_at == faketime(0)
    assert txn.began_at == faketime(2 * SECOND)
    assert txn.stalled_at == faketime(2 * SECOND + MIN_DUR + 1)
    assert txn.prepare_began_at == faketime(2 * SECOND + MIN_DUR + 1)
    assert txn.prepare_done_at == faketime(2 * SECOND + MIN_DUR + 1)


async def test_txn_min_dur_elapses_then_prior_syncs(tf: Fixture) -> None:
    timer, m = tf.timer, tf.machine
    prior, prior_commit, prior_ack = prior_txn(timer)
    txn = m.txn_init(prior, tf.channel)

    # The initial message opens the txn.
    tf.pub.publish_committed(tf.to_source, TestMessage(Key="key", Value="1"))
    assert not await tf.must_step(txn, prior)
    assert timer.reset_to == MIN_DUR

    # |minDur| elapses.
    timer.timepoint = faketime(MIN_DUR)
    timer.signal()
    assert not await tf.must_step(txn, prior)
    assert timer.reset_to == MAX_DUR - MIN_DUR

    # It continues to block.
    tf.pub.publish_committed(tf.to_source, TestMessage(Key="key", Value="2"))
    assert not await tf.must_step(txn, prior)

    # |prior| commits.
    timer.timepoint = faketime(MIN_DUR + 1)
    prior_commit.set_result(None)
    assert not await tf.must_step(txn, prior)
    assert prior.committed_at is not None and prior.acked_at is None
    assert m.txn_blocks(txn)  # Still blocking.

    # |prior| ACKs.
    timer.timepoint = faketime(MIN_DUR + 2)
    prior_ack.set_result(None)
    assert not await tf.must_step(txn, prior)
    assert prior.acked_at is not None

    # An additional ready message is consumed.
    assert not m.txn_blocks(txn)
    tf.pub.publish_committed(tf.to_source, TestMessage(Key="key", Value="3"))
    await tf.buffered()
    assert not await tf.must_step(txn, prior)

    # The channel stalls, and the transaction starts to commit.
    timer.timepoint = faketime(MIN_DUR + 3)
    assert await tf.must_step(txn, prior)

    assert timer.stopped
    assert txn.min_dur == -1
    assert txn.max_dur == MAX_DUR
    assert txn.channel is not None
    assert txn.consumed_count == 3
    assert len(txn.acks) == 1

    await tf.verify_store_and_echo_out(txn, {"key": "3"})
    assert tf.store.checkpoint.ack_intents[tf.echo_out]
    assert tf.store.checkpoint.sources[tf.source_a].read_through > 0

    assert prior.prepare_done_at == faketime(0)
    assert prior.committed_at == faketime(MIN_DUR + 1)
    assert prior.acked_at == faketime(MIN_DUR + 2)
    assert txn.prev_prepare_done_at == faketime(0)
    assert txn.began_at == faketime(0)
    assert txn.stalled_at == faketime(MIN_DUR + 3)
    assert txn.prepare_began_at == faketime(MIN_DUR + 3)
    assert txn.prepare_done_at == faketime(MIN_DUR + 3)


async def test_txn_max_dur_elapses_then_prior_syncs(tf: Fixture) -> None:
    timer, m = tf.timer, tf.machine
    prior, prior_commit, prior_ack = prior_txn(timer)
    txn = m.txn_init(prior, tf.channel)

    tf.pub.publish_committed(tf.to_source, TestMessage(Key="key", Value="1"))
    assert not await tf.must_step(txn, prior)
    assert timer.reset_to == MIN_DUR

    timer.timepoint = faketime(MIN_DUR)
    timer.signal()
    assert not await tf.must_step(txn, prior)
    assert timer.reset_to == MAX_DUR - MIN_DUR

    tf.pub.publish_committed(tf.to_source, TestMessage(Key="key", Value="2"))
    assert not await tf.must_step(txn, prior)

    # |maxDur| elapses: reading stops, and the transaction stalls on |prior|.
    timer.timepoint = faketime(MAX_DUR)
    timer.signal()
    assert not await tf.must_step(txn, prior)
    assert txn.channel is None
    assert txn.phase is TxnPhase.STALLED

    # Additional messages are not consumed.
    tf.pub.publish_committed(tf.to_source, TestMessage(Key="key", Value="not read"))
    await tf.buffered()

    timer.timepoint = faketime(MAX_DUR + 1)
    prior_commit.set_result(None)
    assert not await tf.must_step(txn, prior)

    timer.timepoint = faketime(MAX_DUR + 2)
    prior_ack.set_result(None)
    assert not await tf.must_step(txn, prior)

    # The transaction starts to commit.
    assert await tf.must_step(txn, prior)

    assert not timer.stopped  # It had already fired.
    assert txn.min_dur == -1
    assert txn.max_dur == -1
    assert txn.channel is None
    assert txn.consumed_count == 2
    assert len(txn.acks) == 1
    assert len(tf.channel) == 1  # "not read" is still there.

    await tf.verify_store_and_echo_out(txn, {"key": "2"})
    assert tf.store.checkpoint.ack_intents[tf.echo_out]
    assert tf.store.checkpoint.sources[tf.source_a].read_through > 0

    assert prior.prepare_done_at == faketime(0)
    assert prior.committed_at == faketime(MAX_DUR + 1)
    assert prior.acked_at == faketime(MAX_DUR + 2)
    assert txn.prev_prepare_done_at == faketime(0)
    assert txn.began_at == faketime(0)
    assert txn.stalled_at == faketime(MAX_DUR)
    assert txn.prepare_began_at == faketime(MAX_DUR + 2)
    assert txn.prepare_done_at == faketime(MAX_DUR + 2)


async def test_txn_doesnt_start_until_first_ack(tf: Fixture) -> None:
    timer, m = tf.timer, tf.machine
    prior = Transaction(commit_barrier=finished_operation(), prepare_done_at=timer.timepoint)
    txn = m.txn_init(prior, tf.channel)

    # |prior| commits and ACKs.
    assert not await tf.must_step(txn, prior)
    assert prior.committed_at is not None and prior.acked_at is not None

    # Pending messages.
    for key in ("A", "B", "C"):
        tf.pub.publish_uncommitted(tf.to_source, TestMessage(Key=key, Value="v"))
        assert not await tf.must_step(txn, prior)

    # The transaction hasn't started.
    assert txn.consumed_count == 0
    assert timer.reset_to is None

    tf.write_txn_pub_acks()

    # It starts, and every ACK'd message is read.
    timer.timepoint = faketime(SECOND)
    assert not await tf.must_step(txn, prior)
    assert timer.reset_to == MIN_DUR
    assert txn.consumed_count == 4  # Three messages and the ACK.
    assert m.txn_blocks(txn)

    # |minDur| elapses.
    timer.timepoint = faketime(SECOND + MIN_DUR)
    timer.signal()
    assert not await tf.must_step(txn, prior)
    assert timer.reset_to == MAX_DUR - MIN_DUR
    assert not m.txn_blocks(txn)  # May now commit.

    # Another pending message is read: wait for its ACK.
    tf.pub.publish_uncommitted(tf.to_source, TestMessage(Key="D", Value="v"))
    await tf.buffered()
    assert not await tf.must_step(txn, prior)
    assert m.txn_blocks(txn)

    # The ACK is read.
    timer.timepoint = faketime(SECOND + MIN_DUR + 1)
    tf.write_txn_pub_acks()
    assert not await tf.must_step(txn, prior)
    assert not m.txn_blocks(txn)  # May commit again.

    timer.timepoint = faketime(SECOND + MIN_DUR + 2)
    assert await tf.must_step(txn, prior)

    assert timer.stopped
    assert txn.min_dur == -1
    assert txn.max_dur == MAX_DUR
    assert txn.channel is not None
    assert txn.consumed_count == 6

    await tf.verify_store_and_echo_out(txn, {"A": "v", "B": "v", "C": "v", "D": "v"})
    assert tf.store.checkpoint.sources[tf.source_a].read_through > 0
    assert tf.store.checkpoint.ack_intents[tf.echo_out]

    assert prior.prepare_done_at == faketime(0)
    assert prior.committed_at == faketime(0)
    assert prior.acked_at == faketime(0)
    assert txn.prev_prepare_done_at == faketime(0)
    assert txn.began_at == faketime(SECOND)
    assert txn.stalled_at == faketime(SECOND + MIN_DUR + 2)
    assert txn.prepare_began_at == faketime(SECOND + MIN_DUR + 2)
    assert txn.prepare_done_at == faketime(SECOND + MIN_DUR + 2)


async def test_txn_read_channel_drain(tf: Fixture) -> None:
    timer, m = tf.timer, tf.machine
    prior, prior_commit, prior_ack = prior_txn(timer)
    alt = MessageChannel(1)
    txn = m.txn_init(prior, alt)

    # The initial message opens the txn.
    tf.pub.publish_committed(tf.to_source, TestMessage(Key="key", Value="1"))
    await tf.buffered()
    item = tf.channel.poll()
    assert isinstance(item, Envelope)
    alt.send_nowait(item)
    assert not await tf.must_step(txn, prior)
    assert timer.reset_to == MIN_DUR

    # The channel's close is read. It continues to block.
    alt.close()
    assert not await tf.must_step(txn, prior)
    assert txn.channel is None

    # |prior| commits and ACKs. Still blocking.
    prior_commit.set_result(None)
    assert not await tf.must_step(txn, prior)
    prior_ack.set_result(None)
    assert not await tf.must_step(txn, prior)
    assert m.txn_blocks(txn)

    # |minDur| elapses.
    timer.timepoint = faketime(MIN_DUR)
    timer.signal()
    assert not await tf.must_step(txn, prior)
    assert timer.reset_to == MAX_DUR - MIN_DUR

    # The next step stalls, and the transaction starts to commit.
    assert await tf.must_step(txn, prior)

    assert timer.stopped
    assert txn.min_dur == -1
    assert txn.max_dur == MAX_DUR
    assert txn.channel is None  # Closed.
    assert txn.consumed_count == 1
    assert len(txn.acks) == 1

    await tf.verify_store_and_echo_out(txn, {"key": "1"})
    assert tf.store.checkpoint.ack_intents[tf.echo_out]
    assert tf.store.checkpoint.sources[tf.source_a].read_through > 0

    assert prior.prepare_done_at == faketime(0)
    assert prior.committed_at == faketime(0)
    assert prior.acked_at == faketime(0)
    assert txn.began_at == faketime(0)
    assert txn.stalled_at == faketime(MIN_DUR)
    assert txn.prepare_began_at == faketime(MIN_DUR)
    assert txn.prepare_done_at == faketime(MIN_DUR)


async def test_idle_txn_updates_progress_on_duplicate_acks(tf: Fixture) -> None:
    timer, m = tf.timer, tf.machine
    prior, prior_commit, prior_ack = prior_txn(timer)
    # Every message of the test's publisher is a duplicate.
    m.sequencer = Sequencer(
        {}, [ProducerState(JournalProducer(tf.source_a, tf.pub.producer_id), (1 << 64) - 2, -1)], buffer=12
    )
    txn = m.txn_init(prior, tf.channel)

    # A duplicate is read; it begins no transaction.
    aa = tf.pub.publish_committed(tf.to_source, TestMessage(Key="key", Value="1"))
    end = (await aa).commit.end
    assert not await tf.must_step(txn, prior)
    assert txn.consumed_count == 0

    # |prior|'s checkpoint was extended through it.
    assert prior.checkpoint.sources[tf.source_a] == cpb.Checkpoint.Source(read_through=end)

    # |prior| commits and ACKs: progress includes the duplicate.
    signal = tf.progress.signal
    prior_commit.set_result(None)
    assert not await tf.must_step(txn, prior)
    prior_ack.set_result(None)
    assert not await tf.must_step(txn, prior)
    assert signal.done()
    assert tf.progress.read_through[tf.source_a] == end

    # Another duplicate: now idle, progress is updated directly.
    aa = tf.pub.publish_committed(tf.to_source, TestMessage(Key="key", Value="1"))
    end = (await aa).commit.end
    signal = tf.progress.signal
    assert not await tf.must_step(txn, prior)
    assert txn.consumed_count == 0
    assert signal.done()
    assert tf.progress.read_through[tf.source_a] == end
    async with asyncio.timeout(STEP_TIMEOUT):
        await tf.progress.wait_for({tf.source_a: end})


async def _stop_mid_sequence(tf: Fixture, txn: Transaction, prior: Transaction) -> AsyncAppend:
    """Write a committed two-message sequence and consume only its first message."""
    tf.pub.publish_uncommitted(tf.to_source, TestMessage(Key="one", Value="1"))
    tf.pub.publish_uncommitted(tf.to_source, TestMessage(Key="two", Value="2"))
    aa = tf.write_txn_pub_acks()[0]
    await aa
    while tf.machine.sequencer.dequeued is None:
        await tf.step(txn, prior)
    await tf.step(txn, prior)  # Consume the first message.
    assert txn.consumed_count == 1
    return aa


async def _finish_sequence(tf: Fixture, txn: Transaction, aa: AsyncAppend) -> None:
    """The transaction committed mid-sequence; the next one finishes it."""
    m, timer = tf.machine, tf.timer
    await tf.verify_store_and_echo_out(txn, {"one": "1"})
    assert m.sequencer.dequeued is not None
    assert aa.result().commit.end > txn.checkpoint.sources[tf.source_a].read_through

    prior, txn = txn, m.txn_init(txn, tf.channel)
    assert not await tf.must_step(txn, prior)

    # |minDur| elapses; run the remainder.
    timer.timepoint = faketime(MAX_DUR + MIN_DUR)
    timer.signal()
    async with asyncio.timeout(STEP_TIMEOUT):
        await m.txn_run(txn, prior)

    # Only now is the whole sequence processed.
    await tf.verify_store_and_echo_out(txn, {"one": "1", "two": "2"})
    assert aa.result().commit.end == txn.checkpoint.sources[tf.source_a].read_through


async def test_txn_max_dur_within_dequeue_sequence(tf: Fixture) -> None:
    timer, m = tf.timer, tf.machine
    prior, prior_commit, prior_ack = prior_txn(timer)
    txn = m.txn_init(prior, tf.channel)
    aa = await _stop_mid_sequence(tf, txn, prior)

    # |maxDur| elapses: no further messages are read.
    timer.timepoint = faketime(MAX_DUR)
    timer.signal()
    assert not await tf.must_step(txn, prior)
    assert txn.channel is None

    prior_commit.set_result(None)
    prior_ack.set_result(None)
    assert not await tf.must_step(txn, prior)
    assert await tf.must_step(txn, prior)  # Commits.
    await _finish_sequence(tf, txn, aa)


async def test_app_defer_within_dequeue_sequence(tf: Fixture) -> None:
    timer, m = tf.timer, tf.machine
    prior, prior_commit, prior_ack = prior_txn(timer)
    txn = m.txn_init(prior, tf.channel)
    aa = await _stop_mid_sequence(tf, txn, prior)

    # The application defers the second message.
    tf.app.consume_error = DeferToNextTransaction()
    assert not await tf.must_step(txn, prior)
    assert txn.channel is None
    assert txn.consumed_count == 1

    prior_commit.set_result(None)
    prior_ack.set_result(None)
    assert not await tf.must_step(txn, prior)

    timer.timepoint = faketime(MAX_DUR)
    timer.signal()
    assert not await tf.must_step(txn, prior)
    assert await tf.must_step(txn, prior)  # Commits.

    tf.app.consume_error = None
    await _finish_sequence(tf, txn, aa)


async def test_run_txns_acks_recovered_checkpoint(tf: Fixture) -> None:
    cp = cpb.Checkpoint()
    cp.ack_intents[tf.echo_out] = b'{"Key": "recovered fixture"}\n'
    # Recovered intents may name journals which no longer exist.
    cp.ack_intents["does/not/exist"] = b'{"Key": "discarded fixture"}\n'

    closed = MessageChannel()
    closed.close()
    async with asyncio.timeout(STEP_TIMEOUT):
        await tf.machine.run(cp, closed)

    got = [e async for e in read_uncommitted(tf.client, tf.echo_out, 0, lambda _j: TestMessage(), block=False)]
    assert [e.message for e in got] == [TestMessage(Key="recovered fixture")]


async def test_run_txns_recovered_ack_error(tf: Fixture) -> None:
    """A recovered intent that cannot be written (here: not a valid journal name) fails the run."""
    cp = cpb.Checkpoint()
    cp.ack_intents["not a valid name"] = b"{}\n"
    closed = MessageChannel()
    closed.close()
    expect = r"^prev\.ack: writing recovered ACK intent for journal not a valid name: "
    with pytest.raises(TransactionError, match=expect):
        async with asyncio.timeout(STEP_TIMEOUT):
            await tf.machine.run(cp, closed)


async def test_run_txns_updates_recorded_hints(tf: Fixture) -> None:
    """A set hints event stores recorded hints between transactions; a failure is prefixed."""
    stored: list[int] = []

    async def store_hints() -> None:
        stored.append(tf.store.commits)

    hints = asyncio.Event()
    hints.set()
    closed = MessageChannel()
    closed.close()
    async with asyncio.timeout(STEP_TIMEOUT):
        await tf.machine.run(cpb.Checkpoint(), closed, hints, store_hints)
    assert stored == [0] and not hints.is_set()

    async def fail() -> None:
        raise OSError("etcd is down")

    hints.set()
    with pytest.raises(TransactionError, match=r"^storeRecordedHints: etcd is down$"):
        await tf.machine.run(cpb.Checkpoint(), closed, hints, fail)


async def test_run_txns_app_error_cases(tf: Fixture) -> None:
    cases: list[tuple[str, Exception, str, bool]] = [
        ("finalize_error", RuntimeError("finalize error"), "txnStartCommit: app.FinalizeTxn: finalize error", True),
        ("consume_error", RuntimeError("consume error"), "app.ConsumeMessage: consume error", True),
        (
            "consume_error",
            DeferToNextTransaction(),
            "consumer transaction is empty, but application deferred the first message",
            True,
        ),
        ("begin_error", RuntimeError("begin error"), "app.BeginTxn: begin error", False),
    ]
    for attr, error, expect, expect_finish in cases:
        setattr(tf.app, attr, error)
        tf.app.finished.clear()
        tf.pub.publish_committed(tf.to_source, TestMessage(Key="key", Value="val"))
        with pytest.raises(TransactionError) as info:
            async with asyncio.timeout(STEP_TIMEOUT):
                await tf.with_loop_timer().run(cpb.Checkpoint(), tf.channel)
        assert str(info.value) == expect
        assert info.value.__cause__ is error
        if expect_finish:
            assert len(tf.app.finished) == 1
            finished = tf.app.finished[0]
            assert finished.done() and finished.exception() is info.value
        else:
            assert tf.app.finished == []


async def test_a_plain_consume_message_is_called_without_a_coroutine(tf: Fixture) -> None:
    # Several messages, so that both the transaction's first (txn_consume) and those after it
    # (the loop's own path) go to the plain function; its errors fail the transaction alike.
    app = PlainEchoApp(tf.echo_out)
    for i in range(3):
        tf.pub.publish_committed(tf.to_source, TestMessage(Key=f"k{i}", Value=str(i)))
    end = (await tf.pub.publish_committed(tf.to_source, TestMessage(Key="k3", Value="3"))).commit.end

    async def close_when_read() -> None:
        await tf.progress.wait_for({tf.source_a: end})
        tf.channel.close()

    m = tf.machine
    machine = Transactions(tf.shard, app, tf.store, m.sequencer, m.publisher, LoopTimer(), tf.progress)
    closer = asyncio.ensure_future(close_when_read())
    try:
        async with asyncio.timeout(STEP_TIMEOUT):
            await machine.run(cpb.Checkpoint(), tf.channel)
    finally:
        closer.cancel()
    assert tf.store.state == {f"k{i}": str(i) for i in range(4)}

    app.consume_error = RuntimeError("plain error")
    channel = MessageChannel(4)
    await channel.send_all([self_committed(tf.source_a, 10, new_producer_id())])
    with pytest.raises(TransactionError, match=r"^app.ConsumeMessage: plain error$"):
        async with asyncio.timeout(STEP_TIMEOUT):
            await Transactions(tf.shard, app, MemoryStore(), Sequencer({}, buffer=12), m.publisher, LoopTimer(),
                               tf.progress).run(cpb.Checkpoint(), channel)


# --- further cases of transaction_test.go-------------------------------------------------------------


async def test_run_txns_commits_and_returns_when_the_channel_drains(tf: Fixture) -> None:
    """run() on a LoopTimer: every message is consumed, committed and ACKed, and when the channel
    closes the last transaction is fully committed before run() returns."""
    tf.pub.publish_uncommitted(tf.to_source, TestMessage(Key="a", Value="1"))
    tf.pub.publish_uncommitted(tf.to_source, TestMessage(Key="b", Value="2"))
    ack = tf.write_txn_pub_acks()[0]
    end = (await ack).commit.end

    async def close_when_read() -> None:
        await tf.progress.wait_for({tf.source_a: end})
        tf.channel.close()

    closer = asyncio.ensure_future(close_when_read())
    try:
        async with asyncio.timeout(STEP_TIMEOUT):
            await tf.with_loop_timer().run(cpb.Checkpoint(), tf.channel)
    finally:
        closer.cancel()
    assert tf.store.state == {"a": "1", "b": "2"}
    assert flatten_read_through(tf.store.checkpoint) == {tf.source_a: end}
    assert [s.journal_producer.producer for s in flatten_producer_states(tf.store.checkpoint)] == [
        tf.pub.producer_id
    ]
    assert tf.progress.publish_at[tf.echo_out] > 0
    echoed = [
        e.message.Key
        async for e in read_committed(tf.client, tf.echo_out, 0, lambda _j: TestMessage(), block=False)
        if get_flags(e.uuid) != Flags.ACK_TXN
    ]
    assert echoed == ["a", "b"]


async def test_txn_read_replays_from_the_journal(tf: Fixture) -> None:
    """A sequence longer than the ring is replayed from the broker (QueueAckCommitReplay)."""
    m = tf.machine
    outcomes: list[QueueOutcome] = []

    class Recording(Sequencer):
        def queue_uncommitted(self, env: Envelope[Any]) -> QueueOutcome:
            outcome = super().queue_uncommitted(env)
            outcomes.append(outcome)
            return outcome

    m.sequencer = Recording({}, buffer=1)
    prior = Transaction(commit_barrier=finished_operation(), prepare_done_at=tf.timer.timepoint)
    txn = m.txn_init(prior, tf.channel)
    for key in ("x", "y", "z"):
        tf.pub.publish_uncommitted(tf.to_source, TestMessage(Key=key, Value=key))
    tf.write_txn_pub_acks()
    while txn.consumed_count < 4:
        assert not await tf.must_step(txn, prior)
    assert QueueOutcome.ACK_COMMIT_REPLAY in outcomes
    assert tf.store.pending == {"x": "x", "y": "y", "z": "z"}


async def test_txn_read_error_and_store_errors(tf: Fixture) -> None:
    m, timer = tf.machine, tf.timer
    prior = Transaction(commit_barrier=finished_operation(), prepare_done_at=timer.timepoint)

    # A reader's error.
    errors = MessageChannel()
    errors.send_nowait(OSError("broken"))
    txn = m.txn_init(prior, errors)
    assert not await tf.must_step(txn, prior)  # |prior| is done.
    with pytest.raises(TransactionError, match=r"^readMessage: broken$"):
        await tf.must_step(txn, prior)
    prior = Transaction(commit_barrier=finished_operation(), prepare_done_at=timer.timepoint)

    # A store whose StartCommit fails at once fails the commit synchronously.
    tf.store.start_commit_error = RuntimeError("fenced")
    txn = m.txn_init(prior, tf.channel)
    tf.pub.publish_committed(tf.to_source, TestMessage(Key="k", Value="v"))
    while txn.consumed_count == 0:
        await tf.must_step(txn, prior)
    timer.timepoint = faketime(MAX_DUR)
    timer.signal()
    assert not await tf.must_step(txn, prior)
    with pytest.raises(TransactionError, match=r"^txnStartCommit: store.StartCommit: fenced$"):
        await tf.must_step(txn, prior)

    # A commit that fails later fails the next transaction at its barrier.
    failed: OpFuture = asyncio.get_running_loop().create_future()
    later = Transaction(commit_barrier=failed, prepare_done_at=timer.timepoint)
    failed.set_exception(RuntimeError("lost the fence"))
    with pytest.raises(TransactionError, match=r"^store.StartCommit: lost the fence$"):
        await tf.must_step(m.txn_init(later, tf.channel), later)

    # So does a failed ACK of the prior transaction.
    ack: OpFuture = asyncio.get_running_loop().create_future()
    ack.set_exception(RuntimeError("no route"))
    acked = Transaction(commit_barrier=finished_operation(), acks=[ack], prepare_done_at=timer.timepoint)
    with pytest.raises(TransactionError, match=r"^prev.ack: no route$"):
        await tf.must_step(m.txn_init(acked, tf.channel), acked)


async def test_message_channel_poll_and_close() -> None:
    ch = MessageChannel(1)
    assert ch.poll() is not CLOSED and len(ch) == 0
    err = OSError("x")
    ch.send_nowait(err)
    with pytest.raises(asyncio.QueueFull):
        ch.send_nowait(err)
    sender = asyncio.ensure_future(ch.send(err))
    await asyncio.sleep(0)
    assert not sender.done()  # Full: the sender waits.
    assert ch.poll() is err
    await asyncio.wait_for(sender, 5)
    ch.close()
    await asyncio.wait_for(ch.wait(), 5)
    assert ch.poll() is err
    assert ch.poll() is CLOSED


def self_committed(journal: str, index: int, producer: bytes) -> Envelope[TestMessage]:
    """An OUTSIDE_TXN envelope of `journal` at [index * 100, index * 100 + 100)."""
    msg = TestMessage(Key=f"k{index}", Value=str(index))
    msg.set_uuid(build_uuid(producer, Clock.at(BASE).value + (index + 1) * 16, Flags.OUTSIDE_TXN))
    return Envelope(journal, index * 100, index * 100 + 100, msg)


async def test_txn_steps_ready_takes_the_steps_txn_step_would(tf: Fixture) -> None:
    timer, m = tf.timer, tf.machine
    prior, prior_commit, prior_ack = prior_txn(timer)
    ch = MessageChannel(16)
    txn = m.txn_init(prior, ch)
    producer = new_producer_id()
    envs = [self_committed(tf.source_a, i, producer) for i in range(7)]
    await ch.send_all(envs[:5])

    # Two steps an envelope (read, then consume), up to the limit; the first begins the transaction.
    assert await m.txn_steps_ready(txn, prior, 3) == 3
    assert txn.consumed_count == 1 and m.sequencer.dequeued is envs[1]
    assert timer.reset_to == MIN_DUR and txn.began_at == faketime(0)
    # The prior transaction still commits: its unresolved barrier does not stop the reading.
    assert txn.barrier is prior_commit
    assert await m.txn_steps_ready(txn, prior, 100) == 7
    assert txn.consumed_count == 5 and len(ch) == 0 and m.sequencer.dequeued is None
    # Nothing queued: waiting (or committing) is txn_step's part.
    assert await m.txn_steps_ready(txn, prior, 100) == 0

    # A fired timer is handled before the next read.
    await ch.send_all(envs[5:])
    timer.timepoint = faketime(MIN_DUR)
    timer.signal()
    assert await m.txn_steps_ready(txn, prior, 1) == 1
    assert txn.min_dur == -1 and timer.reset_to == MAX_DUR - MIN_DUR and len(ch) == 2

    # A resolved barrier stops it before a read: txn_step resolves the barrier first.
    prior_commit.set_result(None)
    assert await m.txn_steps_ready(txn, prior, 100) == 0 and len(ch) == 2
    assert not await tf.step(txn, prior)
    assert prior.committed_at is not None and txn.barrier is prior_ack
    assert await m.txn_steps_ready(txn, prior, 100) == 4
    assert txn.consumed_count == 7

    # A reader's error fails the transaction as txn_step's read would.
    await ch.send_all([OSError("broken")])
    with pytest.raises(TransactionError, match=r"^readMessage: broken$"):
        await m.txn_steps_ready(txn, prior, 100)


async def test_message_channel_takes_lists_whole() -> None:
    ch = MessageChannel(3)
    errors = [OSError(str(i)) for i in range(5)]
    await ch.send_all(errors[:2])
    assert len(ch) == 2 < ch.capacity
    # A list is queued whole once there is room, filling the channel past its capacity.
    await ch.send_all(errors[2:4])
    assert len(ch) == 4 >= ch.capacity
    sender = asyncio.ensure_future(ch.send_all(errors[4:]))
    await asyncio.sleep(0)
    assert not sender.done()  # Full: the sender waits until it is below capacity.
    assert ch.poll() is errors[0]
    await asyncio.sleep(0)
    assert not sender.done()
    assert ch.poll() is errors[1]
    await asyncio.wait_for(sender, 5)
    assert [ch.poll() for _ in range(3)] == errors[2:]
    ch.close()
    assert ch.poll() is CLOSED
    with pytest.raises(ChannelClosed):
        await ch.send_all(errors[:1])


async def test_message_channel_take_and_put_back() -> None:
    ch = MessageChannel(4)
    errors = [OSError(str(i)) for i in range(7)]
    first, second = errors[:3], errors[3:]
    await ch.send_all(first)
    await ch.send_all(second)
    assert len(ch) == 7 and not ch._writable.is_set()
    taken = ch.take(10)
    assert taken is first  # A whole list the channel owns is handed on, not copied.
    assert len(ch) == 4 and not ch._writable.is_set()
    part = ch.take(2)
    assert part == errors[3:5] and len(ch) == 2 and ch._writable.is_set()  # Below capacity: room.
    ch.put_back(part[1:])  # The item not processed goes back to the front.
    assert len(ch) == 3 and ch._readable.is_set()
    rest = ch.take(10)
    assert rest == errors[4:] and len(ch) == 0 and not ch._readable.is_set()
    ch.put_back(rest)
    assert len(ch) == 3 and ch._writable.is_set() and ch._readable.is_set()
    assert [ch.poll() for _ in range(4)] == [*errors[4:], EMPTY]
    assert ch.take(10) == [] and ch.take(0) == []
    ch.close()
    assert ch.take(10) == [] and ch.poll() is CLOSED


async def test_published_messages_linger_until_their_transaction_commits(tf: Fixture, broker: BrokerProcess) -> None:
    # A shard's AppendService lingers (a minute here): the commit must send the transaction's
    # published messages at once, in one RPC, rather than wait out the linger.
    async with AppendService(tf.client, linger=60.0) as ajc:
        machine = Transactions(
            tf.shard, tf.app, tf.store, Sequencer({}, buffer=12), Publisher(ajc, Clock()), LoopTimer(), tf.progress
        )
        channel = MessageChannel(64)
        prev = Transaction(commit_barrier=finished_operation(), prepare_done_at=0)
        txn = machine.txn_init(prev, channel)
        producer = new_producer_id()
        envs = [self_committed(tf.source_a, i, producer) for i in range(20)]
        await channel.send_all(envs)
        before = await asyncio.to_thread(append_rpcs, broker, tf.echo_out)
        async with asyncio.timeout(20):
            await machine.txn_run(txn, prev)  # Consumes all 20, stalls, starts to commit.
            assert txn.consumed_count == 20
            assert txn.commit_barrier is not None
            await txn.commit_barrier
            for ack in txn.acks:
                await ack
        # The 20 echoes in one RPC, then the ACK.
        assert await asyncio.to_thread(append_rpcs, broker, tf.echo_out) - before == 2
        assert tf.store.state == {f"k{i}": str(i) for i in range(20)}


async def test_a_blocked_step_on_the_loop_timer_waits_on_one_future_for_any_of_its_three_events() -> None:
    """The LoopTimer's wait: one future resolved by whichever of the timer, the channel and the prior
    barrier comes first (no task per event)."""
    loop = asyncio.get_running_loop()
    timer, channel = LoopTimer(), MessageChannel(4)
    txn = Transaction(channel=channel, barrier=loop.create_future())

    async def wait() -> None:
        waiting = asyncio.ensure_future(Transactions._wait_watching(txn, timer.watch))
        await asyncio.sleep(0.01)
        assert not waiting.done()  # Nothing happened yet.
        return await asyncio.wait_for(waiting, 5)

    async def then(act: Any) -> None:
        loop.call_later(0.02, act)
        await wait()

    await then(lambda: channel.send_nowait(ValueError("an item")))
    assert isinstance(channel.poll(), ValueError)
    timer.reset(30_000_000)  # 30 ms
    await wait()
    assert timer.poll() is not None
    assert txn.barrier is not None
    await then(lambda: txn.barrier.set_result(None))  # type: ignore[union-attr]

    # An event already there (an item queued before the wait) ends it at once.
    txn.barrier = None
    channel.send_nowait(ValueError("another"))
    await asyncio.wait_for(Transactions._wait_watching(txn, timer.watch), 1)
