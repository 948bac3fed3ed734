"""Protobuf messages as JSON: as Gazette's gazctl prints them, and as the GitOps plans hold them.

`jsonpb` and `encoding_json` write a message as Gazette's Go code does, byte for byte:

- `jsonpb(m)` is gogo/protobuf v1.3.2's `jsonpb.Marshaler{OrigName: true, EmitDefaults: true}`,
  which `gazctl journals list -o json` and `shards list -o json` use (`cmd/gazctl/gazctlcmd/
  journals_list.go`, `shards_list.go`): every field of the Go struct in declaration order, proto
  names, 64-bit integers as strings, enums by name, durations as `"1.500s"`, an unset message
  pointer or bytes field as `null`, an empty repeated field as `[]`, one line without a newline.
- `encoding_json(m)` is Go's `encoding/json` on the generated struct, which `journals fragments
  -o json` uses (`journals_fragments.go`): the `json` struct tags, so zero scalars are left out
  (`omitempty`), enums and durations are plain numbers, bytes base64.

Both follow Gazette's gogoproto options (`gazctl/gogo.py`) and Go's string escaping (`<`, `>`, `&`,
U+2028 and U+2029 escaped, other non-ASCII text as it is).

`message_to_dict` / `MessageDicts` are the dicts `json_format.MessageToDict` makes (proto field
names; with `with_defaults`, fields without presence at their defaults too), with keys in
field-number order at every level, for the GitOps plans. Plans hold thousands of specs that repeat
the same sub-messages (fragment specs, labels, durations): each distinct sub-message is converted
once per call and its dict shared, which makes a 10,000-spec document several times faster than
MessageToDict alone.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from gazctl.gogo import is_duration, is_map, map_fields, non_nullable, std_duration


def message_to_dict(message: Message, *, with_defaults: bool = False) -> dict[str, Any]:
    """`message` as a JSON-ready dict (see the module doc). Do not mutate the result: nested dicts
    may be shared."""
    out = MessageDicts(with_defaults=with_defaults).of(message)
    assert isinstance(out, dict)
    return out


class MessageDicts:
    """Converts many messages, sharing the dicts of their equal sub-messages (see the module doc)."""

    def __init__(self, *, with_defaults: bool = False) -> None:
        self.with_defaults = with_defaults
        self._cache: dict[tuple[str, bytes], Any] = {}
        self._empty: dict[str, Any] = {}  # MessageToDict of each type's empty message.

    def of(self, message: Message) -> Any:
        """A message's dict (or, for a well-known type such as Duration, its JSON value). Do not
        mutate it: nested dicts may be shared."""
        descriptor = message.DESCRIPTOR
        if _is_well_known(descriptor):
            return self._to_dict(message)
        nested: dict[str, Any] = {}
        present = message.ListFields()
        for field, value in present:
            sub = field.message_type
            if sub is None or sub.GetOptions().map_entry:
                continue  # A scalar, or a map: MessageToDict's.
            if field.is_repeated:
                nested[field.name] = [self._shared(v) for v in value]
            else:
                nested[field.name] = self._shared(value)
        if len(nested) == len(present):
            base = self._defaults(type(message))  # Nothing else is set (e.g. a LabelSet).
        elif (scalars := self._scalars(message, present)) is not None:
            base = scalars
        elif nested:
            flat = type(message)()
            flat.CopyFrom(message)
            for name in nested:
                flat.ClearField(name)
            base = self._to_dict(flat)
        else:
            base = self._to_dict(message)
        out: dict[str, Any] = {}
        for field in _by_number(descriptor):
            name = field.name
            if name in nested:
                out[name] = nested[name]
            elif name in base:
                out[name] = base[name]
        return out

    def _shared(self, message: Message) -> Any:
        key = (message.DESCRIPTOR.full_name, message.SerializeToString(deterministic=True))
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self.of(message)
        return hit

    def _scalars(self, message: Message, present: Sequence[tuple[Any, Any]]) -> dict[str, Any] | None:
        """MessageToDict of the message's scalar fields when all are of the common types (strings,
        bools, integers, enums, or repeated ones of those) and it has no map set (None otherwise),
        without its per-call cost."""
        out: dict[str, Any] = {}
        for field, value in present:
            if field.message_type is not None:
                if field.message_type.GetOptions().map_entry:
                    return None
                continue  # Converted apart.
            convert = _SCALARS.get(field.type)
            if convert is None:
                return None
            out[field.name] = [convert(field, v) for v in value] if field.is_repeated else convert(field, value)
        if self.with_defaults:
            for field in message.DESCRIPTOR.fields:
                if field.name in out or field.has_presence:
                    continue
                if field.message_type is not None:
                    if field.message_type.GetOptions().map_entry:
                        out[field.name] = {}
                    continue
                convert = _SCALARS.get(field.type)
                if convert is None:
                    return None
                out[field.name] = [] if field.is_repeated else convert(field, field.default_value)
        return out

    def _defaults(self, cls: type[Message]) -> Any:
        name = cls.DESCRIPTOR.full_name
        hit = self._empty.get(name)
        if hit is None:
            hit = self._empty[name] = self._to_dict(cls())
        return hit

    def _to_dict(self, message: Message) -> Any:
        return json_format.MessageToDict(
            message, preserving_proto_field_name=True, always_print_fields_with_no_presence=self.with_defaults
        )


def _enum_name(field: Any, value: int) -> Any:
    named = field.enum_type.values_by_number.get(value) if field.enum_type is not None else None
    return named.name if named is not None else value


def _same(_field: Any, value: Any) -> Any:
    return value


def _decimal(_field: Any, value: int) -> str:
    return str(value)  # 64-bit integers are JSON strings.


_SCALARS: dict[int, Callable[[Any, Any], Any]] = {
    FieldDescriptor.TYPE_STRING: _same,
    FieldDescriptor.TYPE_BOOL: _same,
    FieldDescriptor.TYPE_INT32: _same,
    FieldDescriptor.TYPE_SINT32: _same,
    FieldDescriptor.TYPE_SFIXED32: _same,
    FieldDescriptor.TYPE_UINT32: _same,
    FieldDescriptor.TYPE_FIXED32: _same,
    FieldDescriptor.TYPE_INT64: _decimal,
    FieldDescriptor.TYPE_SINT64: _decimal,
    FieldDescriptor.TYPE_SFIXED64: _decimal,
    FieldDescriptor.TYPE_UINT64: _decimal,
    FieldDescriptor.TYPE_FIXED64: _decimal,
    FieldDescriptor.TYPE_ENUM: _enum_name,
}
"""How MessageToDict writes each common scalar type; others (floats, bytes) are left to it."""

_ORDER: dict[str, list[FieldDescriptor]] = {}


def _by_number(descriptor: Any) -> list[FieldDescriptor]:
    fields = _ORDER.get(descriptor.full_name)
    if fields is None:
        fields = _ORDER[descriptor.full_name] = sorted(descriptor.fields, key=lambda f: f.number)
    return fields


def _is_well_known(descriptor: Any) -> bool:
    return descriptor.full_name.startswith("google.protobuf.")


_GO_ESCAPES = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def go_string(text: str) -> str:
    """`text` as Go's encoding/json writes a string (HTML-safe, non-ASCII as it is)."""
    return json.dumps(text, ensure_ascii=False).translate(_GO_ESCAPES)


