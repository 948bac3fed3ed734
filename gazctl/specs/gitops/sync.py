"""Applying a plan, guarded by the revisions it read, and reporting what sync last applied.

A plan of journals only goes in one etcd transaction, so a concurrent change to any planned
journal (a create whose journal appeared, an update or delete whose revision moved) fails the
whole sync and changes nothing. With `max_txn_size`, changes go in batches of that size: each batch
is guarded the same way, but a failed batch leaves the earlier ones applied.

A plan with shard changes is applied in three steps (`phases`), so that no shard ever reads a
journal that does not exist: journals created or updated (through a broker, one transaction),
then shards created, updated or deleted (through a consumer's Shard API, one transaction per
consumer group, guarded the same way), then journals deleted (one more transaction). A step that
fails leaves the steps before it applied; planning again and syncing finishes the work.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.client import EtcdTransactionFailed, JournalClient, apply_journals, list_journals
from broker.protocol import labels, pb
from consumer.protocol import pb as cpb
from gazctl.specs.gitops.errors import StalePlan
from gazctl.specs.gitops.plan import Action, Change, Kind, Plan, shard_sha1, spec_sha1
from gazctl.specs.gitops.source import COMMIT, MANAGED_BY, SPEC_SHA1

if TYPE_CHECKING:
    from gazctl.shard_client import ShardClient

log = logging.getLogger("gazctl")


async def cluster_journals(client: JournalClient) -> list[pb.ListResponse.Journal]:
    """Every journal of the cluster (a plan needs the tree's journals and every owned one)."""
    return list((await list_journals(client)).journals)


async def cluster_shards(client: ShardClient) -> list[cpb.ListResponse.Shard]:
    """Every shard of the consumer group (a plan needs the tree's shards and every owned one)."""
    return list((await client.list(pb.LabelSelector())).shards)


@dataclass(frozen=True)
class Step:
    """Changes applied together: journals (through a broker), or shards of one consumer group."""

    kind: Kind
    changes: list[Change]
    consumer: str = ""


def phases(plan: Plan) -> list[Step]:
    """The plan's changes in the order they are applied (see the module docstring); empty steps left out."""
    journals = plan.of(Kind.journal)
    shards = plan.of(Kind.shard)
    if not shards:
        return [Step(Kind.journal, journals)] if journals else []  # One transaction, as always.
    groups = sorted({c.consumer for c in shards})
    steps = [
        Step(Kind.journal, [c for c in journals if c.action is not Action.delete]),
        *(Step(Kind.shard, [c for c in shards if c.consumer == g], g) for g in groups),
        Step(Kind.journal, [c for c in journals if c.action is Action.delete]),
    ]
    return [step for step in steps if step.changes]


async def apply_shard_changes(
    client: ShardClient, changes: Sequence[Change], max_txn_size: int = 0,
    on_applied: Callable[[int, int], None] | None = None, earlier: str = "",
) -> int:
    """Apply shard changes through the Shard API; return the last etcd revision. StalePlan if one moved."""
    size = max_txn_size if max_txn_size > 0 else max(len(changes), 1)
    revision = 0
    for begin in range(0, len(changes), size):
        batch = [c.to_shard_apply() for c in changes[begin : begin + size]]
        resp = await client.call("Apply", cpb.ApplyRequest(changes=batch))
        assert isinstance(resp, cpb.ApplyResponse)
        if resp.status == cpb.ETCD_TRANSACTION_FAILED:
            more = f"; the {begin} shard changes of earlier batches stay applied" if begin else ""
            raise StalePlan(
                "the cluster changed since the plan was made: a planned shard was created, changed or deleted by"
                f" someone else. Nothing of this transaction was applied{more}{earlier}; plan again and retry"
            )
        if resp.status != cpb.OK:
            raise StalePlan(f"consumer {client.address}: Apply: {cpb.Status.Name(resp.status)}{earlier}")
        revision = int(resp.header.etcd.revision)
        if on_applied is not None:
            on_applied(begin + len(batch), len(changes))
    return revision


async def apply_plan(
    client: JournalClient, plan: Plan, max_txn_size: int = 0, on_applied: Callable[[int, int], None] | None = None,
    changes: Sequence[Change] | None = None, earlier: str = "",
) -> int:
    """Apply `plan`'s journal changes (or just `changes`); return the etcd revision of the last
    transaction. StalePlan if the cluster moved.

    `on_applied(done, total)` follows each transaction (see `broker.client.apply_journals`).
    """
    if changes is None:
        changes = plan.of(Kind.journal)
    applied = 0

    def count(done: int, total: int) -> None:
        nonlocal applied
        applied = done
        if on_applied is not None:
            on_applied(done, total)

    try:
        resp = await apply_journals(
            client, [c.to_apply() for c in changes], max_txn_size=max_txn_size, on_applied=count
        )
    except EtcdTransactionFailed:
        batches = f"; the {applied} changes of earlier batches stay applied" if applied else ""
        raise StalePlan(
            f"the cluster changed since the plan was made: a planned journal was created, changed or deleted"
            f" by someone else. Nothing of this transaction was applied{batches}{earlier}; plan again and retry"
        ) from None
    return int(resp.header.etcd.revision)


@dataclass(frozen=True)
class Status:
    """What the cluster says about an owner's journals (or shards)."""

    owner: str
    journals: int
    """How many the owner manages (journals, or shards for a status of shards)."""
    commits: list[tuple[str, int, int]]
    """(commit, journals last written from it, highest mod revision among them), latest first."""
    drifted: list[str]


def status(owner: str, journals: Sequence[pb.ListResponse.Journal]) -> Status:
    """The owner's journals grouped by the commit sync last wrote them from, and those that drifted."""
    return _status(owner, [(j.spec.name, j.spec.labels, j.mod_revision, spec_sha1(j.spec)) for j in journals
                           if labels.value_of(j.spec.labels, MANAGED_BY) == owner])


def shard_status(owner: str, shards: Sequence[cpb.ListResponse.Shard]) -> Status:
    """The owner's shards grouped by the commit sync last wrote them from, and those that drifted."""
    return _status(owner, [(s.spec.id, s.spec.labels, s.mod_revision, shard_sha1(s.spec)) for s in shards
                           if labels.value_of(s.spec.labels, MANAGED_BY) == owner])


def _status(owner: str, owned: Sequence[tuple[str, pb.LabelSet, int, str]]) -> Status:
    count: Counter[str] = Counter()
    latest: dict[str, int] = {}
    drifted = []
    for name, label_set, mod_revision, sha1 in owned:
        commit = labels.value_of(label_set, COMMIT) or "(no commit recorded)"
        count[commit] += 1
        latest[commit] = max(latest.get(commit, 0), mod_revision)
        if labels.value_of(label_set, SPEC_SHA1) != sha1:
            drifted.append(name)
    commits = sorted(((c, n, latest[c]) for c, n in count.items()), key=lambda t: -t[2])
    return Status(owner, len(owned), commits, sorted(drifted))
