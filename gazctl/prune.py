"""Choosing and deleting the fragments `gazctl journals prune` removes (reference 5.7).

A fragment is pruned when it is persisted (it has a backing store) and `now - mod_time >=
retention`, as Gazette's gazctl does. Only fragments the brokers' index tracks are listed (the
largest of overlapping ones), so smaller duplicates stay until a later prune. A retention of 0
(unset) retains indefinitely, as the JournalSpec documents: Gazette's gazctl instead prunes
every persisted fragment of such a journal, which deletes its only long-term copy. Deletion
goes through the fragment's store itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlparse

from broker.fragment.names import content_name, content_path
from broker.protocol import pb
from broker.stores import StoreError, StoreRegistry
from gazctl.errors import GazctlError


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
