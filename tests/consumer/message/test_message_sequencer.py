"""The Sequencer: Gazette's sequencer_test.go cases, ported with their exact expected states."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from consumer.message import (
    ZERO_UUID,
    Envelope,
    Flags,
    JournalProducer,
    ProducerState,
    QueueOutcome,
    ReplayError,
    ReplayRequest,
    Sequencer,
    SequencerStateError,
    TruncatedFrameError,
    get_clock,
    get_producer_id,
    new_producer_id,
)
from consumer.message.sequencer import PartialSeq
from tests.consumer.message.helpers import JOURNAL, TestMsg, envelope_generator

CONT, ACK, OUT = Flags.CONTINUE_TXN, Flags.ACK_TXN, Flags.OUTSIDE_TXN
Q = QueueOutcome


class ReplayIterator(Iterator[Envelope[TestMsg]]):
    """Yields the given envelopes, then ends; a call after the end is a test failure."""

    def __init__(self, envs: tuple[Envelope[TestMsg], ...]) -> None:
        self.envs: list[Envelope[TestMsg]] | None = list(envs)

    def __next__(self) -> Envelope[TestMsg]:
        if self.envs is None:
            raise AssertionError("unexpected extra replay call")
        if not self.envs:
            self.envs = None
            raise StopIteration
        return self.envs.pop(0)


def queue(seq: Sequencer, *envs: Envelope[TestMsg]) -> list[QueueOutcome]:
    return [seq.queue_uncommitted(env) for env in envs]


def partials(seq: Sequencer) -> dict[JournalProducer, PartialSeq]:
    """The Sequencer's producer sequences, by JournalProducer."""
    return {p.jp: p for p in seq._partials.values()}


def expect_deque(seq: Sequencer, *expect: Envelope[TestMsg]) -> None:
    """Dequeue exactly `expect`, checking the bounds tighten as each is processed."""
    for i, env in enumerate(expect):
        assert seq.step()
        assert seq.dequeued == env
        assert seq._emit is not None and seq._emit.begin == env.begin
        if i > 0:
            assert seq._emit.min_clock == get_clock(expect[i - 1].uuid)
    assert not seq.step()
    assert seq.dequeued is None

    last = expect[-1]
    jp = JournalProducer(last.journal, get_producer_id(last.uuid))
    clock = get_clock(last.uuid)
    if clock != 0:
        # The producer's sequence was cleared, ready for its next one.
        assert partials(seq)[jp] == PartialSeq(jp, clock, clock, -1, -1, -1)
    # Reading through the committing envelope is tracked in offsets only now.
    assert seq.offsets[last.journal] == last.end


def expect_replay(seq: Sequencer, begin: int, end: int, *envs: Envelope[TestMsg]) -> None:
    assert seq.replay_range() == ReplayRequest(envs[0].journal, begin, end)
    seq.start_replay(ReplayIterator(envs))


def zero_uuid(env: Envelope[TestMsg]) -> Envelope[TestMsg]:
    """The envelope with its message's UUID zeroed: Gazette's `SetUUID(UUID{})`."""
    return dataclasses.replace(env, message=TestMsg(ZERO_UUID, env.message.Str), uuid=ZERO_UUID)


def by_producer(states: list[ProducerState]) -> list[ProducerState]:
    return sorted(states, key=lambda s: s.journal_producer.producer)


