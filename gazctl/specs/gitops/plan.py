"""Planning: what sync must change so that the cluster matches a spec tree.

Every journal of the tree is compared with the cluster, field by field, ignoring `suspend`
(brokers own it: sync carries the cluster's through) and the bookkeeping labels. A journal sync
writes carries three labels: the owner (`app.gazette.dev/managed-by`), the SHA-1 of the spec it
applied and the commit it came from. A managed journal whose spec no longer hashes to its label
was edited by someone else: the plan reports that drift with the fields it reverts.

Journals of the owner that left the tree are deleted only with `prune`, never journals owned by
another tree or by no one, and never more than `max_prune` (or every owned journal) unless
`allow_mass_prune`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from broker.protocol import labels, pb
from broker.specs.durations import format_duration, from_proto
from gazctl.specs.gitops.errors import OwnershipError, PruneRefused
from gazctl.specs.gitops.source import COMMIT, MANAGED_BY, SPEC_SHA1, Source
from gazctl.specs.gitops.tree import SpecTree

BOOKKEEPING = (SPEC_SHA1, COMMIT)
"""Labels sync writes for itself: never part of a comparison."""

DEFAULT_MAX_PRUNE = 10

Value = int | str | list[str] | None


class Action(StrEnum):
    """What sync does to one journal."""

    create = "create"
    update = "update"
    delete = "delete"


@dataclass(frozen=True)
class FieldChange:
    """One field's value in the cluster (`old`) and in the tree (`new`); None where unset or absent."""

    field: str
    old: Value
    new: Value


@dataclass(frozen=True)
class Change:
    """One journal's change: its action, the revision it is guarded by, its field diff and its new spec."""

    journal: str
    action: Action
    expect_mod_revision: int
    """0 for a create (the journal must not exist); else the revision the plan read."""
    fields: list[FieldChange]
    spec: pb.JournalSpec | None = None
    """The spec to upsert (None for a delete)."""
    drift: bool = False
    """The journal was edited outside the tree since sync last wrote it; the change reverts that."""
    adopt: bool = False
    """The journal exists without an owner: sync takes it over."""

    def to_apply(self) -> pb.ApplyRequest.Change:
        """The ApplyRequest change."""
        if self.action is Action.delete:
            return pb.ApplyRequest.Change(delete=self.journal, expect_mod_revision=self.expect_mod_revision)
        return pb.ApplyRequest.Change(upsert=self.spec, expect_mod_revision=self.expect_mod_revision)


@dataclass
class Plan:
    """The changes that bring the cluster to the tree, and what is left alone."""

    owner: str
    commit: str | None
    tree_digest: str
    changes: list[Change] = field(default_factory=list)
    unchanged: int = 0
    orphans: list[str] = field(default_factory=list)
    """Journals of the owner that left the tree, not deleted because prune was off."""

    def count(self, action: Action) -> int:
        return sum(1 for c in self.changes if c.action is action)

    @property
    def drifted(self) -> int:
        return sum(1 for c in self.changes if c.drift)

    def summary(self) -> dict[str, int]:
        """Counts by kind, in a stable order."""
        return {
            "create": self.count(Action.create),
            "update": self.count(Action.update),
            "delete": self.count(Action.delete),
            "drift": self.drifted,
            "unchanged": self.unchanged,
            "orphaned": len(self.orphans),
        }


def make_plan(
    tree: SpecTree,
    source: Source,
    cluster: Iterable[pb.ListResponse.Journal],
    *,
    prune: bool = False,
    max_prune: int = DEFAULT_MAX_PRUNE,
    allow_mass_prune: bool = False,
) -> Plan:
    """Compare `tree` with the `cluster`'s journals (a listing of at least the tree's and the owner's)."""
    plan = Plan(source.owner, source.commit, tree.digest)
    current = {j.spec.name: j for j in cluster}
    for name, desired in tree.journals.items():
        change = _compare(desired.spec, current.get(name), source)
        if change is None:
            plan.unchanged += 1
        else:
            plan.changes.append(change)

    owned = [j for j in current.values() if labels.value_of(j.spec.labels, MANAGED_BY) == source.owner]
    gone = sorted(j.spec.name for j in owned if j.spec.name not in tree.journals)
    if not prune:
        plan.orphans = gone
    elif gone:
        _guard_prune(len(gone), len(owned), max_prune, allow_mass_prune, source.owner)
        for name in gone:
            journal = current[name]
            fields = [FieldChange(k, v, None) for k, v in spec_fields(journal.spec).items()]
            plan.changes.append(Change(name, Action.delete, journal.mod_revision, fields))
    plan.changes.sort(key=lambda c: c.journal)
    return plan


