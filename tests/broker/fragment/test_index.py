"""Index: local and remote fragments, queries, offset jumps and blocking reads (sections 5.4, 8.2)."""

from __future__ import annotations

import asyncio

import pytest

from broker.fragment import OFFSET_JUMP_AGE, CoverSet, Fragment, Index, SpoolFile
from broker.fragment import index as index_module
from broker.protocol import pb

BASE_TIME = 1_500_000_000


def frag(begin: int, end: int, mod_time: int = 0, file: SpoolFile | None = None) -> Fragment:
    return Fragment(pb.Fragment(begin=begin, end=end, mod_time=mod_time), file)


def cover(*frags: Fragment) -> CoverSet:
    return CoverSet(frags)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def spool_file(tmp_path: object) -> SpoolFile:
    return SpoolFile(str(tmp_path))


async def test_remote_and_local_queries(spool_file: SpoolFile) -> None:
    ind = Index("a/journal")
    ind.replace_remote(cover(frag(100, 150), frag(150, 200)))
    assert ind.first_refresh.is_set()

    r = await ind.query(110, block=True)
    assert (r.status, r.offset, r.write_head) == (pb.OK, 110, 200)
    assert r.fragment is not None and (r.fragment.begin, r.fragment.end, r.fragment.is_local) == (100, 150, False)

    ind.spool_commit(frag(200, 250, file=spool_file))
    r = await ind.query(210, block=True)
    assert (r.status, r.offset, r.write_head) == (pb.OK, 210, 250)
    assert r.fragment is not None and r.fragment.file is spool_file
    assert ind.offset_range() == (100, 250)
    assert ind.summary() == (100, 250, 0)
    assert [(f.begin, f.end) for f in ind.fragments()] == [(100, 150), (150, 200), (200, 250)]


async def test_growing_spool_fragment_replaces_shorter(spool_file: SpoolFile) -> None:
    ind = Index()
    ind.replace_remote(CoverSet())  # The stores were listed: they are empty.
    ind.spool_commit(frag(100, 150, file=spool_file))
    ind.spool_commit(frag(100, 200, file=spool_file))
    assert [(f.begin, f.end) for f in ind.fragments()] == [(100, 200)]
    assert ind.has_local


async def test_remote_replaces_local(spool_file: SpoolFile) -> None:
    ind = Index()
    ind.replace_remote(CoverSet())  # The stores were listed: they are empty.
    ind.spool_commit(frag(100, 200, file=spool_file))
    r = await ind.query(110, block=True)
    assert r.fragment is not None and r.fragment.file is spool_file

    # The listing covers the local fragment with two smaller ones: the local one is dropped.
    ind.replace_remote(cover(frag(100, 150, BASE_TIME), frag(150, 200, BASE_TIME)))
    r = await ind.query(110, block=True)
    assert r.fragment is not None and (r.fragment.begin, r.fragment.end, r.fragment.file) == (100, 150, None)
    assert not ind.has_local
    assert ind.summary() == (100, 200, BASE_TIME)


async def test_local_not_covered_by_listing_stays(spool_file: SpoolFile) -> None:
    ind = Index()
    ind.replace_remote(CoverSet())  # The stores were listed: they are empty.
    ind.spool_commit(frag(100, 200, file=spool_file))
    ind.spool_commit(frag(200, 300, file=spool_file))
    ind.replace_remote(cover(frag(100, 200, BASE_TIME)))
    assert [(f.begin, f.end, f.is_local) for f in ind.fragments()] == [(100, 200, False), (200, 300, True)]
    ind.replace_remote(CoverSet())  # E.g. fragments pruned from the store: only local ones remain.
    assert [(f.begin, f.end) for f in ind.fragments()] == [(200, 300)]


async def test_query_at_head() -> None:
    ind = Index()
    ind.replace_remote(CoverSet())  # The stores were listed: they are empty.
    ind.spool_commit(frag(100, 200))
    r = await ind.query(-1, block=False)
    assert (r.status, r.offset, r.write_head, r.fragment) == (pb.OFFSET_NOT_YET_AVAILABLE, 200, 200, None)

    task = asyncio.create_task(ind.query(-1, block=True))
    await asyncio.sleep(0)
    assert not task.done()
    ind.spool_commit(frag(200, 250))
    r = await asyncio.wait_for(task, 1)
    assert (r.status, r.offset, r.write_head) == (pb.OK, 200, 250)
    assert r.fragment is not None and (r.fragment.begin, r.fragment.end) == (200, 250)


