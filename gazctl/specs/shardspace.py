"""Shardspace: the YAML of a set of ShardSpecs (Gazette's `consumer/shardspace`).

Unlike a journalspace it does not nest: one `common` spec holds the fields the shards share, and
`shards` lists each shard's own fields, its expected `revision` and an optional `delete: true`.

    common:
      recovery_log_prefix: examples/recovery-logs
      hint_prefix: /gazette/hints
      max_txn_duration: 1s
      labels:
      - name: app
        value: counter
    shards:
    - id: shard-000
      sources:
      - journal: examples/part-000
      revision: 17      # Expected mod revision: 0 (or absent) creates, -1 ignores it.
    - id: shard-001
      delete: true
      revision: 18

`push_down` gives each shard the common fields it leaves unset (labels merge by name, the
shard's values winning; sources are taken whole); `hoist` is the reverse, for a listing: the
common spec is the intersection of all shards, which each shard then omits.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from broker.protocol import pb as bpb
from broker.specs import strict
from broker.specs.durations import format_duration, from_proto, to_proto
from broker.specs.strict import At, SpecError
from consumer.protocol import pb
from consumer.protocol.shard_spec import intersect_shard_specs, subtract_shard_specs, union_shard_specs
from consumer.protocol.validation import ValidationError, validate_apply_request

__all__ = ["FlatShard", "Set", "Shard", "change", "dump", "flatten", "hoist", "load", "load_flat", "push_down"]

SPEC_FIELDS = (
    "id",
    "sources",
    "recovery_log_prefix",
    "hint_prefix",
    "hint_backups",
    "max_txn_duration",
    "min_txn_duration",
    "disable",
    "hot_standbys",
    "labels",
    "disable_wait_for_ack",
    "ring_buffer_size",
    "read_channel_size",
)
SHARD_FIELDS = ("comment", "delete", *SPEC_FIELDS, "revision")
COMMON_FIELDS = tuple(f for f in SPEC_FIELDS if f != "id")
SET_FIELDS = ("common", "shards")
SOURCE_FIELDS = ("journal", "min_offset")
LABEL_FIELDS = ("name", "value")
DURATIONS = ("max_txn_duration", "min_txn_duration")
STRINGS = ("id", "recovery_log_prefix", "hint_prefix")
BOOLS = ("disable", "disable_wait_for_ack")
INTS = {
    "hint_backups": (-(2**31), 2**31 - 1),
    "hot_standbys": (0, 2**32 - 1),
    "ring_buffer_size": (0, 2**32 - 1),
    "read_channel_size": (0, 2**32 - 1),
}
INT64 = (-(2**63), 2**63 - 1)


@dataclass
class Shard:
    """One shard of a set: a partial spec, plus its delete mark, expected revision and comment."""

    spec: pb.ShardSpec = field(default_factory=pb.ShardSpec)
    delete: bool | None = None
    revision: int = 0
    """Expected mod revision: 0 means the shard must not exist, -1 means any revision."""
    comment: str = ""
    at: At | None = None
    fields_at: dict[str, At] = field(default_factory=dict)

    def error(self, message: str, key: str = "id") -> SpecError:
        """An error at this shard's `key` (or the shard); a shard built in code is `<set>:0:0`."""
        at = self.fields_at.get(key) or self.at or At("<set>", 0, 0, self.spec.id or "<shard>")
        return at.error(message)


@dataclass
class Set:
    """A shardspace: the common spec (without an id) and the shards."""

    common: pb.ShardSpec = field(default_factory=pb.ShardSpec)
    shards: list[Shard] = field(default_factory=list)


class FlatShard(NamedTuple):
    """A shard with the common fields pushed down: its complete spec, expected revision and delete mark."""

    spec: pb.ShardSpec
    expect_mod_revision: int
    delete: bool


# Decoding.


