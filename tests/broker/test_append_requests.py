"""parse_append_request: content-only AppendRequests become views of the received bytes."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError

from broker.append_requests import ContentChunk, as_message, parse_append_request
from broker.protocol import pb


@pytest.mark.parametrize("size", [1, 127, 128, 16_383, 16_384, 1 << 20])
def test_content_only_messages_are_views_of_their_bytes(size: int) -> None:
    content = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    wire = pb.AppendRequest(content=content).SerializeToString()
    parsed = parse_append_request(wire)
    assert isinstance(parsed, ContentChunk)
    assert parsed.content == content and parsed.content.obj is wire  # No copy was made.
    assert as_message(parsed) == pb.AppendRequest(content=content)


@pytest.mark.parametrize("message", [
    pb.AppendRequest(journal="a/journal"),  # The first message of an append.
    pb.AppendRequest(),  # The empty commit marker.
    pb.AppendRequest(content=b"data", offset=7),  # Content with another field: protobuf decides.
    pb.AppendRequest(content=b"data", union_registers=pb.LabelSet(labels=[pb.Label(name="a", value="b")])),
])
def test_other_messages_are_parsed_by_protobuf(message: pb.AppendRequest) -> None:
    parsed = parse_append_request(message.SerializeToString())
    assert isinstance(parsed, pb.AppendRequest) and parsed == message
    assert as_message(parsed) is parsed


@pytest.mark.parametrize("wire", [
    b"\x22\x05abc",  # A length past the end of the message.
    b"\x22\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",  # A varint that never ends.
])
def test_malformed_content_is_left_to_protobuf_to_reject(wire: bytes) -> None:
    with pytest.raises(DecodeError):
        parse_append_request(wire)
