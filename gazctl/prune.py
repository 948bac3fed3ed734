"""Choosing and deleting the fragments `gazctl journals prune` (and `shards prune`) removes (Gazette's
`cmd/gazctl/gazctlcmd/journals_prune.go`).

A fragment is pruned when it is persisted (it has a backing store) and `now - mod_time >=
retention`, as Gazette's gazctl does. Only fragments the brokers' index tracks are listed (the
largest of overlapping ones), so smaller duplicates stay until a later prune. A retention of 0
(unset) retains indefinitely, as the JournalSpec documents: Gazette's gazctl instead prunes
every persisted fragment of such a journal, which deletes its only long-term copy. Deletion
goes through the fragment's store itself.

Recovery logs (`shards prune`) follow Gazette's rule exactly (`HintedLogs`, `prunable_fragments`):
a fragment is pruned when it overlaps no live segment of any selected shard's hints, and a log is
left whole when any shard using it lacks a hint slot with live files.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from broker.client import JournalClient, list_fragments
from broker.fragment.names import content_name, content_path
from broker.protocol import pb
from broker.stores import StoreError, StoreRegistry
from gazctl.errors import GazctlError

if TYPE_CHECKING:
    from consumer.recoverylog import FSMHints

log = logging.getLogger("gazctl")


@dataclass
class PruneStats:
    """Counts of one journal, or of all: fragments and content bytes listed and pruned."""

    journals: int = 0
    fragments_total: int = 0
    fragments_pruned: int = 0
    bytes_total: int = 0
    bytes_pruned: int = 0

    def add(self, other: PruneStats) -> None:
        """Add the counts of `other` to these."""
        self.journals += other.journals
        self.fragments_total += other.fragments_total
        self.fragments_pruned += other.fragments_pruned
        self.bytes_total += other.bytes_total
        self.bytes_pruned += other.bytes_pruned


@dataclass
class JournalPrune:
    """One journal's aged fragments, and the counts of its listing."""

    journal: str
    aged: list[pb.Fragment] = field(default_factory=list)
    stats: PruneStats = field(default_factory=PruneStats)


def aged_fragments(journal: str, listed: Iterable[pb.Fragment], retention: float, now: float) -> JournalPrune:
    """Return the persisted fragments of `listed` whose age (`now - mod_time`, seconds) is >= `retention` > 0."""
    out = JournalPrune(journal, stats=PruneStats(journals=1))
    for spec in listed:
        size = spec.end - spec.begin
        out.stats.fragments_total += 1
        out.stats.bytes_total += size
        if not spec.backing_store or retention <= 0:
            continue  # Not yet persisted: it lives only in brokers' spools.
        if now - spec.mod_time >= retention:
            out.aged.append(spec)
            out.stats.fragments_pruned += 1
            out.stats.bytes_pruned += size
    return out


def needs_file_root(fragments: Iterable[pb.Fragment]) -> str | None:
    """Return the journal of the first `file://` fragment of `fragments`, or None if there is none."""
    for spec in fragments:
        if urlparse(spec.backing_store).scheme == "file":
            return spec.journal
    return None


async def remove_fragment(stores: StoreRegistry, spec: pb.Fragment) -> None:
    """Delete the persisted fragment `spec` from its backing store; GazctlError names the journal and store."""
    try:
        await stores.get(spec.backing_store).remove(content_path(spec))
    except StoreError as err:
        raise GazctlError(
            f"removing fragment {content_name(spec)} of journal {spec.journal} from {spec.backing_store}: {err}"
        ) from None


