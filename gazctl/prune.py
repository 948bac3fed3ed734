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
left whole when any shard using it lacks a hint slot with live files. Its command loop is
Gazette's too (`fold_shards`, `list_hinted_logs`, `prune_hinted_logs`): fragment store health,
forked segments, suspended logs, its warnings and counts.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import grpc
from google.protobuf import text_format

from broker.client import ClientError, JournalClient, Suspended, fragments_request, list_fragments, list_journals
from broker.fragment.names import content_name, content_path
from broker.protocol import pb
from broker.stores import StoreError, StoreRegistry
from gazctl.bounded import map_bounded
from gazctl.errors import GazctlError

if TYPE_CHECKING:
    from consumer.protocol import pb as cpb
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


def require_file_root(
    plans: Iterable[JournalPrune], file_root: str, *, dry_run: bool, what: str = "journal", verb: str = "prune"
) -> None:
    """GazctlError if deleting (not `dry_run`) a fragment of `plans` needs `file_root` and it is empty."""
    if dry_run or file_root:
        return
    journal = needs_file_root(f for plan in plans for f in plan.aged)
    if journal is not None:
        raise GazctlError(
            f"{what} {journal} has fragments in a file:// store: pass --file-root"
            f" (the directory of the brokers' --broker.file-root) to {verb} them"
        )


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
    require_file_root(plans, file_root, dry_run=dry_run, what=what, verb=verb)
    stores = StoreRegistry(file_root)
    total = PruneStats()
    verb = "would prune" if dry_run else "pruned"
    for plan in plans:
        for spec in plan.aged:
            if not dry_run:
                await remove_fragment(stores, spec)
            print_pruned(verb, spec)
        log.info("pruned journal", extra={"journal": plan.journal, "dry_run": dry_run, **log_fields(plan.stats)})
        total.add(plan.stats)
    return total