def test_ring_add_and_evict() -> None:
    seq = Sequencer(None, (), 5)
    generate = envelope_generator()
    A, B = new_producer_id(), new_producer_id()  # Gazette's names.
    jpA, jpB = JournalProducer(JOURNAL, A), JournalProducer(JOURNAL, B)
    e1 = generate(A, 100, CONT)
    e2 = generate(B, 200, CONT)
    e3 = generate(A, 300, CONT)
    e4 = generate(A, 400, CONT)
    e5, e6, e7, e8, e9, e10, e11 = (generate(B, c, CONT) for c in range(500, 1101, 100))

    def state(ring: list[Any], nxt: list[int], head: int, a: PartialSeq, b: PartialSeq | None = None) -> None:
        assert seq._ring == ring
        assert seq._next == nxt
        assert seq._head == head
        assert partials(seq) == ({jpA: a, jpB: b} if b else {jpA: a})

    # The ring starts empty.
    assert (seq._ring, seq._next, seq._head, partials(seq)) == ([], [], 0, {})
    assert not seq.has_pending()

    assert queue(seq, e1) == [Q.CONTINUE_BEGIN_SPAN]
    state([e1], [-1], 1, PartialSeq(jpA, 99, 100, e1.begin, 0, 0))
    assert seq.has_pending()
    # Continuations always advance read-through offsets.
    assert seq.offsets == {JOURNAL: e1.end}

    assert queue(seq, e2) == [Q.CONTINUE_BEGIN_SPAN]
    state([e1, e2], [-1, -1], 2, PartialSeq(jpA, 99, 100, e1.begin, 0, 0), PartialSeq(jpB, 199, 200, e2.begin, 1, 1))

    assert queue(seq, e3) == [Q.CONTINUE_EXTEND_SPAN]  # e1 => e3.
    state(
        [e1, e2, e3],
        [2, -1, -1],
        3,
        PartialSeq(jpA, 99, 300, e1.begin, 0, 2),
        PartialSeq(jpB, 199, 200, e2.begin, 1, 1),
    )

    assert queue(seq, e4) == [Q.CONTINUE_EXTEND_SPAN]  # e3 => e4.
    state(
        [e1, e2, e3, e4],
        [2, -1, 3, -1],
        4,
        PartialSeq(jpA, 99, 400, e1.begin, 0, 3),
        PartialSeq(jpB, 199, 200, e2.begin, 1, 1),
    )

    assert queue(seq, e5) == [Q.CONTINUE_EXTEND_SPAN]  # e2 => e5.
    state(
        [e1, e2, e3, e4, e5],
        [2, 4, 3, -1, -1],
        0,
        PartialSeq(jpA, 99, 400, e1.begin, 0, 3),
        PartialSeq(jpB, 199, 500, e2.begin, 1, 4),
    )

    assert queue(seq, e6) == [Q.CONTINUE_EXTEND_SPAN]  # Evicts e1; e5 => e6.
    state(
        [e6, e2, e3, e4, e5],
        [-1, 4, 3, -1, 0],
        1,
        PartialSeq(jpA, 99, 400, e1.begin, 2, 3),
        PartialSeq(jpB, 199, 600, e2.begin, 1, 0),
    )

    assert queue(seq, e7, e8) == [Q.CONTINUE_EXTEND_SPAN, Q.CONTINUE_EXTEND_SPAN]
    state(
        [e6, e7, e8, e4, e5],
        [1, 2, -1, -1, 0],
        3,
        PartialSeq(jpA, 99, 400, e1.begin, 3, 3),
        PartialSeq(jpB, 199, 800, e2.begin, 4, 2),
    )

    assert queue(seq, e9) == [Q.CONTINUE_EXTEND_SPAN]  # Evicts A's last entry.
    state(
        [e6, e7, e8, e9, e5],
        [1, 2, 3, -1, 0],
        4,
        # A's begin is still tracked, though none of it is in the ring.
        PartialSeq(jpA, 99, 400, e1.begin, -1, -1),
        PartialSeq(jpB, 199, 900, e2.begin, 4, 3),
    )

    assert queue(seq, e10) == [Q.CONTINUE_EXTEND_SPAN]
    state(
        [e6, e7, e8, e9, e10],
        [1, 2, 3, 4, -1],
        0,
        PartialSeq(jpA, 99, 400, e1.begin, -1, -1),
        PartialSeq(jpB, 199, 1000, e2.begin, 0, 4),
    )

    assert queue(seq, e11) == [Q.CONTINUE_EXTEND_SPAN]
    state(
        [e11, e7, e8, e9, e10],
        [-1, 2, 3, 4, 0],
        1,
        PartialSeq(jpA, 99, 400, e1.begin, -1, -1),
        PartialSeq(jpB, 199, 1100, e2.begin, 1, 0),
    )
    assert seq.offsets == {JOURNAL: e11.end}


