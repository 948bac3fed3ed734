"""`NGramCount`, the word-count message: the protobuf `word_count.NGramCount` (word_count.proto),
framed with Gazette's fixed protobuf framing (content type `application/x-protobuf-fixed`).

Generated protobuf classes cannot be subclassed, so the message the consumer framework handles
is `NGramCount` here, a small class holding the n-gram and its count that serializes as the
proto (`SerializeToString` / `ParseFromString`, what `ProtoFixedFraming` calls) and carries its
UUID in the proto's `uuid` bytes, as Gazette's Get/SetUUID copy the 16 bytes.
"""

from __future__ import annotations

import uuid
from typing import Final

from consumer.message import ZERO_UUID
from examples.word_count import word_count_pb2 as wpb

MESSAGE_TYPE: Final = "word_count.NGramCount"
"""The `app.gazette.dev/message-type` label of the n-gram partitions."""


class NGramCount:
    """An n-gram and a count (a delta, as published; a total, as queried)."""

    __slots__ = ("count", "n_gram", "uuid")

    def __init__(self, n_gram: str = "", count: int = 0, uuid_: uuid.UUID = ZERO_UUID) -> None:
        self.n_gram = n_gram
        self.count = count
        self.uuid = uuid_

    def __repr__(self) -> str:
        return f"NGramCount(n_gram={self.n_gram!r}, count={self.count})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NGramCount):
            return NotImplemented
        return (self.n_gram, self.count, self.uuid) == (other.n_gram, other.count, other.uuid)

    __hash__ = None  # type: ignore[assignment]

    # Message (consumer.message.Message)
    def get_uuid(self) -> uuid.UUID:
        return self.uuid

    def set_uuid(self, value: uuid.UUID) -> None:
        self.uuid = value

    def new_acknowledgement(self, journal: str) -> NGramCount:
        return NGramCount()

    # ProtoFrameable
    def to_proto(self) -> wpb.NGramCount:
        return wpb.NGramCount(
            uuid=b"" if self.uuid == ZERO_UUID else self.uuid.bytes, n_gram=self.n_gram, count=self.count
        )

    def SerializeToString(self) -> bytes:
        return self.to_proto().SerializeToString(deterministic=True)

    def ParseFromString(self, data: bytes) -> NGramCount:
        msg = wpb.NGramCount()
        msg.ParseFromString(data)
        raw = bytes(msg.uuid)
        if raw and len(raw) != 16:
            raise ValueError(f"NGramCount.uuid has {len(raw)} bytes (expected 16)")
        self.uuid = uuid.UUID(bytes=raw) if raw else ZERO_UUID
        self.n_gram = msg.n_gram
        self.count = msg.count
        return self


__all__ = ["MESSAGE_TYPE", "NGramCount"]
