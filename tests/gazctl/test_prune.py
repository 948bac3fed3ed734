"""Which recovery-log fragments `gazctl shards prune` deletes: a pure function of the hints and the
fragment listing (Gazette's `cmd/gazctl/gazctlcmd/shards_prune.go`), and its command loop over fake
RPCs and a temporary file store."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from broker.fragment.names import content_name, content_path
from broker.protocol import pb
from broker.stores import StoreError
from consumer.protocol import pb as cpb
from consumer.protocol import recoverylog_pb2 as rpb
from gazctl.errors import GazctlError
from gazctl.prune import (
    HintedLog,
    HintedLogs,
    JournalPrune,
    SelectedShards,
    fold_shards,
    is_auth_error,
    prunable_fragments,
    prune_hinted_logs,
)

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


def unhinted_fragments(journal: str, listed: list[pb.Fragment], hint_sets: list[rpb.FSMHints]) -> JournalPrune:
    """The fragments of `journal` that Gazette's rule prunes when each of `hint_sets` is one shard's
    hints (`HintedLogs` folds them, `prunable_fragments` applies their segments of `journal`)."""
    hinted = HintedLogs()
    for i, hint_set in enumerate(hint_sets):
        hinted.add_shard(f"shard {i}", journal, hint_set, ())
    return prunable_fragments(journal, listed, [] if journal in hinted.skipped else hinted.segments.get(journal, []))


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


# -- Gazette's rule over shards (HintedLogs): cmd/gazctl/gazctlcmd/shards_prune.go ----------------

OTHER = "shards/recovery/other"


def test_a_shard_is_folded_backups_first_and_skipped_at_its_first_missing_or_empty_slot() -> None:
    good = hints((1, 3, 0, 300, 7), (5, 6, 1000, 1200, 7))
    # backup.0 empty (the recovery of an empty log): nothing is folded, the log is skipped silently.
    hinted = HintedLogs()
    assert hinted.add_shard("s1", LOG, good, [rpb.FSMHints(log=LOG), None]) == "hints have no live files"
    assert hinted.segments == {} and hinted.warned() == [] and LOG in hinted.skipped
    # backup.0 good, backup.1 missing: backup.0 is folded, then the log is skipped: Gazette warns.
    hinted = HintedLogs()
    assert hinted.add_shard("s1", LOG, good, [good, None]) == "has not written all hints required for pruning"
    assert hinted.warned() == [LOG] and hinted.prunable() == []
    # Every slot with live files: the log is pruned by the union of their segments.
    hinted = HintedLogs()
    assert hinted.add_shard("s1", LOG, good, [good]) is None
    assert hinted.prunable() == [LOG] and hinted.segments[LOG] == [(0, 300), (1000, 0), (0, 300), (1000, 0)]
    # The primary missing skips it too.
    hinted = HintedLogs()
    assert hinted.add_shard("s1", LOG, None, [good]) is not None and hinted.warned() == [LOG]
    # Slots after the first missing one are not folded (Gazette's rule), but what they name is kept.
    hinted = HintedLogs()
    hinted.add_shard("s1", LOG, good, [None, good])
    assert hinted.segments == {} and hinted.protected == {LOG: [(0, 300), (1000, 0), (0, 300), (1000, 0)]}


def test_shards_sharing_a_log_protect_each_others_segments_and_one_skip_skips_it() -> None:
    hinted = HintedLogs()
    hinted.add_shard("s1", LOG, hints((1, 3, 0, 300, 7), (5, 6, 1000, 1200, 7)), [])
    hinted.add_shard("s2", LOG, hints((4, 4, 300, 800, 7)), [])
    plan = prunable_fragments(LOG, LISTED, hinted.segments[LOG])
    assert plan.aged == [], "s2's live segment [300, ...) keeps the rest"
    hinted.add_shard("s3", LOG, None, [])
    assert hinted.prunable() == [] and hinted.warned() == [LOG]


def test_segments_of_a_forked_log_are_kept_under_that_log() -> None:
    forked = rpb.FSMHints(log=LOG)
    forked.live_nodes.add(fnode=1, segments=[rpb.Segment(author=7, first_seq_no=1, last_seq_no=2, first_offset=0,
                                                         last_offset=700, log=OTHER)])
    forked.live_nodes.add(fnode=5, segments=[rpb.Segment(author=7, first_seq_no=5, last_seq_no=5, first_offset=1000,
                                                         last_offset=1100)])
    hinted = HintedLogs()
    hinted.add_shard("s1", LOG, forked, [])
    assert hinted.segments == {OTHER: [(0, 700)], LOG: [(1000, 0)]}
    assert hinted.prunable() == [LOG, OTHER]


def test_no_segments_keep_everything_and_an_unpersisted_unhinted_fragment_is_an_error() -> None:
    assert prunable_fragments(LOG, LISTED, []).aged == []
    with pytest.raises(GazctlError, match=r"never persisted.*every shard using this log"):
        prunable_fragments(LOG, [fragment(300, 600, persisted=False)], [(1000, 0)])


# -- Gazette's command loop over shards (fold_shards, prune_hinted_logs) ------------------------------


def test_an_unhealthy_log_is_skipped_its_hints_only_protect_and_a_missing_slot_counts_a_skipped_journal() -> None:
    read: list[str] = []

    async def healthy(journal: str) -> bool:
        return journal != OTHER

    async def get_hints(shard: str) -> cpb.GetHintsResponse:
        read.append(shard)
        resp = cpb.GetHintsResponse(status=cpb.OK)
        if shard == "s1":
            resp.primary_hints.hints.CopyFrom(hints((1, 3, 0, 300, 7)))
        if shard == "s2":  # A fork of LOG: its live file's data lies in LOG at [300, 800).
            forked = resp.primary_hints.hints
            forked.log = OTHER
            forked.live_nodes.add(fnode=1, segments=[rpb.Segment(
                author=7, first_seq_no=1, last_seq_no=2, first_offset=300, last_offset=800, log=LOG)])
            forked.live_nodes.add(fnode=5, segments=[rpb.Segment(
                author=7, first_seq_no=5, last_seq_no=5, first_offset=0, last_offset=100)])
        return resp

    shards = [("s1", LOG), ("s2", OTHER), ("s3", "shards/recovery/third"), ("s4", "")]
    selected = asyncio.run(fold_shards(shards, healthy, get_hints))
    assert read == ["s1", "s2", "s3"]
    assert selected.metrics.shards_total == 4 and selected.metrics.skipped_journals == 1
    assert set(selected.hinted.skipped) == {OTHER, "shards/recovery/third"}
    assert selected.hinted.prunable() == [LOG] and list(selected.hints) == [LOG, "shards/recovery/third"]
    # Gazette's prune would not read s2's hints and so would delete LOG's [300, 800): ours keeps it.
    assert selected.hinted.segments[LOG] == [(0, 0)] and selected.hinted.protected[LOG] == [(300, 800)]


def test_failed_removals_are_warned_counted_and_the_rest_go_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    selected = SelectedShards()
    selected.hinted.add_shard("s1", LOG, hints((5, 6, 1000, 1200, 7)), [])
    plan = prunable_fragments(LOG, LISTED[:3], selected.hinted.segments[LOG])
    missing = plan.aged[0]  # Never written to the store: its removal fails.
    for spec in plan.aged[1:]:
        path = tmp_path / content_path(spec)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    caplog.set_level(logging.INFO, "gazctl")
    metrics = asyncio.run(prune_hinted_logs(selected, [HintedLog(LOG, plan=plan)], str(tmp_path), dry_run=False))
    assert (metrics.fragments_total, metrics.fragments_pruned, metrics.failed_to_remove) == (3, 2, 1)
    assert not any(tmp_path.rglob("*.raw"))
    [warned] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warned.getMessage() == "failed to remove fragment (skipping)"
    assert content_name(missing) in getattr(warned, "fragment", "")
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == [
        "pruned fragments", "finished pruning log", "finished pruning logs for all shards"]


def test_permission_errors_are_gazettes_auth_errors() -> None:
    def store_error(cause: BaseException) -> StoreError:
        try:
            raise StoreError("denied") from cause
        except StoreError as err:
            return err

    assert is_auth_error(store_error(PermissionError(13, "denied")))
    assert not is_auth_error(store_error(FileNotFoundError(2, "gone")))
    assert not is_auth_error(StoreError("no cause"))