async def prune_plans(
    plans: Sequence[JournalPrune], file_root: str, *, dry_run: bool, what: str = "journal", verb: str = "prune"
) -> PruneStats:
    """Delete (unless `dry_run`) the aged fragments of each plan, printing one line of each on stdout.

    A line is `pruned` (or `would prune`), the journal, the fragment's content name, its size, its
    modification time and its store, separated by tabs. Returns the summed counts. Before deleting
    anything, GazctlError if a fragment is in a `file://` store and `file_root` is empty (`what`,
    `verb`: how the error names the journal and the deletion), so a missing flag never leaves a
    prune half done.
    """
    if not dry_run and not file_root:
        journal = needs_file_root(f for plan in plans for f in plan.aged)
        if journal is not None:
            raise GazctlError(
                f"{what} {journal} has fragments in a file:// store: pass --file-root"
                f" (the directory of the brokers' --broker.file-root) to {verb} them"
            )
    stores = StoreRegistry(file_root)
    total = PruneStats()
    verb = "would prune" if dry_run else "pruned"
    for plan in plans:
        for spec in plan.aged:
            modified = datetime.fromtimestamp(spec.mod_time, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            if not dry_run:
                await remove_fragment(stores, spec)
            fields = (verb, spec.journal, content_name(spec), str(spec.end - spec.begin), modified, spec.backing_store)
            sys.stdout.write("\t".join(fields) + "\n")
            sys.stdout.flush()
        log.info("pruned journal", extra={"journal": plan.journal, "dry_run": dry_run, **log_fields(plan.stats)})
        total.add(plan.stats)
    return total


def log_fields(stats: PruneStats) -> dict[str, int]:
    """The fields of a prune summary log line, as Gazette's gazctl logs them."""
    return {
        "journalsPruned": stats.journals,
        "fragmentsTotal": stats.fragments_total,
        "fragmentsPruned": stats.fragments_pruned,
        "fragmentsKept": stats.fragments_total - stats.fragments_pruned,
        "bytesTotal": stats.bytes_total,
        "bytesPruned": stats.bytes_pruned,
        "bytesKept": stats.bytes_total - stats.bytes_pruned,
    }


async def all_fragments(client: JournalClient, request: pb.FragmentsRequest) -> pb.FragmentsResponse:
    """Every fragment `request` selects, across pages, in the first page's response (which has the header)."""
    out: pb.FragmentsResponse | None = None
    while True:
        resp = await list_fragments(client, request)
        if out is None:
            out = resp
        else:
            out.fragments.extend(resp.fragments)
        if resp.next_page_token == 0:
            out.next_page_token = 0
            return out
        if resp.next_page_token <= request.next_page_token:
            raise GazctlError(f"ListFragments page token of journal {request.journal} did not advance")
        request.next_page_token = resp.next_page_token


@dataclass
class HintedLogs:
    """Gazette's `gazctl shards prune` rule (`cmd/gazctl/gazctlcmd/shards_prune.go`), folded over the
    selected shards' hints: the live segments of each recovery log, and the logs to leave whole.

    `add_shard` walks a shard's backup hints, then its primary hints (GetHints' order), folding the
    live segments of each into `segments` under each segment's own log, until one is missing or
    has no live files: the shard's recovery log is then skipped (`skipped`), whatever other shards
    hint of it. A journal that got segments and was skipped is one Gazette warns of ("skipping
    journal because a shard is missing hints that cover it or has unhealthy store"); a shard whose
    first backup is already missing or empty adds no segments, so Gazette skips its log silently.
    """

    segments: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    """Per journal: the (first_offset, last_offset) of every hinted live segment, the last segment
    of each hint set unbounded (last_offset 0): playback reads on past it."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Per recovery log left whole: why (the first shard's reason)."""

    def skip(self, journal: str, why: str) -> None:
        """Leave `journal` whole (e.g. its fragment stores are unhealthy)."""
        self.skipped.setdefault(journal, why)

    def add_shard(
        self, shard: str, recovery_log: str, primary: FSMHints | None, backups: Sequence[FSMHints | None]
    ) -> str | None:
        """Fold one shard's hints; returns why its recovery log must be left whole, or None.
        GazctlError for hints whose segments are inconsistent (Gazette exits on those)."""
        from consumer.recoverylog import RecoveryLogError, live_log_segments

        for hints in (*backups, primary):
            if hints is None or not hints.live_nodes:
                reason = "hints have no live files" if hints is not None else (
                    "has not written all hints required for pruning")
                self.skip(recovery_log, f"shard {shard} {reason}")
                return reason
            try:
                _, live = live_log_segments(hints)
            except RecoveryLogError as err:
                raise GazctlError(f"shard {shard}: unable to fetch hint segments: {err}") from None
            ordered = list(live)
            for i, seg in enumerate(ordered):
                last = 0 if i == len(ordered) - 1 else seg.last_offset
                self.segments.setdefault(seg.log, []).append((seg.first_offset, last))
        return None

    def warned(self) -> list[str]:
        """The journals Gazette's prune warns it skips: hinted by a shard, and left whole."""
        return sorted(j for j in self.segments if j in self.skipped)

    def prunable(self) -> list[str]:
        """The journals whose fragments are checked against their segments, in order."""
        return sorted(j for j in self.segments if j not in self.skipped)


def overlaps_any_segment(segments: Sequence[tuple[int, int]], spec: pb.Fragment) -> bool:
    """Whether the fragment overlaps a (first_offset, last_offset) segment, 0 being unbounded, as
    Gazette's overlapsAnySegment; with no segments at all, every fragment is kept."""
    if not segments:
        return True
    return any((first < spec.end or spec.end == 0) and (last > spec.begin or last == 0) for first, last in segments)


def prunable_fragments(
    journal: str, listed: Iterable[pb.Fragment], segments: Sequence[tuple[int, int]]
) -> JournalPrune:
    """The fragments of recovery log `journal` that overlap none of its hinted `segments` (see
    `HintedLogs`). A fragment overlapping none that was never persisted (mod_time 0) means the
    selector left out a shard using this log: GazctlError, as Gazette exits then."""
    out = JournalPrune(journal, stats=PruneStats(journals=1))
    for spec in listed:
        size = spec.end - spec.begin
        out.stats.fragments_total += 1
        out.stats.bytes_total += size
        if overlaps_any_segment(segments, spec):
            continue
        if spec.mod_time == 0:
            raise GazctlError(
                f"fragment {content_name(spec)} of {journal} was never persisted and overlaps no hinted segment:"
                " the selector does not include every shard using this log"
            )
        out.aged.append(spec)
        out.stats.fragments_pruned += 1
        out.stats.bytes_pruned += size
    return out


def unhinted_fragments(journal: str, listed: Iterable[pb.Fragment], hint_sets: Sequence[FSMHints]) -> JournalPrune:
    """The fragments of recovery log `journal` that no live file of any of `hint_sets` (a shard's
    primary and backup hints, each with live files) has data in: its Player never reads them
    (`cmd/gazctl/gazctlcmd/shards_prune.go`). Gazette's rule for one shard: `HintedLogs` folds the sets, and
    `prunable_fragments` applies their segments of `journal`."""
    hinted = HintedLogs()
    for i, hints in enumerate(hint_sets):
        hinted.add_shard(f"hint set {i}", journal, hints, ())
    segments = [] if journal in hinted.skipped else hinted.segments.get(journal, [])
    return prunable_fragments(journal, listed, segments)
