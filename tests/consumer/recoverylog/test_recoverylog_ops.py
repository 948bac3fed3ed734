"""The op stream's wire format: frames, write payloads, checksums and author fences."""

from __future__ import annotations

import pytest

from consumer.message.framing.proto_fixed import FIXED_FRAME_WORD
from consumer.recoverylog.errors import OpDecodeError
from consumer.recoverylog.ops import (
    RecordedOp,
    author_fence,
    crc32c,
    create_op,
    decode_frames,
    encode_op,
    format_author,
    is_noop,
    marshal_op,
    new_random_author,
    write_op,
)


def test_crc32c_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # The CRC-32C catalogue's check value.
    assert crc32c(b"6789", crc32c(b"12345")) == 0xE3069283  # Chained.
    assert crc32c(b"") == 0


def test_author_fence_is_base_32() -> None:
    assert format_author(1234) == "16i"
    assert format_author(0xFFFFFFFF) == "3vvvvvv"
    fence = author_fence(1234)
    assert [(label.name, label.value) for label in fence.labels] == [("author", "16i")]
    for _ in range(100):
        assert 1 <= new_random_author() <= 0xFFFFFFFF


def test_meta_fields_are_not_marshalled() -> None:
    op = create_op("/a")
    op.seq_no, op.author = 1, 2
    bare = marshal_op(op)
    op.first_offset, op.last_offset, op.log = 10, 20, "a/log"
    assert marshal_op(op) == bare
    assert op.log == "a/log"  # The caller's op is untouched.


def test_frames_round_trip_with_write_payloads() -> None:
    ops = [create_op("/a"), write_op(1, 0, 5), RecordedOp()]
    for i, op in enumerate(ops):
        op.seq_no, op.author = i + 1, 7
    stream = b""
    for op in ops:
        frame, _ = encode_op(op)
        stream += frame + (b"hello" if op.HasField("write") else b"")
    assert stream.startswith(FIXED_FRAME_WORD)
    decoded = decode_frames(stream, log="a/log", offset=100)
    assert [d[0].seq_no for d in decoded] == [1, 2, 3]
    assert decoded[1][2] == b"hello"
    assert decoded[0][0].first_offset == 100
    assert decoded[1][0].first_offset == decoded[0][0].last_offset
    assert decoded[2][0].last_offset == 100 + len(stream)
    assert all(d[0].log == "a/log" for d in decoded)
    assert is_noop(decoded[2][0]) and not is_noop(decoded[0][0])
    assert [marshal_op(d[0]) for d in decoded] == [d[1] for d in decoded]

    with pytest.raises(OpDecodeError, match="truncated write payload") as info:
        decode_frames(stream[: decoded[1][0].last_offset - 100 - 2], log="a/log", offset=100)
    assert info.value.log == "a/log"
    with pytest.raises(OpDecodeError, match="truncated frame"):
        decode_frames(stream[:-1])
    with pytest.raises(OpDecodeError, match="de-synchronization"):
        decode_frames(b"garbage!" + stream)