def load(text: str, file: str = "<stdin>", *, fast: bool = False) -> Set:
    """Decode a shardspace document strictly: unknown fields and ill-typed values are errors naming their line."""
    doc, at = strict.load(text, file, fast=fast)
    if doc is None:
        raise at.error("empty document (expected a shardspace with `common` and `shards`)")
    fields = strict.mapping(doc, at, SET_FIELDS)
    out = Set()
    if "common" in fields:
        value, where = fields["common"]
        _decode_spec(value, where, out.common, COMMON_FIELDS, {})
    if "shards" in fields:
        value, where = fields["shards"]
        out.shards = [_decode_shard(item, item_at) for item, item_at in strict.sequence(value, where)]
    return out


def _decode_shard(value: Any, at: At) -> Shard:
    shard = Shard(at=at)
    fields = _decode_spec(value, at, shard.spec, SHARD_FIELDS, shard.fields_at)
    if "comment" in fields:
        shard.comment = strict.string(*fields["comment"])
    if "delete" in fields:
        shard.delete = strict.boolean(*fields["delete"])
    if "revision" in fields:
        shard.revision = strict.integer(*fields["revision"], *INT64)
    if "id" in fields:
        shard.at = fields["id"][1]
    return shard


def _decode_spec(
    value: Any, at: At, spec: pb.ShardSpec, allowed: tuple[str, ...], fields_at: dict[str, At]
) -> dict[str, tuple[Any, At]]:
    fields = strict.mapping(value if value is not None else {}, at, allowed)
    for key, (item, where) in fields.items():
        fields_at[key] = where
        if key in STRINGS:
            setattr(spec, key, strict.string(item, where))
        elif key in INTS:
            setattr(spec, key, strict.integer(item, where, *INTS[key]))
        elif key in BOOLS:
            setattr(spec, key, bool(strict.boolean(item, where)))
        elif key in DURATIONS:
            ns = strict.duration(item, where)
            if ns:
                getattr(spec, key).CopyFrom(to_proto(ns))
        elif key == "sources":
            for source, source_at in strict.sequence(item, where):
                src = strict.mapping(source, source_at, SOURCE_FIELDS)
                if "journal" not in src:
                    raise source_at.error("source has no journal")
                spec.sources.add(
                    journal=strict.string(*src["journal"]),
                    min_offset=strict.integer(*src["min_offset"], *INT64) if "min_offset" in src else 0,
                )
        elif key == "labels":
            for label, label_at in strict.sequence(item, where):
                lbl = strict.mapping(label, label_at, LABEL_FIELDS)
                if "name" not in lbl:
                    raise label_at.error("label has no name")
                spec.labels.labels.add(
                    name=strict.string(*lbl["name"]),
                    value=strict.string(*lbl["value"]) if "value" in lbl else "",
                )
    return fields


# Flattening and hoisting.


def push_down(space: Set) -> list[Shard]:
    """The shards with the common fields they leave unset (the common spec zeroed)."""
    out = []
    for shard in space.shards:
        spec = union_shard_specs(shard.spec, space.common)
        spec.id = shard.spec.id
        out.append(Shard(spec, shard.delete, shard.revision, shard.comment, shard.at, shard.fields_at))
    return out


def flatten(space: Set) -> list[FlatShard]:
    """Push down, and require each shard to be a valid ApplyRequest change with a unique id.

    Errors name the file, line and field of the shard (or of its offending field).
    """
    out = []
    seen: set[str] = set()
    for shard in push_down(space):
        if not shard.spec.id:
            raise shard.error("shard has no id")
        if shard.spec.id in seen:
            raise shard.error(f"shard {shard.spec.id!r} appears more than once")
        seen.add(shard.spec.id)
        flat = FlatShard(shard.spec, shard.revision, bool(shard.delete))
        try:
            validate_apply_request(pb.ApplyRequest(changes=[change(flat)]))
        except ValidationError as err:
            context = [c for c in err.context[1:2] if c not in ("Upsert", "Delete")] + list(err.context[2:])
            message = str(ValidationError(err.message, context))
            what = "delete of" if flat.delete else "spec of"
            key = "revision" if "ExpectModRevision" in message else _field_of(message, shard)
            raise shard.error(f"invalid {what} shard {flat.spec.id!r}: {message}", key) from None
        out.append(flat)
    return out


