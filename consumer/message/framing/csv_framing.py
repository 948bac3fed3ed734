"""CSV (`text/csv`): each frame is one RFC 4180 record and `\\n`, as Go's encoding/csv has them.

Records are parsed by `csv_parser`; a record may span lines inside quoted fields.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable
from uuid import UUID

from broker.protocol import labels as lbl
from consumer.message.errors import DecodeError, EncodeError, FrameTooLargeError
from consumer.message.framing.base import Frame, Framing, T, Unpacker
from consumer.message.framing.csv_parser import CSVSyntaxError, NeedMore, parse_csv_record
from consumer.message.uuid import parse_uuid


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
        except NeedMore as e:
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
            except NeedMore:
                newline = self._buf.find(b"\n", newline + 1)
                continue
            except CSVSyntaxError as e:
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