def test_txn_sequence_cases() -> None:
    generate = envelope_generator()
    seq = Sequencer(None, (), 3)
    A, B = new_producer_id(), new_producer_id()
    jpA, jpB = JournalProducer(JOURNAL, A), JournalProducer(JOURNAL, B)

    # Case: a sequence with duplicates inside it, served from the ring.
    a1 = generate(A, 1, CONT)
    a2 = generate(A, 2, CONT)
    a1_dup = generate(A, 1, CONT)
    a2_dup = generate(A, 2, CONT)
    a3_ack = generate(A, 3, ACK)
    assert queue(seq, a1, a2, a1_dup, a2_dup, a3_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.ACK_COMMIT_RING,
    ]
    expect_deque(seq, a1, a2, a3_ack)
    assert not seq.has_pending()

    # Case: an ACK with no CONTINUE before it. Unusual, but allowed.
    a4_ack = generate(A, 4, ACK)
    assert queue(seq, a4_ack) == [Q.ACK_EMPTY]
    expect_deque(seq, a4_ack)

    # Case: an ACK of only some of the preceding messages.
    a5 = generate(A, 5, CONT)
    a7_no_ack = generate(A, 7, CONT)  # Not included in a6_ack.
    a6_ack = generate(A, 6, ACK)  # Served from the ring.
    assert queue(seq, a5, a7_no_ack, a6_ack) == [Q.CONTINUE_BEGIN_SPAN, Q.CONTINUE_EXTEND_SPAN, Q.ACK_COMMIT_RING]
    expect_deque(seq, a5, a6_ack)

    # Case: a rollback, interleaved with producer B.
    b1 = generate(B, 1, CONT)  # Evicted.
    a7_rollback = generate(A, 7, CONT)  # Evicted.
    a8_rollback = generate(A, 8, CONT)
    b2 = generate(B, 2, CONT)
    a6_abort = generate(A, 6, ACK)  # Aborts back to clock 6.
    assert queue(seq, a7_rollback, b1, a7_rollback, a8_rollback, b2, a6_abort) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_ROLLBACK,
    ]
    assert seq._emit is None  # Nothing to dequeue.
    assert partials(seq) == {
        jpA: PartialSeq(jpA, 6, 6, -1, -1, -1),
        jpB: PartialSeq(jpB, 0, 2, b1.begin, 1, 1),
    }

    # Case: interleaved producer ACKs. Eviction forces a replay.
    b3_ack = generate(B, 3, ACK)
    assert queue(seq, b3_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq, b1.begin, b2.begin, b1, a7_rollback, a8_rollback)
    expect_deque(seq, b1, b2, b3_ack)

    # Case: a replayed sequence with duplicates inside it and from before it, met both in the
    # ring and in the replay.
    b4 = generate(B, 4, CONT)  # Evicted.
    b1_dup = generate(B, 1, CONT)
    b4_dup = generate(B, 4, CONT)
    b5 = generate(B, 5, CONT)  # Evicted.
    b6 = generate(B, 6, CONT)
    b2_dup = generate(B, 2, CONT)
    b7 = generate(B, 7, CONT)
    b8_ack = generate(B, 8, ACK)
    assert queue(seq, b4, b1_dup, b4_dup, b5, b6, b2_dup, b7, b8_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_ALREADY_ACKED,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_ALREADY_ACKED,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, b4.begin, b6.begin, b4, b1_dup, b4_dup, b5)
    expect_deque(seq, b4, b5, b6, b7, b8_ack)

    # Case: a partial rollback in which every ring entry is skipped.
    b9 = generate(B, 9, CONT)  # Evicted.
    b11_no_ack = generate(B, 11, CONT)  # Evicted.
    b12_no_ack = generate(B, 12, CONT)
    b13_no_ack = generate(B, 13, CONT)
    b10_ack = generate(B, 10, ACK)
    assert queue(seq, b9, b11_no_ack, b12_no_ack, b13_no_ack, b10_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, b9.begin, b12_no_ack.begin, b9, b11_no_ack)
    expect_deque(seq, b9, b10_ack)
    assert not seq.has_pending()

    # Case: interleaved committed sequences needing two replays.
    b11 = generate(B, 11, CONT)  # Evicted.
    a7 = generate(A, 7, CONT)  # Evicted.
    a8 = generate(A, 8, CONT)
    b12 = generate(B, 12, CONT)
    a9_ack = generate(A, 9, ACK)
    b13_ack = generate(B, 13, ACK)
    assert queue(seq, b11, a7, a8, b12, a9_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, a7.begin, a8.begin, a7)
    expect_deque(seq, a7, a8, a9_ack)
    assert seq.has_pending()

    assert queue(seq, b13_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq, b11.begin, b12.begin, b11, a7, a8)
    expect_deque(seq, b11, b12, b13_ack)
    assert not seq.has_pending()

    # Case: a reset to an earlier ACK, then clocks re-used.
    b8_ack_reset = generate(B, 8, ACK)
    b9_reuse = generate(B, 9, CONT)
    b10_ack_reuse = generate(B, 10, ACK)
    assert queue(seq, b8_ack_reset, b9_reuse, b10_ack_reuse) == [
        Q.ACK_ROLLBACK,
        Q.CONTINUE_BEGIN_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    expect_deque(seq, b9_reuse, b10_ack_reuse)


def test_txn_without_buffer() -> None:
    """A buffer of 0 is a ring of 1: every commit replays, up to the ACK."""
    generate = envelope_generator()
    seq = Sequencer(None, (), 0)
    A, B = new_producer_id(), new_producer_id()
    a1 = generate(A, 1, CONT)
    a2 = generate(A, 2, CONT)
    b1 = generate(B, 1, CONT)
    a1_dup = generate(A, 1, CONT)
    a2_dup = generate(A, 2, CONT)
    a3_ack = generate(A, 3, ACK)
    b2 = generate(B, 2, CONT)
    b3_ack = generate(B, 3, ACK)

    assert queue(seq, a1, a2, b1, a1_dup, a2_dup, a3_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, a1.begin, a3_ack.begin, a1, a2, b1, a1_dup, a2_dup)
    expect_deque(seq, a1, a2, a3_ack)

    assert queue(seq, b2, b3_ack) == [Q.CONTINUE_EXTEND_SPAN, Q.ACK_COMMIT_REPLAY]
    expect_replay(seq, b1.begin, b3_ack.begin, b1, a1_dup, a2_dup, a3_ack, b2)
    expect_deque(seq, b1, b2, b3_ack)


def test_outside_txn_cases(caplog: pytest.LogCaptureFixture) -> None:
    generate = envelope_generator()
    seq = Sequencer(None, (), 0)
    A = new_producer_id()
    jpA = JournalProducer(JOURNAL, A)

    # Case: OUTSIDE_TXN messages dequeue immediately.
    a1 = generate(A, 1, OUT)
    a2 = generate(A, 2, OUT)
    assert queue(seq, a1) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, a1)
    assert queue(seq, a2) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, a2)
    assert seq.offsets == {JOURNAL: a2.end}

    # Case: duplicates are ignored.
    a1_dup = generate(A, 1, OUT)
    a2_dup = generate(A, 2, OUT)
    assert queue(seq, a1_dup, a2_dup) == [Q.OUTSIDE_ALREADY_ACKED, Q.OUTSIDE_ALREADY_ACKED]
    assert seq._emit is None
    assert seq.offsets == {JOURNAL: a2_dup.end}

    # Case: an OUTSIDE_TXN message discards preceding CONTINUE_TXN messages.
    a3_discard = generate(A, 3, CONT)
    a4_discard = generate(A, 4, CONT)
    a5 = generate(A, 5, OUT)
    with caplog.at_level(logging.ERROR, logger="consumer.message.sequencer"):
        assert queue(seq, a3_discard, a4_discard, a5) == [
            Q.CONTINUE_BEGIN_SPAN,
            Q.CONTINUE_EXTEND_SPAN,
            Q.OUTSIDE_COMMIT,
        ]
    assert "mixed use of PublishUncommitted and PublishCommitted" in caplog.text
    expect_deque(seq, a5)
    assert seq.offsets == {JOURNAL: a5.end}

    # Case: unknown flags are treated as OUTSIDE_TXN.
    a6_discard = generate(A, 6, CONT)
    a7_bad_bits = generate(A, 7, 0x100)
    a7_bad_bits_dup = generate(A, 7, 0x100)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="consumer.message.sequencer"):
        assert queue(seq, a6_discard, a7_bad_bits) == [Q.CONTINUE_BEGIN_SPAN, Q.OUTSIDE_COMMIT]
    assert "unexpected UUID flags" in caplog.text
    assert "flags=Flags(100)" in caplog.text
    expect_deque(seq, a7_bad_bits)
    assert queue(seq, a7_bad_bits_dup) == [Q.OUTSIDE_ALREADY_ACKED]
    assert seq._emit is None

    # Case: zero-UUID messages always dequeue.
    z1 = zero_uuid(generate(bytes(6), 0, 0))
    z2 = zero_uuid(generate(bytes(6), 0, 0))
    assert queue(seq, z1) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, z1)
    assert queue(seq, z2) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, z2)

    # The zero UUID's producer is not tracked, but still advances offsets.
    assert partials(seq) == {jpA: PartialSeq(jpA, 7, 7, -1, -1, -1)}
    assert seq.offsets == {JOURNAL: z2.end}