async def test_query_at_missing_byte_zero() -> None:
    ind = Index(clock=Clock(BASE_TIME))
    ind.replace_remote(CoverSet())  # The stores were listed: they are empty.
    ind.spool_commit(frag(100, 200))
    r = await ind.query(0, block=False)
    assert r.status == pb.OFFSET_NOT_YET_AVAILABLE

    # Once the first fragment is persisted, a read from byte zero jumps to it, however recently.
    ind.replace_remote(cover(frag(100, 200, BASE_TIME), frag(200, 300)))
    r = await ind.query(0, block=False)
    assert (r.status, r.offset, r.write_head) == (pb.OK, 100, 300)
    # But a read at another missing offset before it does not.
    r = await ind.query(50, block=False)
    assert (r.status, r.offset) == (pb.OFFSET_NOT_YET_AVAILABLE, 50)


async def test_query_at_missing_middle() -> None:
    clock = Clock(BASE_TIME)
    ind = Index(clock=clock)
    ind.replace_remote(CoverSet())  # The stores were listed: they are empty.
    ind.spool_commit(frag(100, 200))
    ind.spool_commit(frag(300, 400))
    assert (await ind.query(110, block=False)).status == pb.OK
    assert (await ind.query(210, block=False)).status == pb.OFFSET_NOT_YET_AVAILABLE
    assert (await ind.query(310, block=False)).status == pb.OK

    # Persisted just now: the gap may be an upload in flight, so no jump yet.
    ind.replace_remote(cover(frag(100, 200, BASE_TIME), frag(300, 400, BASE_TIME)))
    assert (await ind.query(210, block=False)).status == pb.OFFSET_NOT_YET_AVAILABLE

    task = asyncio.create_task(ind.query(210, block=True))
    await asyncio.sleep(0)
    ind.spool_commit(frag(200, 250))
    r = await asyncio.wait_for(task, 1)
    assert (r.status, r.offset, r.write_head) == (pb.OK, 210, 400)
    assert r.fragment is not None and (r.fragment.begin, r.fragment.end) == (200, 250)

    # A blocked read at 250 jumps once time passes the horizon and any change wakes it.
    task = asyncio.create_task(ind.query(250, block=True))
    await asyncio.sleep(0)
    assert not task.done()
    clock.now = BASE_TIME + OFFSET_JUMP_AGE + 1
    ind.spool_commit(frag(0, 1))
    r = await asyncio.wait_for(task, 1)
    assert (r.status, r.offset, r.write_head) == (pb.OK, 300, 400)
    assert r.fragment is not None and r.fragment.mod_time == BASE_TIME

    assert (await ind.query(250, block=False)).status == pb.OK


