"""Index: the queryable set of a journal's fragments, local (spooled) and remote (persisted)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from broker.fragment.cover_set import CoverSet, cover_set_difference
from broker.fragment.fragment import Fragment
from broker.protocol import pb

OFFSET_JUMP_AGE = 6 * 3600
"""Seconds since persisting after which a read of a missing offset may jump to the next fragment."""
GAP_RECHECK = 1.0
"""Seconds a query blocked on a gap (see `Index.query`) waits before asking for another store
listing (doubling each time, up to GAP_RECHECK_MAX): the upload that fills it may be in flight."""
GAP_RECHECK_MAX = 60.0
"""The longest wait between two listings one blocked query asks for."""


@dataclass(frozen=True)
class QueryResult:
    """The answer to an Index.query.

    `status` is OK with the `fragment` covering `offset`, or OFFSET_NOT_YET_AVAILABLE with no
    fragment. `offset` is the resolved read offset (the write head for -1, moved forward by
    offset jumps and begin_mod_time skips). `closed` is True, with OFFSET_NOT_YET_AVAILABLE,
    when the index is closed: a blocking query then returns instead of waiting, as the replica
    went away, and the caller should end the read so that the client retries.
    """

    status: pb.Status.ValueType
    offset: int
    write_head: int
    fragment: Fragment | None = None
    closed: bool = False


class Index:
    """A journal's fragments: local spool commits plus the latest store listing.

    Every change (commit, refresh, close) bumps `version` and wakes blocked queries. Local
    fragments stay until a listing covers them, so reads never wait on a persist.
    """

    def __init__(
        self, journal: str = "", *, clock: Callable[[], float] = time.time, on_gap: Callable[[], None] | None = None
    ) -> None:
        self.journal = journal
        self.first_refresh = asyncio.Event()
        """Set by the first replace_remote; a journal without stores calls it at once."""
        self.on_gap = on_gap
        """Called, now and again, while a blocking query waits on a gap that only a store listing
        can fill (see `query`; e.g. a peer persisted content this replica never held): the
        replica lists its stores then, rather than at its next refresh_interval."""
        self._clock = clock
        self._spool_begin = 0  # Where the replica's spool last began anew (spool_rolled).
        self._set = CoverSet()  # Local and remote fragments.
        self._local = CoverSet()  # Local fragments not yet covered by a listing.
        self._changed = asyncio.Event()  # Replaced on every change; set to wake its waiters.
        self._version = 0
        self._closed = False

    @property
    def version(self) -> int:
        """A counter bumped by every change of the index."""
        return self._version

    @property
    def closed(self) -> bool:
        """Whether close() was called."""
        return self._closed

    @property
    def has_local(self) -> bool:
        """Whether some fragment is known only locally (not yet listed by a store)."""
        return len(self._local) != 0

    def spool_commit(self, f: Fragment) -> None:
        """Add a committed local fragment, replacing the shorter spool fragment it grew from."""
        self._set.add(f)
        self._local.add(f)
        self._wake()

    def spool_rolled(self, offset: int) -> None:
        """The replica's spool begins anew at `offset`: the journal has content before it, which
        this index may not cover yet. Wakes blocked queries (a read at the index's end may now be
        waiting on a gap)."""
        self._spool_begin = offset
        self._wake()

    def replace_remote(self, fragments: CoverSet) -> None:
        """Replace all remote fragments with a fresh store listing.

        Local fragments the listing covers are dropped (their files close once no reader holds
        them); the others stay on top of the listing.
        """
        remote = fragments.copy()
        self._local = cover_set_difference(self._local, remote)
        for f in self._local:
            # Not covered by any run of the listing, so not by one of its fragments either.
            added = remote.add(f)
            assert added, f"local fragment {f!r} is covered by the listing"
        self._set = remote
        self._wake()
        self.first_refresh.set()

    def offset_range(self) -> tuple[int, int]:
        """Return (begin, end): the first fragment's begin and the last one's end (0, 0 when empty)."""
        return self._set.begin_offset(), self._set.end_offset()

    def summary(self) -> tuple[int, int, int]:
        """Return (begin, end, mod_time of the last fragment); mod_time is 0 if it is local."""
        last_mod_time = self._set[-1].mod_time if len(self._set) else 0
        return self._set.begin_offset(), self._set.end_offset(), last_mod_time

    def fragments(self) -> list[Fragment]:
        """Return a snapshot of all fragments, ordered by offset."""
        return list(self._set)

    async def query(self, offset: int, block: bool, begin_mod_time: int = 0) -> QueryResult:
        """Find the fragment to read `offset` from (-1 means the write head).

        A missing offset jumps to the next persisted fragment when the read started at offset 0
        or that fragment was persisted over 6 hours ago; a fresher gap may be an upload still in
        flight, so the read waits for it instead. Persisted fragments modified before
        `begin_mod_time` are skipped. With nothing to serve, a non-blocking query answers
        OFFSET_NOT_YET_AVAILABLE and a blocking one waits for the next change; on a gap below the
        index's end, or below where the replica's spool began (spool_rolled), it calls `on_gap`
        now and again while it waits (see GAP_RECHECK). Queries wait for the first store listing.
        """
        # Until the stores are first listed, the index cannot tell what exists.
        while not self.first_refresh.is_set() and not self._closed:
            await self.wait_for_change()
        requested = offset
        if offset == -1:
            offset = self._set.end_offset()
        recheck = GAP_RECHECK
        loop = asyncio.get_running_loop()
        next_report = 0.0

        while True:
            frags = self._set
            ind, found = frags.longest_overlapping(offset)

            if (
                not found
                and ind != len(frags)
                and frags[ind].mod_time != 0
                and (requested == 0 or frags[ind].mod_time < self._clock() - OFFSET_JUMP_AGE)
            ):
                offset, found = frags[ind].begin, True

            if found:
                f = frags[ind]
                if f.mod_time != 0 and f.mod_time < begin_mod_time:
                    offset = f.end
                    continue
                return QueryResult(pb.OK, offset, frags.end_offset(), f)

            if not block or self._closed:
                return QueryResult(pb.OFFSET_NOT_YET_AVAILABLE, offset, frags.end_offset(), closed=self._closed)
            if offset < max(frags.end_offset(), self._spool_begin) and self.on_gap is not None:
                # A gap that only a store listing can fill: ask for one now, and again (backing
                # off) while it stays.
                if loop.time() >= next_report:
                    self.on_gap()
                    next_report, recheck = loop.time() + recheck, min(2 * recheck, GAP_RECHECK_MAX)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(next_report - loop.time()):
                        await self.wait_for_change()
                continue
            await self.wait_for_change()

    async def wait_for_change(self, since: int | None = None) -> int:
        """Wait until `version` differs from `since` (default: the current one) or the index closes.

        Returns the version then current.
        """
        if since is None:
            since = self._version
        while self._version == since and not self._closed:
            await self._changed.wait()
        return self._version

    def close(self) -> None:
        """Close the index: blocked and future blocking queries return with `closed` set.

        Spool files are left open, as readers may still be streaming them.
        """
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        self._version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
