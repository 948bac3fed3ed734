"""Segments and SegmentSet: Gazette's segment_test.go cases."""

from __future__ import annotations

import itertools
import random

import pytest

from consumer.protocol import recoverylog_pb
from consumer.recoverylog.errors import SegmentError
from consumer.recoverylog.segments import NotReducible, SegmentSet, reduce_segments, validate_segment

Seg = recoverylog_pb.Segment
A, B = "log/A", "log/B"


def model() -> list[Seg]:
    return [
        Seg(author=0xA, first_seq_no=5, last_seq_no=10, first_offset=500, last_offset=1001, log=A),
        Seg(author=0xB, first_seq_no=11, last_seq_no=11, first_offset=1100, last_offset=1101, log=A),
        Seg(author=0xB, first_seq_no=13, last_seq_no=15, first_offset=1300, last_offset=1501, log=A),
    ]


def model_set() -> SegmentSet:
    return SegmentSet(model())


@pytest.mark.parametrize("change, error", [
    ({"author": 0}, "Author is zero"),
    ({"first_seq_no": 0}, "FirstSeqNo <= 0"),
    ({"first_seq_no": -1}, "FirstSeqNo <= 0"),
    ({"first_offset": -1}, "FirstOffset < 0"),
    ({"last_seq_no": 9}, "LastSeqNo < segment.FirstSeqNo"),
    ({"first_offset": 100, "last_offset": 99}, "LastOffset <= segment.FirstOffset"),
    ({"log": ""}, "Log: invalid length"),
])
def test_segment_validation_cases(change: dict[str, object], error: str) -> None:
    seg = Seg(author=0xFEFE, first_seq_no=10, first_checksum=0xABAB, first_offset=0, last_seq_no=10, last_offset=1,
              log="a/log")
    validate_segment(seg)
    for name, value in change.items():
        setattr(seg, name, value)
    with pytest.raises(SegmentError, match=error) as info:
        validate_segment(seg)
    assert info.value.log == seg.log and info.value.seq_no == seg.first_seq_no
    seg.CopyFrom(Seg(author=1, first_seq_no=10, last_seq_no=10, log="a/log"))
    validate_segment(seg)  # LastOffset may be zero.


def s(author: int, first: int, last: int, fo: int, lo: int, ck: int = 0, log: str = A) -> Seg:
    return Seg(author=author, first_seq_no=first, last_seq_no=last, first_offset=fo, last_offset=lo, first_checksum=ck,
               log=log)


REDUCTIONS = [
    # Overlap.
    (s(1, 2, 7, 200, 700, 0x22), s(1, 4, 9, 400, 901, 0x44), s(1, 2, 9, 200, 901, 0x22)),
    (s(1, 2, 7, 200, 701, 0x22), s(1, 4, 9, 100, 901, 0x44), "expected monotonic FirstOffset: "),
    (s(1, 2, 7, 200, 701, 0x22), s(1, 4, 9, 400, 700, 0x44), "expected monotonic LastOffset: "),
    (s(1, 2, 7, 200, 0, 0x22), s(1, 4, 9, 400, 901, 0x44), "expected preceding Segment to also include LastOffset: "),
    (s(1, 2, 7, 200, 701, 0x22), s(2, 4, 9, 400, 901, 0x44), "expected Segment Author equality: "),
    (s(1, 2, 7, 200, 701, 0x22), s(1, 4, 9, 400, 901, 0x44, B), "expected Segment Log equality: "),
    # Covered.
    (s(1, 2, 7, 200, 701, 0x22), s(1, 3, 6, 300, 0, 0x33), s(1, 2, 7, 200, 701, 0x22)),
    # Disjoint.
    (s(1, 2, 4, 200, 401, 0x22), s(1, 6, 7, 600, 0, 0x66), None),
    # Equal-right: a non-zero LastOffset is preferred.
    (s(1, 2, 7, 200, 701, 0x22), s(1, 4, 7, 400, 0, 0x44), s(1, 2, 7, 200, 701, 0x22)),
    (s(1, 2, 7, 200, 701, 0x22), s(1, 4, 7, 400, 702, 0x44), "expected monotonic LastOffset: "),
    # Equal-left: the larger FirstOffset is preferred.
    (s(1, 2, 7, 200, 701, 0x22), s(1, 2, 9, 210, 901, 0x22), s(1, 2, 9, 210, 901, 0x22)),
    (s(1, 2, 7, 200, 701, 0x22), s(1, 2, 9, 210, 901, 0xBAD), "expected FirstChecksum equality: "),
    # Identity.
    (s(1, 2, 7, 190, 701, 0x22), s(1, 2, 7, 200, 0, 0x22), s(1, 2, 7, 200, 701, 0x22)),
    # Adjacent.
    (s(1, 2, 4, 200, 401, 0x22), s(1, 5, 7, 500, 701, 0x55), s(1, 2, 7, 200, 701, 0x22)),
    (s(1, 2, 4, 200, 401, 0x22), s(2, 5, 7, 500, 701, 0x55), None),
    (s(1, 2, 4, 200, 401, 0x22), s(1, 5, 7, 500, 701, 0x55, B), None),
    (s(1, 2, 4, 200, 0, 0x22), s(1, 5, 7, 500, 0, 0x55, B),
     "Segment cannot use a different log where preceding Segment.LastOffset is zero: "),
]