_CONTEXT_FIELDS = {
    "Sources": "sources",
    "RecoveryLogPrefix": "recovery_log_prefix",
    "HintPrefix": "hint_prefix",
    "HintBackups": "hint_backups",
    "MinTxnDuration": "min_txn_duration",
    "MaxTxnDuration": "max_txn_duration",
    "LabelSet": "labels",
    "Labels": "labels",
}


def _field_of(message: str, shard: Shard) -> str:
    """The YAML key an error message is about, if the shard sets it (else the shard's `id`)."""
    for name, key in _CONTEXT_FIELDS.items():
        if name in message and key in shard.fields_at:
            return key
    return "id"


def load_flat(text: str, file: str = "<stdin>") -> list[FlatShard]:
    """`flatten(load(text, file))`, parsing with the fast loader unless there is an error to locate."""
    return strict.with_positions(lambda fast: flatten(load(text, file, fast=fast)))


def error_at(text: str, file: str, shard_id: str, key: str, message: str) -> SpecError:
    """An error at `key` of shard `shard_id` of the shardspace `text` (else at the shard), naming
    the file and line: for problems found after decoding, e.g. a journal that does not exist."""
    for shard in push_down(load(text, file)):
        if shard.spec.id == shard_id:
            return shard.error(message, key)
    return At(file, 0, 0, shard_id).error(message)


def change(flat: FlatShard) -> pb.ApplyRequest.Change:
    """The ApplyRequest change of a flattened shard."""
    if flat.delete:
        return pb.ApplyRequest.Change(expect_mod_revision=flat.expect_mod_revision, delete=flat.spec.id)
    return pb.ApplyRequest.Change(expect_mod_revision=flat.expect_mod_revision, upsert=flat.spec)


def hoist(shards: Iterable[tuple[pb.ShardSpec, int]]) -> Set:
    """The set of (spec, mod revision) pairs with the fields all shards share hoisted into `common`."""
    out = Set(shards=[Shard(spec=_copy(spec), revision=revision) for spec, revision in shards])
    if not out.shards:
        return out
    common = _copy(out.shards[0].spec)
    for shard in out.shards[1:]:
        common = intersect_shard_specs(common, shard.spec)
    common.id = ""
    out.common = common
    for shard in out.shards:
        shard.spec = subtract_shard_specs(shard.spec, common)
    return out


def _copy(spec: pb.ShardSpec) -> pb.ShardSpec:
    out = pb.ShardSpec()
    out.CopyFrom(spec)
    return out


# Encoding.


def dump(space: Set) -> str:
    """Encode a set as YAML, omitting unset fields (so it round-trips through `load`)."""
    doc = CommentedMap()
    common = _encode_spec(space.common)
    if common:
        doc["common"] = common
    shards = CommentedSeq()
    for shard in space.shards:
        item = CommentedMap()
        if shard.comment:
            item["comment"] = shard.comment
        if shard.delete is not None:
            item["delete"] = shard.delete
        item.update(_encode_spec(shard.spec))
        if shard.revision:
            item["revision"] = shard.revision
        shards.append(item)
    doc["shards"] = shards
    yaml = YAML(typ="rt")
    yaml.width = 4096
    out = io.StringIO()
    yaml.dump(doc, out)
    return out.getvalue()


def _encode_spec(spec: pb.ShardSpec) -> CommentedMap:
    out = CommentedMap()
    for key in SPEC_FIELDS:
        if key == "sources":
            if spec.sources:
                out[key] = CommentedSeq(_encode_source(s) for s in spec.sources)
        elif key == "labels":
            if spec.labels.labels:
                out[key] = CommentedSeq(_encode_label(label) for label in spec.labels.labels)
        elif key in DURATIONS:
            ns = from_proto(getattr(spec, key))
            if ns:
                out[key] = format_duration(ns)
        else:
            value = getattr(spec, key)
            if value:
                out[key] = value
    return out


def _encode_source(source: pb.ShardSpec.Source) -> CommentedMap:
    out = CommentedMap()
    out["journal"] = source.journal
    if source.min_offset:
        out["min_offset"] = source.min_offset
    return out


def _encode_label(label: bpb.Label) -> CommentedMap:
    out = CommentedMap()
    out["name"] = label.name
    out["value"] = label.value or DoubleQuotedScalarString("")
    return out
