"""Framings: Gazette's json/fixed/csv framing fixtures, plus offsets and chunk boundaries."""

from __future__ import annotations

import dataclasses
import itertools
import json
import uuid
from typing import Any

import pytest

from broker.protocol import labels as lbl
from broker.protocol import pb
from consumer.message import (
    CSV_FRAMING,
    JSON_FRAMING,
    PROTO_FIXED_FRAMING,
    CSVRecord,
    DecodeError,
    DesyncError,
    EncodeError,
    Frame,
    FrameTooLargeError,
    Framing,
    FramingError,
    TruncatedFrameError,
    UnknownContentTypeError,
    Unpacker,
    encode_fixed_frame,
    framing_for,
    supported_content_types,
)
from tests.consumer.message.helpers import TestMsg

HEADER_20 = bytes([0x66, 0x33, 0x93, 0x36, 0x14, 0x00, 0x00, 0x00])
FRAME_20 = HEADER_20 + b"test message content"  # Gazette's fixture: 8 + 20 = 28 bytes.


class FrameableString:
    """Gazette's frameablestring: a 'protobuf' message whose payload is the string itself."""

    def __init__(self, s: str = "") -> None:
        self.s = s

    def SerializeToString(self) -> bytes:
        return self.s.encode()

    def ParseFromString(self, data: bytes) -> int:
        self.s = data.decode()
        return len(data)