def test_producer_states_round_trip() -> None:
    generate = envelope_generator()
    seq1 = Sequencer(None, (), 12)
    A, B, C = new_producer_id(), new_producer_id(), new_producer_id()
    jpA, jpB, jpC = (JournalProducer(JOURNAL, p) for p in (A, B, C))
    a1 = generate(A, 1, CONT)
    a2 = generate(A, 2, CONT)
    b1 = generate(B, 1, CONT)
    b2 = generate(B, 2, CONT)
    c1_ack = generate(C, 1, ACK)
    b3_ack = generate(B, 3, ACK)
    c2 = generate(C, 2, CONT)
    c1_rollback = generate(C, 1, ACK)
    a3_ack = generate(A, 3, ACK)
    z1 = zero_uuid(generate(bytes(6), 0, 0))

    assert queue(seq1, a1, a2, b1, b2, c1_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_EMPTY,
    ]
    expect_deque(seq1, c1_ack)
    assert queue(seq1, z1) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq1, z1)

    # Taking a checkpoint clears pending: only sequences begun *since* the last one are pending.
    assert seq1.has_pending()
    offsets, states = seq1.checkpoint(0)
    assert not seq1.has_pending()

    # Recover a new Sequencer from the checkpoint; it checkpoints identically.
    seq2 = Sequencer(offsets, states, 12)
    _, states2 = seq2.checkpoint(0)
    expect = by_producer(
        [
            ProducerState(jpA, 0, a1.begin),
            ProducerState(jpB, 0, b1.begin),
            ProducerState(jpC, 1, -1),
        ]
    )
    assert by_producer(states) == expect
    assert by_producer(states2) == expect
    assert offsets == {JOURNAL: z1.end}

    # Both produce the same output from here, though seq2 must replay where seq1 need not.
    assert queue(seq1, b3_ack) == [Q.ACK_COMMIT_RING]
    assert queue(seq2, b3_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, b1.begin, b3_ack.begin, b1, b2, c1_ack)
    expect_deque(seq1, b1, b2, b3_ack)
    expect_deque(seq2, b1, b2, b3_ack)

    assert queue(seq1, c2, c1_rollback) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_ROLLBACK]
    assert queue(seq2, c2, c1_rollback) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_ROLLBACK]
    assert seq1._emit is None and seq2._emit is None

    assert queue(seq1, a3_ack) == [Q.ACK_COMMIT_RING]
    assert queue(seq2, a3_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, a1.begin, a3_ack.begin, a1, a2, b1, b2, c1_ack)
    expect_deque(seq1, a1, a2, a3_ack)
    expect_deque(seq2, a1, a2, a3_ack)


