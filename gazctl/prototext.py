"""Protobuf messages in the text format of gogo/protobuf v1.3.2's `proto.MarshalText`, which Gazette's
gazctl prints for `-o proto` and `apply --dry-run` (`cmd/gazctl/gazctlcmd/journals_list.go`,
`journals_fragments.go`, `shards_list.go`, `journals_apply.go`, `shards_apply.go`).

It differs from protobuf's Python `text_format`: sub-messages are `name: <` ... `>`; fields come in
declaration order; zero scalars are left out, but a non-nullable sub-message (`gazctl/gogo.py`) is
written even when empty; a stdduration field is left out when zero and otherwise written as
`<seconds: .. nanos: ..>`; strings escape every byte outside printable ASCII as `\\ooo` octal.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from broker.protocol.textformat import quote_bytes
from gazctl.gogo import is_map, map_fields, non_nullable, std_duration


def marshal_text(message: Message) -> str:
    """`message` as gogo's `proto.MarshalText` writes Gazette's Go struct of it."""
    out: list[str] = []
    _struct(message, 0, out)
    return "".join(out)


def _struct(message: Message, depth: int, out: list[str]) -> None:
    indent = "  " * depth
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if is_map(field):
            key_field, value_field = map_fields(field)
            inner = indent + "  "
            for key in sorted(value, key=str):
                out.append(f"{indent}{field.name}: <\n{inner}key: {_scalar(key_field, key)}\n")
                out.append(f"{inner}value: ")
                _any(value_field, value[key], depth + 1, out)
                out.append(f"\n{indent}>\n")
        elif field.is_repeated:
            for item in value:
                out.append(f"{indent}{field.name}: ")
                _any(field, item, depth, out)
                out.append("\n")
        elif field.message_type is not None:
            if std_duration(field) and non_nullable(field):
                if value.seconds == 0 and value.nanos == 0:
                    continue  # A zero time.Duration, as a zero int64.
            elif not (non_nullable(field) or message.HasField(field.name)):
                continue
            out.append(f"{indent}{field.name}: ")
            _any(field, value, depth, out)
            out.append("\n")
        elif value:  # proto3 scalars at their zero value are left out.
            out.append(f"{indent}{field.name}: {_scalar(field, value)}\n")


def _any(field: Any, value: Any, depth: int, out: list[str]) -> None:
    """A field's value: a scalar, or `<`, the message's fields one level deeper, and `>`."""
    if field.message_type is None:
        out.append(_scalar(field, value))
        return
    out.append("<\n")
    _struct(value, depth + 1, out)
    out.append("  " * depth + ">")


def _scalar(field: Any, value: Any) -> str:
    if field.type == FieldDescriptor.TYPE_ENUM:
        named = field.enum_type.values_by_number.get(value)
        return named.name if named is not None else str(value)
    if field.type == FieldDescriptor.TYPE_STRING:
        return quote_bytes(value.encode("utf-8"))
    if field.type == FieldDescriptor.TYPE_BYTES:
        return quote_bytes(value)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return "true" if value else "false"
    return str(value)


__all__ = ["marshal_text"]