class FrameableError(FrameableString):
    """Gazette's frameableerror: reads half the payload, then fails."""

    def SerializeToString(self) -> bytes:
        raise ValueError("error!")

    def ParseFromString(self, data: bytes) -> int:
        self.s = data[: len(data) // 2].decode()
        raise ValueError("error!")


def drain(unpacker: Unpacker, *, eof: bool = False) -> list[Frame]:
    return list(unpacker.frames(eof=eof))


def unpack_all(framing: Framing, data: bytes, offset: int = 0) -> list[Frame]:
    unpacker = framing.unpacker("a/journal", offset)
    unpacker.feed(data)
    return drain(unpacker, eof=True)


# --- Registry ---------------------------------------------------------------------------------


def test_framing_determination() -> None:
    assert framing_for(lbl.CONTENT_TYPE_JSON_LINES) is JSON_FRAMING
    assert framing_for(lbl.CONTENT_TYPE_PROTO_FIXED) is PROTO_FIXED_FRAMING
    assert framing_for(lbl.CONTENT_TYPE_CSV) is CSV_FRAMING
    assert supported_content_types() == ["application/x-ndjson", "application/x-protobuf-fixed", "text/csv"]

    # The recovery log is not a message framing.
    with pytest.raises(UnknownContentTypeError) as info:
        framing_for(lbl.CONTENT_TYPE_RECOVERY_LOG)
    assert info.value.content_type == lbl.CONTENT_TYPE_RECOVERY_LOG
    assert info.value.supported == ("application/x-ndjson", "application/x-protobuf-fixed", "text/csv")
    assert info.value.reason.startswith("unrecognized content-type (application/x-gazette-recoverylog)")
    assert "application/x-ndjson, application/x-protobuf-fixed, text/csv" in str(info.value)


def test_framing_from_labels_and_specs() -> None:
    labels = lbl.label_set((lbl.CONTENT_TYPE, lbl.CONTENT_TYPE_CSV), ("app.gazette.dev/tag", "x"))
    assert framing_for(labels) is CSV_FRAMING
    assert framing_for(pb.JournalSpec(name="a/b", labels=labels)) is CSV_FRAMING
    assert framing_for({lbl.CONTENT_TYPE: lbl.CONTENT_TYPE_JSON_LINES}) is JSON_FRAMING

    # No content-type label: Gazette's `unrecognized content-type ()`.
    with pytest.raises(UnknownContentTypeError) as info:
        framing_for(pb.JournalSpec(name="a/b"))
    assert info.value.reason.startswith("unrecognized content-type ();")
    # Content types match exactly, as Gazette's registry does.
    with pytest.raises(UnknownContentTypeError):
        framing_for("application/x-ndjson; charset=utf-8")


# --- Protobuf, fixed framing ------------------------------------------------------------------


def test_fixed_marshal_fixtures() -> None:
    assert PROTO_FIXED_FRAMING.marshal(FrameableString("test message content")) == FRAME_20
    assert PROTO_FIXED_FRAMING.marshal(FrameableString("foo message")) == (
        bytes([0x66, 0x33, 0x93, 0x36, 0x0B, 0, 0, 0]) + b"foo message"
    )
    assert encode_fixed_frame(b"foo") == bytes([0x66, 0x33, 0x93, 0x36, 0x03, 0x00, 0x00, 0x00]) + b"foo"


def test_fixed_marshal_errors() -> None:
    with pytest.raises(EncodeError) as info:
        PROTO_FIXED_FRAMING.marshal(FrameableError("test message"))
    assert info.value.reason == "error!"
    assert info.value.content_type == lbl.CONTENT_TYPE_PROTO_FIXED
    with pytest.raises(EncodeError, match="is not ProtoFrameable"):
        PROTO_FIXED_FRAMING.marshal({"not": "a proto"})


def test_fixed_decode_consumes_exactly_one_frame() -> None:
    unpacker = PROTO_FIXED_FRAMING.unpacker("a/journal")
    unpacker.feed(FRAME_20 + b"extra")
    frame = unpacker.next_frame()
    assert frame == Frame("a/journal", 0, 28, FRAME_20)
    assert PROTO_FIXED_FRAMING.unmarshal(frame, FrameableString()).s == "test message content"
    assert unpacker.next_frame() is None
    assert (unpacker.offset, unpacker.buffered) == (28, 5)  # "extra" is left over.


def test_fixed_decode_error() -> None:
    (frame,) = unpack_all(PROTO_FIXED_FRAMING, FRAME_20, offset=1000)
    msg = FrameableError()
    with pytest.raises(DecodeError) as info:
        PROTO_FIXED_FRAMING.unmarshal(frame, msg)
    assert (info.value.reason, info.value.journal, info.value.offset) == ("error!", "a/journal", 1000)
    assert msg.s == "test messa"


def test_fixed_trailing_newline_is_a_clean_eof() -> None:
    unpacker = PROTO_FIXED_FRAMING.unpacker()
    unpacker.feed(FRAME_20 + b"\n")
    assert [f.data for f in drain(unpacker)] == [FRAME_20]
    assert unpacker.buffered == 1  # The newline waits: more bytes could follow it.
    assert unpacker.next_frame(eof=True) is None
    assert unpacker.buffered == 0


def test_fixed_desync_detection() -> None:
    unpacker = PROTO_FIXED_FRAMING.unpacker("a/journal", 500)
    unpacker.feed(b"foobar" + FRAME_20)
    with pytest.raises(DesyncError) as info:
        unpacker.next_frame()
    assert info.value.skipped == b"foobar"
    assert (info.value.offset, info.value.end, info.value.reason) == (500, 506, "detected de-synchronization")
    # The following frame is intact.
    frame = unpacker.next_frame()
    assert frame is not None and (frame.begin, frame.end) == (506, 534)
    assert PROTO_FIXED_FRAMING.unmarshal(frame, FrameableString()).s == "test message content"


@pytest.mark.parametrize(
    ("fixture", "reason"),
    [
        (b"", None),  # EOF at the first byte: clean.
        (FRAME_20[:7], "Peek(FixedFrameHeaderLength): unexpected EOF"),  # Partway through the header.
        (b"foo" + FRAME_20[:4], "Peek(FixedFrameHeaderLength): unexpected EOF"),  # A de-synced partial header.
        (FRAME_20[:8], "reading frame (size 28): unexpected EOF"),  # Just the header.
        (FRAME_20[:19], "reading frame (size 28): unexpected EOF"),  # Partway through the payload.
    ],
)
def test_fixed_incomplete_frames_at_eof(fixture: bytes, reason: str | None) -> None:
    unpacker = PROTO_FIXED_FRAMING.unpacker("a/journal", 100)
    unpacker.feed(fixture)
    assert unpacker.next_frame() is None  # Not an error until the stream ends.
    if reason is None:
        assert unpacker.next_frame(eof=True) is None
        return
    with pytest.raises(TruncatedFrameError) as info:
        unpacker.next_frame(eof=True)
    assert (info.value.reason, info.value.offset, info.value.end) == (reason, 100, 100 + len(fixture))
    assert unpacker.buffered == 0  # The partial frame was consumed.
    assert unpacker.next_frame(eof=True) is None


def test_fixed_underflow_reading_desync_header() -> None:
    """Gazette's 16-byte bufio buffer, modelled as 16-byte chunks: 13, then 8 garbage bytes."""
    fixture = b"x" * (13 + 8) + FRAME_20
    unpacker = PROTO_FIXED_FRAMING.unpacker()
    chunks = [fixture[i : i + 16] for i in range(0, len(fixture), 16)]

    unpacker.feed(chunks[0])
    with pytest.raises(DesyncError) as info:
        unpacker.next_frame()
    assert info.value.skipped == fixture[:13]  # The last 3 bytes might begin a magic word.
    assert unpacker.next_frame() is None

    unpacker.feed(chunks[1])
    with pytest.raises(DesyncError) as info:
        unpacker.next_frame()
    assert info.value.skipped == fixture[13:21]  # Stops at the magic word.
    assert unpacker.next_frame() is None

    for chunk in chunks[2:]:
        unpacker.feed(chunk)
    assert drain(unpacker, eof=True) == [Frame("", 21, 49, FRAME_20)]


def test_fixed_round_trips_real_protobuf_messages() -> None:
    specs = [pb.JournalSpec(name=f"a/journal/{i}", replication=i) for i in range(3)]
    data = b"".join(PROTO_FIXED_FRAMING.marshal(s) for s in specs)
    frames = unpack_all(PROTO_FIXED_FRAMING, data)
    assert [PROTO_FIXED_FRAMING.unmarshal(f, pb.JournalSpec()) for f in frames] == specs
    assert frames[-1].end == len(data)


def test_fixed_frame_too_large_resynchronizes() -> None:
    unpacker = PROTO_FIXED_FRAMING.unpacker(max_frame_size=16)
    small = encode_fixed_frame(b"ok")
    unpacker.feed(FRAME_20 + small)
    with pytest.raises(FrameTooLargeError, match="frame size 28 exceeds the maximum frame size of 16"):
        unpacker.next_frame()
    with pytest.raises(DesyncError) as info:  # The payload of the oversized frame.
        unpacker.next_frame()
    assert info.value.skipped == b"test message content"
    assert drain(unpacker) == [Frame("", 28, 38, small)]


# --- JSON lines -------------------------------------------------------------------------------


@dataclasses.dataclass
class AB:
    A: int
    B: str
    _ignored: int = 53  # Private, like a Go unexported field: not encoded.


@dataclasses.dataclass
class Bar:
    Bar: int


@dataclasses.dataclass
class OnlyB:
    B: str = ""


def test_json_marshal_fixtures() -> None:
    assert JSON_FRAMING.marshal(AB(42, "the answer")) == b'{"A":42,"B":"the answer"}\n'
    assert JSON_FRAMING.marshal(Bar(63)) == b'{"Bar":63}\n'


def test_json_marshal_error() -> None:
    @dataclasses.dataclass
    class Unencodable:
        Unencodable: Any = dataclasses.field(default_factory=object)

    with pytest.raises(EncodeError) as info:
        JSON_FRAMING.marshal(Unencodable())
    assert info.value.reason == "json: unsupported type: object"
    with pytest.raises(EncodeError):
        JSON_FRAMING.marshal({"nan": float("nan")})  # Go rejects NaN too.


def test_json_marshal_escapes_as_go_does() -> None:
    assert JSON_FRAMING.marshal({"S": "<a&b>\u2028é", "B": b"\x00\xff"}) == (
        '{"S":"\\u003ca\\u0026b\\u003e\\u2028é","B":"AP8="}\n'.encode()
    )


def test_json_decode_fixture() -> None:
    unpacker = JSON_FRAMING.unpacker("a/journal")
    unpacker.feed(b'{"A":42,"B":"test message content"}\n')
    frame = unpacker.next_frame()
    assert frame is not None
    assert JSON_FRAMING.unmarshal(frame, OnlyB()).B == "test message content"
    assert unpacker.next_frame(eof=True) is None  # EOF on a frame boundary is clean.


def test_json_unexpected_eof() -> None:
    unpacker = JSON_FRAMING.unpacker("a/journal", 7)
    unpacker.feed(b'{"A":42,"B":"missing trailing newline"}')
    assert unpacker.next_frame() is None
    with pytest.raises(TruncatedFrameError) as info:
        unpacker.next_frame(eof=True)
    assert (info.value.reason, info.value.offset, info.value.end) == ("unexpected EOF", 7, 46)


def test_json_decode_error_consumes_exactly_the_bad_line() -> None:
    unpacker = JSON_FRAMING.unpacker("a/journal")
    unpacker.feed(b'{"A":42,"B":"missing quote but including newline}\nextra')
    frame = unpacker.next_frame()
    assert frame is not None
    with pytest.raises(DecodeError) as info:
        JSON_FRAMING.unmarshal(frame, OnlyB())
    assert (info.value.journal, info.value.offset, info.value.content_type) == ("a/journal", 0, "application/x-ndjson")
    assert unpacker.buffered == len(b"extra")


def test_json_round_trips_uuid_fields() -> None:
    u = uuid.UUID("83fc2f81-cc5f-11e9-9402-010203040506")
    data = JSON_FRAMING.marshal(TestMsg(u, "hello"))
    assert data == b'{"UUID":"83fc2f81-cc5f-11e9-9402-010203040506","Str":"hello"}\n'
    (frame,) = unpack_all(JSON_FRAMING, data)
    assert JSON_FRAMING.unmarshal(frame, TestMsg()) == TestMsg(u, "hello")

    # Keys match field names case-insensitively, as in Go; unknown keys are ignored.
    decoded = JSON_FRAMING.unmarshal(b'{"uuid":"83fc2f81-cc5f-11e9-9402-010203040506","other":1}\n', TestMsg())
    assert decoded == TestMsg(u, "")
    with pytest.raises(DecodeError) as info:
        JSON_FRAMING.unmarshal(b'{"UUID":"nope"}\n', TestMsg())
    assert info.value.reason == "invalid UUID length: 4"


@dataclasses.dataclass
class Guarded:
    """A dataclass whose class sees every assignment (it upper-cases Str): decoding must go through it."""

    UUID: uuid.UUID | None = None
    Str: str = ""

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value.upper() if name == "Str" else value)


