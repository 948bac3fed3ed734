"""Framings: how messages are laid out as bytes in a journal, chosen by its `content-type` label.

| content-type                   | Framing              | frame                                            |
|--------------------------------|----------------------|--------------------------------------------------|
| `application/x-ndjson`         | JSONFraming          | one compact JSON document and `\\n`               |
| `application/x-protobuf-fixed` | ProtoFixedFraming    | `66 33 93 36`, uint32 LE payload length, payload |
| `text/csv`                     | CSVFraming           | one RFC 4180 record and `\\n`                     |

A Framing marshals a message to bytes and unmarshals a frame into a message. An `Unpacker`
splits one journal's byte stream, fed in chunks of any size, into whole `Frame`s that know
their journal offsets [begin, end). An error consumes the bytes it reports (and an oversized
frame's remaining bytes after it), so the caller may log it and keep reading.

Where this differs from Gazette: a CSV record left without its newline at the end of the
stream is an error, as it is for JSON lines (Go's encoding/csv would accept it); unpackers cap
frames at `max_frame_size`; and feeding a chunk past a gap in offsets reports a partial frame
as truncated instead of splicing the bytes together.
"""

from __future__ import annotations

import abc
import base64
import dataclasses
import json
import re
import types
import typing
from collections.abc import Iterator, Mapping, MutableMapping
from typing import ClassVar, Protocol, TypeVar, runtime_checkable
from uuid import UUID

from broker.protocol import labels as lbl
from broker.protocol import pb
from consumer.message.errors import (
    DecodeError,
    DesyncError,
    EncodeError,
    FrameTooLargeError,
    FramingError,
    MessageError,
    TruncatedFrameError,
    UnknownContentTypeError,
)
from consumer.message.uuid import parse_uuid

T = TypeVar("T")

DEFAULT_MAX_FRAME_SIZE = 1 << 28
"""256 MiB. A longer frame is more likely a corrupt length or a missing newline than a message."""


@dataclasses.dataclass(frozen=True, slots=True)
class Frame:
    """The bytes of one whole frame, which spans [begin, end) of `journal`."""

    journal: str
    begin: int
    end: int
    data: bytes