def test_producer_states_round_trip_during_dequeue() -> None:
    generate = envelope_generator()
    seq1 = Sequencer(None, (), 12)
    A = new_producer_id()
    jpA = JournalProducer(JOURNAL, A)
    a1 = generate(A, 1, CONT)
    a2 = generate(A, 2, CONT)
    a3_ack = generate(A, 3, ACK)
    a4 = generate(A, 4, CONT)
    a5 = generate(A, 5, CONT)
    a6_ack = generate(A, 6, ACK)

    assert queue(seq1, a1, a2, a3_ack) == [Q.CONTINUE_BEGIN_SPAN, Q.CONTINUE_EXTEND_SPAN, Q.ACK_COMMIT_RING]
    assert seq1.step()  # Step to a1.

    # Suppose the process crashes here, before a1 is processed.
    offsets, states = seq1.checkpoint(0)
    # Round-trip the states through new Sequencers a couple of times.
    seq2 = Sequencer(offsets, states, 12)
    offsets, states = seq2.checkpoint(0)
    seq2 = Sequencer(offsets, states, 12)

    # States are as of just before a3_ack.
    for seq in (seq1, seq2):
        assert seq.checkpoint(0) == ({JOURNAL: a2.end}, [ProducerState(jpA, 0, a1.begin)])

    # seq2 starts by reading a3_ack again.
    assert queue(seq2, a3_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, a1.begin, a3_ack.begin, a1, a2)

    assert seq1.step()  # To a2.
    assert seq1.step()  # To a3_ack.
    assert not seq1.step()  # Done.
    expect_deque(seq2, a1, a2, a3_ack)

    # seq1 checkpoints partway through dequeuing its next sequence.
    assert queue(seq1, a4, a5, a6_ack) == [Q.CONTINUE_BEGIN_SPAN, Q.CONTINUE_EXTEND_SPAN, Q.ACK_COMMIT_RING]
    assert seq1.step()  # To a4.
    assert seq1.step()  # To a5. Crash.

    offsets, states = seq1.checkpoint(0)
    seq2 = Sequencer(offsets, states, 12)
    offsets, states = seq2.checkpoint(0)
    seq2 = Sequencer(offsets, states, 12)

    # States are as of just before a6_ack, tightened to reflect that a4 was processed.
    for seq in (seq1, seq2):
        assert seq.checkpoint(0) == ({JOURNAL: a5.end}, [ProducerState(jpA, 4, a5.begin)])

    # seq2 reads a6_ack again, then dequeues from a5 (not a4).
    assert queue(seq2, a6_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, a5.begin, a6_ack.begin, a5)
    expect_deque(seq2, a5, a6_ack)