@dataclasses.dataclass(slots=True)
class Slotted:
    UUID: uuid.UUID | None = None
    Str: str = ""


@dataclasses.dataclass
class LateUUID:
    """A UUID field __init__ leaves unset: an object without it must not need it."""

    Str: str = ""
    UUID: uuid.UUID = dataclasses.field(init=False)


@dataclasses.dataclass(frozen=True)
class Frozen:
    Str: str = ""


def test_json_decodes_dataclasses_of_every_kind_alike() -> None:
    u = uuid.UUID("83fc2f81-cc5f-11e9-9402-010203040506")
    line = b'{"UUID":"83fc2f81-cc5f-11e9-9402-010203040506","Str":"hello"}\n'
    # Keys that are all field names; the same with one in another case; a null UUID.
    plain, folded = JSON_FRAMING.unmarshal(line, TestMsg()), JSON_FRAMING.unmarshal(line.lower(), TestMsg())
    assert plain == TestMsg(u, "hello") and type(plain.UUID) is uuid.UUID
    assert folded == TestMsg(u, "hello") and "str" not in folded.__dict__
    assert JSON_FRAMING.unmarshal(b'{"UUID":null,"Str":"x"}\n', TestMsg(u)) == TestMsg(None, "x")  # type: ignore[arg-type]
    # A class that intervenes in assignment, or keeps its fields in slots, is assigned field by field.
    assert JSON_FRAMING.unmarshal(line, Guarded()) == Guarded(u, "HELLO")
    assert JSON_FRAMING.unmarshal(line, Slotted()) == Slotted(u, "hello")
    assert JSON_FRAMING.unmarshal(b'{"Str":"x"}\n', LateUUID()).Str == "x"
    assert JSON_FRAMING.unmarshal(line, LateUUID()).UUID == u
    with pytest.raises(DecodeError, match="cannot assign to field 'Str'"):
        JSON_FRAMING.unmarshal(b'{"Str":"x"}\n', Frozen())