async def test_a_query_blocked_on_a_gap_asks_for_listings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gap below the index's end (e.g. a peer persisted what this replica never held) is filled
    only by a store listing: the blocked query asks for one at once, then again, backing off."""
    recheck = 0.25
    monkeypatch.setattr(index_module, "GAP_RECHECK", recheck)
    asked: list[float] = []
    ind = Index(on_gap=lambda: asked.append(asyncio.get_running_loop().time()))
    ind.replace_remote(CoverSet())  # The stores were listed: they are empty.
    ind.spool_commit(frag(300, 400))

    # At or past the end, only an append can serve it: no listing is asked for.
    head = asyncio.create_task(ind.query(400, block=True))
    await asyncio.sleep(0.2)
    assert not head.done() and asked == []

    task = asyncio.create_task(ind.query(100, block=True))
    await asyncio.sleep(0)
    assert len(asked) == 1  # At once.
    # Asked again `recheck` later, then twice that later (the next, four times `recheck` after that one).
    # Watched for rather than slept on: a loaded host's late wake-up must not see the fourth ask.
    async with asyncio.timeout(30):
        while len(asked) < 3:
            await asyncio.sleep(0.01)
    assert len(asked) == 3, asked
    assert asked[1] - asked[0] >= recheck and asked[2] - asked[1] >= 2 * recheck, asked
    assert not task.done()
    ind.spool_commit(frag(400, 450))  # A change elsewhere wakes it, within its backoff: not asked again.
    await asyncio.sleep(0)
    assert len(asked) == 3 and not task.done()

    ind.replace_remote(cover(frag(100, 300, BASE_TIME)))  # The listing that fills the gap.
    r = await asyncio.wait_for(task, 1)
    assert (r.status, r.offset, r.write_head) == (pb.OK, 100, 450)
    assert (await asyncio.wait_for(head, 1)).status == pb.OK

    # At the index's end, until the replica's spool rolls past it (it joined the route there, and
    # the primary persists what came before): then a gap too.
    asked.clear()
    joined = asyncio.create_task(ind.query(450, block=True))
    await asyncio.sleep(0.2)
    assert asked == [] and not joined.done()
    ind.spool_rolled(500)
    await asyncio.sleep(0)
    assert len(asked) == 1 and not joined.done()
    ind.replace_remote(cover(frag(100, 300, BASE_TIME), frag(300, 500, BASE_TIME)))
    r = await asyncio.wait_for(joined, 1)
    assert (r.status, r.offset) == (pb.OK, 450)


@pytest.mark.parametrize(
    ("offset", "expect"),
    [(50, (200, 300)), (150, (200, 300)), (200, (200, 300)), (350, (400, 500)), (400, (400, 500)), (500, (500, 600))],
)
async def test_query_with_begin_mod_time(offset: int, expect: tuple[int, int]) -> None:
    begin = BASE_TIME
    ind = Index()
    ind.replace_remote(
        cover(
            frag(100, 200, begin - 10),  # Too old.
            frag(200, 300, begin),
            frag(300, 400, begin - 1),  # Too old.
            frag(400, 500, begin + 100),
        )
    )
    ind.spool_commit(frag(500, 600))  # Local: no mod_time, never skipped.
    r = await ind.query(offset, block=False, begin_mod_time=begin)
    assert r.fragment is not None
    assert (r.status, r.offset, r.write_head) == (pb.OK, expect[0], 600)
    assert (r.fragment.begin, r.fragment.end) == expect


async def test_close_wakes_blocked_queries() -> None:
    ind = Index()
    ind.replace_remote(CoverSet())  # The stores were listed: they are empty.
    ind.spool_commit(frag(100, 200))
    task = asyncio.create_task(ind.query(-1, block=True))
    await asyncio.sleep(0)
    ind.close()
    r = await asyncio.wait_for(task, 1)
    assert (r.status, r.offset, r.closed, r.fragment) == (pb.OFFSET_NOT_YET_AVAILABLE, 200, True, None)
    # Later blocking queries return at once; covered offsets are still served.
    r = await asyncio.wait_for(ind.query(300, block=True), 1)
    assert r.closed
    assert (await ind.query(150, block=True)).status == pb.OK


async def test_cancelled_query() -> None:
    ind = Index()
    ind.replace_remote(CoverSet())  # The stores were listed: they are empty.
    task = asyncio.create_task(ind.query(0, block=True))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_wait_for_change_and_first_refresh() -> None:
    ind = Index()
    assert not ind.first_refresh.is_set()
    v0 = ind.version

    waiter = asyncio.create_task(ind.wait_for_change())
    await asyncio.sleep(0)
    assert not waiter.done()
    ind.replace_remote(CoverSet())  # A journal without stores.
    assert await asyncio.wait_for(waiter, 1) == v0 + 1
    assert ind.first_refresh.is_set()

    # A change missed between two awaits is still seen through `since`.
    ind.spool_commit(frag(0, 10))
    assert await asyncio.wait_for(ind.wait_for_change(since=v0 + 1), 1) == v0 + 2

    ind.close()
    assert await asyncio.wait_for(ind.wait_for_change(), 1) == ind.version


async def test_query_waits_for_the_first_listing() -> None:
    ind = Index()
    query = asyncio.ensure_future(ind.query(0, block=False))
    await asyncio.sleep(0.01)
    assert not query.done()  # Before the stores are listed, "nothing there yet" would be a guess.
    ind.replace_remote(cover(frag(0, 100, BASE_TIME)))
    r = await asyncio.wait_for(query, 1)
    assert r.status == pb.OK and r.fragment is not None and r.fragment.end == 100
