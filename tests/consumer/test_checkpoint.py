"""Checkpoint building and flattening: Gazette's CheckpointSuite (checkpoint_extensions_test.go)."""

from __future__ import annotations

from consumer.checkpoint import ack_intents_of, build_checkpoint, flatten_producer_states, flatten_read_through
from consumer.message import AckIntent, JournalProducer, ProducerState
from consumer.protocol import pb as cpb

FOO = ProducerState(JournalProducer("foo", bytes([1, 2, 3, 4, 5, 6])), 456, 789)
BAR = ProducerState(JournalProducer("bar", bytes([0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0xFF])), 789, 101)


def test_round_trip() -> None:
    read_through = {"foo": 111, "bar": 222}
    intents = [AckIntent("baz", b"intent"), AckIntent("bing", b"other-intent")]
    cp = build_checkpoint(read_through, [FOO, BAR], intents)

    assert dict(cp.ack_intents) == {"baz": b"intent", "bing": b"other-intent"}
    foo = cpb.Checkpoint.Source(read_through=111)
    foo.producers.add(id=bytes([1, 2, 3, 4, 5, 6]), state=cpb.Checkpoint.ProducerState(last_ack=456, begin=789))
    bar = cpb.Checkpoint.Source(read_through=222)
    bar.producers.add(
        id=bytes([0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0xFF]), state=cpb.Checkpoint.ProducerState(last_ack=789, begin=101)
    )
    assert dict(cp.sources) == {"foo": foo, "bar": bar}

    # Inputs are recovered (producer order is not preserved).
    assert sorted(flatten_producer_states(cp), key=lambda s: s.journal_producer.journal != "foo") == [FOO, BAR]
    assert flatten_read_through(cp) == read_through
    assert ack_intents_of(cp) == intents


def test_producer_states_without_read_through() -> None:
    """A producer's journal gets a Source even when it has no read-through offset."""
    cp = build_checkpoint({}, [FOO])
    assert flatten_read_through(cp) == {"foo": 0}
    assert flatten_producer_states(cp) == [FOO]
    assert build_checkpoint({}) == cpb.Checkpoint()


def test_producer_id_map_regression() -> None:
    """A fixture written when producers were a map<string, ProducerState> decodes the same."""
    fixture = bytes([
        0xA, 0x21, 0xA, 0x3, 0x62, 0x61, 0x72, 0x12, 0x1A, 0x8, 0xDE, 0x1, 0x12, 0x15, 0xA, 0x6,
        0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0xFF, 0x12, 0xB, 0x9, 0x15, 0x3, 0x0, 0x0, 0x0, 0x0, 0x0,
        0x0, 0x10, 0x65, 0xA, 0x21, 0xA, 0x3, 0x66, 0x6F, 0x6F, 0x12, 0x1A, 0x8, 0x6F, 0x12, 0x16,
        0xA, 0x6, 0x1, 0x2, 0x3, 0x4, 0x5, 0x6, 0x12, 0xC, 0x9, 0xC8, 0x1, 0x0, 0x0, 0x0, 0x0, 0x0,
        0x0, 0x10, 0x95, 0x6, 0x12, 0xD, 0xA, 0x3, 0x62, 0x61, 0x7A, 0x12, 0x6, 0x69, 0x6E, 0x74,
        0x65, 0x6E, 0x74, 0x12, 0x14, 0xA, 0x4, 0x62, 0x69, 0x6E, 0x67, 0x12, 0xC, 0x6F, 0x74, 0x68,
        0x65, 0x72, 0x2D, 0x69, 0x6E, 0x74, 0x65, 0x6E, 0x74,
    ])  # fmt: skip
    cp = cpb.Checkpoint.FromString(fixture)
    states = sorted(flatten_producer_states(cp), key=lambda s: s.journal_producer.journal)
    assert states == [BAR, FOO]
    assert flatten_read_through(cp) == {"foo": 111, "bar": 222}
    assert dict(cp.ack_intents) == {"baz": b"intent", "bing": b"other-intent"}
