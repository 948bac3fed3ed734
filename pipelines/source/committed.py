"""Read-committed filtering of one partition's messages through the Sequencer.

A partition runs a Sequencer that starts empty at its begin offset. Messages of a transaction
whose first message lies before the partition are seen as a suffix: they begin a span here and
the committing ACK settles them (or a rollback ACK, whose clock is below the span's, drops them).
Messages of transactions still open at the partition's end are settled by reading past the end;
only offsets inside the partition are emitted, so each committed message is emitted by exactly
one partition. ACKs themselves are never rows.

Rows wait (in memory, as Arrow batches) while a transaction that began before them is open, so a
transaction open across a whole fragment holds that fragment's rows until it settles.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from uuid import UUID

from consumer.message import (
    ZERO_UUID,
    Envelope,
    Flags,
    QueueOutcome,
    Sequencer,
    clock_unix_ns,
    get_clock,
    get_flags,
    get_producer_id,
)

RING = 1 << 16
"""Sequencer ring size: a committed sequence larger than this is re-read (replayed) from the journal."""

Replay = Callable[[int, int], Iterable[Envelope[None]]]
"""Envelopes of bytes [begin, end) of the partition's journal, decoded again."""

_SETTLES = frozenset(
    {
        QueueOutcome.OUTSIDE_COMMIT, QueueOutcome.ACK_ROLLBACK, QueueOutcome.ACK_EMPTY,
        QueueOutcome.ACK_COMMIT_RING, QueueOutcome.ACK_COMMIT_REPLAY,
    }
)


class CommittedFilter:
    """Which messages of [begin, end) of `journal` are committed, fed in journal order."""

    def __init__(self, journal: str, begin: int, end: int, replay: Replay) -> None:
        self.journal = journal
        self.begin = begin
        self.end = end
        self._replay = replay
        self._seq = Sequencer({journal: begin}, buffer=RING)
        self.open: dict[bytes, int] = {}
        """Producer -> offset of the first message of its open transaction."""
        self.last_clock: dict[bytes, int] = {}
        """Producer -> wall time (unix ns) of the last message of its open transaction."""
        self.committed: set[int] = set()
        """Offsets (in [begin, end)) of committed, non-ACK messages not yet taken."""

    def feed(self, offset: int, end: int, uuid: UUID | None) -> None:
        """Apply the message at [offset, end); a None UUID commits at once (Gazette's zero UUID)."""
        env: Envelope[None] = Envelope(self.journal, offset, end, None, uuid or ZERO_UUID)
        outcome = self._seq.queue_uncommitted(env)
        producer = get_producer_id(env.uuid)
        if outcome is QueueOutcome.CONTINUE_BEGIN_SPAN:
            self.open[producer] = offset
        elif outcome in _SETTLES and env.uuid != ZERO_UUID:
            self.open.pop(producer, None)
            self.last_clock.pop(producer, None)
        if producer in self.open and env.uuid != ZERO_UUID:
            self.last_clock[producer] = clock_unix_ns(get_clock(env.uuid))
        if outcome.needs_replay:
            rng = self._seq.replay_range()
            self._seq.start_replay(iter(self._replay(rng.begin, rng.end)))
        if outcome.commits:
            while self._seq.step():
                done = self._seq.dequeued
                assert done is not None
                if get_flags(done.uuid) != Flags.ACK_TXN and self.begin <= done.begin < self.end:
                    self.committed.add(done.begin)

    def settled_before(self, abandoned_before_ns: int | None = None) -> int:
        """Every message before this offset is decided (committed or not).

        Transactions whose last message is older than `abandoned_before_ns` (unix ns) are taken
        as abandoned (a producer that died without an ACK or a rollback) and do not hold it back.
        """
        cutoff = abandoned_before_ns

        def live(producer: bytes) -> bool:
            return cutoff is None or self.last_clock.get(producer, cutoff) >= cutoff

        return min((begin for producer, begin in self.open.items() if live(producer)), default=1 << 62)

    def pending_inside(self) -> bool:
        """Whether a transaction that began inside the partition is still open."""
        return any(begin < self.end for begin in self.open.values())

    def take(self, offsets: Iterable[int]) -> Iterator[bool]:
        """For each offset: whether it is committed (and forget it)."""
        for offset in offsets:
            if offset in self.committed:
                self.committed.discard(offset)
                yield True
            else:
                yield False