def test_json_decode_into_mappings_and_self_decoding_messages() -> None:
    target: dict[str, Any] = {"stale": True}
    assert JSON_FRAMING.unmarshal(b'{"a":[1,2]}\n', target) == {"a": [1, 2]}

    class Raw:
        data = b""

        def marshal_json(self) -> bytes:
            return b'{"raw":1}'

        def unmarshal_json(self, data: bytes) -> None:
            self.data = data

    assert JSON_FRAMING.marshal(Raw()) == b'{"raw":1}\n'
    assert JSON_FRAMING.unmarshal(b'{"x":2}\n', Raw()).data == b'{"x":2}'

    class BadRaw(Raw):
        def marshal_json(self) -> bytes:
            return b'{"a":1}\n{"b":2}'

    with pytest.raises(EncodeError, match="contains a newline"):
        JSON_FRAMING.marshal(BadRaw())


@pytest.mark.parametrize(
    "line",
    [
        b'{"n":18446744073709551615,"m":-9223372036854775808,"f":1.5,"e":1e300,"s":"x","t":true,"z":null}\n',
        b'{"big":18446744073709551616}\n',  # Beyond 64 bits: orjson would make these floats.
        b'{"neg":-9223372036854775809}\n',
        b'{"nested":{"a":[1,{"b":123456789012345678901234567890}]}}\n',
        b'{"list":[12345678901234567890123]}\n',
        b'{"f":1e19,"g":-1e19,"h":1e400}\n',  # Integral floats beyond 64 bits; one out of range (inf).
        b'{"s":"\xff\xfe bad UTF-8"}\n',  # U+FFFD for each bad byte, as Go substitutes.
        b'{"s":"\\ud800 lone surrogate"}\n',
        b' {"a":1} \r\n',
        b'{"a":1,"a":2}\n',  # The last duplicate wins.
    ],
)
def test_json_values_are_the_standard_decoders(line: bytes) -> None:
    """Decoded values are exactly what json.loads makes of the frame's text (orjson is only faster)."""
    expect = json.loads(line.decode("utf-8", errors="replace"))
    got = JSON_FRAMING.unmarshal(line, {})
    assert got == expect and repr(got) == repr(expect)

    @dataclasses.dataclass
    class AnyFields:
        n: Any = None
        big: Any = None
        neg: Any = None
        nested: Any = None
        list: Any = None
        f: Any = None
        s: Any = None

    decoded = JSON_FRAMING.unmarshal(line, AnyFields())
    for name, value in expect.items():
        if hasattr(decoded, name):
            assert repr(getattr(decoded, name)) == repr(value), name


