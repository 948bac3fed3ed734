"""Exactly-once, end to end, against a real broker: Publisher → journal → read-committed reader.

A JSON-lines journal receives committed transactions, a rolled-back one (a restarted producer
re-appends its last committed ACK intents), duplicated appends of the same UUIDs, and
self-committed messages, interleaved across producers. A read-committed reader must see each
committed message exactly once, in order per producer, and no rolled-back message.
"""

from __future__ import annotations

from typing import Any

import pytest

from broker.client import AppendService, JournalClient
from consumer.message import (
    JSON_FRAMING,
    AckIntent,
    Clock,
    Envelope,
    Flags,
    MessageError,
    Publisher,
    QueueOutcome,
    Sequencer,
    get_clock,
    get_flags,
    get_producer_id,
    read_committed,
    read_uncommitted,
    read_uncommitted_batches,
)
from tests.consumer.message.helpers import TestMsg, new_test_msg
from tests.support.journals import new_journal

NDJSON = "application/x-ndjson"
EO = "message/eo"
"""The prefix of the journals these tests make."""


def to(journal: str) -> Any:
    """A MappingFunc sending everything to `journal`."""
    return lambda _msg: (journal, NDJSON)


class RecordingSequencer(Sequencer):
    """A Sequencer which records its queue outcomes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes: list[QueueOutcome] = []

    def queue_uncommitted(self, env: Envelope[Any]) -> QueueOutcome:
        outcome = super().queue_uncommitted(env)
        self.outcomes.append(outcome)
        return outcome


def strs(envs: list[Envelope[TestMsg]], producer: bytes | None = None, acks: bool = False) -> list[str]:
    return [
        e.message.Str
        for e in envs
        if (producer is None or get_producer_id(e.uuid) == producer)
        and (acks or get_flags(e.uuid) != Flags.ACK_TXN)
    ]


async def test_publish_uncommitted_clocks_and_acks(client: JournalClient) -> None:
    """Gazette's TestPublishUncommitted fixture, then reading the ACKs back."""
    j1, j2, j3 = [await new_journal(client, EO, content_type=NDJSON) for _ in range(3)]
    async with AppendService(client) as svc:
        pub = Publisher(svc, Clock(0))
        msgs = {s: TestMsg(Str=s) for s in ("one", "two", "three", "four")}
        pub.publish_uncommitted(to(j1), msgs["one"])
        pub.publish_uncommitted(to(j2), msgs["two"])
        assert pub.pending_journals() == [j1, j2]
        intents, _ = pub.commit()
        pub.publish_uncommitted(to(j3), msgs["three"])
        pub.publish_uncommitted(to(j1), msgs["four"])
        intents += pub.build_ack_intents()
        assert pub.pending_journals() == []
        pub.write_ack_intents(intents[2:])
        committed = pub.publish_committed(to(j2), TestMsg(Str="five"))
        await svc.flush()
    assert committed.done()

    assert [get_clock(m.UUID) for m in msgs.values()] == [160, 320, 800, 960]
    assert [get_flags(m.UUID) for m in msgs.values()] == [Flags.CONTINUE_TXN] * 4
    assert [i.journal for i in intents] == [j1, j2, j3, j1]
    acks = [JSON_FRAMING.unmarshal(i.intent, TestMsg()) for i in intents]
    assert [get_clock(a.UUID) for a in acks] == [480, 640, 1120, 1280]
    assert {get_flags(a.UUID) for a in acks} == {Flags.ACK_TXN}
    assert {get_producer_id(a.UUID) for a in acks} == {pub.producer_id}

    got = [e async for e in read_committed(client, j1, 0, new_test_msg, block=False)]
    assert strs(got, acks=True) == ["one", "", "four", ""]
    got = [e async for e in read_committed(client, j2, 0, new_test_msg, block=False)]
    assert strs(got, acks=True) == ["two", "", "five"]
    assert get_flags(got[-1].uuid) == Flags.OUTSIDE_TXN
    got = [e async for e in read_committed(client, j3, 0, new_test_msg, block=False)]
    assert strs(got, acks=True) == ["three", ""]


