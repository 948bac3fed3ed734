"""Which recovery-log fragments `gazctl shards prune` deletes: a pure function of the hints and the
fragment listing (reference 6.6), tested without I/O."""

from __future__ import annotations

import pytest

from broker.protocol import pb
from consumer.protocol import recoverylog_pb2 as rpb
from gazctl.errors import GazctlError
from gazctl.prune import unhinted_fragments

LOG = "shards/recovery/log"


def hints(*nodes: tuple[int, int, int, int, int]) -> rpb.FSMHints:
    """Hints of live Fnodes, each (fnode = first seq, last seq, first offset, last offset, author)."""
    out = rpb.FSMHints(log=LOG)
    for fnode, last_seq, first, last, author in nodes:
        seg = rpb.Segment(author=author, first_seq_no=fnode, last_seq_no=last_seq, first_offset=first, last_offset=last)
        out.live_nodes.add(fnode=fnode, segments=[seg])
    return out


def fragment(begin: int, end: int, persisted: bool = True) -> pb.Fragment:
    return pb.Fragment(
        journal=LOG, begin=begin, end=end, compression_codec=pb.NONE, sum=pb.SHA1Sum(part1=begin + 1),
        backing_store="file:///" if persisted else "", mod_time=1_700_000_000 if persisted else 0,
    )


LISTED = [
    fragment(0, 100),  # Fnode 1's data.
    fragment(300, 600),  # Between the live files: dead.
    fragment(600, 1000),  # Dead too (Fnode 5 begins at 1000).
    fragment(1000, 1500),  # Fnode 5's data.
    fragment(1500, 2000),  # Past the last segment's recorded end: the live tail, kept.
    fragment(2000, 2100, persisted=False),  # Only in brokers' spools: never deleted.
]


def test_fragments_no_live_segment_overlaps_are_pruned() -> None:
    plan = unhinted_fragments(LOG, LISTED, [hints((1, 3, 0, 300, 7), (5, 6, 1000, 1200, 7))])
    assert [(f.begin, f.end) for f in plan.aged] == [(300, 600), (600, 1000)]
    assert (plan.stats.fragments_total, plan.stats.fragments_pruned) == (6, 2)
    assert (plan.stats.bytes_total, plan.stats.bytes_pruned) == (1900, 700)


def test_every_hint_set_keeps_its_segments() -> None:
    # An older backup still needs [300, 800): the fragments it overlaps stay.
    backup = hints((1, 3, 0, 300, 7), (4, 4, 300, 800, 7))
    plan = unhinted_fragments(LOG, LISTED, [hints((1, 3, 0, 300, 7), (5, 6, 1000, 1200, 7)), backup])
    assert plan.aged == []


def test_segments_of_other_logs_do_not_protect_this_one() -> None:
    other = rpb.FSMHints(log=LOG)
    other.live_nodes.add(fnode=1, segments=[rpb.Segment(author=7, first_seq_no=1, last_seq_no=2, first_offset=0,
                                                        last_offset=700, log="shards/recovery/old-log")])
    other.live_nodes.add(fnode=5, segments=[rpb.Segment(author=7, first_seq_no=5, last_seq_no=5, first_offset=1000,
                                                        last_offset=1100)])
    plan = unhinted_fragments(LOG, LISTED, [other])
    assert [(f.begin, f.end) for f in plan.aged] == [(0, 100), (300, 600), (600, 1000)]


def test_a_persisted_fragment_without_mod_time_is_an_error() -> None:
    odd = fragment(300, 600)
    odd.mod_time = 0
    with pytest.raises(GazctlError, match="never persisted"):
        unhinted_fragments(LOG, [odd], [hints((1, 3, 0, 300, 7), (5, 6, 1000, 1200, 7))])
