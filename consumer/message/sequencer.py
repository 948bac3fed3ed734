"""The Sequencer: turns read-uncommitted envelopes into read-committed ones.

Feed every envelope read from the journals, in order, to `queue_uncommitted`. When its outcome
commits (`QueueOutcome.commits`), drain with `step()` until it returns False, processing
`dequeued` after each True. Messages come out deduplicated and in order per (journal,
producer), with no head-of-line blocking across producers; an ACK_TXN envelope is itself
dequeued last in its sequence.

A ring buffer of recent envelopes usually holds a whole committed sequence. When it does not
(the ring evicted its start, or the sequence began before a recovered checkpoint), the outcome
is QUEUE_ACK_COMMIT_REPLAY: the caller reads `replay_range()` from the journal again, decodes it
into envelopes, and passes them as an iterator to `start_replay` before stepping. The Sequencer
never reads journals itself.

Checkpoints (`checkpoint`) record read-through offsets and per-producer states; a Sequencer
built from them (`Sequencer(offsets, states)`) continues exactly where the first left off.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from consumer.message.envelope import Envelope, JournalProducer, ProducerState
from consumer.message.errors import ReplayError, SequencerStateError
from consumer.message.uuid import (
    FLAGS_MASK,
    PRODUCER_ID_LENGTH,
    PRODUCER_MASK,
    Flags,
    flags_string,
    get_clock,
    get_flags,
    get_producer_id,
)

log = logging.getLogger(__name__)


class QueueOutcome(enum.IntEnum):
    """What `queue_uncommitted` did with an envelope. Values are Gazette's (iota from 0)."""

    OUTSIDE_ALREADY_ACKED = 0
    """An OUTSIDE_TXN duplicate of an acknowledged message: ignored."""
    OUTSIDE_COMMIT = 1
    """An OUTSIDE_TXN message committed itself: dequeue it."""
    CONTINUE_ALREADY_ACKED = 2
    """A CONTINUE_TXN duplicate of an acknowledged message: ignored."""
    CONTINUE_TXN_CLOCK_LARGER = 3
    """A CONTINUE_TXN duplicate within the open transaction (its clock is not larger): ignored."""
    CONTINUE_BEGIN_SPAN = 4
    """A CONTINUE_TXN message began the producer's transaction."""
    CONTINUE_EXTEND_SPAN = 5
    """A CONTINUE_TXN message extended the producer's transaction."""
    ACK_ROLLBACK = 6
    """An ACK_TXN rolled the producer back to its clock, discarding the open transaction."""
    ACK_EMPTY = 7
    """An ACK_TXN committed with no message before it: dequeue it."""
    ACK_COMMIT_RING = 8
    """An ACK_TXN committed a transaction held wholly in the ring: dequeue it."""
    ACK_COMMIT_REPLAY = 9
    """An ACK_TXN committed a transaction not wholly in the ring: replay, then dequeue it."""

    @property
    def commits(self) -> bool:
        """Whether messages are now ready: the caller must drain `step()`."""
        return self is _OUTSIDE_COMMIT or self is _ACK_COMMIT_RING or self is _ACK_EMPTY or self is _ACK_COMMIT_REPLAY

    @property
    def needs_replay(self) -> bool:
        """Whether the caller must `start_replay(replay_range())` before stepping."""
        return self is QueueOutcome.ACK_COMMIT_REPLAY

    def __str__(self) -> str:
        return _OUTCOME_NAMES[self]


# Gazette's QueueOutcome.String(), used in its metrics labels.
_OUTCOME_NAMES = {
    QueueOutcome.OUTSIDE_ALREADY_ACKED: "outsideAlreadyAcked",
    QueueOutcome.OUTSIDE_COMMIT: "outsideCommit",
    QueueOutcome.CONTINUE_ALREADY_ACKED: "continueAlreadyAcked",
    QueueOutcome.CONTINUE_TXN_CLOCK_LARGER: "continueRingClockLarger",
    QueueOutcome.CONTINUE_BEGIN_SPAN: "continueBeginSpan",
    QueueOutcome.CONTINUE_EXTEND_SPAN: "continueExtendSpan",
    QueueOutcome.ACK_ROLLBACK: "ackRollback",
    QueueOutcome.ACK_EMPTY: "ackEmpty",
    QueueOutcome.ACK_COMMIT_RING: "ackCommitRing",
    QueueOutcome.ACK_COMMIT_REPLAY: "ackCommitReplay",
}