async def test_exactly_once_with_rollbacks_and_replays(client: JournalClient) -> None:
    journal = await new_journal(client, EO, content_type=NDJSON)
    m = to(journal)
    clock_a = Clock(1 << 40)
    async with AppendService(client) as svc:
        a = Publisher(svc, clock_a)
        b = Publisher(svc, Clock(1 << 41))
        c = Publisher(svc)  # An automatic (wall-clock) clock.

        # Txn 1 of A, interleaved with B's transaction: committed.
        a.publish_uncommitted(m, TestMsg(Str="a1"))
        b.publish_uncommitted(m, TestMsg(Str="b1"))
        a.publish_uncommitted(m, TestMsg(Str="a2"))
        b.publish_uncommitted(m, TestMsg(Str="b2"))
        a.publish_uncommitted(m, TestMsg(Str="a3"))
        last_committed_a, _ = a.commit()
        b.commit()
        c.publish_committed(m, TestMsg(Str="c1"))

        # Txn 2 of A is written, then A crashes before committing it. The restarted A (same
        # producer, clock continuing) re-appends its last committed ACK intents: a rollback.
        a.publish_uncommitted(m, TestMsg(Str="a4-rolled-back"))
        b.publish_uncommitted(m, TestMsg(Str="b3"))
        a.publish_uncommitted(m, TestMsg(Str="a5-rolled-back"))
        a = Publisher(svc, clock_a, producer_id=a.producer_id)
        a.write_ack_intents(last_committed_a)
        b.commit()

        # Txn 3 of A commits; then A restarts and its appends are replayed whole (same UUIDs):
        # the duplicated messages and the duplicated ACK must change nothing.
        txn3 = [TestMsg(Str="a6"), TestMsg(Str="a7")]
        for msg in txn3:
            a.publish_uncommitted(m, msg)
        last_committed_a, _ = a.commit()
        await svc.flush()
        a = Publisher(svc, clock_a, producer_id=a.producer_id)
        for msg in txn3:
            svc.append(journal, JSON_FRAMING.marshal(msg))
        a.write_ack_intents(last_committed_a)

        # Txn 4 of A: messages written and ACK intents built (and "persisted"), then a crash
        # before the ACKs are appended. Its messages are appended again (same UUIDs) amid B's
        # messages, before the restarted A appends the recovered intents: committed once.
        txn4 = [TestMsg(Str="a8"), TestMsg(Str="a9")]
        for msg in txn4:
            a.publish_uncommitted(m, msg)
        recovered: list[AckIntent] = a.build_ack_intents()
        b.publish_uncommitted(m, TestMsg(Str="b4"))
        b.publish_uncommitted(m, TestMsg(Str="b5"))
        for msg in txn4:
            svc.append(journal, JSON_FRAMING.marshal(msg))
        c.publish_committed(m, TestMsg(Str="c2"))
        c3 = TestMsg(Str="c3")
        c.publish_committed(m, c3)
        svc.append(journal, JSON_FRAMING.marshal(c3))  # A duplicated self-committed message.
        a = Publisher(svc, clock_a, producer_id=a.producer_id)
        a.write_ack_intents(recovered)
        b.commit()

        # Txn 5 of A: left open (never acknowledged).
        a.publish_uncommitted(m, TestMsg(Str="a10-open"))
        await svc.flush()

    everything = [e async for e in read_uncommitted(client, journal, 0, new_test_msg, block=False)]
    assert "a4-rolled-back" in strs(everything) and "a10-open" in strs(everything)
    assert strs(everything, a.producer_id).count("a6") == 2
    assert strs(everything, a.producer_id).count("a8") == 2

    for ring in (1, 2, 3, 1024):
        seq = RecordingSequencer({journal: 0}, buffer=ring)
        got = [e async for e in read_committed(client, journal, 0, new_test_msg, block=False, sequencer=seq)]
        assert strs(got, a.producer_id) == ["a1", "a2", "a3", "a6", "a7", "a8", "a9"], ring
        assert strs(got, b.producer_id) == ["b1", "b2", "b3", "b4", "b5"], ring
        assert strs(got, c.producer_id) == ["c1", "c2", "c3"], ring
        # Each envelope was committed once, and offsets only increase within a producer.
        assert len({e.uuid for e in got}) == len(got)
        for producer in (a.producer_id, b.producer_id):
            begins = [e.begin for e in got if get_producer_id(e.uuid) == producer]
            assert begins == sorted(begins)
        assert QueueOutcome.ACK_ROLLBACK in seq.outcomes
        assert QueueOutcome.CONTINUE_ALREADY_ACKED in seq.outcomes
        assert QueueOutcome.CONTINUE_TXN_CLOCK_LARGER in seq.outcomes
        assert QueueOutcome.OUTSIDE_ALREADY_ACKED in seq.outcomes
        if ring <= 3:
            assert QueueOutcome.ACK_COMMIT_REPLAY in seq.outcomes, ring
        else:
            assert QueueOutcome.ACK_COMMIT_REPLAY not in seq.outcomes


async def test_reader_init_errors(client: JournalClient) -> None:
    with pytest.raises(MessageError, match=r"fetching journal spec: named journal does not exist \(does/not/exist\)"):
        [e async for e in read_uncommitted(client, "does/not/exist", 0, new_test_msg, block=False)]
    journal = await new_journal(client, EO)
    with pytest.raises(MessageError, match=r"determining framing: unrecognized content-type \(\)"):
        [e async for e in read_uncommitted(client, journal, 0, new_test_msg, block=False)]


async def test_read_uncommitted_batches_lists_and_a_decode_error(client: JournalClient) -> None:
    journal = await new_journal(client, EO, content_type=NDJSON)
    async with AppendService(client) as svc:
        pub = Publisher(svc)
        for i in range(300):
            pub.publish_committed(to(journal), TestMsg(Str=f"m{i}"))
        await svc.flush()
        await svc.append(journal, b"not json\n")
        pub.publish_committed(to(journal), TestMsg(Str="never read"))

    batches: list[list[Envelope[TestMsg]]] = []
    with pytest.raises(MessageError, match="Expecting value") as info:
        async for batch in read_uncommitted_batches(client, journal, 0, new_test_msg, block=False, max_batch=128):
            batches.append(batch)
    # Lists of at most max_batch, in order, all before the bad frame, which ends the iteration.
    assert all(0 < len(b) <= 128 for b in batches) and max(len(b) for b in batches) == 128
    envs = [e for b in batches for e in b]
    assert [e.message.Str for e in envs] == [f"m{i}" for i in range(300)]
    assert [e.begin for e in envs[1:]] == [e.end for e in envs[:-1]]
    assert info.value.offset == envs[-1].end
