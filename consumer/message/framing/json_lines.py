"""JSON lines (`application/x-ndjson`): one compact JSON document and `\\n` per frame."""

from __future__ import annotations

import base64
import dataclasses
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, MutableMapping
from typing import Any, Protocol, runtime_checkable
from uuid import UUID

import orjson

from broker.protocol import labels as lbl
from consumer.message.errors import EncodeError, FrameTooLargeError
from consumer.message.framing.base import Frame, Framing, T, Unpacker
from consumer.message.uuid import parse_uuid


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


# One encoder for every message: json.dumps with these options would build one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_json_default)


def _dataclass_fields(value: object) -> dict[str, object]:
    # Fields named with a leading underscore are private, like Go's unexported fields: dropped.
    return {name: getattr(value, name) for name in _public_fields(type(value))}


_public_names: dict[type, tuple[str, ...]] = {}


def _public_fields(cls: type) -> tuple[str, ...]:
    names = _public_names.get(cls)
    if names is None:
        names = _public_names[cls] = tuple(f.name for f in dataclasses.fields(cls) if not f.name.startswith("_"))
    return names


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
        if _is_marshaler(type(message)):
            try:
                doc = message.marshal_json()  # type: ignore[attr-defined]
            except Exception as e:
                raise EncodeError(str(e), content_type=self.content_type) from e
            if b"\n" in doc:
                # A newline would split the frame in two.
                raise EncodeError("marshal_json() output contains a newline", content_type=self.content_type)
            return doc + b"\n"

        value = _dataclass_fields(message) if dataclasses.is_dataclass(message) else message
        try:
            text = _ENCODER.encode(value)
        except (TypeError, ValueError, RecursionError) as e:
            raise EncodeError(str(e), content_type=self.content_type) from e
        return (_GO_JSON_ESCAPE_RE.sub(lambda m: _GO_JSON_ESCAPES[m.group()], text) + "\n").encode("utf-8")

    def unmarshal(self, frame: Frame | bytes, message: T) -> T:
        data = frame.data if isinstance(frame, Frame) else frame
        try:
            decode = _decoders.get(type(message))
            if decode is None:
                decode = _decoders[type(message)] = _decoder_for(type(message))
            decode(data, message)
        except Exception as e:
            raise self._decode_error(frame, e) from e
        return message

    def unpacker(self, journal: str = "", offset: int = 0, *, max_frame_size: int | None = None) -> Unpacker:
        return LineUnpacker(self, journal, offset, max_frame_size)


_new_tuple = tuple.__new__  # Frame(...) less its Python-level __new__.

_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_scan_once = _DECODER.scan_once  # type: ignore[attr-defined]  # Set by JSONDecoder.__init__, untyped.
_orjson_loads = orjson.loads
_OrjsonError = orjson.JSONDecodeError
_ROUNDED = float(1 << 63)
"""orjson makes an integer literal outside [-2**63, 2**64) a float of at least this magnitude."""


def _decode_json(data: bytes) -> object:
    """The JSON document of a frame's `data` (`{...}\\n`).

    orjson decodes it at half the standard decoder's cost; what orjson refuses (invalid UTF-8,
    which Go replaces with U+FFFD; a lone surrogate; an out-of-range float) or would round (an
    integer beyond 64 bits, which it makes a float) goes to the standard decoder, whose values
    and errors are the framing's.
    """
    try:
        value = _orjson_loads(data)
    except _OrjsonError:
        return _decode_json_stdlib(data)
    if type(value) is dict:
        for item in value.values():
            if type(item) is not str and type(item) is not int and _rounded(item):
                return _decode_json_stdlib(data)
    elif _rounded(value):
        return _decode_json_stdlib(data)
    return value


def _rounded(value: object) -> bool:
    """Whether an orjson `value` holds a float it made of an integer literal beyond 64 bits."""
    pending: list[Any] = [value]
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind is dict:
            pending.extend(item.values())
        elif kind is list:
            pending.extend(item)
        elif kind is float and item.is_integer() and abs(item) >= _ROUNDED:
            return True
    return False


def _decode_json_stdlib(data: bytes) -> object:
    """`data`'s JSON document by the standard decoder: as a frame holds it (`{...}\\n`) straight
    through its scanner, anything else (leading space, trailing garbage, an error) through `decode`."""
    text = data.decode("utf-8", errors="replace")  # Go substitutes U+FFFD for invalid UTF-8.
    try:
        value, end = _scan_once(text, 0)
    except StopIteration:
        return _DECODER.decode(text)  # Raises the decoder's own error (or handles leading space).
    if end == len(text) or (end == len(text) - 1 and text[end] == "\n"):
        return value
    return _DECODER.decode(text)


def _is_marshaler(cls: type) -> bool:
    """Whether messages of `cls` encode themselves, decided once per class."""
    found = _marshalers.get(cls)
    if found is None:
        found = _marshalers[cls] = issubclass(cls, JSONMarshaler)
    return found


_marshalers: dict[type, bool] = {}

