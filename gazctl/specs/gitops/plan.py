"""Planning: what sync must change so that the cluster matches a spec tree.

Every journal of the tree is compared with the cluster, field by field, ignoring `suspend`
(brokers own it: sync carries the cluster's through) and the bookkeeping labels. A journal sync
writes carries three labels: the owner (`app.gazette.dev/managed-by`), the SHA-1 of the spec it
applied and the commit it came from. A managed journal whose spec no longer hashes to its label
was edited by someone else: the plan reports that drift with the fields it reverts.

Journals of the owner that left the tree are deleted only with `prune`, never journals owned by
another tree or by no one, and never more than `max_prune` (or every owned journal) unless
`allow_mass_prune`.

Shards are planned the same way, against the consumer's Shard API listing: the same three labels,
drift, ownership and prune guard (counted apart from journals). Every journal a shard of the tree
reads, and its recovery log, must be in the tree or in the cluster and not pruned by the plan.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from broker.protocol import labels, pb
from broker.specs.durations import format_duration, from_proto
from consumer.protocol import pb as cpb
from gazctl.specs.gitops.errors import GitOpsError, OwnershipError, PruneRefused
from gazctl.specs.gitops.shards import DesiredShard, display_name, needed_journals
from gazctl.specs.gitops.source import COMMIT, MANAGED_BY, SPEC_SHA1, Source
from gazctl.specs.gitops.tree import SpecTree

BOOKKEEPING = (SPEC_SHA1, COMMIT)
"""Labels sync writes for itself: never part of a comparison."""

DEFAULT_MAX_PRUNE = 10

Value = int | str | list[str] | None


class Action(StrEnum):
    """What sync does to one journal or shard."""

    create = "create"
    update = "update"
    delete = "delete"


class Kind(StrEnum):
    """What a change is to: a journal (through a broker) or a shard (through a consumer)."""

    journal = "journal"
    shard = "shard"


Spec = pb.JournalSpec | cpb.ShardSpec


@dataclass(frozen=True)
class FieldChange:
    """One field's value in the cluster (`old`) and in the tree (`new`); None where unset or absent."""

    field: str
    old: Value
    new: Value


@dataclass(frozen=True)
class Change:
    """One journal's or shard's change: its action, the revision guarding it, its field diff and new spec."""

    name: str
    action: Action
    expect_mod_revision: int
    """0 for a create (the journal or shard must not exist); else the revision the plan read."""
    fields: list[FieldChange]
    spec: Spec | None = None
    """The spec to upsert (None for a delete)."""
    drift: bool = False
    """Edited outside the tree since sync last wrote it; the change reverts that."""
    adopt: bool = False
    """It exists without an owner: sync takes it over."""
    kind: Kind = Kind.journal
    consumer: str = ""
    """A shard's consumer group ("" for the default one)."""

    @property
    def display(self) -> str:
        """The name to show: a journal's name, a shard's id (`NAME:id` in a named consumer group)."""
        return display_name(self.consumer, self.name)

    @property
    def journal(self) -> str:
        """The journal's name (or the shard's id)."""
        return self.name

    def to_apply(self) -> pb.ApplyRequest.Change:
        """The broker's ApplyRequest change (of a journal)."""
        assert self.kind is Kind.journal
        if self.action is Action.delete:
            return pb.ApplyRequest.Change(delete=self.name, expect_mod_revision=self.expect_mod_revision)
        assert isinstance(self.spec, pb.JournalSpec)
        return pb.ApplyRequest.Change(upsert=self.spec, expect_mod_revision=self.expect_mod_revision)

    def to_shard_apply(self) -> cpb.ApplyRequest.Change:
        """The consumer's ApplyRequest change (of a shard)."""
        assert self.kind is Kind.shard
        if self.action is Action.delete:
            return cpb.ApplyRequest.Change(delete=self.name, expect_mod_revision=self.expect_mod_revision)
        assert isinstance(self.spec, cpb.ShardSpec)
        return cpb.ApplyRequest.Change(upsert=self.spec, expect_mod_revision=self.expect_mod_revision)