class Unpacker(abc.ABC):
    """Splits one journal's byte stream into frames, incrementally.

    `feed` chunks as they arrive; call `next_frame` until it returns None (more bytes needed).
    At the end of the stream pass `eof=True`: a partial frame then raises TruncatedFrameError.
    """

    def __init__(self, framing: Framing, journal: str = "", offset: int = 0, max_frame_size: int | None = None) -> None:
        self.framing = framing
        self.journal = journal
        self.max_frame_size = DEFAULT_MAX_FRAME_SIZE if max_frame_size is None else max_frame_size
        self._buf = bytearray()
        self._pos = 0  # Index in _buf of the next unconsumed byte.
        self._base = offset  # Journal offset of _buf[0].
        self._pending: FramingError | None = None  # Raised by the next next_frame().

    @property
    def offset(self) -> int:
        """Journal offset of the next byte not yet consumed: where the next frame begins."""
        return self._base + self._pos

    @property
    def end_offset(self) -> int:
        """Journal offset just past the last byte fed."""
        return self._base + len(self._buf)

    @property
    def buffered(self) -> int:
        """Count of fed bytes not yet consumed."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes, offset: int | None = None) -> None:
        """Append a chunk that starts at journal `offset` (default: where the last chunk ended).

        A chunk past the end of the last one means the journal skipped content (Gazette's
        offset jump): buffered bytes of a partial frame are dropped, and the next `next_frame`
        raises TruncatedFrameError for them.
        """
        expect = self.end_offset
        if offset is not None and offset != expect:
            if offset < expect:
                raise FramingError(
                    f"chunk at offset {offset} overlaps bytes already fed through offset {expect}",
                    journal=self.journal,
                    offset=offset,
                    content_type=self.framing.content_type,
                )
            if self.buffered:
                self._pending = TruncatedFrameError(
                    f"journal content jumped from offset {expect} to {offset}, truncating a frame",
                    journal=self.journal,
                    offset=self.offset,
                    end=expect,
                    content_type=self.framing.content_type,
                )
            self._buf.clear()
            self._pos = 0
            self._base = offset
            self._on_jump()
        if self._pos:
            # Compact once per chunk: cheap, and keeps the buffer from growing without bound.
            del self._buf[: self._pos]
            self._base += self._pos
            self._pos = 0
        self._buf += data

    def next_frame(self, *, eof: bool = False) -> Frame | None:
        """The next whole frame, or None if more bytes are needed (or, with `eof`, none remain).

        Raises a FramingError for garbage, having consumed it; calling again continues after it.
        """
        if self._pending is not None:
            error, self._pending = self._pending, None
            raise error
        return self._scan(eof)

    def frames(self, *, eof: bool = False) -> Iterator[Frame]:
        """Yield whole frames until more bytes are needed. An error ends this iterator only."""
        while (frame := self.next_frame(eof=eof)) is not None:
            yield frame

    @abc.abstractmethod
    def _scan(self, eof: bool) -> Frame | None:
        """Framing-specific: find, consume and return the frame at `_pos`."""

    def _on_jump(self) -> None:  # noqa: B027  # An optional hook; most unpackers need nothing.
        """Hook: the stream jumped ahead; forget any state about the dropped bytes."""

    def _take(self, size: int) -> Frame:
        begin = self.offset
        data = bytes(self._buf[self._pos : self._pos + size])
        self._pos += size
        return Frame(self.journal, begin, begin + size, data)

    def _error(self, cls: type[FramingError], reason: str, begin: int) -> FramingError:
        return cls(reason, journal=self.journal, offset=begin, content_type=self.framing.content_type)

    def _truncated(self, reason: str) -> TruncatedFrameError:
        """Consume every buffered byte and describe them as a truncated frame."""
        begin, end = self.offset, self.end_offset
        self._pos = len(self._buf)
        return TruncatedFrameError(
            reason, journal=self.journal, offset=begin, end=end, content_type=self.framing.content_type
        )


class Framing(abc.ABC):
    """Marshals messages to frames and unmarshals frames to messages, for one content type."""

    content_type: ClassVar[str]

    @abc.abstractmethod
    def marshal(self, message: object) -> bytes:
        """The whole frame of `message`. Raises EncodeError."""

    @abc.abstractmethod
    def unmarshal(self, frame: Frame | bytes, message: T) -> T:
        """Decode a whole frame into `message` (in place) and return it. Raises DecodeError."""

    @abc.abstractmethod
    def unpacker(self, journal: str = "", offset: int = 0, *, max_frame_size: int | None = None) -> Unpacker:
        """A new Unpacker for the byte stream of `journal` that starts at `offset`."""

    def _decode_error(self, frame: Frame | bytes, error: BaseException) -> DecodeError:
        reason = error.reason if isinstance(error, MessageError) else (str(error) or type(error).__name__)
        if isinstance(frame, Frame):
            return DecodeError(reason, journal=frame.journal, offset=frame.begin, content_type=self.content_type)
        return DecodeError(reason, content_type=self.content_type)


# --- JSON lines -------------------------------------------------------------------------------


@runtime_checkable
class JSONMarshaler(Protocol):
    """A message that encodes itself: one JSON document, with no newline."""

    def marshal_json(self) -> bytes: ...


@runtime_checkable
class JSONUnmarshaler(Protocol):
    """A message that decodes itself from one JSON document."""

    def unmarshal_json(self, data: bytes) -> None: ...


# Go's encoding/json escapes these inside strings (they never appear outside one).
_GO_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_GO_JSON_ESCAPE_RE = re.compile("[<>&\u2028\u2029]")


def _json_default(value: object) -> object:
    if isinstance(value, UUID):
        return str(value)  # Go encodes a uuid.UUID as its canonical text.
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")  # As Go encodes []byte.
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _dataclass_fields(value)
    raise TypeError(f"json: unsupported type: {type(value).__name__}")


def _dataclass_fields(value: object) -> dict[str, object]:
    # Fields named with a leading underscore are private, like Go's unexported fields: dropped.
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if not f.name.startswith("_")}  # type: ignore[arg-type]


def _reject_constant(name: str) -> object:
    raise ValueError(f"invalid JSON constant {name}")  # Go rejects NaN and Infinity.


class JSONFraming(Framing):
    """JSON lines: each frame is one compact JSON document followed by `\\n`.

    The framing never injects a UUID: a message keeps its UUID in an ordinary field (e.g. a
    dataclass field `UUID: uuid.UUID`), encoded as canonical lowercase text, giving frames like
    `{"UUID":"…","Key":"k"}`. Messages may be:

    - a JSONMarshaler / JSONUnmarshaler, which encodes or decodes itself;
    - a dataclass: encoded field by field in declaration order, skipping `_private` fields;
      decoded by matching object keys to field names (exactly, else case-insensitively, as Go
      does), parsing UUID-typed fields from text and ignoring unknown keys;
    - a mutable mapping: encoded as an object; decoded by replacing its contents.

    Encoding matches Go's `json.Encoder`: compact, UTF-8, with `<`, `>`, `&`, U+2028 and U+2029
    escaped; bytes become base64.
    """

    content_type = lbl.CONTENT_TYPE_JSON_LINES

    def marshal(self, message: object) -> bytes:
        if isinstance(message, JSONMarshaler):
            try:
                doc = message.marshal_json()
            except Exception as e:
                raise EncodeError(str(e), content_type=self.content_type) from e
            if b"\n" in doc:
                # A newline would split the frame in two.
                raise EncodeError("marshal_json() output contains a newline", content_type=self.content_type)
            return doc + b"\n"

        value = _dataclass_fields(message) if dataclasses.is_dataclass(message) else message
        try:
            text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_json_default)
        except (TypeError, ValueError, RecursionError) as e:
            raise EncodeError(str(e), content_type=self.content_type) from e
        return (_GO_JSON_ESCAPE_RE.sub(lambda m: _GO_JSON_ESCAPES[m.group()], text) + "\n").encode("utf-8")

    def unmarshal(self, frame: Frame | bytes, message: T) -> T:
        data = frame.data if isinstance(frame, Frame) else frame
        try:
            if isinstance(message, JSONUnmarshaler):
                message.unmarshal_json(data.rstrip(b"\n"))
                return message
            # Go substitutes U+FFFD for invalid UTF-8 rather than failing.
            value = json.loads(data.decode("utf-8", errors="replace"), parse_constant=_reject_constant)
            if isinstance(message, MutableMapping):
                if not isinstance(value, dict):
                    raise ValueError(f"json: cannot unmarshal {_json_kind(value)} into {type(message).__name__}")
                message.clear()
                message.update(value)
            elif dataclasses.is_dataclass(message) and not isinstance(message, type):
                _decode_dataclass(value, message)
            else:
                raise TypeError(f"{type(message).__name__} is not a dataclass, a mapping or a JSONUnmarshaler")
        except Exception as e:
            raise self._decode_error(frame, e) from e
        return message

    def unpacker(self, journal: str = "", offset: int = 0, *, max_frame_size: int | None = None) -> Unpacker:
        return LineUnpacker(self, journal, offset, max_frame_size)


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


_uuid_fields_cache: dict[type, tuple[dict[str, str], frozenset[str]]] = {}


def _dataclass_layout(cls: type) -> tuple[dict[str, str], frozenset[str]]:
    """(lower-cased name -> field name, names of UUID-typed fields) of a dataclass."""
    layout = _uuid_fields_cache.get(cls)
    if layout is None:
        names = [f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")]
        hints = typing.get_type_hints(cls)
        uuid_fields = frozenset(n for n in names if _is_uuid_type(hints.get(n)))
        layout = ({n.lower(): n for n in reversed(names)}, uuid_fields)
        _uuid_fields_cache[cls] = layout
    return layout


def _is_uuid_type(hint: object) -> bool:
    if hint is UUID:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return UUID in typing.get_args(hint)
    return False


def _decode_dataclass(value: object, message: object) -> None:
    if value is None:
        return  # Go leaves the target untouched for `null`.
    if not isinstance(value, dict):
        raise ValueError(f"json: cannot unmarshal {_json_kind(value)} into {type(message).__name__}")
    by_lower, uuid_fields = _dataclass_layout(type(message))
    exact = set(by_lower.values())
    for key, item in value.items():
        name = key if key in exact else by_lower.get(key.lower())
        if name is None:
            continue
        if name in uuid_fields and isinstance(item, str):
            item = parse_uuid(item)
        setattr(message, name, item)


class LineUnpacker(Unpacker):
    """Frames are lines through `\\n`. A final line without one is truncated at end of stream."""

    def __init__(self, framing: Framing, journal: str = "", offset: int = 0, max_frame_size: int | None = None) -> None:
        super().__init__(framing, journal, offset, max_frame_size)
        self._search_from = 0  # Bytes before this index (from _pos) hold no newline.
        self._skipping = False  # Dropping the rest of a too-large line.

    def _on_jump(self) -> None:
        self._search_from = 0
        self._skipping = False

    def _scan(self, eof: bool) -> Frame | None:
        # _search_from is relative to _pos, so it survives compaction; reset it whenever _pos moves.
        while True:
            newline = self._buf.find(b"\n", self._pos + self._search_from)
            if self._skipping:
                self._search_from = 0
                if newline == -1:
                    self._pos = len(self._buf)
                    return None
                self._pos, self._skipping = newline + 1, False
                continue

            if newline == -1:
                if self.buffered > self.max_frame_size:
                    begin = self.offset
                    self._pos, self._search_from, self._skipping = len(self._buf), 0, True
                    raise self._error(
                        FrameTooLargeError, f"line exceeds the maximum frame size of {self.max_frame_size}", begin
                    )
                if eof and self.buffered:
                    self._search_from = 0
                    raise self._truncated("unexpected EOF")
                self._search_from = self.buffered
                return None

            self._search_from = 0
            size = newline + 1 - self._pos
            if size > self.max_frame_size:
                begin = self.offset
                self._pos = newline + 1
                raise self._error(
                    FrameTooLargeError,
                    f"line of {size} bytes exceeds the maximum frame size of {self.max_frame_size}",
                    begin,
                )
            return self._take(size)


# --- Protobuf, fixed framing ------------------------------------------------------------------

FIXED_FRAME_WORD = bytes((0x66, 0x33, 0x93, 0x36))
"""The magic word that begins every fixed frame, for de-synchronization detection."""
FIXED_FRAME_HEADER_LENGTH = 8
"""The magic word and a uint32 little-endian payload length."""


@runtime_checkable
class ProtoFrameable(Protocol):
    """A message with protobuf's serialization methods (every generated protobuf message)."""

    def SerializeToString(self) -> bytes: ...

    def ParseFromString(self, data: bytes) -> object: ...


