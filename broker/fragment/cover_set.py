"""CoverSet: fragments sorted by begin and by end, none contained in another."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from typing import overload

from broker.fragment.fragment import Fragment


class CoverSet:
    """Fragments ordered by begin and, equally, by end; no fragment is contained in another.

    So no two share a begin or an end, while overlapping chains are allowed. Adding prefers
    larger fragments: one that covers others replaces them.
    """

    def __init__(self, fragments: Iterable[Fragment] = ()) -> None:
        self._frags: list[Fragment] = []
        for f in fragments:
            self.add(f)

    def add(self, f: Fragment) -> bool:
        """Add `f`, replacing every fragment it covers; False if it is empty or already covered.

        Re-adding a fragment of the same extent replaces it and returns True.
        """
        if f.begin == f.end:
            return False
        frags = self._frags
        # frags[lo:hi] are the fragments inside [f.begin, f.end): begin >= f.begin and end <= f.end.
        lo = bisect.bisect_left(frags, f.begin, key=_begin)
        hi = bisect.bisect_right(frags, f.end, key=_end)
        if lo > hi:
            return False  # frags[hi] begins before f and ends after it.
        if lo == hi:
            # Nothing is inside f; a neighbour sharing one boundary and reaching past the other covers it.
            if lo > 0 and frags[lo - 1].end == f.end:
                return False
            if lo < len(frags) and frags[lo].begin == f.begin:
                return False
        frags[lo:hi] = [f]
        return True

    def longest_overlapping(self, offset: int) -> tuple[int, bool]:
        """Return (index, True) of the fragment covering `offset` that reaches furthest.

        With none covering it, return (index of the first fragment beginning after `offset`,
        False), which is len(self) when there is none.
        """
        # The last fragment beginning at or before offset also ends last among those that do.
        ind = bisect.bisect_right(self._frags, offset, key=_begin)
        if ind > 0 and self._frags[ind - 1].end > offset:
            return ind - 1, True
        return ind, False

    def begin_offset(self) -> int:
        """Return the first fragment's begin, or 0 when empty."""
        return self._frags[0].begin if self._frags else 0

    def end_offset(self) -> int:
        """Return the last fragment's end, or 0 when empty."""
        return self._frags[-1].end if self._frags else 0

    def copy(self) -> CoverSet:
        """Return a shallow copy; the fragments are shared."""
        out = CoverSet()
        out._frags = list(self._frags)
        return out

    def __len__(self) -> int:
        return len(self._frags)

    def __iter__(self) -> Iterator[Fragment]:
        return iter(self._frags)

    @overload
    def __getitem__(self, i: int) -> Fragment: ...
    @overload
    def __getitem__(self, i: slice) -> list[Fragment]: ...
    def __getitem__(self, i: int | slice) -> Fragment | list[Fragment]:
        return self._frags[i]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CoverSet):
            return NotImplemented
        return self._frags == other._frags

    def __repr__(self) -> str:
        return f"CoverSet([{', '.join(f'[{f.begin}, {f.end})' for f in self._frags)}])"


def cover_set_difference(a: CoverSet, b: CoverSet) -> CoverSet:
    """Return the fragments of `a` not covered by one contiguous or overlapping run of `b`.

    A gap of a single byte in `b` leaves a fragment of `a` spanning it uncovered.
    """
    out = CoverSet()
    for f in a:
        if not _covered(f, b):
            out._frags.append(f)  # Already ordered, and a subset of a valid set stays valid.
    return out


def _covered(f: Fragment, b: CoverSet) -> bool:
    offset = f.begin
    while offset < f.end:
        ind, found = b.longest_overlapping(offset)
        if not found:
            return False
        offset = b[ind].end
    return True


def _begin(f: Fragment) -> int:
    return f.begin


def _end(f: Fragment) -> int:
    return f.end