@dataclass
class Plan:
    """The changes that bring the cluster to the tree, and what is left alone."""

    owner: str
    commit: str | None
    tree_digest: str
    changes: list[Change] = field(default_factory=list)
    unchanged: int = 0
    """Journals already as the tree says."""
    orphans: list[str] = field(default_factory=list)
    """Journals of the owner that left the tree, not deleted because prune was off."""
    shards: bool = False
    """Whether shards were planned (the tree has shards, or a consumer was asked for the owner's)."""
    unchanged_shards: int = 0
    orphan_shards: list[str] = field(default_factory=list)
    """Shards of the owner that left the tree (`NAME:id` in a named consumer group), not deleted
    because prune was off."""

    def count(self, action: Action, kind: Kind | None = None) -> int:
        return sum(1 for c in self.changes if c.action is action and (kind is None or c.kind is kind))

    @property
    def drifted(self) -> int:
        return sum(1 for c in self.changes if c.drift)

    def of(self, kind: Kind) -> list[Change]:
        return [c for c in self.changes if c.kind is kind]

    def summary(self) -> dict[str, int]:
        """Counts by kind of change (journals and shards together), in a stable order."""
        return {
            "create": self.count(Action.create),
            "update": self.count(Action.update),
            "delete": self.count(Action.delete),
            "drift": self.drifted,
            "unchanged": self.unchanged + self.unchanged_shards,
            "orphaned": len(self.orphans) + len(self.orphan_shards),
        }

    def summary_of(self, kind: Kind) -> dict[str, int]:
        """The counts of one kind."""
        changes = self.of(kind)
        return {
            "create": sum(1 for c in changes if c.action is Action.create),
            "update": sum(1 for c in changes if c.action is Action.update),
            "delete": sum(1 for c in changes if c.action is Action.delete),
            "drift": sum(1 for c in changes if c.drift),
            "unchanged": self.unchanged if kind is Kind.journal else self.unchanged_shards,
            "orphaned": len(self.orphans if kind is Kind.journal else self.orphan_shards),
        }


def make_plan(
    tree: SpecTree,
    source: Source,
    cluster: Iterable[pb.ListResponse.Journal],
    *,
    prune: bool = False,
    max_prune: int = DEFAULT_MAX_PRUNE,
    allow_mass_prune: bool = False,
    shards: Mapping[str, Iterable[cpb.ListResponse.Shard]] | None = None,
) -> Plan:
    """Compare `tree` with the `cluster`'s journals (a listing of at least the tree's and the owner's)
    and with `shards`, the listing of every shard of each consumer group asked (by group name,
    "" for the default group), which must include every group of the tree.

    A shard whose source or recovery-log journal is neither in the tree nor in the cluster (or is
    pruned by this plan) is an error naming the shard's file, line and field.
    """
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

    shards = shards or {}
    missing = sorted(set(tree.shards) - set(shards))
    if missing:
        raise GitOpsError(f"the tree declares shards of consumer group(s) {missing}, which were not listed")
    if shards:
        plan.shards = True
        deleted = set(gone) if prune else set()
        _require_journals(tree, (set(current) - deleted) | set(tree.journals))
        for consumer, listed in sorted(shards.items()):
            _plan_shards(plan, tree.shards.get(consumer, {}), consumer, source, listed, prune, max_prune,
                         allow_mass_prune)
    plan.changes.sort(key=lambda c: (c.kind is Kind.shard, c.consumer, c.name))
    return plan


def _require_journals(tree: SpecTree, available: set[str]) -> None:
    for shard in tree.all_shards():
        for journal, key in needed_journals(shard.spec):
            if journal not in available:
                what = "recovery log" if key == "recovery_log_prefix" else "source journal"
                raise shard.error(
                    f"the {what} {journal!r} of shard {shard.display!r} is neither in the tree nor in the cluster"
                    " (or this sync prunes it): declare it in the tree", key)


def _plan_shards(
    plan: Plan, desired_shards: Mapping[str, DesiredShard], consumer: str, source: Source,
    shards: Iterable[cpb.ListResponse.Shard], prune: bool, max_prune: int, allow_mass_prune: bool,
) -> None:
    """Plan the shards of one consumer group."""
    current = {s.spec.id: s for s in shards}
    for shard_id, desired in desired_shards.items():
        change = _compare_shard(desired.spec, current.get(shard_id), source, consumer)
        if change is None:
            plan.unchanged_shards += 1
        else:
            plan.changes.append(change)
    owned = [s for s in current.values() if labels.value_of(s.spec.labels, MANAGED_BY) == source.owner]
    gone = sorted(s.spec.id for s in owned if s.spec.id not in desired_shards)
    if not prune:
        plan.orphan_shards += [display_name(consumer, shard_id) for shard_id in gone]
    elif gone:
        group = f" in consumer group {consumer}" if consumer else ""
        _guard_prune(len(gone), len(owned), max_prune, allow_mass_prune, source.owner, "shards", group)
        for shard_id in gone:
            shard = current[shard_id]
            fields = [FieldChange(k, v, None) for k, v in shard_fields(shard.spec).items()]
            plan.changes.append(Change(shard_id, Action.delete, shard.mod_revision, fields, kind=Kind.shard,
                                       consumer=consumer))