@pytest.mark.parametrize(
    ("line", "target"),
    [
        (b"[1,2]\n", OnlyB()),  # Not an object.
        (b'{"B":NaN}\n', OnlyB()),  # Go rejects NaN.
        (b"\n", OnlyB()),  # Empty.
        (b"[1]\n", {}),
        (b"{}\n", object()),  # Not a supported message type.
    ],
)
def test_json_decode_errors(line: bytes, target: Any) -> None:
    with pytest.raises(DecodeError):
        JSON_FRAMING.unmarshal(line, target)


def test_line_unpacking_cases() -> None:
    """TestLineUnpackingCases, with Gazette's 16-byte buffer as 16-byte chunks."""
    data = b"a line\n" + b"x" * 24 + b"\nextra"
    unpacker = JSON_FRAMING.unpacker()
    frames: list[Frame] = []
    for i in range(0, len(data), 16):
        unpacker.feed(data[i : i + 16])
        frames.extend(drain(unpacker))
    assert frames == [Frame("", 0, 7, b"a line\n"), Frame("", 7, 32, b"x" * 24 + b"\n")]
    with pytest.raises(TruncatedFrameError) as info:
        unpacker.next_frame(eof=True)
    assert (info.value.offset, info.value.end) == (32, 37)  # "extra".
    assert unpacker.next_frame(eof=True) is None  # Then a clean EOF.