def test_producer_states_round_trip_straddling_duplicate() -> None:
    """A duplicated sequence straddles a recovered checkpoint, which keeps only the last ACK.

    The checkpoint was taken after a1 was processed (last_ack 1, begin at a2). The journal then
    holds duplicates of a1 and a2 before the ACK. a2 is dequeued from the replay; its duplicate
    a2_dup, met again in the ring, must be skipped.
    """
    generate = envelope_generator()
    A = new_producer_id()
    jpA = JournalProducer(JOURNAL, A)
    a1 = generate(A, 1, CONT)
    a2 = generate(A, 2, CONT)
    a1_dup = generate(A, 1, CONT)
    a2_dup = generate(A, 2, CONT)
    a3_ack = generate(A, 3, ACK)

    seq = Sequencer({JOURNAL: a2.end}, [ProducerState(jpA, 1, a2.begin)], 12)
    assert queue(seq, a1_dup, a2_dup, a3_ack) == [
        Q.CONTINUE_ALREADY_ACKED,
        Q.CONTINUE_EXTEND_SPAN,  # The recovered sequence is open, so this extends it.
        Q.ACK_COMMIT_REPLAY,  # Its start (a2) is not in the ring.
    ]
    expect_replay(seq, a2.begin, a2_dup.begin, a2, a1_dup)
    expect_deque(seq, a2, a3_ack)
    assert a1.end < a2.begin


def test_producer_pruning() -> None:
    generate = envelope_generator()
    seq = Sequencer(None, (), 12)
    A, B, C = new_producer_id(), new_producer_id(), new_producer_id()
    jpA, jpB, jpC = (JournalProducer(JOURNAL, p) for p in (A, B, C))
    # Clock units are 100 ns, above 4 counter bits.
    a_cont = generate(A, 10 << 4, CONT)
    b_cont = generate(B, 19 << 4, CONT)
    b_ack = generate(B, 20 << 4, ACK)
    c_cont = generate(C, 30 << 4, CONT)

    assert queue(seq, a_cont, b_cont, b_ack) == [Q.CONTINUE_BEGIN_SPAN, Q.CONTINUE_BEGIN_SPAN, Q.ACK_COMMIT_RING]
    expect_deque(seq, b_cont, b_ack)
    assert queue(seq, c_cont) == [Q.CONTINUE_BEGIN_SPAN]

    state_a = ProducerState(jpA, (10 << 4) - 1, a_cont.begin)
    state_b = ProducerState(jpB, 20 << 4, -1)
    state_c = ProducerState(jpC, (30 << 4) - 1, c_cont.begin)

    # A 2000 ns horizon prunes no producer.
    assert by_producer(seq.checkpoint(20 * 100)[1]) == by_producer([state_a, state_b, state_c])
    assert len(partials(seq)) == 3
    # 1900 ns prunes A.
    assert by_producer(seq.checkpoint(19 * 100)[1]) == by_producer([state_b, state_c])
    assert len(partials(seq)) == 2
    # 1 ns prunes B.
    assert seq.checkpoint(1)[1] == [state_c]
    assert len(partials(seq)) == 1
    # A horizon larger than the clocks themselves prunes nothing (Go's uint64 would wrap).
    assert seq.checkpoint(10**15)[1] == [state_c]