def encode_fixed_frame(payload: bytes) -> bytes:
    """A fixed frame of `payload`: the magic word, its little-endian uint32 length, then it."""
    if len(payload) > 0xFFFFFFFF:
        raise EncodeError(f"payload of {len(payload)} bytes exceeds the uint32 frame length")
    return FIXED_FRAME_WORD + len(payload).to_bytes(4, "little") + payload


class ProtoFixedFraming(Framing):
    """Protobuf messages, each preceded by an 8-byte header: magic word and payload length."""

    content_type = lbl.CONTENT_TYPE_PROTO_FIXED

    def marshal(self, message: object) -> bytes:
        if not isinstance(message, ProtoFrameable):
            raise EncodeError(f"{message!r} is not ProtoFrameable", content_type=self.content_type)
        try:
            payload = message.SerializeToString()
        except Exception as e:
            raise EncodeError(str(e), content_type=self.content_type) from e
        return encode_fixed_frame(payload)

    def unmarshal(self, frame: Frame | bytes, message: T) -> T:
        data = frame.data if isinstance(frame, Frame) else frame
        try:
            if not isinstance(message, ProtoFrameable):
                raise TypeError(f"{message!r} is not ProtoFrameable")
            if data[:4] != FIXED_FRAME_WORD or len(data) < FIXED_FRAME_HEADER_LENGTH:
                raise ValueError("frame does not begin with a fixed frame header")
            message.ParseFromString(bytes(data[FIXED_FRAME_HEADER_LENGTH:]))
        except Exception as e:
            raise self._decode_error(frame, e) from e
        return message

    def unpacker(self, journal: str = "", offset: int = 0, *, max_frame_size: int | None = None) -> Unpacker:
        return FixedUnpacker(self, journal, offset, max_frame_size)


