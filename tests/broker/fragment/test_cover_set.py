"""CoverSet: the vectors of Gazette's `broker/fragment/cover_set_test.go` and its other tests."""

from __future__ import annotations

import pytest

from broker.fragment import CoverSet, Fragment, cover_set_difference, parse_fragment_from_relative_path
from broker.protocol import pb


def frag(begin: int, end: int) -> Fragment:
    return Fragment(pb.Fragment(begin=begin, end=end))


def spans(s: CoverSet) -> list[tuple[int, int]]:
    return [(f.begin, f.end) for f in s]


def build(*pairs: tuple[int, int]) -> CoverSet:
    s = CoverSet()
    for b, e in pairs:
        assert s.add(frag(b, e)), (b, e)
    return s


def test_add_insert_at_end() -> None:
    assert spans(build((100, 200), (200, 300), (201, 301))) == [(100, 200), (200, 300), (201, 301)]


def test_add_replace_range_at_end() -> None:
    s = build((100, 200), (200, 300), (300, 400), (400, 500), (150, 500))
    assert spans(s) == [(100, 200), (150, 500)]


def test_add_replace_one_at_end() -> None:
    assert spans(build((100, 200), (200, 300), (199, 300))) == [(100, 200), (199, 300)]
    assert spans(build((100, 200), (200, 300), (200, 301))) == [(100, 200), (200, 301)]


def test_add_replace_range_in_middle() -> None:
    s = build((100, 200), (200, 300), (300, 400), (400, 500), (150, 450))
    assert spans(s) == [(100, 200), (150, 450), (400, 500)]


def test_add_replace_one_in_middle() -> None:
    s = build((100, 200), (200, 300), (300, 400), (150, 350))
    assert spans(s) == [(100, 200), (150, 350), (300, 400)]


def test_add_insert_in_middle() -> None:
    assert spans(build((100, 200), (300, 400), (200, 300))) == [(100, 200), (200, 300), (300, 400)]
    assert spans(build((100, 200), (300, 400), (201, 299))) == [(100, 200), (201, 299), (300, 400)]


def test_add_at_beginning() -> None:
    assert spans(build((100, 200), (200, 300), (300, 400), (100, 300))) == [(100, 300), (300, 400)]
    assert spans(build((100, 200), (200, 300), (300, 400), (99, 200))) == [(99, 200), (200, 300), (300, 400)]
    assert spans(build((200, 300), (300, 400), (199, 200))) == [(199, 200), (200, 300), (300, 400)]


def test_add_overlapping_ranges() -> None:
    s = build((100, 150), (149, 201), (200, 250), (250, 300), (299, 351), (350, 400))
    for pair in [(200, 300), (300, 400), (100, 200)]:
        assert s.add(frag(*pair))
    assert spans(s) == [(100, 200), (149, 201), (200, 300), (299, 351), (300, 400)]


def test_add_covered_is_rejected_and_exact_duplicate_replaces() -> None:
    s = build((100, 200), (200, 300), (300, 400))
    for pair in [(101, 200), (100, 199), (201, 300), (200, 299), (301, 400), (150, 160)]:
        assert not s.add(frag(*pair)), pair
    for pair in [(100, 200), (200, 300), (300, 400)]:
        replacement = frag(*pair)
        assert s.add(replacement), pair
        assert any(f is replacement for f in s)
    assert spans(s) == [(100, 200), (200, 300), (300, 400)]


def test_add_empty_is_ignored() -> None:
    s = build((100, 200))
    assert not s.add(frag(150, 150))
    assert not s.add(frag(300, 300))
    assert spans(s) == [(100, 200)]


def test_offsets() -> None:
    s = CoverSet()
    assert (s.begin_offset(), s.end_offset()) == (0, 0)
    s.add(frag(100, 150))
    assert (s.begin_offset(), s.end_offset()) == (100, 150)
    s.add(frag(140, 250))
    assert (s.begin_offset(), s.end_offset()) == (100, 250)
    s.add(frag(50, 100))
    assert (s.begin_offset(), s.end_offset()) == (50, 250)


LONGEST = build((100, 200), (149, 201), (200, 300), (299, 351), (300, 400), (500, 600))


@pytest.mark.parametrize(
    ("offset", "ind", "found"),
    [
        (0, 0, False),
        (100, 0, True),
        (148, 0, True),
        (149, 1, True),
        (199, 1, True),
        (200, 2, True),
        (298, 2, True),
        (299, 3, True),
        (300, 4, True),
        (350, 4, True),
        (399, 4, True),
        (400, 5, False),
        (401, 5, False),
        (499, 5, False),
        (500, 5, True),
        (599, 5, True),
        (600, 6, False),
    ],
)
def test_longest_overlapping(offset: int, ind: int, found: bool) -> None:
    assert LONGEST.longest_overlapping(offset) == (ind, found)


def test_difference() -> None:
    b = build((100, 200), (150, 225), (225, 250), (250, 300), (301, 400))
    a = build(
        (99, 105),  # Begins before b's first fragment.
        (100, 110),  # Inside one fragment of b.
        (110, 120),
        (130, 210),  # Covered by two fragments of b.
        (150, 225),  # Exactly one fragment of b.
        (151, 300),  # Covered by three fragments of b.
        (152, 301),  # Not covered: b has a one-byte gap at 300.
        (300, 350),  # Not covered, the same gap.
        (301, 360),  # Covered.
        (360, 401),  # Reaches past b.
        (400, 450),  # Wholly outside b.
    )
    out = cover_set_difference(a, b)
    assert spans(out) == [(99, 105), (152, 301), (300, 350), (360, 401), (400, 450)]
    assert spans(cover_set_difference(a, CoverSet())) == spans(a)
    assert len(cover_set_difference(CoverSet(), b)) == 0


def test_parsed_multiple_overlaps() -> None:
    s = CoverSet()
    for name in [
        "0000000000000000-00000000400a8d41",
        "00000000400a8d41-00000000595722d7",
        "00000000400a8d41-000000007a3fb5ee",
        "00000000400a8d41-000000007af92e59",
        "00000000595722d7-000000007af92fb4",
        "000000007a3fb5ee-000000007af92fb4",
        "000000007af92e59-000000007af92e59",
    ]:
        s.add(Fragment(parse_fragment_from_relative_path("a/journal", f"{name}-{'0' * 40}.raw")))
    assert spans(s) == [(0, 0x400A8D41), (0x400A8D41, 0x7AF92E59), (0x595722D7, 0x7AF92FB4)]


def test_sequence_protocol() -> None:
    s = build((100, 200), (200, 300))
    assert len(s) == 2
    assert s[0].begin == 100 and s[-1].end == 300
    assert [f.end for f in s[0:1]] == [200]
    assert s == build((100, 200), (200, 300))
    assert s.copy() == s and s.copy() is not s