def _guard_prune(
    count: int, owned: int, max_prune: int, allow: bool, owner: str, what: str = "journals", where: str = ""
) -> None:
    if allow:
        return
    if count == owned:
        raise PruneRefused(
            f"prune would delete every {what[:-1]} managed by {owner}{where} ({count}): is the spec directory right?"
            " Pass --allow-mass-prune if that is intended"
        )
    if count > max_prune:
        raise PruneRefused(
            f"prune would delete {count} {what} managed by {owner}{where}, more than --max-prune {max_prune};"
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
    _drop_bookkeeping(canonical.labels)
    return hashlib.sha1(canonical.SerializeToString(deterministic=True)).hexdigest()


def _drop_bookkeeping(label_set: pb.LabelSet) -> None:
    """Remove the bookkeeping labels in place (a spec the tree just built has none: nothing to copy)."""
    if any(label.name in BOOKKEEPING for label in label_set.labels):
        for name in BOOKKEEPING:
            label_set.CopyFrom(labels.remove(label_set, name))


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


# Shards.


def _compare_shard(
    desired: cpb.ShardSpec, shard: cpb.ListResponse.Shard | None, source: Source, consumer: str
) -> Change | None:
    wanted = cpb.ShardSpec()
    wanted.CopyFrom(desired)
    wanted.labels.CopyFrom(labels.set_value(wanted.labels, MANAGED_BY, source.owner))
    wanted_sha1 = shard_sha1(wanted)

    def upsert() -> cpb.ShardSpec:
        spec = cpb.ShardSpec()
        spec.CopyFrom(wanted)
        spec.labels.CopyFrom(labels.set_value(spec.labels, SPEC_SHA1, wanted_sha1))
        if source.commit:
            spec.labels.CopyFrom(labels.set_value(spec.labels, COMMIT, source.commit))
        return spec

    if shard is None:
        fields = [FieldChange(k, None, v) for k, v in shard_fields(wanted).items()]
        return Change(desired.id, Action.create, 0, fields, upsert(), kind=Kind.shard, consumer=consumer)
    owner = labels.value_of(shard.spec.labels, MANAGED_BY)
    if owner is not None and owner != source.owner:
        raise OwnershipError(
            f"shard {display_name(consumer, desired.id)!r} is managed by {owner!r}, not by {source.owner!r}: "
            "remove it from this tree, or remove its label there first"
        )
    current_sha1 = shard_sha1(shard.spec)
    if current_sha1 == wanted_sha1:
        return None
    recorded = labels.value_of(shard.spec.labels, SPEC_SHA1)
    return Change(
        desired.id, Action.update, shard.mod_revision, diff_fields(shard_fields(shard.spec), shard_fields(wanted)),
        upsert(), drift=owner is not None and recorded is not None and recorded != current_sha1,
        adopt=owner is None, kind=Kind.shard, consumer=consumer,
    )


def shard_sha1(spec: cpb.ShardSpec) -> str:
    """SHA-1 of a shard spec as sync compares it: without the bookkeeping labels."""
    canonical = cpb.ShardSpec()
    canonical.CopyFrom(spec)
    _drop_bookkeeping(canonical.labels)
    return hashlib.sha1(canonical.SerializeToString(deterministic=True)).hexdigest()


def shard_fields(spec: cpb.ShardSpec) -> dict[str, Value]:
    """A shard spec's compared fields by name (`sources`, `labels.<name>`), set ones only."""
    out: dict[str, Value] = {
        "sources": [s.journal + (f"@{s.min_offset}" if s.min_offset else "") for s in spec.sources],
        "recovery_log_prefix": spec.recovery_log_prefix,
        "hint_prefix": spec.hint_prefix,
        "hint_backups": spec.hint_backups,
        "max_txn_duration": _duration(spec.max_txn_duration),
        "min_txn_duration": _duration(spec.min_txn_duration),
        "disable": "true" if spec.disable else "",
        "hot_standbys": spec.hot_standbys,
        "disable_wait_for_ack": "true" if spec.disable_wait_for_ack else "",
        "ring_buffer_size": spec.ring_buffer_size,
        "read_channel_size": spec.read_channel_size,
    }
    for label in spec.labels.labels:
        if label.name not in BOOKKEEPING:
            values = out.setdefault(f"labels.{label.name}", [])
            assert isinstance(values, list)
            values.append(label.value)
    return {k: v for k, v in out.items() if v not in (0, "", [], None)}