def wrong_journal(env: Envelope[TestMsg]) -> Envelope[TestMsg]:
    return dataclasses.replace(env, journal="wrong/journal")


def early_begin(env: Envelope[TestMsg]) -> Envelope[TestMsg]:
    return dataclasses.replace(env, begin=env.begin - 1)


def late_end(env: Envelope[TestMsg]) -> Envelope[TestMsg]:
    return dataclasses.replace(env, end=env.end + 100)


@pytest.mark.parametrize(
    ("alter", "expect"),
    [
        (None, None),
        ("error", "replay reader: unexpected EOF"),
        (wrong_journal, "replay of wrong journal (wrong/journal; expected test/journal)"),
        (early_begin, "replay has wrong Begin (101; expected >= 102)"),
        (late_end, "replay has wrong End (302; expected <= 204)"),
    ],
)
def test_replay_reader_errors(alter: Any, expect: str | None) -> None:
    generate = envelope_generator()
    seq = Sequencer(None, (), 0)
    A, B = new_producer_id(), new_producer_id()
    b1 = generate(B, 1, CONT)
    a2 = generate(A, 2, CONT)
    a3_ack = generate(A, 3, ACK)
    assert queue(seq, b1, a2, a3_ack) == [Q.CONTINUE_BEGIN_SPAN, Q.CONTINUE_BEGIN_SPAN, Q.ACK_COMMIT_REPLAY]
    assert seq.replay_range() == ReplayRequest(JOURNAL, a2.begin, a3_ack.begin)

    def replay() -> Iterator[Envelope[TestMsg]]:
        if alter == "error":
            raise TruncatedFrameError("unexpected EOF", journal=JOURNAL, offset=a2.begin)
        yield alter(a2) if alter else a2

    seq.start_replay(replay())
    if expect is None:
        assert seq.step() and seq.dequeued == a2
        return
    with pytest.raises(ReplayError) as info:
        seq.step()
    assert info.value.reason == expect


def test_protocol_misuse_is_reported() -> None:
    generate = envelope_generator()
    seq = Sequencer(None, (), 0)
    A = new_producer_id()
    with pytest.raises(SequencerStateError):
        seq.replay_range()
    with pytest.raises(SequencerStateError):
        seq.start_replay(iter([]))

    a1 = generate(A, 1, CONT)
    a2_ack = generate(A, 2, ACK)
    assert queue(seq, a1, a2_ack) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_COMMIT_REPLAY]
    with pytest.raises(SequencerStateError, match="committed messages remain to dequeue"):
        seq.queue_uncommitted(generate(A, 3, CONT))
    with pytest.raises(SequencerStateError, match="required to start_replay"):
        seq.step()


def test_committed_iterator_and_outcome_properties() -> None:
    generate = envelope_generator()
    seq = Sequencer(None, (), 8)
    A = new_producer_id()
    envs = [generate(A, 1, CONT), generate(A, 2, CONT), generate(A, 3, ACK)]
    outcomes = queue(seq, *envs)
    assert [o.commits for o in outcomes] == [False, False, True]
    assert not any(o.needs_replay for o in outcomes)
    assert list(seq.committed()) == envs
    assert list(seq.committed()) == []
    assert str(Q.CONTINUE_TXN_CLOCK_LARGER) == "continueRingClockLarger"
    assert [int(q) for q in (Q.OUTSIDE_ALREADY_ACKED, Q.ACK_COMMIT_REPLAY)] == [0, 9]


def test_ack_regression_logs_loss_of_exactly_once(caplog: pytest.LogCaptureFixture) -> None:
    generate = envelope_generator()
    seq = Sequencer(None, (), 8)
    A = new_producer_id()
    assert queue(seq, generate(A, 5, ACK)) == [Q.ACK_EMPTY]
    assert len(list(seq.committed())) == 1
    with caplog.at_level(logging.ERROR, logger="consumer.message.sequencer"):
        assert queue(seq, generate(A, 3, ACK)) == [Q.ACK_ROLLBACK]  # An upstream checkpoint regressed.
        assert "loss of exactly-once semantics" in caplog.text
        assert queue(seq, generate(A, 3, ACK)) == [Q.ACK_ROLLBACK]  # A duplicate ACK: harmless.
    # Messages after the regressed ACK are processed again (at-least-once).
    assert queue(seq, generate(A, 4, OUT)) == [Q.OUTSIDE_COMMIT]


