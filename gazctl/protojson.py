"""Protobuf messages as the JSON-ready dicts gazctl prints, as `json_format.MessageToDict` makes
them (proto field names; with `with_defaults`, fields without presence at their defaults too),
with keys in field-number order at every level.

Listings and plans hold thousands of specs that repeat the same sub-messages (fragment specs,
labels, durations): each distinct sub-message is converted once per call and its dict shared,
which makes a 10,000-spec document several times faster than MessageToDict alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message


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


__all__ = ["MessageDicts", "message_to_dict"]
