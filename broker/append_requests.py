"""AppendRequests as the broker's Append RPC receives them: content stays where it arrived.

Most messages of an append carry nothing but `content`. Parsed by protobuf, each of their bytes
would be copied into the message, and again into a new `bytes` on every read of the field (a
copy per MiB apiece, measured). `parse_append_request` recognizes such a message by its wire
form and returns a `ContentChunk` whose content is a view of the received bytes; any other
message is parsed by protobuf as usual.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.protocol import pb

CONTENT_TAG = (4 << 3) | 2
"""AppendRequest.content (field 4) with the length-delimited wire type, as its first byte."""


@dataclass(frozen=True, slots=True)
class ContentChunk:
    """An AppendRequest whose only field is a non-empty `content`."""

    content: memoryview


def parse_append_request(data: bytes) -> pb.AppendRequest | ContentChunk:
    """The gRPC request deserializer of Append: a `ContentChunk` where it can, else a message."""
    if len(data) > 1 and data[0] == CONTENT_TAG:
        length, start = _varint(data, 1)
        if length > 0 and start + length == len(data):
            return ContentChunk(memoryview(data)[start:])
    return pb.AppendRequest.FromString(data)


def as_message(request: pb.AppendRequest | ContentChunk) -> pb.AppendRequest:
    """The request as a protobuf message again (to forward it to another broker)."""
    if isinstance(request, ContentChunk):
        return pb.AppendRequest(content=bytes(request.content))
    return request


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it) of the base-128 varint at `pos`; value -1 if it is malformed."""
    value = shift = 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    return -1, pos
