"""The stream-sum messages, `Chunk` and `Sum`, as JSON lines that Gazette's Go example reads too.

Gazette's Go types are::

    type StreamID [16]byte
    type Chunk struct { UUID message.UUID; ID StreamID; SeqNo int; Data []byte }
    type Sum   struct { UUID message.UUID; ID StreamID; SeqNo int; Value uint64 }

and Go's `encoding/json` encodes them (no json tags) with the field names as keys, a UUID as its
canonical text, a `[16]byte` as an array of 16 numbers and a `[]byte` as base64 (`null` when
nil)::

    {"UUID":"…","ID":[12,201,…],"SeqNo":3,"Data":"q83v…"}        a Chunk
    {"UUID":"…","ID":[12,201,…],"SeqNo":0,"Data":null}           its stream's final chunk
    {"UUID":"…","ID":[12,201,…],"SeqNo":11,"Value":12570767…}    a Sum

A stream's chunks have SeqNo 1, 2, … in order; the last one has empty Data and ends the stream.
A `Sum`'s SeqNo is that of the last chunk summed (the final chunk's, for the sums the summer
publishes: it publishes only final sums), and Value is the CRC-64 (see `crc64`) of the stream's
data. `Sum.final` is True for a sum of a finished stream; it is not encoded (Go's Sum has no
such field), and a decoded Sum is always final. ACKs are messages of the same type with only a
UUID set (Gazette's `NewAcknowledgement`); read-committed readers must skip them.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import uuid
from typing import Any, Final

from consumer.message import ZERO_UUID, parse_uuid

STREAM_ID_SIZE: Final = 16
CHUNK_MESSAGE_TYPE: Final = "stream_sum.Chunk"
"""The `app.gazette.dev/message-type` label of chunk partitions."""
SUM_MESSAGE_TYPE: Final = "stream_sum.Sum"
"""The `app.gazette.dev/message-type` label of sum partitions."""


def _encode(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode("ascii")


def _stream_id_of(value: Any, what: str) -> bytes:
    if value is None:
        return bytes(STREAM_ID_SIZE)
    if (
        not isinstance(value, list)
        or len(value) != STREAM_ID_SIZE
        or not all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= 255 for b in value)
    ):
        raise ValueError(f"{what}.ID must be an array of {STREAM_ID_SIZE} byte values, not {value!r}")
    return bytes(value)


def _int_of(value: Any, what: str) -> int:
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{what} must be an integer, not {value!r}")
    return value


def _uuid_of(doc: dict[str, Any]) -> uuid.UUID:
    value = doc.get("UUID")
    return ZERO_UUID if value is None else parse_uuid(value)


def _object(data: bytes, what: str) -> dict[str, Any]:
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ValueError(f"a {what} must be a JSON object, not {data[:80]!r}")
    return doc


@dataclasses.dataclass
class Chunk:
    """An ordered piece of a stream's content; empty `Data` marks the stream's final chunk."""

    UUID: uuid.UUID = ZERO_UUID
    ID: bytes = bytes(STREAM_ID_SIZE)
    SeqNo: int = 0
    Data: bytes = b""

    @property
    def final(self) -> bool:
        return not self.Data

    # -- message.Message --
    def get_uuid(self) -> uuid.UUID:
        return self.UUID

    def set_uuid(self, value: uuid.UUID) -> None:
        self.UUID = value

    def new_acknowledgement(self, journal: str) -> Chunk:
        return Chunk()

    # -- JSON framing --
    def marshal_json(self) -> bytes:
        return _encode({
            "UUID": str(self.UUID),
            "ID": list(self.ID),
            "SeqNo": self.SeqNo,
            "Data": base64.b64encode(self.Data).decode("ascii") if self.Data else None,
        })

    def unmarshal_json(self, data: bytes) -> None:
        doc = _object(data, "Chunk")
        raw = doc.get("Data")
        if raw is not None and not isinstance(raw, str):
            raise ValueError(f"Chunk.Data must be base64 text or null, not {raw!r}")
        self.UUID = _uuid_of(doc)
        self.ID = _stream_id_of(doc.get("ID"), "Chunk")
        self.SeqNo = _int_of(doc.get("SeqNo"), "Chunk.SeqNo")
        self.Data = base64.b64decode(raw, validate=True) if raw else b""


@dataclasses.dataclass
class Sum:
    """The CRC-64 sum of a stream through chunk `SeqNo`."""

    UUID: uuid.UUID = ZERO_UUID
    ID: bytes = bytes(STREAM_ID_SIZE)
    SeqNo: int = 0
    Value: int = 0
    final: bool = True

    # -- message.Message --
    def get_uuid(self) -> uuid.UUID:
        return self.UUID

    def set_uuid(self, value: uuid.UUID) -> None:
        self.UUID = value

    def new_acknowledgement(self, journal: str) -> Sum:
        return Sum()

    # -- JSON framing --
    def marshal_json(self) -> bytes:
        return _encode({"UUID": str(self.UUID), "ID": list(self.ID), "SeqNo": self.SeqNo, "Value": self.Value})

    def unmarshal_json(self, data: bytes) -> None:
        doc = _object(data, "Sum")
        value = _int_of(doc.get("Value"), "Sum.Value")
        if not 0 <= value < 1 << 64:
            raise ValueError(f"Sum.Value must be a uint64, not {value}")
        self.UUID = _uuid_of(doc)
        self.ID = _stream_id_of(doc.get("ID"), "Sum")
        self.SeqNo = _int_of(doc.get("SeqNo"), "Sum.SeqNo")
        self.Value = value
        self.final = True


def stream_key(message: Chunk | Sum) -> bytes:
    """The mapping key of a message: its stream ID's bytes (as Gazette's chunk mapping)."""
    return message.ID


__all__ = ["CHUNK_MESSAGE_TYPE", "STREAM_ID_SIZE", "SUM_MESSAGE_TYPE", "Chunk", "Sum", "stream_key"]