def _guard_prune(count: int, owned: int, max_prune: int, allow: bool, owner: str) -> None:
    if allow:
        return
    if count == owned:
        raise PruneRefused(
            f"prune would delete every journal managed by {owner} ({count}): is the spec directory right?"
            " Pass --allow-mass-prune if that is intended"
        )
    if count > max_prune:
        raise PruneRefused(
            f"prune would delete {count} journals managed by {owner}, more than --max-prune {max_prune};"
            " raise --max-prune or pass --allow-mass-prune if that is intended"
        )


def _compare(desired: pb.JournalSpec, journal: pb.ListResponse.Journal | None, source: Source) -> Change | None:
    wanted = pb.JournalSpec()
    wanted.CopyFrom(desired)
    wanted.labels.CopyFrom(labels.set_value(wanted.labels, MANAGED_BY, source.owner))
    wanted_sha1 = spec_sha1(wanted)

    def upsert(suspend: pb.JournalSpec.Suspend | None) -> pb.JournalSpec:
        spec = pb.JournalSpec()
        spec.CopyFrom(wanted)
        spec.labels.CopyFrom(labels.set_value(spec.labels, SPEC_SHA1, wanted_sha1))
        if source.commit:
            spec.labels.CopyFrom(labels.set_value(spec.labels, COMMIT, source.commit))
        if suspend is not None:
            spec.suspend.CopyFrom(suspend)  # Brokers own suspend: keep theirs.
        return spec

    if journal is None:
        fields = [FieldChange(k, None, v) for k, v in spec_fields(wanted).items()]
        return Change(desired.name, Action.create, 0, fields, upsert(None))

    owner = labels.value_of(journal.spec.labels, MANAGED_BY)
    if owner is not None and owner != source.owner:
        raise OwnershipError(
            f"journal {desired.name!r} is managed by {owner!r}, not by {source.owner!r}: "
            "remove it from this tree, or remove its label there first"
        )
    current_sha1 = spec_sha1(journal.spec)
    if current_sha1 == wanted_sha1:
        return None
    recorded = labels.value_of(journal.spec.labels, SPEC_SHA1)
    fields = diff_fields(spec_fields(journal.spec), spec_fields(wanted))
    return Change(
        desired.name, Action.update, journal.mod_revision, fields, upsert(journal.spec.suspend),
        drift=owner is not None and recorded is not None and recorded != current_sha1,
        adopt=owner is None,
    )


def spec_sha1(spec: pb.JournalSpec) -> str:
    """SHA-1 of a spec as sync compares it: without suspend and the bookkeeping labels."""
    canonical = pb.JournalSpec()
    canonical.CopyFrom(spec)
    canonical.ClearField("suspend")
    for name in BOOKKEEPING:
        canonical.labels.CopyFrom(labels.remove(canonical.labels, name))
    return hashlib.sha1(canonical.SerializeToString(deterministic=True)).hexdigest()


def spec_fields(spec: pb.JournalSpec) -> dict[str, Value]:
    """A spec's compared fields by dotted name (`fragment.length`, `labels.<name>`), set ones only."""
    frag = spec.fragment
    out: dict[str, Value] = {
        "replication": spec.replication,
        "fragment.length": frag.length,
        "fragment.compression_codec": _enum(pb.CompressionCodec, frag.compression_codec),
        "fragment.stores": list(frag.stores),
        "fragment.refresh_interval": _duration(frag.refresh_interval),
        "fragment.retention": _duration(frag.retention),
        "fragment.flush_interval": _duration(frag.flush_interval),
        "fragment.path_postfix_template": frag.path_postfix_template,
        "flags": _enum(pb.JournalSpec.Flag, spec.flags),
        "max_append_rate": spec.max_append_rate,
    }
    for label in spec.labels.labels:
        if label.name not in BOOKKEEPING:
            values = out.setdefault(f"labels.{label.name}", [])
            assert isinstance(values, list)
            values.append(label.value)
    return {k: v for k, v in out.items() if v not in (0, "", [], None)}


def diff_fields(old: Mapping[str, Value], new: Mapping[str, Value]) -> list[FieldChange]:
    """The fields whose values differ, in name order."""
    return [FieldChange(k, old.get(k), new.get(k)) for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)]


def _enum(enum: Any, number: int) -> str | int:
    if number == 0:
        return 0
    try:
        return str(enum.Name(number))
    except ValueError:
        return number


def _duration(d: Any) -> str:
    ns = from_proto(d)
    return format_duration(ns) if ns else ""
