"""Strings in the protobuf text format as Go's (gogo/protobuf v1.3.2 `proto/text.go`, `writeString`)
writes them: byte by byte, printable ASCII as it is, `\\n`, `\\r`, `\\t`, `\\"` and `\\\\`, every other
byte as a three-digit octal escape. The gateway's compact route and register tokens and gazctl's
`-o proto` output use it."""

from __future__ import annotations

_ESCAPES = {0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t", 0x22: '\\"', 0x5C: "\\\\"}


def quote_bytes(data: bytes) -> str:
    """`data` as a quoted string of the text format (`"a\\n\\303\\251"`)."""
    out = ['"']
    for byte in data:
        escape = _ESCAPES.get(byte)
        if escape is not None:
            out.append(escape)
        elif 0x20 <= byte < 0x7F:
            out.append(chr(byte))
        else:
            out.append(f"\\{byte:03o}")
    out.append('"')
    return "".join(out)


__all__ = ["quote_bytes"]
