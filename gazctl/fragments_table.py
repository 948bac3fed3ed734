"""Renderings of journal fragments: the humanized `journals fragments` table and one-line JSON objects.

The table follows Gazette's gazctl: JOURNAL, OFFSET (begin), LENGTH (IEC bytes, as go-humanize's
IBytes), PERSISTED (a humanized age as go-humanize's Time; blank for a fragment not yet persisted),
SHA1 (first 6 bytes in hex, then `...`), COMPRESSION, and URL when signed URLs were asked for.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from rich import box
from rich.table import Table
from rich.text import Text

from broker.fragment.sums import digest_of
from broker.protocol import pb

_IEC_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")

_SECOND = 1
_MINUTE = 60
_HOUR = 60 * _MINUTE
_DAY = 24 * _HOUR
_WEEK = 7 * _DAY
_MONTH = 30 * _DAY
_YEAR = 12 * _MONTH
_LONG_TIME = 37 * _YEAR

# (age below which the entry applies, its text, the divisor of the age for `%d`), as go-humanize's.
_MAGNITUDES: tuple[tuple[float, str, int], ...] = (
    (_SECOND, "now", 1),
    (2 * _SECOND, "1 second {}", 1),
    (_MINUTE, "{n} seconds {}", _SECOND),
    (2 * _MINUTE, "1 minute {}", 1),
    (_HOUR, "{n} minutes {}", _MINUTE),
    (2 * _HOUR, "1 hour {}", 1),
    (_DAY, "{n} hours {}", _HOUR),
    (2 * _DAY, "1 day {}", 1),
    (_WEEK, "{n} days {}", _DAY),
    (2 * _WEEK, "1 week {}", 1),
    (_MONTH, "{n} weeks {}", _WEEK),
    (2 * _MONTH, "1 month {}", 1),
    (_YEAR, "{n} months {}", _MONTH),
    (18 * _MONTH, "1 year {}", 1),
    (2 * _YEAR, "2 years {}", 1),
    (_LONG_TIME, "{n} years {}", _YEAR),
    (math.inf, "a long while {}", 1),
)


def iec_bytes(size: int) -> str:
    """Return `size` in IEC units as go-humanize's IBytes: `7 B`, `43 B`, `2.5 KiB`, `128 KiB`."""
    if size < 10:
        return f"{size} B"
    exp = min(math.floor(math.log(size) / math.log(1024)), len(_IEC_UNITS) - 1)
    value = math.floor(size / 1024**exp * 10 + 0.5) / 10
    return f"{value:.0f} {_IEC_UNITS[exp]}" if value >= 10 else f"{value:.1f} {_IEC_UNITS[exp]}"


def humanized_age(then: int, now: float) -> str:
    """Return the age of Unix time `then` as go-humanize's Time: `now`, `8 minutes ago`, `2 days from now`."""
    diff = now - then
    label = "ago"
    if diff < 0:
        diff, label = -diff, "from now"
    for below, text, divisor in _MAGNITUDES:
        if diff < below:
            return text.format(label, n=int(diff // divisor))
    raise AssertionError("unreachable: the last magnitude is unbounded")


def sha1_prefix(sum_: pb.SHA1Sum) -> str:
    """Return the first 6 bytes of a fragment's SHA-1 in hex, then `...`."""
    return digest_of(sum_)[:6].hex() + "..."


def table(responses: Iterable[pb.FragmentsResponse], *, now: float, urls: bool = False) -> Table:
    """Return the fragments of `responses` as a table; with `urls`, a URL column of signed URLs."""
    out = Table(box=box.ASCII, show_edge=True, highlight=False)
    out.add_column("JOURNAL", overflow="fold")
    out.add_column("OFFSET", justify="right", overflow="fold")
    out.add_column("LENGTH", overflow="fold")
    out.add_column("PERSISTED", overflow="fold")
    out.add_column("SHA1", overflow="fold")
    out.add_column("COMPRESSION", overflow="fold")
    if urls:
        out.add_column("URL", overflow="fold")
    for resp in responses:
        for entry in resp.fragments:
            spec = entry.spec
            row = [
                spec.journal,
                str(spec.begin),
                iec_bytes(spec.end - spec.begin),
                humanized_age(spec.mod_time, now) if spec.mod_time else "",
                sha1_prefix(spec.sum),
                pb.CompressionCodec.Name(spec.compression_codec),
            ]
            if urls:
                row.append(entry.signed_url)
            out.add_row(*(Text(cell) for cell in row))
    return out


def to_json_line(entry: pb.FragmentsResponse._Fragment) -> str:
    """Return one fragment as a JSON object: proto field names in field order, every field, enums as numbers.

    Numbers stay JSON numbers (protobuf's JSON mapping would quote 64-bit integers), as Gazette's
    gazctl writes them with Go's encoding/json.
    """
    return json.dumps(_plain(entry), separators=(",", ":"))


def _plain(msg: Message) -> dict[str, Any]:
    """Return `msg` as a dict of plain values, keyed by field name in field-number order."""
    out: dict[str, Any] = {}
    descriptor: Descriptor = msg.DESCRIPTOR  # type: ignore[assignment]
    for field in sorted(descriptor.fields, key=lambda f: f.number):
        value = getattr(msg, field.name)
        if field.is_repeated:
            out[field.name] = [_value(field, v) for v in value]
        else:
            out[field.name] = _value(field, value)
    return out


def _value(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return _plain(value)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode()  # As Go's encoding/json writes []byte.
    return value
