"""Reading messages from a journal: read-uncommitted and read-committed async iterators.

`read_uncommitted` yields every message as written (Gazette's ReadUncommittedIter), and
`read_uncommitted_batches` the same a chunk's envelopes at a time.
`read_committed` runs them through a Sequencer (Gazette's ReadCommittedIter): it yields only
acknowledged messages, deduplicated and in order per producer, with each committing ACK last
in its sequence. When the Sequencer's ring no longer holds the start of a committed sequence,
the sequence's range is read again with a second reader.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TypeVar

from broker.client import (
    JournalClient,
    OffsetJump,
    OffsetNotYetAvailable,
    RetryReader,
    list_journals,
)
from broker.protocol import pb
from consumer.message.decoder import EnvelopeDecoder, NewMessage
from consumer.message.envelope import Envelope
from consumer.message.errors import MessageError
from consumer.message.framing import framing_for
from consumer.message.sequencer import Sequencer

log = logging.getLogger(__name__)

M = TypeVar("M")

SPEC_RETRY_SECONDS = 60.0
"""How long fetching a journal's spec retries while no broker answers (one may be restarting)."""


async def fetch_journal_spec(
    client: JournalClient, journal: str, *, retry_for: float = SPEC_RETRY_SECONDS
) -> pb.JournalSpec:
    """The spec of `journal` (any `;meta` suffix is ignored). Raises MessageError if it doesn't exist,
    or if no broker answered for `retry_for` seconds (a broker restarting is waited for, as a
    RetryReader waits)."""
    name = journal.split(";", 1)[0]
    sel = pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name="name", value=name)]))
    try:
        resp = await list_journals(client, sel, retry_for=retry_for)
    except Exception as e:
        raise MessageError(f"fetching journal spec: {e}", journal=journal) from e
    for j in resp.journals:
        if j.spec.name == name:
            return j.spec
    raise MessageError(f"fetching journal spec: named journal does not exist ({name})", journal=journal)


async def read_uncommitted(
    client: JournalClient,
    journal: str,
    offset: int,
    message_factory: NewMessage[M],
    *,
    block: bool = True,
    end_offset: int = 0,
    spec: pb.JournalSpec | None = None,
) -> AsyncIterator[Envelope[M]]:
    """Yield the Envelopes of `journal` from `offset`, committed or not.

    The framing comes from the journal's `content-type` label. A blocking read never ends; a
    non-blocking one ends at the write head, and any read ends at `end_offset` (if non-zero).
    Offset jumps (e.g. removed content) are logged and followed. A decode error ends the
    iterator with its MessageError.
    """
    async for batch in read_uncommitted_batches(
        client, journal, offset, message_factory, block=block, end_offset=end_offset, spec=spec
    ):
        for env in batch:
            yield env


async def read_uncommitted_batches(
    client: JournalClient,
    journal: str,
    offset: int,
    message_factory: NewMessage[M],
    *,
    block: bool = True,
    end_offset: int = 0,
    spec: pb.JournalSpec | None = None,
    max_batch: int = 128,
) -> AsyncIterator[list[Envelope[M]]]:
    """`read_uncommitted`, a list at a time: the Envelopes decoded from each chunk read, in lists of
    at most `max_batch` (never empty). Cheaper per envelope for a reader that hands them on; a
    decode error ends the iterator after the list of envelopes before it.

    The rest of a chunk is decoded only as the lists are taken: messages decoded far ahead of
    their use cost a consumer about a tenth of its throughput in cache misses (bench_consumer).
    The next chunk is read meanwhile, one read ahead.
    """
    if spec is None:
        spec = await fetch_journal_spec(client, journal)
    try:
        framing = framing_for(spec)
    except MessageError as e:
        raise MessageError(f"determining framing: {e.reason}", journal=journal) from e
    decoder: EnvelopeDecoder[M] = EnvelopeDecoder(journal, framing, message_factory, offset)
    async with RetryReader(client, journal, offset=offset, block=block, end_offset=end_offset) as rr:

        async def read_chunk() -> tuple[bytes, int]:
            data = await rr.read()
            return data, rr.offset - len(data)

        # The next chunk is read while this one is decoded and handed on: a reader that waited
        # for the broker only once its envelopes were all taken left a consumer without input.
        pending: asyncio.Future[tuple[bytes, int]] | None = None
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(read_chunk())
                try:
                    data, begin = await pending
                except OffsetJump as jump:
                    if jump.offset != -1:
                        log.warning("offset jump", extra={"journal": journal, "from": jump.offset, "to": jump.to})
                    continue
                except OffsetNotYetAvailable:
                    break  # A non-blocking read reached the write head.
                finally:
                    pending = None
                if not data:
                    break  # end_offset reached.
                decoder.feed(data, begin)
                pending = asyncio.ensure_future(read_chunk())
                # An error is raised by the take() after the one that returned the envelopes before it.
                while batch := decoder.take(max_batch):
                    yield batch
        finally:
            if pending is not None:  # Closed early (or failed): the read ahead is not wanted.
                pending.cancel()
                await asyncio.wait([pending])  # Before the reader closes under it.
                if not pending.cancelled():
                    pending.exception()  # Retrieved: it is not this iterator's error.
    while batch := decoder.take(max_batch, eof=True):
        yield batch


async def read_committed(
    client: JournalClient,
    journal: str,
    offset: int,
    message_factory: NewMessage[M],
    buffer: int = 1024,
    *,
    block: bool = True,
    sequencer: Sequencer | None = None,
) -> AsyncIterator[Envelope[M]]:
    """Yield the committed Envelopes of `journal` read from `offset`, deduplicated, in order per producer.

    `buffer` is the Sequencer's ring size (ignored if `sequencer` is given, e.g. one rebuilt
    from a checkpoint; its offset for `journal` should then be `offset`). ACK envelopes are
    yielded too, each last in its sequence. A sequence whose start left the ring is re-read
    over `Sequencer.replay_range()` with a second, bounded reader.
    """
    seq = Sequencer({journal: offset}, buffer=buffer) if sequencer is None else sequencer
    spec = await fetch_journal_spec(client, journal)
    async for env in read_uncommitted(client, journal, offset, message_factory, block=block, spec=spec):
        outcome = seq.queue_uncommitted(env)
        if outcome.needs_replay:
            rng = seq.replay_range()
            replayed = [
                e
                async for e in read_uncommitted(
                    client, rng.journal, rng.begin, message_factory, block=False, end_offset=rng.end, spec=spec
                )
            ]
            seq.start_replay(iter(replayed))
        while seq.step():
            assert seq.dequeued is not None
            yield seq.dequeued
