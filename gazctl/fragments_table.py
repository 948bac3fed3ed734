"""Renderings of journal fragments: the humanized `journals fragments` table and one-line JSON objects,
as Gazette's gazctl prints them.

The table follows Gazette's gazctl: JOURNAL, OFFSET (begin), LENGTH (IEC bytes, as go-humanize's
IBytes), PERSISTED (a humanized age as go-humanize's Time; blank for a fragment not yet persisted),
SHA1 (first 6 bytes in hex, then `...`), COMPRESSION, and URL when signed URLs were asked for.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from broker.fragment.sums import digest_of
from broker.protocol import pb
from gazctl import tables
from gazctl.protojson import encoding_json

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


def table_text(responses: Iterable[pb.FragmentsResponse], *, now: float, urls: bool = False) -> str:
    """The fragments of `responses` as Gazette's table (`cmd/gazctl/gazctlcmd/journals_fragments.go`);
    with `urls`, a URL column of signed URLs."""
    headers = ["Journal", "Offset", "Length", "Persisted", "SHA1", "Compression"]
    if urls:
        headers.append("URL")
    rows = []
    for resp in responses:
        for entry in resp.fragments:
            spec = entry.spec
            row = [
                spec.journal,
                str(spec.begin),
                iec_bytes(spec.end - spec.begin),
                humanized_age(spec.mod_time, now) if spec.mod_time else "",
                sha1_prefix(spec.sum),
                _codec_name(spec.compression_codec),
            ]
            if urls:
                row.append(entry.signed_url)
            rows.append(row)
    return tables.render(headers, rows)


def _codec_name(codec: int) -> str:
    """A codec's name, or its number as Go's String() of an unknown enum value writes it."""
    named = pb.CompressionCodec.DESCRIPTOR.values_by_number.get(codec)
    return named.name if named is not None else str(codec)


def to_json_line(entry: pb.FragmentsResponse._Fragment) -> str:
    """One fragment as Gazette's `journals fragments -o json` writes it, with Go's encoding/json of the
    generated struct: zero fields left out, enums as numbers (see `gazctl/protojson.py`)."""
    return encoding_json(entry)