# Module-level aliases: an enum member looked up on its class costs more than the comparison.
_OUTSIDE_ALREADY_ACKED = QueueOutcome.OUTSIDE_ALREADY_ACKED
_OUTSIDE_COMMIT = QueueOutcome.OUTSIDE_COMMIT
_CONTINUE_ALREADY_ACKED = QueueOutcome.CONTINUE_ALREADY_ACKED
_CONTINUE_TXN_CLOCK_LARGER = QueueOutcome.CONTINUE_TXN_CLOCK_LARGER
_CONTINUE_BEGIN_SPAN = QueueOutcome.CONTINUE_BEGIN_SPAN
_CONTINUE_EXTEND_SPAN = QueueOutcome.CONTINUE_EXTEND_SPAN
_ACK_ROLLBACK = QueueOutcome.ACK_ROLLBACK
_ACK_EMPTY = QueueOutcome.ACK_EMPTY
_ACK_COMMIT_RING = QueueOutcome.ACK_COMMIT_RING
_ACK_COMMIT_REPLAY = QueueOutcome.ACK_COMMIT_REPLAY
_IGNORED = (_OUTSIDE_ALREADY_ACKED, _CONTINUE_ALREADY_ACKED, _CONTINUE_TXN_CLOCK_LARGER)
_OUTSIDE_TXN = int(Flags.OUTSIDE_TXN)
_CONTINUE_TXN = int(Flags.CONTINUE_TXN)
_ACK_TXN = int(Flags.ACK_TXN)


@dataclasses.dataclass(frozen=True, slots=True)
class ReplayRequest:
    """Bytes [begin, end) of `journal` must be read again and passed to `start_replay`."""

    journal: str
    begin: int
    end: int


@dataclasses.dataclass(slots=True)
class PartialSeq:
    """The open (or just committed) sequence of one JournalProducer.

    Clocks in (min_clock, max_clock] are the sequence; `begin` is the offset of its first
    message or -1; ring_start / ring_stop index its first and last envelopes in the ring, or -1.
    """

    jp: JournalProducer
    min_clock: int
    max_clock: int
    begin: int = -1
    ring_start: int = -1
    ring_stop: int = -1

    def reset(self, clock: int) -> None:
        """Make this an empty sequence after `clock`."""
        self.min_clock = self.max_clock = clock
        self.begin = self.ring_start = self.ring_stop = -1


def _key(jp: JournalProducer) -> tuple[str, int]:
    """The Sequencer's key of a producer within a journal."""
    return jp.journal, int.from_bytes(jp.producer, "big")


def _journal_producer(key: tuple[str, int]) -> JournalProducer:
    """The JournalProducer of a Sequencer's key (`_key`'s inverse)."""
    return JournalProducer(key[0], key[1].to_bytes(PRODUCER_ID_LENGTH, "big"))


