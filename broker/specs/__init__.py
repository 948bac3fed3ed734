"""Spec documents as people write them: strict YAML decoding with positions, and Go durations.

`strict` decodes round-trip YAML into typed values that carry their `At` (file, line, column and
field path), raising `SpecError` for anything unknown, mistyped or missing; `durations` parses
and prints Go's duration strings (`1h30m`). Journal spec trees (gazctl), pipeline definitions and
shard specs are built on them.
"""

from broker.specs.durations import DurationError, format_duration, parse_duration
from broker.specs.strict import At, SpecError

__all__ = ["At", "DurationError", "SpecError", "format_duration", "parse_duration"]
