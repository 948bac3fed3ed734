"""Framing one row's value as one record of a journal, so readers find the same records again.

- `lines`: the value and a newline (none added if it already ends with one). A newline inside
  the value would make two records of one: refused.
- `none`: the value's bytes as they are (the writer of the DataFrame delimits them).
- `fixed`: Gazette's `application/x-protobuf-fixed` frame: the word `66 33 93 36`, the payload
  length as uint32 little-endian, then the payload.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from pipelines.sink.options import SinkError

FIXED_FRAME_WORD = b"\x66\x33\x93\x36"
MAX_FIXED_PAYLOAD = (1 << 32) - 1

Framer = Callable[[bytes], bytes]


def frame_lines(value: bytes) -> bytes:
    end = len(value) - 1 if value.endswith(b"\n") else len(value)
    if value.find(b"\n", 0, end) >= 0:
        raise SinkError(
            "a value contains a newline before its end, so framing 'lines' would split it into two records: "
            "use option framing=none or fixed, or escape the newline"
        )
    return value if end < len(value) else value + b"\n"


def frame_none(value: bytes) -> bytes:
    return value


def frame_fixed(value: bytes) -> bytes:
    if len(value) > MAX_FIXED_PAYLOAD:
        raise SinkError(f"a value of {len(value)} bytes is too large for framing 'fixed' (at most 4 GiB - 1)")
    return FIXED_FRAME_WORD + struct.pack("<I", len(value)) + value


FRAMERS: dict[str, Framer] = {"lines": frame_lines, "none": frame_none, "fixed": frame_fixed}