def go_duration(seconds: int, nanos: int) -> str:
    """A Duration as jsonpb writes it: `"0s"`, `"30s"`, `"1.500s"`, `"-0.000001s"`."""
    sign = ""
    if nanos < 0:
        nanos = -nanos
        if seconds == 0:
            sign = "-"
    text = f"{sign}{seconds}.{nanos:09d}"
    for _ in range(2):
        text = text.removesuffix("000")
    return '"' + text.removesuffix(".000") + 's"'


_QUOTED_INTS = frozenset({
    FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64,
    FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64,
})
_INTS = _QUOTED_INTS | {
    FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32,
    FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32,
}


def jsonpb(message: Message) -> str:
    """`message` as gogo's `jsonpb.Marshaler{OrigName: true, EmitDefaults: true}` writes Gazette's
    Go struct of it (see the module doc)."""
    return _Jsonpb().message(message)


class _Jsonpb:
    """One jsonpb document; equal sub-messages (a listing's repeated labels, fragment specs and
    routes) are written once and their text reused."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, bytes], str] = {}

    def message(self, message: Message) -> str:
        descriptor = message.DESCRIPTOR
        if descriptor.full_name == "google.protobuf.Duration":
            return go_duration(message.seconds, message.nanos)  # type: ignore[attr-defined]
        parts = []
        for field in descriptor.fields:
            parts.append(f'"{field.name}":{self.field(message, field)}')
        return "{" + ",".join(parts) + "}"

    def field(self, message: Message, field: Any) -> str:
        value = getattr(message, field.name)
        if is_map(field):
            value_field = map_fields(field)[1]
            items = sorted(value.items(), key=lambda kv: str(kv[0]))
            return "{" + ",".join(f"{go_string(str(k))}:{self.value(value_field, v)}" for k, v in items) + "}"
        if field.is_repeated:
            return "[" + ",".join(self.value(field, v) for v in value) + "]"
        if field.message_type is not None:
            if not (non_nullable(field) or message.HasField(field.name)):
                return "null"
        elif field.type == FieldDescriptor.TYPE_BYTES and not value:
            return "null"  # A nil []byte.
        return self.value(field, value)

    def value(self, field: Any, value: Any) -> str:
        if field.message_type is not None:
            key = (field.message_type.full_name, value.SerializeToString(deterministic=True))
            hit = self._seen.get(key)
            if hit is None:
                hit = self._seen[key] = self.message(value)
            return hit
        if field.type == FieldDescriptor.TYPE_ENUM:
            named = field.enum_type.values_by_number.get(value)
            return f'"{named.name}"' if named is not None else str(value)
        return _scalar(field, value, quote_64=True)


def _scalar(field: Any, value: Any, *, quote_64: bool) -> str:
    """A string, bytes, bool or integer field's value as Go's encoding/json writes it (jsonpb
    quotes 64-bit integers)."""
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        return go_string(value)
    if kind == FieldDescriptor.TYPE_BYTES:
        return '"' + base64.b64encode(value).decode("ascii") + '"'
    if kind == FieldDescriptor.TYPE_BOOL:
        return "true" if value else "false"
    if kind in _INTS:
        return f'"{value}"' if quote_64 and kind in _QUOTED_INTS else str(value)
    return json.dumps(value)  # Floats: none in Gazette's messages.


def encoding_json(message: Message) -> str:
    """`message` as Go's `encoding/json` writes Gazette's Go struct of it (see the module doc):
    each field under its `json` tag, which is the proto name, with `omitempty` on all but the
    non-nullable message fields."""
    parts = []
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        kept = non_nullable(field)
        if is_map(field):
            if not value and not kept:
                continue
            value_field = map_fields(field)[1]
            items = sorted(value.items(), key=lambda kv: str(kv[0]))
            text = "{" + ",".join(f"{go_string(str(k))}:{_go_value(value_field, v)}" for k, v in items) + "}"
            parts.append(f'"{field.name}":{text}' if value else f'"{field.name}":null')
        elif field.is_repeated:
            if not value:
                if kept:
                    parts.append(f'"{field.name}":null')  # A nil slice.
                continue
            parts.append(f'"{field.name}":[' + ",".join(_go_value(field, v) for v in value) + "]")
        elif field.message_type is not None:
            if kept or message.HasField(field.name):
                parts.append(f'"{field.name}":{_go_value(field, value)}')
        elif value:
            parts.append(f'"{field.name}":{_go_value(field, value)}')
    return "{" + ",".join(parts) + "}"


def _go_value(field: Any, value: Any) -> str:
    if is_duration(field) and std_duration(field):
        return str(value.seconds * 1_000_000_000 + value.nanos)  # A time.Duration: nanoseconds.
    if field.message_type is not None:
        return encoding_json(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return str(value)
    return _scalar(field, value, quote_64=False)


__all__ = ["MessageDicts", "encoding_json", "go_duration", "go_string", "jsonpb", "message_to_dict"]