class FixedUnpacker(Unpacker):
    """Frames are a fixed header and a payload; garbage is skipped to the next magic word.

    As Gazette's UnpackFixedFrame does: when the bytes at a frame boundary are not the magic
    word, scan the buffered bytes for the next one and raise DesyncError for the bytes skipped
    (all but the last 3 buffered, if no magic word is buffered: they may begin one). At the end
    of the stream, a single leftover `\\n` is a clean end (a Hadoop-streaming legacy).
    """

    def _scan(self, eof: bool) -> Frame | None:
        pos, avail = self._pos, self.buffered
        if avail < FIXED_FRAME_HEADER_LENGTH:
            if not eof or avail == 0:
                return None
            if avail == 1 and self._buf[pos] == 0x0A:
                self._pos += 1
                return None
            raise self._truncated("Peek(FixedFrameHeaderLength): unexpected EOF")

        if self._buf[pos : pos + 4] != FIXED_FRAME_WORD:
            found = self._buf.find(FIXED_FRAME_WORD, pos + 1)
            skip = (found - pos) if found != -1 else avail - (len(FIXED_FRAME_WORD) - 1)
            begin = self.offset
            skipped = bytes(self._buf[pos : pos + skip])
            self._pos += skip
            raise DesyncError(skipped, journal=self.journal, offset=begin, content_type=self.framing.content_type)

        size = FIXED_FRAME_HEADER_LENGTH + int.from_bytes(self._buf[pos + 4 : pos + 8], "little")
        if size > self.max_frame_size:
            # Drop only the header: the next call resynchronizes at the next magic word.
            begin = self.offset
            self._pos += FIXED_FRAME_HEADER_LENGTH
            raise self._error(
                FrameTooLargeError, f"frame size {size} exceeds the maximum frame size of {self.max_frame_size}", begin
            )
        if avail < size:
            if eof:
                raise self._truncated(f"reading frame (size {size}): unexpected EOF")
            return None
        return self._take(size)