def test_json_line_too_large() -> None:
    unpacker = JSON_FRAMING.unpacker(max_frame_size=8)
    unpacker.feed(b"0123456789")  # No newline yet, and already too long.
    with pytest.raises(FrameTooLargeError) as info:
        unpacker.next_frame()
    assert info.value.offset == 0
    unpacker.feed(b"abc\n{}\n")  # The rest of the long line is skipped.
    assert drain(unpacker) == [Frame("", 14, 17, b"{}\n")]

    unpacker.feed(b"0123456789\n{}\n")  # A whole line that is too long.
    with pytest.raises(FrameTooLargeError):
        unpacker.next_frame()
    assert drain(unpacker) == [Frame("", 28, 31, b"{}\n")]


# --- CSV --------------------------------------------------------------------------------------


def test_csv_marshal_fixtures() -> None:
    u = str(uuid.uuid4())
    assert CSV_FRAMING.marshal(CSVRecord([u, "123", 'qu"ote'])) == f'{u},123,"qu""ote"\n'.encode()
    assert CSV_FRAMING.marshal(CSVRecord([u, "567,891"])) == f'{u},"567,891"\n'.encode()


def test_csv_marshal_quotes_as_go_does() -> None:
    record = CSVRecord(["", " lead", "\\.", "a\nb", "cr\r", "plain", "tab\tinside"])
    assert CSV_FRAMING.marshal(record) == b'," lead","\\.","a\nb","cr\r",plain,tab\tinside\n'
    with pytest.raises(EncodeError, match="is not CSVFrameable"):
        CSV_FRAMING.marshal(42)


def test_csv_decode_fixture() -> None:
    u = str(uuid.uuid4())
    unpacker = CSV_FRAMING.unpacker("a/journal")
    unpacker.feed(f"{u},bar,baz\n".encode())
    frame = unpacker.next_frame()
    assert frame is not None
    assert CSV_FRAMING.unmarshal(frame, CSVRecord()) == CSVRecord([u, "bar", "baz"])
    assert unpacker.next_frame(eof=True) is None


def test_csv_errors_if_fields_change() -> None:
    u = str(uuid.uuid4())
    unpacker = CSV_FRAMING.unpacker("a/journal")
    unpacker.feed(f"{u},foo,bar\n{u},baz\n{u},x,y\n".encode())
    first = unpacker.next_frame()
    assert first is not None and CSV_FRAMING.unmarshal(first, CSVRecord()) == [u, "foo", "bar"]
    with pytest.raises(DecodeError) as info:
        unpacker.next_frame()
    assert info.value.reason == "record on line 2: wrong number of fields"
    assert info.value.offset == first.end
    third = unpacker.next_frame()  # The bad record was consumed.
    assert third is not None and CSV_FRAMING.unmarshal(third, CSVRecord()) == [u, "x", "y"]


def test_csv_decode_error() -> None:
    (frame,) = unpack_all(CSV_FRAMING, b"not-a-uuid, bar, baz\n")
    with pytest.raises(DecodeError) as info:
        CSV_FRAMING.unmarshal(frame, CSVRecord())
    assert info.value.reason == "invalid UUID length: 10"


