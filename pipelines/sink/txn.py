"""Transactions of the writer: Gazette message UUIDs on every row, ACKs that commit or roll back.

Each Spark task is one Gazette producer: its ProducerID is derived from the write's id and the
task's partition (`producer_for`), so every attempt of a partition is the same producer. Rows
are stamped `CONTINUE_TXN`, with clocks ticking per journal from a base clock (`Stamper`); the
driver commits a task's rows with one `ACK_TXN` per (journal, producer) carrying the last
clock the task wrote, and rolls a producer back with an ACK whose clock is not above any
clock it wrote (`ack_record`). Readers that read committed (Gazette's Sequencer, and the
`gazette` reader by default) deliver a row only once its ACK is in the journal.

Only JSON lines journals (`application/x-ndjson`) carry UUIDs here: the UUID is the value's
top-level `uuid` field (or `UUID`, or `_meta.uuid`, where the value already has one), which
is where the `gazette` reader and Gazette's JSON framing look for it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping

from broker.client.append_service import AppendService
from broker.client.dial import JournalClient
from broker.protocol.credentials import Credentials
from consumer.message.clock import TICK
from consumer.message.uuid import PRODUCER_ID_LENGTH, Flags, ProducerID, build_uuid
from pipelines.sink.options import SinkError

ROLLBACK_CLOCK = 1
"""The clock of a rollback ACK when the producer's lowest clock is not known (streaming)."""

_UUID_KEYS = (b'"uuid"', b'"UUID"', b'"_meta"')
_WHITESPACE = b" \t\r\n"


def producer_for(write_id: str, partition: int) -> ProducerID:
    """The ProducerID of `partition`'s tasks in write `write_id`: 6 bytes of a hash, multicast bit set.

    As `consumer.message.uuid.new_producer_id`, bit 0 of byte 0 is set: the node ID is not a MAC.
    """
    digest = hashlib.sha256(f"gazette-sink/{write_id}/{partition}".encode()).digest()
    out = bytearray(digest[:PRODUCER_ID_LENGTH])
    out[0] |= 0x01
    return bytes(out)


def ack_record(producer: ProducerID, clock: int) -> bytes:
    """A JSON lines ACK_TXN message of `producer` at `clock`: commits its clocks <= `clock`, rolls back the rest."""
    return b'{"uuid":"%s"}\n' % str(build_uuid(producer, clock, Flags.ACK_TXN)).encode()


def stamp_json(value: bytes, uuid_text: str, row: int, journal: str) -> bytes:
    """`value` (one JSON object, without its newline) with its UUID set to `uuid_text`.

    A value without a `uuid`, `UUID` or `_meta` key anywhere gets `{"uuid":"...",` spliced in
    front of its members, its other bytes untouched; else it is parsed, the UUID set where the
    value has one (`UUID`, `uuid` and/or `_meta.uuid`; top-level `uuid` if none), and dumped
    compactly. A value that is not a JSON object is refused, naming the row.
    """
    body = value.strip(_WHITESPACE)
    if body[:1] == b"{" and body[-1:] == b"}" and not any(key in body for key in _UUID_KEYS):
        inner = body[1:-1]
        head = b'{"uuid":"%s"' % uuid_text.encode()
        return head + b"}" if not inner.strip(_WHITESPACE) else head + b"," + inner + b"}"
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise SinkError(
            f"row {row} (to journal {journal}) has a value which is not a JSON object: a transactional write "
            "sets each message's top-level 'uuid' (set option transactional=false to append values as they are)"
        )
    meta = doc.get("_meta")
    placed = False
    for key in ("UUID", "uuid"):
        if key in doc:
            doc[key] = uuid_text
            placed = True
    if isinstance(meta, dict) and "uuid" in meta:
        meta["uuid"] = uuid_text
        placed = True
    if not placed:
        doc = {"uuid": uuid_text, **doc}
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


class Stamper:
    """The UUIDs of one task's rows: its producer, a clock per journal ticking from `base`."""

    def __init__(self, producer: ProducerID, base: int) -> None:
        self.producer = producer
        self.base = base
        self.last: dict[str, int] = {}
        """The last clock stamped per journal."""

    def next(self, journal: str) -> str:
        # The first clock is base + 1, so a reader's Sequencer, meeting this producer first at it,
        # holds base as its last ACK: a rollback ACK at `base` is then an exact, quiet rollback.
        clock = self.last.get(journal, self.base + 1 - TICK) + TICK
        self.last[journal] = clock
        return str(build_uuid(self.producer, clock, Flags.CONTINUE_TXN))


def stamp(stamper: Stamper, value: bytes, row: int, journal: str) -> bytes:
    """A JSON lines record of `value` (framed: one trailing newline) carrying the next UUID of `journal`."""
    end = len(value) - 1 if value.endswith(b"\n") else len(value)
    if value.find(b"\n", 0, end) >= 0:
        raise SinkError(
            f"row {row} (to journal {journal}) has a newline before its end, which would split it into two "
            "JSON lines records: escape it (json.dumps does)"
        )
    return stamp_json(value[:end], stamper.next(journal), row, journal) + b"\n"


async def append_acks(
    broker: str, acks: Mapping[str, bytes], credentials: Credentials | None = None
) -> list[tuple[str, BaseException]]:
    """Append each journal's ACKs (one append per journal, in parallel); return the journals that failed.

    An ACK appended twice changes nothing (the second is a rollback of nothing), so appends whose
    outcome is unknown are retried.
    """
    failed: list[tuple[str, BaseException]] = []
    async with JournalClient(broker, credentials=credentials) as client:
        async with AppendService(client, retry_unknown_outcome=True) as service:
            pending = {journal: service.append(journal, data) for journal, data in sorted(acks.items()) if data}
            results = await asyncio.gather(*(aa.future for aa in pending.values()), return_exceptions=True)
    for journal, result in zip(pending, results, strict=True):
        if isinstance(result, BaseException):
            failed.append((journal, result))
    return failed
