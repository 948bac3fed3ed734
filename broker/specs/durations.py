"""Go `time.ParseDuration` and `time.Duration.String()` for spec files, e.g. `10m`, `1h30m`, `1m0s`."""

from __future__ import annotations

import re

from google.protobuf.duration_pb2 import Duration

from broker.errors import GazetteError
from broker.protocol.validation import duration_ns, go_duration

__all__ = ["DurationError", "format_duration", "from_proto", "parse_duration", "to_proto"]

_UNITS = {
    "ns": 1,
    "us": 10**3,
    "µs": 10**3,  # U+00B5 micro sign.
    "μs": 10**3,  # U+03BC Greek mu.
    "ms": 10**6,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
}
_COMPONENT = re.compile(r"(\d*)(?:\.(\d*))?([^\d.]*)")
_MAX_NS = 2**63 - 1


class DurationError(GazetteError, ValueError):
    """A string which is not a Go duration."""


def parse_duration(text: str) -> int:
    """Parse a Go duration string (`300ms`, `-1.5h`, `2h45m`, `0`) into nanoseconds."""
    s = text
    negative = s[:1] == "-"
    if s and s[0] in "+-":
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise DurationError(f"invalid duration {text!r}")
    total = 0
    while s:
        m = _COMPONENT.match(s)
        assert m is not None  # Every group is optional.
        whole, frac, unit = m.group(1), m.group(2), m.group(3)
        if not whole and not frac:
            raise DurationError(f"invalid duration {text!r}")
        if not unit:
            raise DurationError(f"missing unit in duration {text!r}")
        if unit not in _UNITS:
            raise DurationError(f"unknown unit {unit!r} in duration {text!r}")
        scale = _UNITS[unit]
        total += int(whole or "0") * scale
        if frac:
            total += int(frac) * scale // 10 ** len(frac)
        if total > _MAX_NS + (1 if negative else 0):
            raise DurationError(f"duration {text!r} overflows int64 nanoseconds")
        s = s[m.end() :]
    return -total if negative else total


def format_duration(ns: int) -> str:
    """Format nanoseconds as Go's `time.Duration.String()`: `1m0s`, `720h0m0s`, `0s`."""
    return go_duration(ns)


def to_proto(ns: int) -> Duration:
    """Return a protobuf Duration of `ns` nanoseconds."""
    out = Duration()
    out.FromNanoseconds(ns)
    return out


def from_proto(d: Duration) -> int:
    """Return a protobuf Duration in nanoseconds."""
    return duration_ns(d)
