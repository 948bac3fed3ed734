"""EnvelopeDecoder, and a Sequencer driven from journal byte chunks end to end."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from broker.protocol import labels as lbl
from broker.protocol import pb
from consumer.message import (
    CSV_FRAMING,
    JSON_FRAMING,
    Clock,
    CSVRecord,
    DecodeError,
    Envelope,
    EnvelopeDecoder,
    Flags,
    QueueOutcome,
    Sequencer,
    TruncatedFrameError,
    UnknownContentTypeError,
    build_uuid,
    decode_chunks,
    new_producer_id,
)
from tests.consumer.message.helpers import TestMsg, new_test_msg


def chunked(data: bytes, offset: int, size: int) -> Iterator[tuple[int, bytes]]:
    for i in range(0, len(data), size):
        yield offset + i, data[i : i + size]


def test_decoder_yields_envelopes_with_offsets() -> None:
    producer = new_producer_id()
    msgs = [TestMsg(build_uuid(producer, 160 * (i + 1), Flags.OUTSIDE_TXN), f"m{i}") for i in range(5)]
    data = b"".join(JSON_FRAMING.marshal(m) for m in msgs)

    spec = pb.JournalSpec(name="a/journal", labels=lbl.label_set((lbl.CONTENT_TYPE, lbl.CONTENT_TYPE_JSON_LINES)))
    decoder = EnvelopeDecoder.for_spec(spec, new_test_msg, offset=1000)
    envs: list[Envelope[TestMsg]] = []
    for offset, chunk in chunked(data, 1000, 9):
        decoder.feed(chunk, offset)
        envs.extend(decoder.envelopes())
    envs.extend(decoder.envelopes(eof=True))

    assert [e.message for e in envs] == msgs
    assert [e.uuid for e in envs] == [m.UUID for m in msgs]
    assert envs[0].begin == 1000 and envs[-1].end == 1000 + len(data)
    assert all(a.end == b.begin for a, b in itertools.pairwise(envs))
    assert decoder.offset == 1000 + len(data)


def test_decoder_errors_carry_journal_offset_and_content_type() -> None:
    decoder = EnvelopeDecoder("a/journal", JSON_FRAMING, new_test_msg, 1000)
    decoder.feed(b'{"Str":"partial')
    assert decoder.next() is None
    with pytest.raises(TruncatedFrameError) as info:
        decoder.next(eof=True)
    assert str(info.value) == "unexpected EOF (journal a/journal, offset 1000, content-type application/x-ndjson)"

    def broken(journal: str) -> TestMsg:
        raise RuntimeError("no messages today")

    decoder = EnvelopeDecoder("a/journal", JSON_FRAMING, broken)
    decoder.feed(b"{}\n{}\n")
    with pytest.raises(DecodeError, match="newMessage: no messages today"):
        decoder.next()
    assert decoder.offset == 3  # The frame was consumed; the next one is reachable.

    with pytest.raises(UnknownContentTypeError):
        EnvelopeDecoder.for_spec(pb.JournalSpec(name="a/journal"), new_test_msg)


def test_take_returns_the_envelopes_before_an_error_then_raises_it_then_goes_on() -> None:
    producer = new_producer_id()
    msgs = [TestMsg(build_uuid(producer, 160 * (i + 1), Flags.OUTSIDE_TXN), f"m{i}") for i in range(5)]
    lines = [JSON_FRAMING.marshal(m) for m in msgs]
    lines[2] = b'{"Str":oops}\n'  # Not JSON.
    data = b"".join(lines)
    begins = list(itertools.accumulate((len(line) for line in lines), initial=0))
    decoder = EnvelopeDecoder("a/journal", JSON_FRAMING, new_test_msg)
    decoder.feed(data)
    assert [e.message.Str for e in decoder.take(10)] == ["m0", "m1"]
    assert decoder.offset == begins[3]  # The bad frame is consumed; the next envelope is m3.
    with pytest.raises(DecodeError) as info:
        decoder.take(10)
    assert info.value.offset == begins[2]
    first = decoder.take(1)
    assert [(e.message.Str, e.begin, e.end) for e in first] == [("m3", begins[3], begins[4])]
    assert [e.message.Str for e in decoder.take(10)] == ["m4"]
    assert decoder.take(10) == [] and decoder.offset == len(data)

    # newMessage failing mid-batch: the frames after its frame are kept for the next take().
    calls = itertools.count()

    def every_other(journal: str) -> TestMsg:
        if next(calls) == 1:
            raise RuntimeError("not this one")
        return TestMsg()

    lines[2] = lines[1]
    begins = list(itertools.accumulate((len(line) for line in lines), initial=0))
    decoder = EnvelopeDecoder("a/journal", JSON_FRAMING, every_other)
    decoder.feed(b"".join(lines))
    assert len(decoder.take(10)) == 1
    with pytest.raises(DecodeError, match="newMessage: not this one") as info:
        decoder.next()
    assert info.value.offset == begins[1]
    assert decoder.offset == begins[2]
    assert [e.begin for e in decoder.take(2)] == begins[2:4]
    assert [e.begin for e in decoder.take(2)] == [begins[4]]


def test_decoder_csv_records() -> None:
    u = build_uuid(new_producer_id(), 160, Flags.OUTSIDE_TXN)
    (env,) = decode_chunks("a/csv", CSV_FRAMING, lambda j: CSVRecord(), [(0, f"{u},x,y\n".encode())])
    assert (env.message, env.uuid, env.begin, env.end) == (CSVRecord([str(u), "x", "y"]), u, 0, 41)


def test_decode_chunks_raises_on_a_partial_final_frame() -> None:
    with pytest.raises(TruncatedFrameError):
        list(decode_chunks("a/journal", JSON_FRAMING, new_test_msg, [(0, b"{}\n{")]))
    assert list(decode_chunks("a/journal", JSON_FRAMING, new_test_msg, [])) == []


class Journal:
    """An in-memory journal of JSON lines that two producers publish to, as Gazette's publisher does."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.clock = Clock()
        self.pub, self.txn_pub = new_producer_id(), new_producer_id()

    def publish(self, producer: bytes, flags: int, text: str = "") -> TestMsg:
        msg = TestMsg(build_uuid(producer, self.clock.tick(), flags), text)
        self.data += JSON_FRAMING.marshal(msg)
        return msg

    def committed(self, text: str) -> TestMsg:
        return self.publish(self.pub, Flags.OUTSIDE_TXN, text)

    def uncommitted(self, text: str) -> TestMsg:
        return self.publish(self.txn_pub, Flags.CONTINUE_TXN, text)

    def ack(self) -> TestMsg:
        return self.publish(self.txn_pub, Flags.ACK_TXN)