# --- CSV --------------------------------------------------------------------------------------


@runtime_checkable
class CSVFrameable(Protocol):
    """A message described by one CSV record."""

    def marshal_csv(self) -> list[str]: ...

    def unmarshal_csv(self, fields: list[str]) -> None: ...


class CSVRecord(list[str]):
    """A ready-made CSV message: a list of fields whose first field is the message UUID."""

    def marshal_csv(self) -> list[str]:
        return list(self)

    def unmarshal_csv(self, fields: list[str]) -> None:
        """Copy `fields` in, after checking field 0 parses as a UUID."""
        if not fields:
            raise ValueError("fields are empty")
        parse_uuid(fields[0])
        self[:] = fields

    def get_uuid(self) -> UUID:
        return parse_uuid(self[0])

    def set_uuid(self, value: UUID) -> None:
        self[0] = str(value)

    def new_acknowledgement(self, journal: str) -> CSVRecord:
        """An empty record with as many fields as this one."""
        return CSVRecord([""] * len(self))


# Go's unicode.IsSpace: a field starting with one of these is quoted by encoding/csv.
_GO_SPACES = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | frozenset(
    chr(c) for c in range(0x2000, 0x200B)
)


def _csv_field(field: str) -> str:
    needs_quotes = field != "" and (field == "\\." or any(c in field for c in ',"\r\n') or field[0] in _GO_SPACES)
    return '"' + field.replace('"', '""') + '"' if needs_quotes else field