def test_csv_quoted_fields_across_lines_and_chunks() -> None:
    u = str(uuid.uuid4())
    data = f'{u},"multi\nline, with ""quotes""",x\r\n\n{u},plain,"y"\n'.encode()
    expect = [[u, 'multi\nline, with "quotes"', "x"], [u, "plain", "y"]]
    first_end = data.index(b"x\r\n") + 3
    # Every split point gives the same frames and offsets.
    for cut in range(len(data) + 1):
        unpacker = CSV_FRAMING.unpacker("a/journal")
        frames: list[Frame] = []
        for chunk in (data[:cut], data[cut:]):
            unpacker.feed(chunk)
            frames.extend(drain(unpacker))
        assert unpacker.next_frame(eof=True) is None
        assert [CSV_FRAMING.unmarshal(f, CSVRecord()) for f in frames] == expect
        # The empty line between the records is skipped.
        assert [(f.begin, f.end) for f in frames] == [(0, first_end), (first_end + 1, len(data))]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b'a"b,c\n', 'parse error on line 1: bare " in non-quoted field'),
        (b'"a"b,c\n', 'parse error on line 1: extraneous or missing " in quoted-field'),
    ],
)
def test_csv_syntax_errors_consume_the_record(data: bytes, reason: str) -> None:
    unpacker = CSV_FRAMING.unpacker()
    unpacker.feed(data + b"ok,1\n")
    with pytest.raises(DecodeError) as info:
        unpacker.next_frame()
    assert info.value.reason == reason
    assert drain(unpacker) == [Frame("", len(data), len(data) + 5, b"ok,1\n")]


def test_csv_unterminated_record_at_eof() -> None:
    for data in (b"a,b", b'a,"open\nquote'):
        unpacker = CSV_FRAMING.unpacker()
        unpacker.feed(data)
        assert unpacker.next_frame() is None
        with pytest.raises(TruncatedFrameError, match="unexpected EOF"):
            unpacker.next_frame(eof=True)


def test_csv_record_acknowledgement() -> None:
    record = CSVRecord([str(uuid.uuid4()), "a", "b"])
    ack = record.new_acknowledgement("a/journal")
    assert ack == ["", "", ""]
    u = uuid.uuid4()
    ack.set_uuid(u)
    assert ack.get_uuid() == u
    assert CSV_FRAMING.marshal(ack) == f"{u},,\n".encode()
    with pytest.raises(ValueError, match="fields are empty"):
        CSVRecord().unmarshal_csv([])


# --- All framings: offsets and chunking -------------------------------------------------------


def json_stream() -> bytes:
    return b"".join(JSON_FRAMING.marshal({"n": i, "s": "x" * i}) for i in range(12))


def fixed_stream() -> bytes:
    return b"".join(encode_fixed_frame(b"p" * i) for i in range(12))


def csv_stream() -> bytes:
    return b"".join(CSV_FRAMING.marshal(CSVRecord([str(i), "a,b" * (i % 3), 'q"uote\n' * (i % 2)])) for i in range(12))


@pytest.mark.parametrize(
    ("framing", "stream"),
    [(JSON_FRAMING, json_stream), (PROTO_FIXED_FRAMING, fixed_stream), (CSV_FRAMING, csv_stream)],
)
def test_frames_do_not_depend_on_chunking(framing: Framing, stream: Any) -> None:
    data: bytes = stream()
    whole = unpack_all(framing, data, offset=4096)
    assert len(whole) == 12
    assert whole[0].begin == 4096 and whole[-1].end == 4096 + len(data)
    assert all(a.end == b.begin for a, b in itertools.pairwise(whole))
    assert b"".join(f.data for f in whole) == data

    for size in (1, 2, 7, 64):
        unpacker = framing.unpacker("a/journal", 4096)
        frames: list[Frame] = []
        for i in range(0, len(data), size):
            unpacker.feed(data[i : i + size], 4096 + i)
            frames.extend(drain(unpacker))
        frames.extend(drain(unpacker, eof=True))
        assert frames == whole


