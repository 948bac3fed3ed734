"""Applying a plan, guarded by the revisions it read, and reporting what sync last applied.

All changes go in one etcd transaction, so a concurrent change to any planned journal (a
create whose journal appeared, an update or delete whose revision moved) fails the whole
sync and changes nothing. With `max_txn_size`, changes go in batches of that size: each batch
is guarded the same way, but a failed batch leaves the earlier ones applied.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from broker.client import EtcdTransactionFailed, JournalClient, apply_journals, list_journals
from broker.protocol import labels, pb
from gazctl.specs.gitops.errors import StalePlan
from gazctl.specs.gitops.plan import Plan, spec_sha1
from gazctl.specs.gitops.source import COMMIT, MANAGED_BY, SPEC_SHA1

log = logging.getLogger("gazctl")


async def cluster_journals(client: JournalClient) -> list[pb.ListResponse.Journal]:
    """Every journal of the cluster (a plan needs the tree's journals and every owned one)."""
    return list((await list_journals(client)).journals)


async def apply_plan(
    client: JournalClient, plan: Plan, max_txn_size: int = 0, on_applied: Callable[[int, int], None] | None = None
) -> int:
    """Apply `plan`; return the etcd revision of the last transaction. StalePlan if the cluster moved.

    `on_applied(done, total)` follows each transaction (see `broker.client.apply_journals`).
    """
    applied = 0

    def count(done: int, total: int) -> None:
        nonlocal applied
        applied = done
        if on_applied is not None:
            on_applied(done, total)

    try:
        resp = await apply_journals(
            client, [c.to_apply() for c in plan.changes], max_txn_size=max_txn_size, on_applied=count
        )
    except EtcdTransactionFailed:
        earlier = f"; the {applied} changes of earlier batches stay applied" if applied else ""
        raise StalePlan(
            f"the cluster changed since the plan was made: a planned journal was created, changed or deleted"
            f" by someone else. Nothing of this transaction was applied{earlier}; plan again and retry"
        ) from None
    return int(resp.header.etcd.revision)


@dataclass(frozen=True)
class Status:
    """What the cluster says about an owner's journals."""

    owner: str
    journals: int
    commits: list[tuple[str, int, int]]
    """(commit, journals last written from it, highest mod revision among them), latest first."""
    drifted: list[str]


def status(owner: str, journals: Sequence[pb.ListResponse.Journal]) -> Status:
    """The owner's journals grouped by the commit sync last wrote them from, and those that drifted."""
    owned = [j for j in journals if labels.value_of(j.spec.labels, MANAGED_BY) == owner]
    count: Counter[str] = Counter()
    latest: dict[str, int] = {}
    drifted = []
    for j in owned:
        commit = labels.value_of(j.spec.labels, COMMIT) or "(no commit recorded)"
        count[commit] += 1
        latest[commit] = max(latest.get(commit, 0), j.mod_revision)
        if labels.value_of(j.spec.labels, SPEC_SHA1) != spec_sha1(j.spec):
            drifted.append(j.spec.name)
    commits = sorted(((c, n, latest[c]) for c, n in count.items()), key=lambda t: -t[2])
    return Status(owner, len(owned), commits, sorted(drifted))