class _NeedMore(Exception):
    """The record continues past the bytes given (an open quoted field)."""


class _CSVSyntax(Exception):
    """The record is malformed."""


_UNQUOTED_END = re.compile("[,\n]")


def parse_csv_record(text: str) -> list[str]:
    """Fields of one CSV record that ends with `\\n`, parsed as Go's encoding/csv does.

    Raises _NeedMore if a quoted field is still open at the end of `text`.
    """
    text = text.replace("\r\n", "\n")  # Go reads lines, normalizing CRLF, even inside quotes.
    if '"' not in text:
        return text[:-1].split(",")  # The common case.

    fields: list[str] = []
    i, n = 0, len(text)
    while True:
        if text.startswith('"', i):
            i += 1
            parts: list[str] = []
            while True:
                q = text.find('"', i)
                if q == -1:
                    raise _NeedMore
                parts.append(text[i:q])
                after = text[q + 1 : q + 2]
                if after == '"':
                    parts.append('"')
                    i = q + 2
                elif after == ",":
                    fields.append("".join(parts))
                    i = q + 2
                    break
                elif after == "\n":
                    fields.append("".join(parts))
                    return fields
                else:
                    raise _CSVSyntax('extraneous or missing " in quoted-field')
        else:
            match = _UNQUOTED_END.search(text, i)
            end = match.start() if match else n
            field = text[i:end]
            if '"' in field:
                raise _CSVSyntax('bare " in non-quoted field')
            fields.append(field)
            if match is None or match.group() == "\n":
                return fields
            i = end + 1


class CSVFraming(Framing):
    """CSV: each frame is one record of RFC 4180 fields, ended by `\\n`.

    Messages are CSVFrameable (CSVRecord is ready-made). Marshalling quotes a field exactly when
    Go's encoding/csv does: it holds `,`, `"`, CR or LF, starts with a space, or is `\\.`.
    Reading follows encoding/csv with its defaults: empty lines are skipped, CRLF reads as LF,
    and every record must have as many fields as the first one read.
    """

    content_type = lbl.CONTENT_TYPE_CSV

    def marshal(self, message: object) -> bytes:
        if not isinstance(message, CSVFrameable):
            raise EncodeError(f"{message!r} is not CSVFrameable", content_type=self.content_type)
        try:
            fields = message.marshal_csv()
        except Exception as e:
            raise EncodeError(str(e), content_type=self.content_type) from e
        return (",".join(_csv_field(f) for f in fields) + "\n").encode("utf-8")

    def unmarshal(self, frame: Frame | bytes, message: T) -> T:
        data = frame.data if isinstance(frame, Frame) else frame
        try:
            if not isinstance(message, CSVFrameable):
                raise TypeError(f"{message!r} is not CSVFrameable")
            text = data.decode("utf-8", errors="replace")
            fields = parse_csv_record(text if text.endswith("\n") else text + "\n")
            message.unmarshal_csv(fields)
        except _NeedMore as e:
            raise self._decode_error(frame, ValueError('extraneous or missing " in quoted-field')) from e
        except Exception as e:
            raise self._decode_error(frame, e) from e
        return message

    def unpacker(self, journal: str = "", offset: int = 0, *, max_frame_size: int | None = None) -> Unpacker:
        return CSVUnpacker(self, journal, offset, max_frame_size)