@pytest.mark.parametrize("a, b, expect", REDUCTIONS)
def test_segment_reduction_cases(a: Seg, b: Seg, expect: Seg | str | None) -> None:
    for x, y in ((a, b), (b, a)):  # The reduction is symmetric.
        if expect is None:
            with pytest.raises(NotReducible):
                reduce_segments(x, y)
        elif isinstance(expect, str):
            with pytest.raises(SegmentError, match=expect):
                reduce_segments(x, y)
        else:
            assert reduce_segments(x, y) == expect


def permute_and_add(to: SegmentSet, segments: list[Seg]) -> list[SegmentSet]:
    """`to` with `segments` added in every order (or 24 random ones)."""
    orders = list(itertools.permutations(segments))
    if len(orders) > 24:
        rng = random.Random(7)
        orders = [tuple(rng.sample(segments, len(segments))) for _ in range(24)]
    out = []
    for order in orders:
        result = SegmentSet(list(to))
        for seg in order:
            result.add(seg)
        out.append(result)
    return out


def test_set_identity_cases() -> None:
    for result in permute_and_add(SegmentSet(), model()):
        assert list(result) == model()


def test_set_non_overlapping_insertion_cases() -> None:
    added = [s(0xF, 1, 4, 100, 401), s(0xF, 12, 12, 1200, 1201), s(0xF, 16, 18, 1600, 1801),
             s(0xF, 19, 20, 20, 21, 0, B)]
    for result in permute_and_add(model_set(), added):
        assert list(result) == [added[0], model()[0], model()[1], added[1], model()[2], added[2], added[3]]


def test_set_overlap_cases() -> None:
    added = [s(0xA, 1, 4, 100, 401), s(0xB, 12, 12, 1200, 1201), s(0xB, 16, 18, 1600, 0)]
    for result in permute_and_add(model_set(), added):
        assert list(result) == [s(0xA, 1, 10, 100, 1001), s(0xB, 11, 18, 1100, 0)]


def test_set_covered_cases() -> None:
    added = [s(0xA, 5, 9, 500, 0), s(0xA, 6, 10, 600, 0), s(0xB, 11, 11, 1100, 0), s(0xB, 13, 14, 1300, 0),
             s(0xB, 14, 15, 1400, 0)]
    for result in permute_and_add(model_set(), added):
        assert list(result) == model()


def test_set_point_extensions() -> None:
    added = [s(0xB, 16, 16, 1600, 1601), s(0xB, 17, 17, 1700, 1701), s(0xB, 18, 18, 1800, 1801),
             s(0xC, 19, 19, 1900, 0), s(0xC, 20, 20, 2000, 0)]
    for result in permute_and_add(model_set(), added):
        assert list(result) == [model()[0], model()[1], s(0xB, 13, 18, 1300, 1801), s(0xC, 19, 20, 1900, 0)]


@pytest.mark.parametrize("seg, error", [
    (s(0xC, 4, 5, 400, 501), "expected Segment Author equality: "),
    (s(0xA, 10, 11, 1000, 1101), "expected Segment Author equality: "),
    (s(0xB, 10, 11, 1000, 1101), "expected Segment Author equality: "),
    (s(0xC, 15, 15, 1500, 1501), "expected Segment Author equality: "),
    (s(0xA, 4, 5, 400, 501, 0, "wrong"), "expected Segment Log equality: "),
    (s(0xB, 12, 12, 1200, 0), "expected preceding Segment to also include LastOffset: "),
    (s(0xB, 12, 12, 1050, 1200), "expected monotonic FirstOffset: "),
    (s(0xA, 3, 3, 300, 1050), "expected monotonic LastOffset: "),
])
def test_set_consistency_checks(seg: Seg, error: str) -> None:
    segments = model_set()
    with pytest.raises(SegmentError, match=error):
        segments.add(seg)
    assert list(segments) == model()  # Unchanged.


@pytest.mark.parametrize("first, last, begin, end", [
    (0, 100000, 0, 3), (0, 500, 0, 0), (0, 501, 0, 1), (1000, 1001, 0, 1), (1000, 1100, 0, 1),
    (1000, 1101, 0, 2), (1000, 1300, 0, 2), (1000, 1301, 0, 3), (1000, 100000, 0, 3), (1001, 1001, 1, 1),
    (1001, 1100, 1, 1), (1001, 1101, 1, 2), (1100, 1101, 1, 2), (1101, 1101, 2, 2), (1101, 1300, 2, 2),
    (1101, 1301, 2, 3), (1300, 1301, 2, 3), (1300, 100000, 2, 3), (1500, 100000, 2, 3), (1501, 100000, 3, 3),
    (10000, 100000, 3, 3),
])
def test_intersection_cases(first: int, last: int, begin: int, end: int) -> None:
    assert model_set().intersect(A, first, last) == model()[begin:end]


def test_added_segments_are_copies() -> None:
    seg = s(0xA, 1, 2, 0, 10)
    segments = SegmentSet([seg])
    seg.last_seq_no = 5
    assert segments[0].last_seq_no == 2