_Decode = Callable[[bytes, Any], None]
_decoders: dict[type, _Decode] = {}
"""How a frame's bytes decode into a message, by the message's class."""


def _decoder_for(cls: type) -> _Decode:
    """How messages of `cls` decode, decided once per class (runtime Protocol checks are slow)."""
    if issubclass(cls, JSONUnmarshaler):
        return _decode_self
    if issubclass(cls, MutableMapping):
        return _decode_mapping
    if dataclasses.is_dataclass(cls):
        return _dataclass_decoder(cls)
    return _decode_other


def _decode_self(data: bytes, message: Any) -> None:
    message.unmarshal_json(data.rstrip(b"\n"))


def _decode_mapping(data: bytes, message: Any) -> None:
    value = _decode_json(data)
    if not isinstance(value, dict):
        raise ValueError(f"json: cannot unmarshal {_json_kind(value)} into {type(message).__name__}")
    message.clear()
    message.update(value)


def _decode_other(data: bytes, message: Any) -> None:
    _decode_json(data)  # Its error first, if it has one.
    raise TypeError(f"{type(message).__name__} is not a dataclass, a mapping or a JSONUnmarshaler")


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


def _dataclass_decoder(cls: type) -> _Decode:
    """Decodes a JSON object into a dataclass by matching its keys to field names (exactly, else
    case-insensitively, as Go does), parsing UUID-typed fields from text, ignoring unknown keys."""
    names = [f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")]
    hints = typing.get_type_hints(cls)
    fields = {n: (n, _is_uuid_type(hints.get(n))) for n in names}
    # The first declared field wins among names that differ only in case, as in Go.
    exact, by_lower = fields.get, {n.lower(): fields[n] for n in reversed(names)}.get
    uuid_names = tuple(n for n in names if fields[n][1])
    # An object whose keys are all exact field names (every message a Go or Python publisher
    # wrote) goes into the instance's __dict__ in one update, where setattr would be the same.
    in_place = _plain_attributes(cls, names)
    field_names = frozenset(names)

    def decode(data: bytes, message: Any) -> None:
        value = _decode_json(data)
        if value is None:
            return  # Go leaves the target untouched for `null`.
        if type(value) is not dict:
            raise ValueError(f"json: cannot unmarshal {_json_kind(value)} into {type(message).__name__}")
        if in_place and field_names.issuperset(value):
            attrs = message.__dict__
            attrs.update(value)
            for name in uuid_names:
                if type(item := value.get(name)) is str:
                    attrs[name] = parse_uuid(item)
            return
        for key, item in value.items():
            field = exact(key) or by_lower(key.lower())
            if field is None:
                continue
            name, is_uuid = field
            if is_uuid and type(item) is str:
                item = parse_uuid(item)
            setattr(message, name, item)

    return decode


def _plain_attributes(cls: type, names: list[str]) -> bool:
    """Whether setting the fields `names` of a `cls` instance is a plain store into its __dict__
    (no __slots__, __setattr__ or descriptor intervenes), decided once per class."""
    if cls.__setattr__ is not object.__setattr__ or "__slots__" in cls.__dict__:
        return False
    return not any(hasattr(type(inspect.getattr_static(cls, n, None)), "__set__") for n in names)


def _is_uuid_type(hint: object) -> bool:
    if hint is UUID:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return UUID in typing.get_args(hint)
    return False


class LineUnpacker(Unpacker):
    """Frames are lines through `\\n`. A final line without one is truncated at end of stream."""

    def __init__(self, framing: Framing, journal: str = "", offset: int = 0, max_frame_size: int | None = None) -> None:
        super().__init__(framing, journal, offset, max_frame_size)
        self._search_from = 0  # Bytes before this index (from _pos) hold no newline.
        self._skipping = False  # Dropping the rest of a too-large line.
        self._snapshot: bytes | None = None  # bytes(_buf), for take_frames, until the next feed.

    def feed(self, data: bytes, offset: int | None = None) -> None:
        super().feed(data, offset)
        self._snapshot = None

    def _on_jump(self) -> None:
        self._search_from = 0
        self._skipping = False

    def take_frames(self, limit: int, *, eof: bool = False) -> list[Frame]:
        # The usual case, whole lines of at most max_frame_size, cut from one bytes copy of the
        # buffer in one loop: a third of the cost of next_frame's per frame. Anything else (a
        # held error, a line being skipped, a partial or oversized line) is next_frame's.
        if self._pending is not None or self._skipping:
            return super().take_frames(limit, eof=eof)
        snapshot = self._snapshot
        if snapshot is None:
            snapshot = self._snapshot = bytes(self._buf)
        find, pos, base, journal, max_size = snapshot.find, self._pos, self._base, self.journal, self.max_frame_size
        frames: list[Frame] = []
        append = frames.append
        for _ in range(limit):
            end = find(b"\n", pos) + 1
            if not end or end - pos > max_size:
                break
            append(_new_tuple(Frame, (journal, base + pos, base + end, snapshot[pos:end])))
            pos = end
        if not frames:
            return super().take_frames(limit, eof=eof)
        self._pos, self._search_from = pos, 0
        return frames

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