class CSVUnpacker(Unpacker):
    """Frames are CSV records, which may span lines inside quoted fields."""

    def __init__(self, framing: Framing, journal: str = "", offset: int = 0, max_frame_size: int | None = None) -> None:
        super().__init__(framing, journal, offset, max_frame_size)
        self._line = 0  # Lines consumed, for Go's "record on line N" errors.
        self._fields_per_record = 0  # Set by the first record read.

    def _scan(self, eof: bool) -> Frame | None:
        while True:
            pos = self._pos
            # Skip empty lines, as encoding/csv does.
            if self._buf.startswith(b"\n", pos):
                self._pos, self._line = pos + 1, self._line + 1
                continue
            if self._buf.startswith(b"\r\n", pos):
                self._pos, self._line = pos + 2, self._line + 1
                continue
            break

        newline = self._buf.find(b"\n", pos)
        while newline != -1:
            size = newline + 1 - pos
            if size > self.max_frame_size:
                break
            try:
                fields = parse_csv_record(self._buf[pos : newline + 1].decode("utf-8", errors="replace"))
            except _NeedMore:
                newline = self._buf.find(b"\n", newline + 1)
                continue
            except _CSVSyntax as e:
                begin, line = self.offset, self._line + 1
                self._consume_lines(newline + 1)
                raise self._error(DecodeError, f"parse error on line {line}: {e}", begin) from None
            return self._record(fields, newline + 1)

        if self.buffered > self.max_frame_size:
            begin = self.offset
            self._consume_lines(len(self._buf))
            raise self._error(
                FrameTooLargeError, f"record exceeds the maximum frame size of {self.max_frame_size}", begin
            )
        if eof and self.buffered:
            raise self._truncated("unexpected EOF")
        return None

    def _record(self, fields: list[str], stop: int) -> Frame:
        line = self._line + 1
        if self._fields_per_record == 0:
            self._fields_per_record = len(fields)
        elif len(fields) != self._fields_per_record:
            begin = self.offset
            self._consume_lines(stop)
            raise self._error(DecodeError, f"record on line {line}: wrong number of fields", begin)
        frame = self._take(stop - self._pos)
        self._line += frame.data.count(b"\n")
        return frame

    def _consume_lines(self, stop: int) -> None:
        self._line += self._buf.count(b"\n", self._pos, stop)
        self._pos = stop


# --- Registry ---------------------------------------------------------------------------------

_registry: dict[str, Framing] = {}


def register_framing(framing: Framing) -> None:
    """Register `framing` under its content type, replacing any framing registered before."""
    _registry[framing.content_type] = framing


def supported_content_types() -> list[str]:
    """The registered content types, sorted."""
    return sorted(_registry)


def framing_for(source: str | pb.LabelSet | pb.JournalSpec | Mapping[str, str]) -> Framing:
    """The framing for a content type, or for the `content-type` label of a LabelSet or JournalSpec.

    Raises UnknownContentTypeError, naming the content type (empty if the label is absent) and
    the supported ones.
    """
    if isinstance(source, str):
        content_type = source
    elif isinstance(source, pb.JournalSpec):
        content_type = lbl.value_of(source.labels, lbl.CONTENT_TYPE) or ""
    elif isinstance(source, pb.LabelSet):
        content_type = lbl.value_of(source, lbl.CONTENT_TYPE) or ""
    else:
        content_type = source.get(lbl.CONTENT_TYPE, "")
    framing = _registry.get(content_type)
    if framing is None:
        raise UnknownContentTypeError(content_type, supported_content_types())
    return framing


JSON_FRAMING = JSONFraming()
PROTO_FIXED_FRAMING = ProtoFixedFraming()
CSV_FRAMING = CSVFraming()
for _framing in (JSON_FRAMING, PROTO_FIXED_FRAMING, CSV_FRAMING):
    register_framing(_framing)
