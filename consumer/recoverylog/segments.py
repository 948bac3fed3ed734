"""Segments of a recovery log and the SegmentSet (Gazette's `consumer/recoverylog/segment.go`).

A Segment is a contiguous run of RecordedOps of one author in one log: its first and last
(inclusive) seq_no, the first op's offset (a lower bound when a Recorder wrote it), the offset
just past the last op (0: unknown), and the FSM checksum before the first op.

A SegmentSet keeps these invariants:
- seq numbers strictly increase, with no overlap (`s[i].last_seq_no < s[i+1].first_seq_no`);
- entries of one log have monotonic first_offset, and monotonic last_offset, where a strict
  suffix may have last_offset 0 (unbounded).
`add` reduces a segment with overlapping or adjacent ones of the same author and log.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import overload

from broker.protocol.validation import ValidationError
from consumer.protocol import recoverylog_pb
from consumer.protocol.validation import validate_segment as _validate_segment
from consumer.recoverylog.errors import SegmentError

Segment = recoverylog_pb.Segment


def segment_repr(s: Segment) -> str:
    """A one-line description of a segment for error messages."""
    return (
        f"Segment{{Author:{s.author:#x} FirstSeqNo:{s.first_seq_no} FirstOffset:{s.first_offset} "
        f"FirstChecksum:{s.first_checksum:#x} LastSeqNo:{s.last_seq_no} LastOffset:{s.last_offset} Log:{s.log!r}}}"
    )


def validate_segment(segment: Segment) -> None:
    """Raise SegmentError unless the segment is consistent (Gazette's Segment.Validate: `Author is
    zero`, `FirstSeqNo <= 0`, `FirstOffset < 0`, `LastSeqNo < segment.FirstSeqNo`,
    `LastOffset <= segment.FirstOffset`, or an invalid Log)."""
    try:
        _validate_segment(segment)
    except ValidationError as exc:
        raise SegmentError(
            str(exc), log=segment.log, offset=segment.first_offset, seq_no=segment.first_seq_no, author=segment.author
        ) from exc


def copy_segment(s: Segment) -> Segment:
    out = Segment()
    out.CopyFrom(s)
    return out


class NotReducible(SegmentError):
    """Two segments that are consistent but cannot be merged into one (internal: caught here)."""

    def __init__(self, reason: str = "segments cannot be merged into one") -> None:
        super().__init__(reason)


def _nonzero_less(a: int, b: int) -> bool:
    return a != 0 and a < b


def reduce_segments(a: Segment, b: Segment) -> Segment:
    """One segment covering both `a` and `b` (a new message). Raises NotReducible when they are
    disjoint, or adjacent with another author or log; SegmentError when they are inconsistent."""
    if a.first_seq_no > b.first_seq_no or (a.first_seq_no == b.first_seq_no and a.last_seq_no < b.last_seq_no):
        a, b = b, a

    def fail(reason: str) -> SegmentError:
        return SegmentError(
            f"{reason}: {segment_repr(a)} vs {segment_repr(b)}", log=b.log, offset=b.first_offset,
            seq_no=b.first_seq_no, author=b.author,
        )

    same_log = a.log == b.log
    # Offset ordering constraints.
    if a.first_seq_no < b.first_seq_no and same_log and a.first_offset > b.first_offset:
        raise fail("expected monotonic FirstOffset")
    if a.first_seq_no < b.first_seq_no and a.last_offset == 0 and b.last_offset != 0:
        raise fail("expected preceding Segment to also include LastOffset")
    if a.last_offset == 0 and not same_log:
        raise fail("Segment cannot use a different log where preceding Segment.LastOffset is zero")
    if (a.last_seq_no <= b.last_seq_no and same_log and _nonzero_less(b.last_offset, a.last_offset)) or (
        a.last_seq_no >= b.last_seq_no and same_log and _nonzero_less(a.last_offset, b.last_offset)
    ):
        raise fail("expected monotonic LastOffset")
    # Checksum constraint.
    if a.first_seq_no == b.first_seq_no and a.first_checksum != b.first_checksum:
        raise fail("expected FirstChecksum equality")
    # Cases which cannot reduce further.
    if a.last_seq_no + 1 < b.first_seq_no:
        raise NotReducible()  # Disjoint.
    if a.last_seq_no + 1 == b.first_seq_no and (a.author != b.author or not same_log):
        raise NotReducible()  # Adjacent, of different authors or logs.
    # The remaining cases overlap (or are adjacent), so must share author and log.
    if a.author != b.author:
        raise fail("expected Segment Author equality")
    if not same_log:
        raise fail("expected Segment Log equality")

    out = copy_segment(a)
    # FirstOffset is a lower bound: prefer the tighter (larger) one.
    if a.first_seq_no == b.first_seq_no and a.first_offset < b.first_offset:
        out.first_offset = b.first_offset
    # LastOffset is optional: prefer that it be set (monotonicity is checked above).
    if a.last_seq_no == b.last_seq_no and a.last_offset == 0:
        out.last_offset = b.last_offset
    # Extend in the overlap and adjacent cases.
    if a.last_seq_no < b.last_seq_no:
        out.last_seq_no, out.last_offset = b.last_seq_no, b.last_offset
    return out


class SegmentSet(Sequence[Segment]):
    """Ordered, non-overlapping Segments (see the module doc for the invariants)."""

    def __init__(self, segments: Sequence[Segment] = ()) -> None:
        self._s: list[Segment] = []
        for s in segments:
            self.add(s)

    def add(self, segment: Segment) -> None:
        """Add a copy of `segment`, reducing it with overlapping or adjacent segments of the same
        author and log. Raises SegmentError if it is invalid or inconsistent with the set."""
        validate_segment(segment)
        segment = copy_segment(segment)
        s = self._s
        begin = bisect.bisect_left([x.first_seq_no for x in s], segment.first_seq_no)
        # At most one reduction with the preceding segment (first_seq_no strictly increases).
        if begin > 0:
            try:
                segment = reduce_segments(s[begin - 1], segment)
                begin -= 1
            except NotReducible:
                pass
        end = begin
        while end != len(s):
            try:
                segment = reduce_segments(s[end], segment)
            except NotReducible:
                break
            end += 1
        s[begin:end] = [segment]

    def intersect(self, log: str, first_offset: int, last_offset: int) -> list[Segment]:
        """The segments overlapping offsets [first_offset, last_offset). Every segment must be of `log`."""
        if last_offset < first_offset:
            raise ValueError(f"invalid range [{first_offset}, {last_offset})")
        for x in self._s:
            if x.log != log:
                raise ValueError(f"segment log {x.log!r} != {log!r}")
        j = bisect.bisect_left([x.first_offset for x in self._s], last_offset)
        i = j
        while i != 0 and (self._s[i - 1].last_offset == 0 or self._s[i - 1].last_offset > first_offset):
            i -= 1
        return self._s[i:j]

    @overload
    def __getitem__(self, i: int) -> Segment: ...

    @overload
    def __getitem__(self, i: slice) -> list[Segment]: ...

    def __getitem__(self, i: int | slice) -> Segment | list[Segment]:
        return self._s[i]

    def __len__(self) -> int:
        return len(self._s)

    def __iter__(self) -> Iterator[Segment]:
        return iter(self._s)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SegmentSet):
            return self._s == other._s
        if isinstance(other, list):
            return self._s == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SegmentSet([{', '.join(segment_repr(x) for x in self._s)}])"


__all__ = ["NotReducible", "Segment", "SegmentSet", "copy_segment", "reduce_segments", "segment_repr",
           "validate_segment"]
