"""Building a shard's `Checkpoint` from a transaction's results, and flattening it back.

Gazette's `BuildCheckpoint`, `FlattenReadThrough` and `FlattenProducerStates`
(consumer/protocol/checkpoint_extensions.go): a Checkpoint holds, per source journal, the
offset read through and the state of each producer seen there, and per journal the framed ACK
intent the transaction's publisher must append once the checkpoint is committed. A Sequencer
built from the flattened checkpoint continues exactly where the transaction left off.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from consumer.message import AckIntent, JournalProducer, ProducerState
from consumer.protocol import pb as cpb


def build_checkpoint(
    read_through: Mapping[str, int],
    producer_states: Iterable[ProducerState] = (),
    ack_intents: Iterable[AckIntent] = (),
) -> cpb.Checkpoint:
    """A Checkpoint with a Source per journal of `read_through`, its producers' states listed under
    their journal (which gets a Source even if it has no read-through offset), and each ACK intent
    under its journal (a later intent for the same journal replaces an earlier one)."""
    cp = cpb.Checkpoint()
    for journal, offset in read_through.items():
        cp.sources[journal].read_through = offset
    for state in producer_states:
        entry = cp.sources[state.journal_producer.journal].producers.add()
        entry.id = bytes(state.journal_producer.producer)
        entry.state.last_ack = state.last_ack
        entry.state.begin = state.begin
    for ack in ack_intents:
        cp.ack_intents[ack.journal] = ack.intent
    return cp


def flatten_read_through(cp: cpb.Checkpoint) -> dict[str, int]:
    """The read-through offset of every source journal of `cp`."""
    return {journal: source.read_through for journal, source in cp.sources.items()}


def flatten_producer_states(cp: cpb.Checkpoint) -> list[ProducerState]:
    """The ProducerStates of `cp`, journal by journal (Go's map order is not kept: don't rely on it).

    A producer ID is taken as its first 6 bytes, zero-padded if shorter, as Go copies it into a
    ProducerID array.
    """
    out = []
    for journal, source in cp.sources.items():
        for entry in source.producers:
            producer = bytes(entry.id[:6]).ljust(6, b"\x00")
            out.append(ProducerState(JournalProducer(journal, producer), entry.state.last_ack, entry.state.begin))
    return out


def ack_intents_of(cp: cpb.Checkpoint) -> list[AckIntent]:
    """The ACK intents of `cp`, ordered by journal name."""
    return [AckIntent(journal, bytes(cp.ack_intents[journal])) for journal in sorted(cp.ack_intents)]