def test_sequencer_driven_from_journal_chunks() -> None:
    """Gazette's TestIntegrationOfPublisherWithSequencerAndReader, over bytes instead of a broker.

    A ring of 3 overflows, so the last transaction is replayed from the journal's bytes.
    """
    journal = Journal()
    decoder = EnvelopeDecoder("a/journal", JSON_FRAMING, new_test_msg)
    seq = Sequencer(None, (), 3)
    replays: list[tuple[int, int]] = []

    def pump() -> list[TestMsg]:
        """Read one envelope (feeding 7-byte chunks as needed), queue it, drain what commits."""
        while (env := decoder.next()) is None:
            start = decoder.end_offset
            assert start < len(journal.data), "no envelope to read"
            decoder.feed(bytes(journal.data[start : start + 7]), start)
        outcome = seq.queue_uncommitted(env)
        if outcome.needs_replay:
            request = seq.replay_range()
            replays.append((request.begin, request.end))
            data = bytes(journal.data[request.begin : request.end])
            seq.start_replay(
                decode_chunks(request.journal, JSON_FRAMING, new_test_msg, chunked(data, request.begin, 5))
            )
        return [env.message for env in seq.committed()]

    # The transactional producer writes first, then the committed one, then the ACK.
    one = journal.uncommitted("one")
    two = journal.committed("two")
    ack1 = journal.ack()
    assert pump() == []
    assert pump() == [two]
    assert pump() == [one, ack1]
    assert [m.UUID for m in (one, two, ack1)] == [
        build_uuid(journal.txn_pub, 160, Flags.CONTINUE_TXN),
        build_uuid(journal.pub, 320, Flags.OUTSIDE_TXN),
        build_uuid(journal.txn_pub, 480, Flags.ACK_TXN),
    ]

    # Interleaved messages, enough to overflow the ring.
    three = journal.uncommitted("three")
    four = journal.committed("four")
    five = journal.uncommitted("five")
    six = journal.committed("six")
    seven = journal.uncommitted("seven")
    ack2 = journal.ack()
    assert pump() == []
    assert pump() == [four]
    assert pump() == []
    assert pump() == [six]
    assert pump() == []
    assert replays == []
    assert pump() == [three, five, seven, ack2]
    assert [m.UUID for m in (three, five, seven, ack2)] == [
        build_uuid(journal.txn_pub, 640, Flags.CONTINUE_TXN),
        build_uuid(journal.txn_pub, 960, Flags.CONTINUE_TXN),
        build_uuid(journal.txn_pub, 1280, Flags.CONTINUE_TXN),
        build_uuid(journal.txn_pub, 1440, Flags.ACK_TXN),
    ]
    assert len(replays) == 1
    assert seq.offsets == {"a/journal": len(journal.data)}

    # A Sequencer restarted from a checkpoint sees only what follows it: here a recovered
    # upstream primary re-appends its ACK intent, and a retried append duplicates "six".
    offsets, states = seq.checkpoint()
    restarted = Sequencer(offsets, states, 3)
    start = len(journal.data)
    journal.data += JSON_FRAMING.marshal(ack2) + JSON_FRAMING.marshal(six)
    tail = decode_chunks("a/journal", JSON_FRAMING, new_test_msg, chunked(bytes(journal.data[start:]), start, 11))
    assert [restarted.queue_uncommitted(env) for env in tail] == [
        QueueOutcome.ACK_ROLLBACK,  # Its clock equals the last ACK's: harmless.
        QueueOutcome.OUTSIDE_ALREADY_ACKED,
    ]
    assert restarted.offsets == {"a/journal": len(journal.data)}