@pytest.mark.parametrize(
    ("framing", "stream"),
    [(JSON_FRAMING, json_stream), (PROTO_FIXED_FRAMING, fixed_stream), (CSV_FRAMING, csv_stream)],
)
def test_take_frames_returns_next_frames_frames_at_most_limit_at_a_time(framing: Framing, stream: Any) -> None:
    data: bytes = stream()
    whole = unpack_all(framing, data, offset=4096)
    for size, limit in itertools.product((1, 7, 64, len(data)), (1, 5, 100)):
        unpacker = framing.unpacker("a/journal", 4096)
        frames: list[Frame] = []
        for i in range(0, len(data), size):
            unpacker.feed(data[i : i + size], 4096 + i)
            while taken := unpacker.take_frames(limit):
                assert len(taken) <= limit
                frames.extend(taken)
        assert unpacker.take_frames(limit, eof=True) == []
        assert frames == whole, (size, limit)


def test_take_frames_holds_an_error_after_its_first_frame_for_the_next_call() -> None:
    # JSON lines: the whole lines before a line too long, then its error, then the lines after it.
    unpacker = JSON_FRAMING.unpacker("a/journal", 0, max_frame_size=8)
    unpacker.feed(b'{}\n{"a":1}\n' + b"x" * 20 + b"\n{}\n")
    assert unpacker.take_frames(10) == [Frame("a/journal", 0, 3, b"{}\n"), Frame("a/journal", 3, 11, b'{"a":1}\n')]
    with pytest.raises(FrameTooLargeError) as info:
        unpacker.take_frames(10)
    assert info.value.offset == 11
    assert unpacker.take_frames(10) == [Frame("a/journal", 32, 35, b"{}\n")]

    # A framing without a fast path: the frame before the garbage, then its error, then the rest.
    unpacker = PROTO_FIXED_FRAMING.unpacker("a/journal", 500)
    unpacker.feed(FRAME_20 + b"foobar" + FRAME_20)
    assert [(f.begin, f.end) for f in unpacker.take_frames(10)] == [(500, 528)]
    with pytest.raises(DesyncError) as desync:
        unpacker.next_frame()  # next_frame raises the held error too.
    assert (desync.value.offset, desync.value.end) == (528, 534)
    assert [(f.begin, f.end) for f in unpacker.take_frames(10)] == [(534, 562)]

    # A partial line waits for more bytes, and is truncated at the end of the stream.
    unpacker = JSON_FRAMING.unpacker("a/journal", 0)
    unpacker.feed(b'{}\n{"a"')
    assert unpacker.take_frames(10) == [Frame("a/journal", 0, 3, b"{}\n")]
    assert unpacker.take_frames(10) == []
    unpacker.feed(b":1}\n{")
    assert unpacker.take_frames(10) == [Frame("a/journal", 3, 11, b'{"a":1}\n')]
    with pytest.raises(TruncatedFrameError):
        unpacker.take_frames(10, eof=True)


def test_offset_jump_truncates_a_partial_frame() -> None:
    unpacker = JSON_FRAMING.unpacker("a/journal", 100)
    unpacker.feed(b'{"a":1}\n{"b"')
    assert drain(unpacker) == [Frame("a/journal", 100, 108, b'{"a":1}\n')]
    unpacker.feed(b'{"c":3}\n', offset=500)  # The journal skipped [112, 500).
    with pytest.raises(TruncatedFrameError) as info:
        unpacker.next_frame()
    assert (info.value.offset, info.value.end) == (108, 112)
    assert drain(unpacker) == [Frame("a/journal", 500, 508, b'{"c":3}\n')]

    # A jump on a frame boundary loses nothing.
    unpacker.feed(b"{}\n", offset=900)
    assert drain(unpacker) == [Frame("a/journal", 900, 903, b"{}\n")]

    with pytest.raises(FramingError, match="overlaps"):
        unpacker.feed(b"{}\n", offset=901)
