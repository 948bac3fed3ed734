"""Shard spec files of a spec tree: shardspace documents of explicit shards and shard templates.

A spec file whose top-level mapping has a `shards` key is a shardspace (Gazette's
`consumer/shardspace`: `common`, then `shards`); every other spec file is a journalspace tree.
In a spec repository an item of `shards` is either

- a shard: `id` and its fields, as `gazctl shards apply` takes it, or
- a template: an item with `for_each_journal: SELECTOR`, which stands for one shard per journal
  of the tree matching the selector (labels, and the meta-labels `name` and `prefix`). Its `id`,
  its `sources[].journal` and its label values may hold placeholders: `{journal}` (the matched
  journal's name), `{base}` (its last path component) and `{label:NAME}` (the journal's value of
  label NAME). Without `sources`, the shard reads the matched journal.

Each shard inherits the fields of the file's `common` it leaves unset (labels merge by name), as
`shards apply` pushes them down. A file may name the consumer group its shards belong to
(`consumer: NAME`, whose Shard API address `--consumer NAME=URL` or `$CONSUMER_ADDRESS_NAME`
gives); shards of files that name none belong to the group of `--consumer.address`. A shard id
is unique within its group. No `revision` or `delete`: sync reads revisions from the
consumer, and deletes a shard once it leaves the tree (`sync --prune`).

Templates match the journals the *tree* declares (never the cluster's), so a partition added to
the tree gets its shard in the same sync, and a plan is computed from the files alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.protocol import labels, pb
from broker.protocol.selectors import SelectorError, format_selector, parse_selector
from broker.protocol.validation import ValidationError
from broker.specs import SpecError, strict
from broker.specs.strict import At
from consumer.protocol import pb as cpb
from consumer.protocol.shard_spec import recovery_log, union_shard_specs
from consumer.protocol.validation import validate_shard_spec
from gazctl.specs import shardspace

SHARDS_KEY = "shards"
FOR_EACH = "for_each_journal"
CONSUMER_KEY = "consumer"
FILE_FIELDS = (CONSUMER_KEY, "common", SHARDS_KEY)
DEFAULT_CONSUMER = ""
"""The consumer group of files that name none: the one of `--consumer.address`."""
_CONSUMER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
ITEM_FIELDS = (*shardspace.SHARD_FIELDS, FOR_EACH)
PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_SHARDS_LINE = re.compile(r"""^["']?shards["']?[ \t]*:""", re.M)

_FORBIDDEN = (
    ("revision", "sync reads each shard's revision from the consumer"),
    ("delete", "remove the shard from the tree and sync with --prune"),
)
_CONTEXT_FIELDS = (
    ("Sources", "sources"),
    ("RecoveryLogPrefix", "recovery_log_prefix"),
    ("HintPrefix", "hint_prefix"),
    ("HintBackups", "hint_backups"),
    ("MinTxnDuration", "min_txn_duration"),
    ("MaxTxnDuration", "max_txn_duration"),
    ("LabelSet", "labels"),
    ("Labels", "labels"),
    ("Id", "id"),
)


def is_shard_file(text: str) -> bool:
    """Whether a (rendered) spec file is a shardspace: a `shards:` key at the top level (block style).

    A flow-style or indented document is recognized when the journalspace decoder rejects its
    `shards` key (see `tree`).
    """
    return _SHARDS_LINE.search(text) is not None


@dataclass(frozen=True)
class Item:
    """One item of a file's `shards`: a shard, or a template (with a selector)."""

    index: int
    spec: cpb.ShardSpec
    """The item's own fields (a template's id, sources and labels may hold placeholders)."""
    selector: pb.LabelSelector | None
    keys: frozenset[str]
    """The fields the item sets."""


@dataclass
class ShardFile:
    """A decoded shardspace of the tree: its common spec and items, and its text to locate errors."""

    label: str
    text: str
    common: cpb.ShardSpec
    items: list[Item]
    consumer: str = DEFAULT_CONSUMER
    """The consumer group the file's shards belong to (its `consumer` key), "" for the default one."""
    _positions: dict[int, tuple[At, dict[str, At]]] | None = field(default=None, repr=False)

    def at(self, index: int, key: str = "id") -> At:
        """The position of item `index`'s `key` (or of the item), decoding the file again with positions."""
        if self._positions is None:
            self._positions = {}
            _decode(self.text, self.label, fast=False, positions=self._positions)
        item_at, fields_at = self._positions[index]
        return fields_at.get(key) or fields_at.get(key.split("[")[0]) or fields_at.get("id") or item_at


@dataclass(frozen=True)
class DesiredShard:
    """A shard as the tree declares it: its complete spec, and the item (and journal) it comes from."""

    spec: cpb.ShardSpec
    file: ShardFile
    index: int
    journal: str | None = None
    """The journal a template made this shard for (None for a shard named in the file)."""

    @property
    def consumer(self) -> str:
        return self.file.consumer

    @property
    def display(self) -> str:
        """The shard's id, after `NAME:` for a named consumer group."""
        return display_name(self.file.consumer, self.spec.id)

    def at(self, key: str = "id") -> At:
        return self.file.at(self.index, key)

    def error(self, message: str, key: str = "id") -> SpecError:
        """An error at the item's `key`, naming the template's journal."""
        made = f" (made by the template for journal {self.journal!r})" if self.journal is not None else ""
        return self.at(key).error(message + made)

    def where(self) -> str:
        at = self.at()
        return f"{at.file}:{at.line}"


def decode(text: str, label: str) -> ShardFile:
    """Decode one shardspace file of a spec tree; errors name its line and field."""
    return strict.with_positions(lambda fast: _decode(text, label, fast=fast))


def _decode(
    text: str, label: str, *, fast: bool, positions: dict[int, tuple[At, dict[str, At]]] | None = None
) -> ShardFile:
    doc, at = strict.load(text, label, fast=fast)
    if doc is None:
        raise at.error("empty document (expected a shardspace with `common` and `shards`)")
    fields = strict.mapping(doc, at, FILE_FIELDS)
    consumer = DEFAULT_CONSUMER
    if CONSUMER_KEY in fields:
        consumer = strict.string(*fields[CONSUMER_KEY])
        if not _CONSUMER_NAME.fullmatch(consumer):
            raise fields[CONSUMER_KEY][1].error(
                f"invalid consumer name {consumer!r}: 1 to 63 letters, digits and -_. (it names the consumer group"
                " whose address `--consumer NAME=URL` gives)")
    common = cpb.ShardSpec()
    if "common" in fields:
        value, where = fields["common"]
        shardspace._decode_spec(value, where, common, shardspace.COMMON_FIELDS, {})
    items = []
    if SHARDS_KEY in fields:
        for index, (value, item_at) in enumerate(strict.sequence(*fields[SHARDS_KEY])):
            fields_at: dict[str, At] = {}
            spec = cpb.ShardSpec()
            item = shardspace._decode_spec(value, item_at, spec, ITEM_FIELDS, fields_at)
            if positions is not None:
                positions[index] = (item_at, fields_at)
                if "sources" in item:
                    for i, (source, source_at) in enumerate(strict.sequence(*item["sources"])):
                        journal = strict.mapping(source, source_at, shardspace.SOURCE_FIELDS).get("journal")
                        fields_at[f"sources[{i}]"] = journal[1] if journal else source_at
            for key, why in _FORBIDDEN:
                if key in item:
                    raise item[key][1].error(f"`{key}` is not allowed in a spec repository: {why}")
            if "id" not in item:
                raise item_at.error("shard has no id")
            selector = None
            if FOR_EACH in item:
                selector = _selector(*item[FOR_EACH])
            else:
                for key in ("id", "sources", "labels"):
                    if key in item and _placeholders(spec, key):
                        raise item[key][1].error(
                            f"placeholders such as {{journal}} are for templates: add `{FOR_EACH}: SELECTOR`"
                        )
            items.append(Item(index, spec, selector, frozenset(item)))
    return ShardFile(label, text, common, items, consumer)


def _selector(value: Any, at: At) -> pb.LabelSelector:
    text = strict.string(value, at)
    if not text.strip():
        raise at.error("an empty selector would match every journal of the tree; name the journals' labels")
    try:
        return labels.rewrite_prefix_meta_label(parse_selector(text))
    except SelectorError as err:
        raise at.error(f"invalid selector {text!r}: {err}") from None


def _placeholders(spec: cpb.ShardSpec, key: str) -> bool:
    if key == "id":
        return "{" in spec.id
    if key == "sources":
        return any("{" in s.journal for s in spec.sources)
    return any("{" in label.value for label in spec.labels.labels)


def display_name(consumer: str, shard_id: str) -> str:
    """`id`, or `NAME:id` in a named consumer group (`:` is in neither a shard id nor a group name)."""
    return f"{consumer}:{shard_id}" if consumer else shard_id


def expand(
    files: list[ShardFile], journals: Mapping[str, pb.JournalSpec]
) -> tuple[dict[str, dict[str, DesiredShard]], list[str]]:
    """Every shard of `files`, templates expanded over `journals`, each validated and named once in
    its consumer group.

    Returns the shards by consumer group and id (sorted) and notes (templates that matched no journal).
    """
    groups: dict[str, dict[str, DesiredShard]] = {}
    notes: list[str] = []
    label_sets: dict[str, pb.LabelSet] | None = None
    for file in files:
        groups.setdefault(file.consumer, {})  # A group of no shards is still asked (its owned shards are pruned).
        for item in file.items:
            if item.selector is None:
                made = [DesiredShard(_flat(item.spec, file.common), file, item.index)]
            else:
                if label_sets is None:
                    label_sets = {name: labels.journal_label_set(spec) for name, spec in journals.items()}
                matched = [name for name, ls in label_sets.items() if labels.matches(item.selector, ls)]
                if not matched:
                    at = file.at(item.index, FOR_EACH)
                    notes.append(f"{at.file}:{at.line}: the template's {FOR_EACH} "
                                 f"{format_selector(item.selector)!r} matches no journal of the tree")
                made = [DesiredShard(_flat(_instance(item, file, journals[name]), file.common), file, item.index, name)
                        for name in matched]
            shards = groups.setdefault(file.consumer, {})
            for shard in made:
                _validate(shard)
                first = shards.get(shard.spec.id)
                if first is not None:
                    raise shard.at().error(
                        f"shard {shard.spec.id!r}{_made(shard)} is also declared at {first.where()}{_made(first)};"
                        " name each shard once")
                shards[shard.spec.id] = shard
    return {name: dict(sorted(shards.items())) for name, shards in sorted(groups.items())}, notes


def _made(shard: DesiredShard) -> str:
    return f" (made by the template for journal {shard.journal!r})" if shard.journal is not None else ""


def _flat(spec: cpb.ShardSpec, common: cpb.ShardSpec) -> cpb.ShardSpec:
    out = union_shard_specs(spec, common)
    out.id = spec.id
    return out


def _instance(item: Item, file: ShardFile, journal: pb.JournalSpec) -> cpb.ShardSpec:
    """The template `item` filled in for `journal`."""

    def fill(text: str, key: str) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if name == "journal":
                return journal.name
            if name == "base":
                return journal.name.rsplit("/", 1)[-1]
            if name.startswith("label:"):
                value = labels.value_of(journal.labels, name[len("label:"):])
                if value is None:
                    raise file.at(item.index, key).error(
                        f"journal {journal.name!r} has no label {name[len('label:'):]!r} for {match.group(0)}")
                return value
            raise file.at(item.index, key).error(
                f"unknown placeholder {match.group(0)} (expected {{journal}}, {{base}} or {{label:NAME}})")

        return PLACEHOLDER.sub(one, text)

    spec = cpb.ShardSpec()
    spec.CopyFrom(item.spec)
    spec.id = fill(spec.id, "id")
    if "sources" in item.keys:
        for source in spec.sources:
            source.journal = fill(source.journal, "sources")
    else:
        spec.sources.add(journal=journal.name)
    for label in spec.labels.labels:
        label.value = fill(label.value, "labels")
    return spec


def _validate(shard: DesiredShard) -> None:
    try:
        validate_shard_spec(shard.spec)
    except ValidationError as err:
        message = str(err)
        keys = shard.file.items[shard.index].keys
        key = next((k for name, k in _CONTEXT_FIELDS if name in message and k in keys), "id")
        raise shard.error(f"invalid spec of shard {shard.spec.id!r}: {message}", key) from None


def needed_journals(spec: cpb.ShardSpec) -> list[tuple[str, str]]:
    """The journals a shard needs, with the field naming each: its sources and its recovery log."""
    out = [(s.journal, f"sources[{i}]") for i, s in enumerate(spec.sources)]
    if spec.recovery_log_prefix:
        out.append((recovery_log(spec), "recovery_log_prefix"))
    return out
