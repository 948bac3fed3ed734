"""RecordedOps as they are written to a recovery log journal (Gazette's
`consumer/recoverylog/recorded_op.proto` and `recorder.go`).

Each op is a protobuf fixed frame (`consumer.message.framing.proto_fixed`: the magic word, the
length as a little-endian uint32, the marshalled RecordedOp). A write op's frame is followed by
`write.length` raw bytes. The FSM's checksum chains CRC-32C (Castagnoli) over the marshalled op
bytes only: neither the frame header nor any write payload.

Also here: Authors (random non-zero uint32s identifying a recording process) and their journal
register fence, `author=<base-32 author>`.
"""

from __future__ import annotations

import secrets

from broker.protocol import pb as bpb
from consumer.message.framing.proto_fixed import FIXED_FRAME_HEADER_LENGTH, FIXED_FRAME_WORD, encode_fixed_frame
from consumer.protocol import recoverylog_pb
from consumer.recoverylog.errors import OpDecodeError

RecordedOp = recoverylog_pb.RecordedOp

MAX_AUTHOR = 0xFFFFFFFF
AUTHOR_REGISTER = "author"
"""Name of the journal register holding the author allowed to append to a log."""

MAX_OP_SIZE = 1 << 26
"""Largest marshalled RecordedOp accepted on decode (a frame header claiming more is corrupt)."""


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC-32C (Castagnoli) of `data`, continuing from `crc` (Go's `crc32.Update(crc, castagnoli, data)`).

    Pure Python: the checksum covers only marshalled ops (tens of bytes each), never write payloads.
    """
    table = _CRC32C_TABLE
    crc ^= 0xFFFFFFFF
    for b in bytes(data):
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def new_random_author() -> int:
    """A random Author in [1, 2**32 - 1]."""
    return secrets.randbelow(MAX_AUTHOR) + 1


def format_author(author: int) -> str:
    """The author as Go's `strconv.FormatUint(author, 32)` writes it (1234 -> "16i")."""
    if author == 0:
        return "0"
    digits = "0123456789abcdefghijklmnopqrstuv"
    out = []
    while author:
        author, rem = divmod(author, 32)
        out.append(digits[rem])
    return "".join(reversed(out))


def author_fence(author: int) -> bpb.LabelSet:
    """The register label set fencing appends to this author: `{author: <base 32>}`."""
    return bpb.LabelSet(labels=[bpb.Label(name=AUTHOR_REGISTER, value=format_author(author))])


def author_selector(author: int) -> bpb.LabelSelector:
    """The check_registers selector of appends by this author."""
    return bpb.LabelSelector(include=author_fence(author))


def create_op(path: str) -> RecordedOp:
    return RecordedOp(create=RecordedOp.Create(path=path))


def link_op(fnode: int, path: str) -> RecordedOp:
    return RecordedOp(link=RecordedOp.Link(fnode=fnode, path=path))


def unlink_op(fnode: int, path: str) -> RecordedOp:
    return RecordedOp(unlink=RecordedOp.Link(fnode=fnode, path=path))


def write_op(fnode: int, offset: int, length: int) -> RecordedOp:
    return RecordedOp(write=RecordedOp.Write(fnode=fnode, offset=offset, length=length))


def property_op(path: str, content: str) -> RecordedOp:
    return RecordedOp(property=recoverylog_pb.Property(path=path, content=content))


def is_noop(op: RecordedOp) -> bool:
    """Whether the op has none of create, link, unlink, write or property: a hand-off barrier."""
    return not (
        op.HasField("create") or op.HasField("link") or op.HasField("unlink") or op.HasField("write")
        or op.HasField("property")
    )


def marshal_op(op: RecordedOp) -> bytes:
    """The op's bytes as written to the log, without the meta-fields (first/last offset, log)."""
    if op.first_offset or op.last_offset or op.log:
        bare = RecordedOp()
        bare.CopyFrom(op)
        bare.ClearField("first_offset")
        bare.ClearField("last_offset")
        bare.ClearField("log")
        op = bare
    return op.SerializeToString(deterministic=True)


def encode_op(op: RecordedOp) -> tuple[bytes, bytes]:
    """(frame, marshalled op bytes): the frame goes to the log, the op bytes to the FSM's checksum."""
    op_bytes = marshal_op(op)
    return encode_fixed_frame(op_bytes), op_bytes


def parse_frame_header(header: bytes | bytearray | memoryview, *, log: str = "", offset: int | None = None) -> int:
    """The op length a frame header declares. Raises OpDecodeError if it is not a fixed frame header
    (the caller may resynchronize at the next magic word: `find_frame_word`)."""
    if len(header) < FIXED_FRAME_HEADER_LENGTH or bytes(header[:4]) != FIXED_FRAME_WORD:
        raise OpDecodeError("detected de-synchronization", log=log, offset=offset)
    length = int.from_bytes(header[4:8], "little")
    if length > MAX_OP_SIZE:
        raise OpDecodeError(f"frame length {length} exceeds the maximum op size {MAX_OP_SIZE}", log=log, offset=offset)
    return length


def find_frame_word(buf: bytes | bytearray, start: int = 0) -> int:
    """Index of the next magic word in `buf` at or after `start`, or -1."""
    return buf.find(FIXED_FRAME_WORD, start)


def decode_op(op_bytes: bytes | bytearray | memoryview, *, log: str = "", offset: int = 0) -> RecordedOp:
    """A RecordedOp from its marshalled bytes read at `offset` of `log`, with the meta-fields set:
    first_offset = offset, last_offset = the end of its frame and write payload, log = log."""
    op = RecordedOp()
    try:
        op.ParseFromString(bytes(op_bytes))
    except Exception as exc:
        raise OpDecodeError(f"unmarshal RecordedOp: {exc}", log=log, offset=offset) from exc
    if op.HasField("write") and op.write.length < 0:
        raise OpDecodeError(f"invalid write length {op.write.length}", log=log, offset=offset, seq_no=op.seq_no)
    op.first_offset = offset
    payload = op.write.length if op.HasField("write") else 0
    op.last_offset = offset + FIXED_FRAME_HEADER_LENGTH + len(op_bytes) + payload
    op.log = log
    return op


def decode_frames(data: bytes, *, log: str = "", offset: int = 0) -> list[tuple[RecordedOp, bytes, bytes]]:
    """Every (op, op bytes, write payload) of a complete, in-memory stretch of a log (tests, tools).

    Raises OpDecodeError on a de-synchronization or a truncated frame.
    """
    out = []
    pos = 0
    while pos < len(data):
        length = parse_frame_header(data[pos : pos + FIXED_FRAME_HEADER_LENGTH], log=log, offset=offset + pos)
        begin = pos + FIXED_FRAME_HEADER_LENGTH
        if begin + length > len(data):
            raise OpDecodeError("truncated frame: unexpected EOF", log=log, offset=offset + pos)
        op_bytes = data[begin : begin + length]
        op = decode_op(op_bytes, log=log, offset=offset + pos)
        payload_len = op.write.length if op.HasField("write") else 0
        end = begin + length + payload_len
        if end > len(data):
            raise OpDecodeError("truncated write payload: unexpected EOF", log=log, offset=offset + pos)
        out.append((op, op_bytes, data[begin + length : end]))
        pos = end
    return out


__all__ = [
    "AUTHOR_REGISTER",
    "FIXED_FRAME_HEADER_LENGTH",
    "MAX_AUTHOR",
    "RecordedOp",
    "author_fence",
    "author_selector",
    "crc32c",
    "create_op",
    "decode_frames",
    "decode_op",
    "encode_op",
    "find_frame_word",
    "format_author",
    "is_noop",
    "link_op",
    "marshal_op",
    "new_random_author",
    "parse_frame_header",
    "property_op",
    "unlink_op",
    "write_op",
]