def test_zero_clock_envelope_does_not_unpend_a_real_producer() -> None:
    generate = envelope_generator()
    seq = Sequencer(None, (), 8)
    zero_producer = bytes(6)
    assert queue(seq, generate(zero_producer, 7, CONT)) == [Q.CONTINUE_BEGIN_SPAN]
    assert seq.has_pending()
    z = zero_uuid(generate(zero_producer, 0, 0))
    assert queue(seq, z) == [Q.OUTSIDE_COMMIT]
    assert list(seq.committed()) == [z]
    assert seq.has_pending()  # The open sequence of the real producer is still pending.


def test_self_committed_messages_take_no_ring_slot() -> None:
    # A self-committed message is its own sequence, dequeued at once: it is never put in the
    # ring, so a ring of three keeps another producer's span of two, and its ACK, through any
    # number of them.
    generate = envelope_generator()
    seq = Sequencer(None, (), 3)
    A, B = new_producer_id(), new_producer_id()
    a1, a2 = generate(A, 1, CONT), generate(A, 2, CONT)
    assert queue(seq, a1, a2) == [Q.CONTINUE_BEGIN_SPAN, Q.CONTINUE_EXTEND_SPAN]
    for clock in range(1, 6):
        b = generate(B, clock, OUT)
        assert queue(seq, b) == [Q.OUTSIDE_COMMIT]
        expect_deque(seq, b)
    assert seq._ring == [a1, a2]
    ack = generate(A, 3, ACK)
    assert queue(seq, ack) == [Q.ACK_COMMIT_RING]  # Not ACK_COMMIT_REPLAY: a1 was not evicted.
    expect_deque(seq, a1, a2, ack)
    assert seq.offsets == {JOURNAL: ack.end}


def test_dequeue_lone_is_queue_then_step_for_a_self_committed_message() -> None:
    # The same envelopes through queue_uncommitted + step(), and through dequeue_lone where it
    # applies: the same dequeued envelopes, offsets and checkpointed producer states.
    generate = envelope_generator()
    A, B = new_producer_id(), new_producer_id()
    envs = [
        generate(A, 1, OUT),  # A producer seen for the first time.
        generate(A, 2, OUT),
        generate(A, 2, OUT),  # A duplicate: not dequeue_lone's.
        generate(B, 1, CONT),  # Opens a span of B: not dequeue_lone's.
        generate(A, 3, OUT),
        generate(B, 2, OUT),  # B has an open span: not dequeue_lone's (it clobbers the span).
        zero_uuid(generate(A, 9, OUT)),  # A zero clock: not dequeue_lone's.
        generate(A, 4, OUT),
    ]
    lone = {0, 1, 4, 7}
    slow, fast = Sequencer(None, (), 4), Sequencer(None, (), 4)
    for i, env in enumerate(envs):
        seen_slow = []
        if seq_commits := slow.queue_uncommitted(env).commits:
            while slow.step():
                seen_slow.append(slow.dequeued)
        assert fast.dequeue_lone(env) is (i in lone), i
        seen_fast = []
        if i in lone:
            seen_fast.append(fast.dequeued)
            assert not fast.step()
        elif fast.queue_uncommitted(env).commits:
            while fast.step():
                seen_fast.append(fast.dequeued)
        assert seen_fast == seen_slow == ([env] if seq_commits else []), i
        assert fast.offsets == slow.offsets, i
        assert by_producer(fast.checkpoint(0)[1]) == by_producer(slow.checkpoint(0)[1]), i

    # Nothing changes when it declines: here, a sequence is still being dequeued.
    a5 = generate(A, 5, OUT)
    assert fast.dequeue_lone(a5) and fast.dequeued is a5
    assert not fast.dequeue_lone(generate(A, 6, OUT))
    assert fast.dequeued is a5
    with pytest.raises(SequencerStateError):
        fast.queue_uncommitted(generate(A, 6, OUT))