def print_pruned(verb: str, spec: pb.Fragment) -> None:
    """The stdout line of a pruned fragment: `verb`, journal, content name, size, mod time and store."""
    modified = datetime.fromtimestamp(spec.mod_time, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    fields = (verb, spec.journal, content_name(spec), str(spec.end - spec.begin), modified, spec.backing_store)
    sys.stdout.write("\t".join(fields) + "\n")
    sys.stdout.flush()


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
    protected: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    """Per journal: segments of hints the rule stops short of (slots after a shard's first missing
    or empty one, and every slot of a shard whose log's stores are unhealthy). Gazette's prune
    ignores them, and may delete fragments a fork of that shard still needs; ours keeps every
    fragment they overlap, in logs the rule prunes anyway (they add no log to prune)."""

    def skip(self, journal: str, why: str) -> None:
        """Leave `journal` whole (e.g. its fragment stores are unhealthy)."""
        self.skipped.setdefault(journal, why)

    def add_shard(
        self, shard: str, recovery_log: str, primary: FSMHints | None, backups: Sequence[FSMHints | None]
    ) -> str | None:
        """Fold one shard's hints; returns why its recovery log must be left whole, or None.
        GazctlError for hints whose segments are inconsistent (Gazette exits on those)."""
        slots = (*backups, primary)
        for i, hints in enumerate(slots):
            if hints is None or not hints.live_nodes:
                reason = "hints have no live files" if hints is not None else (
                    "has not written all hints required for pruning")
                self.skip(recovery_log, f"shard {shard} {reason}")
                self.protect_shard(shard, slots[i + 1:])
                return reason
            self._fold(shard, hints, self.segments)
        return None

    def protect_shard(self, shard: str, slots: Sequence[FSMHints | None]) -> None:
        """Keep every fragment the live files of `slots` have data in (`protected`)."""
        for hints in slots:
            if hints is not None and hints.live_nodes:
                self._fold(shard, hints, self.protected)

    @staticmethod
    def _fold(shard: str, hints: FSMHints, into: dict[str, list[tuple[int, int]]]) -> None:
        from consumer.recoverylog import RecoveryLogError, live_log_segments

        try:
            _, live = live_log_segments(hints)
        except RecoveryLogError as err:
            raise GazctlError(f"shard {shard}: unable to fetch hint segments: {err}") from None
        ordered = list(live)
        for i, seg in enumerate(ordered):
            last = 0 if i == len(ordered) - 1 else seg.last_offset
            into.setdefault(seg.log, []).append((seg.first_offset, last))

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


# -- `gazctl shards prune`: Gazette's command loop (cmd/gazctl/gazctlcmd/shards_prune.go) ---------------

REMOVE_LIMIT = 32
"""Fragments deleted at once, as Gazette's prune (cloud stores take a round trip each)."""


@dataclass
class ShardsPruneMetrics:
    """Gazette's shardsPruneMetrics: running counts across the whole prune."""

    shards_total: int = 0
    fragments_total: int = 0
    fragments_pruned: int = 0
    bytes_total: int = 0
    bytes_pruned: int = 0
    skipped_journals: int = 0
    failed_to_remove: int = 0
    permission_denied: int = 0

    def fields(self, journal: str = "") -> dict[str, int | str]:
        """The fields of Gazette's `finished pruning log(s)` lines, in its order."""
        out: dict[str, int | str] = {
            "shardsTotal": self.shards_total,
            "fragmentsTotal": self.fragments_total,
            "fragmentsPruned": self.fragments_pruned,
            "fragmentsKept": self.fragments_total - self.fragments_pruned,
            "bytesTotal": self.bytes_total,
            "bytesPruned": self.bytes_pruned,
            "bytesKept": self.bytes_total - self.bytes_pruned,
            "skippedJournals": self.skipped_journals,
            "failedToRemove": self.failed_to_remove,
            "permissionDenied": self.permission_denied,
        }
        if journal:
            out["journal"] = journal
        return out


def hint_slots(resp: cpb.GetHintsResponse) -> tuple[FSMHints | None, list[FSMHints | None]]:
    """The primary hints and each backup's of a GetHints reply, None where a key holds none."""
    primary = resp.primary_hints.hints if resp.primary_hints.HasField("hints") else None
    return primary, [b.hints if b.HasField("hints") else None for b in resp.backup_hints]


@dataclass
class SelectedShards:
    """The selected shards' hints, folded as Gazette's prune folds them (`fold_shards`)."""

    hinted: HintedLogs = field(default_factory=HintedLogs)
    metrics: ShardsPruneMetrics = field(default_factory=ShardsPruneMetrics)
    hints: dict[str, list[cpb.GetHintsResponse]] = field(default_factory=dict)
    """Each GetHints reply, under its shard's recovery log (Gazette logs them with what it prunes)."""


async def recovery_log_stores_healthy(client: JournalClient, journal: str) -> bool:
    """Whether every fragment store of `journal`'s spec is healthy (FragmentStoreHealth, without the
    delete probe), as Gazette's checkRecoveryLogStoresHealth; each failure is warned with its fields."""
    label = pb.Label(name="name", value=journal)
    try:
        listed = await list_journals(client, pb.LabelSelector(include=pb.LabelSet(labels=[label])))
        if not listed.journals:
            raise GazctlError(f"named journal does not exist ({journal})")
    except (ClientError, GazctlError) as err:
        log.warning("failed to fetch journal spec for recovery log", extra={"journal": journal, "error": str(err)})
        return False
    for store in listed.journals[0].spec.fragment.stores:
        try:
            resp = await client.stub().FragmentStoreHealth(pb.FragmentStoreHealthRequest(fragment_store=store))
            if resp.status not in (pb.OK, pb.FRAGMENT_STORE_UNHEALTHY):
                raise GazctlError(pb.Status.Name(resp.status))
        except (grpc.aio.AioRpcError, GazctlError) as err:
            error = err.details() if isinstance(err, grpc.aio.AioRpcError) else str(err)
            log.warning("failed to check fragment store health",
                        extra={"journal": journal, "store": store, "error": error})
            return False
        if resp.status != pb.OK:
            log.warning("fragment store is unhealthy", extra={
                "journal": journal, "store": store, "status": pb.Status.Name(resp.status),
                "storeError": resp.store_health_error,
            })
            return False
    return True


async def fold_shards(
    shards: Iterable[tuple[str, str]],
    healthy: Callable[[str], Awaitable[bool]],
    get_hints: Callable[[str], Awaitable[cpb.GetHintsResponse]],
) -> SelectedShards:
    """Fold each (shard ID, recovery log) of `shards`, in order, as Gazette's prune: a log whose
    stores are not `healthy` is skipped (its shard's hints only protect, see `HintedLogs.protected`);
    else its GetHints reply (`get_hints`) is folded by `HintedLogs.add_shard`, and a shard missing
    hints counts a skipped journal (Gazette's skippedJournals) and skips its log. Shards without a
    recovery log are counted only."""
    out = SelectedShards()
    for shard, recovery_log in shards:
        out.metrics.shards_total += 1
        if not recovery_log:
            log.info("shard has no recovery log", extra={"shard": shard})
            continue
        if not await healthy(recovery_log):
            # Gazette's prune reads no hints of this shard; ours still keeps what they name elsewhere.
            out.hinted.skip(recovery_log, "a fragment store is unhealthy")
            primary, backups = hint_slots(await get_hints(shard))
            out.hinted.protect_shard(shard, (*backups, primary))
            continue
        resp = await get_hints(shard)
        out.hints.setdefault(recovery_log, []).append(resp)
        primary, backups = hint_slots(resp)
        reason = out.hinted.add_shard(shard, recovery_log, primary, backups)
        if reason is not None:
            out.metrics.skipped_journals += 1
            log.debug("will skip pruning recovery log journal",
                      extra={"shard": shard, "reason": reason, "journal": recovery_log})
    return out


@dataclass
class HintedLog:
    """One journal of `HintedLogs.segments`, listed: its prunable fragments, or why it is left whole."""

    journal: str
    skipped: bool = False
    """A shard using it is missing hints, or its stores are unhealthy (Gazette warns)."""
    suspended: bool = False
    """It is fully suspended: it has no fragments to list."""
    plan: JournalPrune | None = None


async def list_hinted_logs(selected: SelectedShards, client: JournalClient) -> list[HintedLog]:
    """Every journal the hints name, in name order, with the fragments it may lose. Listing all of
    them before deleting anything, a fragment that was never persisted and overlaps no segment fails
    the prune before any deletion (Gazette's exits there, after pruning the logs before it)."""
    hinted = selected.hinted

    async def one(journal: str) -> HintedLog:
        if journal in hinted.skipped:
            return HintedLog(journal, skipped=True)
        try:
            resp = await all_fragments(client, fragments_request(journal))
        except Suspended:
            return HintedLog(journal, suspended=True)
        except ClientError as err:
            raise GazctlError(f"failed to fetch fragments of {journal}: {err}") from None
        segments = hinted.segments[journal] + hinted.protected.get(journal, [])
        return HintedLog(journal, plan=prunable_fragments(journal, (f.spec for f in resp.fragments), segments))

    return await map_bounded(sorted(hinted.segments), one)


def is_auth_error(err: BaseException) -> bool:
    """Whether a store refused a deletion for want of permission (Gazette's IsAuthError): the file
    store's permission errors, S3's AccessDenied and NoSuchBucket."""
    cause = err.__cause__
    if isinstance(cause, PermissionError):
        return True
    response = getattr(cause, "response", None)
    code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
    return code in ("AccessDenied", "NoSuchBucket")


def _segment_text(segments: Sequence[tuple[int, int]]) -> str:
    return "[" + " ".join(f"{first}-{last or 'open'}" for first, last in segments) + "]"


async def prune_hinted_logs(
    selected: SelectedShards, logs: Sequence[HintedLog], file_root: str, *, dry_run: bool
) -> ShardsPruneMetrics:
    """Delete (unless `dry_run`) the prunable fragments of `logs`, logging each step as Gazette's
    prune does and printing each pruned fragment on stdout (`print_pruned`). A failed deletion is
    warned and counted, not raised; the running metrics are returned."""
    require_file_root([x.plan for x in logs if x.plan is not None], file_root, dry_run=dry_run,
                      what="recovery log", verb="delete")
    stores = StoreRegistry(file_root)
    try:
        await _prune_logs(selected, logs, stores, dry_run=dry_run)
    finally:
        await stores.close()
    log.info("finished pruning logs for all shards", extra=selected.metrics.fields())
    return selected.metrics


async def _prune_logs(selected: SelectedShards, logs: Sequence[HintedLog], stores: StoreRegistry, *,
                      dry_run: bool) -> None:
    metrics = selected.metrics
    for item in logs:
        journal = item.journal
        if item.skipped:
            log.warning("skipping journal because a shard is missing hints that cover it or has unhealthy store",
                        extra={"journal": journal})
            continue
        log.debug("checking fragments of journal", extra={"journal": journal})
        if item.plan is None:
            metrics.skipped_journals += 1
            log.debug("skipping suspended recovery log", extra={"journal": journal})
            continue
        metrics.fragments_total += item.plan.stats.fragments_total
        metrics.bytes_total += item.plan.stats.bytes_total
        for spec in item.plan.aged:
            # Gazette's field `name` is reserved by Python's logging: the content name is `fragment`.
            log.debug("pruning fragment", extra={
                "log": journal, "fragment": content_name(spec), "size": spec.end - spec.begin, "mod": spec.mod_time,
                "begin": spec.begin, "end": spec.end,
            })

        async def remove(spec: pb.Fragment) -> bool:
            if dry_run:
                return True
            try:
                await stores.get(spec.backing_store).remove(content_path(spec))
            except StoreError as err:
                fields = {"fragment": f"{spec.backing_store}{content_path(spec)}", "error": str(err)}
                if is_auth_error(err):
                    log.warning("skipping fragment removal: no permission to delete", extra=fields)
                    metrics.permission_denied += 1
                else:
                    log.warning("failed to remove fragment (skipping)", extra=fields)
                    metrics.failed_to_remove += 1
                return False
            return True

        removed = await map_bounded(item.plan.aged, remove, limit=REMOVE_LIMIT)
        pruned = [spec for spec, ok in zip(item.plan.aged, removed, strict=True) if ok]
        for spec in pruned:
            metrics.fragments_pruned += 1
            metrics.bytes_pruned += spec.end - spec.begin
            print_pruned("would prune" if dry_run else "pruned", spec)
        if pruned:
            log.info("pruned fragments", extra={
                "journal": journal,
                "allHints": "[" + " ".join(
                    text_format.MessageToString(h, as_one_line=True) for h in selected.hints.get(journal, [])
                ) + "]",
                "liveSegments": _segment_text(selected.hinted.segments[journal]),
                "prunedFragments": "[" + " ".join(content_name(spec) for spec in pruned) + "]",
            })
        log.info("finished pruning log", extra=metrics.fields(journal))