class Sequencer:
    """Sequences read-uncommitted envelopes into acknowledged, read-committed ones.

    `offsets` maps each journal to the offset of the next envelope to read; `states` are
    ProducerStates from a previous `checkpoint`; `buffer` is the ring capacity (at least 1).
    """

    def __init__(
        self,
        offsets: Mapping[str, int] | None = None,
        states: Sequence[ProducerState] = (),
        buffer: int = 1,
    ) -> None:
        self.dequeued: Envelope[Any] | None = None
        """The envelope to process after `step()` returned True; None otherwise."""
        self._dequeued_clock = 0
        self._dequeued_ring_index = -1
        self._offsets: dict[str, int] = dict(offsets or {})
        # By (journal, producer ID as an int): the UUID's low 48 bits, looked up once per message
        # read without building the ID's bytes.
        self._partials: dict[tuple[str, int], PartialSeq] = {
            _key(state.journal_producer): PartialSeq(
                state.journal_producer, state.last_ack, state.last_ack, state.begin
            )
            for state in states
        }
        # Sequences begun since the last checkpoint, by identity as in Go (the throwaway sequence
        # of a zero clock must not un-pend a real producer's).
        self._pending: dict[int, PartialSeq] = {}
        self._emit: PartialSeq | None = None
        # The envelope of a ready OUTSIDE_COMMIT sequence of one, held outside the ring for step().
        self._lone: Envelope[Any] | None = None
        self._replay_it: Iterator[Envelope[Any]] | None = None
        self._capacity = max(buffer, 1)
        self._ring: list[Envelope[Any] | None] = []
        self._next: list[int] = []  # Per-producer linked lists through the ring.
        self._clocks: list[int] = []  # The clock of each ring entry's UUID.
        self._head = 0  # Next ring index to write.

    @property
    def offsets(self) -> dict[str, int]:
        """A copy of the read-through offsets: where to resume reading each journal."""
        return dict(self._offsets)

    def dequeue_lone(self, env: Envelope[Any]) -> bool:
        """`queue_uncommitted(env)` then `step()`, in one, for the usual envelope: an OUTSIDE_COMMIT
        of a producer with no open span, a committed sequence of one never put in the ring.

        True: `dequeued` is `env`, as after that queue_uncommitted and step(); call step() once it
        is processed. False: nothing changed (any other envelope, or committed messages remain
        to dequeue): call queue_uncommitted.
        """
        if self._emit is not None:
            return False
        # The producer, clock and flags of the UUID (as consumer.message.uuid computes them),
        # inline: this runs once per message read.
        u = env.uuid.int
        if (u >> 48) & FLAGS_MASK != _OUTSIDE_TXN:
            return False
        hi = u >> 64  # Its fields in a 64-bit int (cheaper to shift than the 128-bit one).
        clock = (hi >> 32) << 4 | ((hi >> 16) & 0xFFFF) << 36 | (hi & 0xFFF) << 52 | (u >> 58) & 0xF
        if not clock:
            return False
        key = (env.journal, u & PRODUCER_MASK)
        partial = self._partials.get(key)
        if partial is None:
            partial = self._new_partial(key, clock)
        elif clock <= partial.min_clock or partial.begin != -1:
            return False
        # _decide's OUTSIDE_COMMIT, and step() of its sequence of one.
        partial.begin = env.begin
        partial.max_clock = clock
        partial.ring_start = partial.ring_stop = -1
        self._emit = partial
        self.dequeued = env
        self._dequeued_clock = clock
        self._dequeued_ring_index = -1
        return True

    def _new_partial(self, key: tuple[str, int], clock: int) -> PartialSeq:
        jp = _journal_producer(key)
        partial = self._partials[key] = PartialSeq(jp, clock - 1, clock - 1)
        return partial

    def queue_uncommitted(self, env: Envelope[Any]) -> QueueOutcome:
        """Apply the next read-uncommitted envelope and say what became of it.

        Raises SequencerStateError if committed messages remain to be dequeued.
        """
        if self._emit is not None:
            raise SequencerStateError("committed messages remain to dequeue", journal=env.journal, offset=env.begin)
        if self.dequeue_lone(env):
            self._lone, self.dequeued = env, None  # For step() to hand out.
            return _OUTSIDE_COMMIT
        u = env.uuid.int
        key = (env.journal, u & PRODUCER_MASK)
        clock = get_clock(env.uuid)
        flags = (u >> 48) & FLAGS_MASK
        uuid_clock = clock  # As the ring keeps it for step(), even when overridden below.
        partial = self._partials.get(key)

        if clock == 0:
            # A zero clock (including the zero UUID) commits at once, untracked.
            partial = PartialSeq(_journal_producer(key), 0, 0)
            flags, clock = _OUTSIDE_TXN, 1
        elif partial is None:
            partial = self._new_partial(key, clock)

        ring = self._ring
        if len(ring) < self._capacity or ring[self._head] is not None:
            self._evict_at_head()  # (A full ring's empty slot needs nothing: the usual case.)

        outcome = self._decide(env, partial, clock, flags)

        # Each outcome either sets _emit or advances offsets, never both: offsets advance past a
        # committing envelope only once its sequence is consumed, so a crash re-reads it.
        if outcome is _OUTSIDE_COMMIT:
            # Clobber any open span (an effective rollback): this message is the sequence.
            self._add_at_head(env, partial, uuid_clock)
            partial.begin = env.begin
            partial.ring_start = partial.ring_stop
            partial.max_clock = clock
            self._emit = partial
        elif outcome is _CONTINUE_BEGIN_SPAN or outcome is _CONTINUE_EXTEND_SPAN:
            if outcome is _CONTINUE_BEGIN_SPAN:
                partial.begin = env.begin
                self._pending[id(partial)] = partial
            self._add_at_head(env, partial, uuid_clock)
            partial.max_clock = clock
            self._offsets[env.journal] = env.end
        elif outcome is _ACK_ROLLBACK:
            partial.reset(clock)
            self._pending.pop(id(partial), None)
            self._offsets[env.journal] = env.end
        elif outcome in _IGNORED:
            self._offsets[env.journal] = env.end
        else:  # ACK_EMPTY, ACK_COMMIT_RING, ACK_COMMIT_REPLAY
            self._add_at_head(env, partial, uuid_clock)
            if outcome is _ACK_EMPTY:
                partial.begin = env.begin
            # Commit through `clock`, which may be below max_clock: larger clocks are dropped.
            partial.max_clock = clock
            self._emit = partial
        return outcome

    def _decide(self, env: Envelope[Any], partial: PartialSeq, clock: int, flags: int) -> QueueOutcome:
        """The outcome table of Gazette's QueueUncommitted; no state changes here."""
        if flags == _CONTINUE_TXN:
            if clock <= partial.min_clock:
                return _CONTINUE_ALREADY_ACKED
            if clock <= partial.max_clock:
                return _CONTINUE_TXN_CLOCK_LARGER
            if partial.begin == -1:
                return _CONTINUE_BEGIN_SPAN
            return _CONTINUE_EXTEND_SPAN

        if flags == _ACK_TXN:
            if clock < partial.min_clock:
                # The upstream shard recovered an older checkpoint. Accept the reset: refusing could
                # drop messages it re-sends under new UUIDs; this window becomes at-least-once.
                self._log_error(
                    env, partial, "unexpected ACK_TXN which is less than lastACK (loss of exactly-once semantics)"
                )
                return _ACK_ROLLBACK
            if clock == partial.min_clock:
                return _ACK_ROLLBACK
            if partial.begin == -1:
                return _ACK_EMPTY
            if partial.ring_start == -1:
                return _ACK_COMMIT_REPLAY  # No part of the sequence is in the ring.
            start = self._ring[partial.ring_start]
            if start is None or start.begin != partial.begin:
                return _ACK_COMMIT_REPLAY  # Only a suffix is in the ring.
            return _ACK_COMMIT_RING

        if flags != _OUTSIDE_TXN:
            self._log_error(env, partial, "unexpected UUID flags")  # Then handled as OUTSIDE_TXN.
        if clock <= partial.min_clock:
            return _OUTSIDE_ALREADY_ACKED
        if partial.begin != -1:
            self._log_error(
                env,
                partial,
                "unexpected OUTSIDE_TXN with a preceding CONTINUE_TXN"
                " (mixed use of PublishUncommitted and PublishCommitted to the same journal?)",
            )
        return _OUTSIDE_COMMIT

    def step(self) -> bool:
        """Step to the next committed envelope: True if `dequeued` now holds one.

        False means the committed sequence is done (or none was ready). Calling step() again
        marks the previous `dequeued` as processed. Raises ReplayError if the replay iterator
        fails or strays outside `replay_range()`, and SequencerStateError if a replay was
        required but not started.
        """
        emit = self._emit
        if emit is None:
            return False
        lone = self._lone
        if lone is not None:
            # An OUTSIDE_COMMIT sequence of one, never in the ring (dequeue_lone's, queued).
            self._lone = None
            self.dequeued = lone
            return True
        ring = self._ring
        if self.dequeued is None:
            if self._replay_it is None:
                start = ring[emit.ring_start]
                if start is None or emit.begin != start.begin:
                    raise SequencerStateError(
                        "caller was required to start_replay, and didn't", journal=emit.jp.journal, offset=emit.begin
                    )
        else:
            # The previous envelope was processed: tighten the bound past it.
            emit.min_clock = self._dequeued_clock
            if self._dequeued_ring_index != -1:
                ring[self._dequeued_ring_index] = None  # Release it; eviction skips empty slots.

        while emit.ring_start != -1:
            if self._replay_it is None:
                # Consume the ring; ring_start moves one past the dequeued entry.
                index = emit.ring_start
                candidate = ring[index]
                emit.ring_start = self._next[index]
                if candidate is None:
                    continue
                self._dequeued_ring_index = index
                clock = self._clocks[index]
            else:
                replayed = self._next_replayed(emit)
                if replayed is None:
                    self._replay_it = None  # Replay done: continue from the ring.
                    continue
                if get_producer_id(replayed.uuid) != emit.jp.producer:
                    continue  # The replayed range interleaves other producers' messages.
                candidate = replayed
                self._dequeued_ring_index = -1
                clock = get_clock(candidate.uuid)

            self.dequeued = candidate
            self._dequeued_clock = clock
            if clock != 0 and clock <= emit.min_clock:
                # A duplicate. Replays see these routinely, and the ring can too when a duplicated
                # sequence straddles a recovered checkpoint (which keeps only the last ACK).
                continue
            if clock > emit.max_clock:
                continue  # Past the committing ACK: rolled back.
            emit.begin = candidate.begin  # A checkpoint now resumes from here.
            return True

        # The sequence is consumed. Only now move the journal's offset past the committing
        # envelope, which queue_uncommitted deliberately left unread.
        if self.dequeued is not None:
            self._offsets[emit.jp.journal] = self.dequeued.end
        # emit.reset(emit.min_clock), inline: this runs once per message consumed.
        emit.max_clock = emit.min_clock
        emit.begin = emit.ring_start = emit.ring_stop = -1
        if self._pending:
            self._pending.pop(id(emit), None)
        self.dequeued = None
        self._emit = None
        self._dequeued_clock = 0
        self._dequeued_ring_index = -1
        return False

    def committed(self) -> Iterator[Envelope[Any]]:
        """Yield each committed envelope of the ready sequence (sugar over step/dequeued).

        Each envelope counts as processed when the next one is requested.
        """
        while self.step():
            assert self.dequeued is not None
            yield self.dequeued

    def _next_replayed(self, emit: PartialSeq) -> Envelope[Any] | None:
        """The next replayed envelope after checking it lies in the replay range; None at its end."""
        assert self._replay_it is not None
        try:
            env = next(self._replay_it)
        except StopIteration:
            return None
        except Exception as e:
            reason = getattr(e, "reason", None) or str(e) or type(e).__name__
            raise ReplayError(f"replay reader: {reason}", journal=emit.jp.journal, offset=emit.begin) from e

        ring_begin = self._ring_begin(emit)
        if env.journal != emit.jp.journal:
            raise ReplayError(
                f"replay of wrong journal ({env.journal}; expected {emit.jp.journal})",
                journal=env.journal,
                offset=env.begin,
            )
        if env.begin < emit.begin:
            raise ReplayError(
                f"replay has wrong Begin ({env.begin}; expected >= {emit.begin})", journal=env.journal, offset=env.begin
            )
        if env.end > ring_begin:
            raise ReplayError(
                f"replay has wrong End ({env.end}; expected <= {ring_begin})", journal=env.journal, offset=env.begin
            )
        return env

    def _ring_begin(self, emit: PartialSeq) -> int:
        start = self._ring[emit.ring_start]
        assert start is not None, "the committing envelope is always in the ring"
        return start.begin

    def replay_range(self) -> ReplayRequest:
        """The journal bytes to replay before the ready sequence can be dequeued.

        Raises SequencerStateError if no sequence is ready.
        """
        if self._emit is None:
            raise SequencerStateError("no committed messages to replay")
        return ReplayRequest(self._emit.jp.journal, self._emit.begin, self._ring_begin(self._emit))

    def start_replay(self, envelopes: Iterator[Envelope[Any]]) -> None:
        """Set the iterator of read-uncommitted envelopes decoded from `replay_range()`.

        It may yield envelopes of other producers (they are skipped) and should end at the
        range's end. Raises SequencerStateError if no sequence is ready.
        """
        if self._emit is None:
            raise SequencerStateError("no committed messages to replay")
        self._replay_it = iter(envelopes)

    def has_pending(self) -> bool:
        """Whether a producer's sequence began since the last checkpoint (more messages are likely)."""
        return bool(self._pending)

    def checkpoint(self, prune_horizon_ns: int = 0) -> tuple[dict[str, int], list[ProducerState]]:
        """Read-through offsets and the state of each producer, for a later `Sequencer(...)`.

        Producers whose max clock trails their journal's largest acknowledged clock by more than
        `prune_horizon_ns` nanoseconds are forgotten; 0 prunes none. Clears `has_pending`.
        """
        newest: dict[str, int] = {}
        for (journal, _), partial in self._partials.items():
            if partial.min_clock > newest.get(journal, 0):
                newest[journal] = partial.min_clock
        # Clock units are 100 ns, above 4 counter bits. Go's uint64 would wrap below zero; a
        # negative bound prunes nothing, which is what a horizon older than the clock means.
        bounds = {
            journal: (clock - ((prune_horizon_ns // 100) << 4) if prune_horizon_ns > 0 else 0)
            for journal, clock in newest.items()
        }
        states: list[ProducerState] = []
        for key, partial in list(self._partials.items()):
            if partial.max_clock >= bounds.get(key[0], 0):
                states.append(ProducerState(partial.jp, partial.min_clock, partial.begin))
            else:
                del self._partials[key]
        # Sequences still open weren't completed in this transaction; don't make the next wait.
        self._pending.clear()
        return dict(self._offsets), states

    def _evict_at_head(self) -> None:
        if len(self._ring) < self._capacity:
            self._ring.append(None)  # Still filling: the new slot is the head.
            self._next.append(-1)
            self._clocks.append(0)
            return
        evicted = self._ring[self._head]
        if evicted is None:
            return  # Already empty.

        partial = self._partials.get((evicted.journal, evicted.uuid.int & PRODUCER_MASK))
        # The evicted envelope may still start its producer's sequence in the ring.
        if partial is not None and partial.ring_start == self._head:
            only = partial.ring_start == partial.ring_stop
            if only and self._next[partial.ring_start] == -1:
                partial.ring_start = partial.ring_stop = -1
            elif not only and self._next[partial.ring_start] != -1:
                partial.ring_start = self._next[partial.ring_start]
            else:
                raise SequencerStateError("invariant violated: ringStart == ringStop iff next[ringStart] == -1")
        self._ring[self._head] = None
        self._next[self._head] = -1

    def _add_at_head(self, env: Envelope[Any], partial: PartialSeq, clock: int) -> None:
        head = self._head
        self._ring[head] = env
        self._clocks[head] = clock
        self._next[head] = -1
        if partial.ring_stop == -1:
            partial.ring_start = head
        else:
            self._next[partial.ring_stop] = head
        partial.ring_stop = head
        self._head = (head + 1) % self._capacity

    def _log_error(self, env: Envelope[Any], partial: PartialSeq, message: str) -> None:
        log.error(
            "%s: journal=%s begin=%d end=%d producer=%s clock=%d flags=%s"
            " partial.minClock=%d partial.maxClock=%d partial.begin=%d partial.ringStart=%d partial.ringStop=%d",
            message,
            env.journal,
            env.begin,
            env.end,
            get_producer_id(env.uuid).hex(),
            get_clock(env.uuid),
            flags_string(get_flags(env.uuid)),
            partial.min_clock,
            partial.max_clock,
            partial.begin,
            partial.ring_start,
            partial.ring_stop,
        )
