"""Journalspace: the hierarchical YAML of JournalSpecs (Gazette's `broker/journalspace`).

A tree of nodes, each a partial JournalSpec. A node whose name is empty or ends in `/` is a
directory: it has children, which it prefixes and which are ordered by name, and it has no
revision. Any other node is a journal. `flatten` pushes each directory's fields down to the
journals below it (a journal's unset fields inherit); `hoist` does the reverse for a flat list
of specs, building the minimal tree that flattens back to them.

    name: foo/
    replication: 3
    fragment: {length: 1048576, compression_codec: SNAPPY, refresh_interval: 1m0s}
    children:
    - name: foo/bar
      revision: 17      # Expected mod revision: 0 creates, -1 ignores it.
    - name: foo/baz
      delete: true
"""

from __future__ import annotations

import copy
import io
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.nodes import ScalarNode
from ruamel.yaml.resolver import VersionedResolver
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from broker.protocol import pb
from broker.protocol.validation import (
    ValidationError,
    validate_apply_request,
    validate_journal,
    validate_label_set,
)
from broker.specs import SpecError, strict
from broker.specs.durations import format_duration, from_proto, to_proto
from broker.specs.strict import At
from gazctl.specs import journalspec

__all__ = [
    "FlatSpec",
    "Node",
    "change",
    "dump",
    "flatten",
    "hoist",
    "hoist_tree",
    "journals",
    "load",
    "push_down",
    "validate_tree",
]

NODE_FIELDS = (
    "comment",
    "delete",
    "name",
    "replication",
    "labels",
    "fragment",
    "flags",
    "max_append_rate",
    "suspend",
    "revision",
    "children",
)
LABEL_FIELDS = ("name", "value", "prefix")
FRAGMENT_FIELDS = (
    "length",
    "compression_codec",
    "stores",
    "refresh_interval",
    "retention",
    "flush_interval",
    "path_postfix_template",
)
FRAGMENT_DURATIONS = ("refresh_interval", "retention", "flush_interval")
SUSPEND_FIELDS = ("level", "offset")

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)

_CODECS = dict(pb.CompressionCodec.items())
_FLAGS = dict(pb.JournalSpec.Flag.items())
_SUSPEND_LEVELS = dict(pb.JournalSpec.Suspend.Level.items())


@dataclass
class Node:
    """One node of a journalspace tree: a partial spec, plus its delete mark, revision and children."""

    spec: pb.JournalSpec = field(default_factory=pb.JournalSpec)
    delete: bool | None = None
    """Delete this journal, or every journal below this directory; None inherits the parent's."""
    revision: int = 0
    """Expected mod revision of a journal: 0 means it must not exist, -1 means any revision."""
    children: list[Node] = field(default_factory=list)
    comment: str = ""
    """Free text, passed through."""
    stores_set: bool = False
    """`stores` was given, even as an empty list: the parent's stores are not inherited."""
    at: At | None = None
    """Where the node was decoded from; None for nodes built in code."""
    fields_at: dict[str, At] = field(default_factory=dict)
    """Where each decoded field's value sits."""

    @property
    def name(self) -> str:
        """The node's (full, absolute) name."""
        return self.spec.name

    @property
    def is_dir(self) -> bool:
        """Whether the node is a directory: its name is empty or ends in `/`."""
        return not self.spec.name or self.spec.name.endswith("/")

    def error(self, message: str, key: str = "name") -> SpecError:
        """Return an error at this node's `key` (or the node); a node built in code is `<tree>:0:0`."""
        at = self.fields_at.get(key) or self.at or At("<tree>", 0, 0, self.spec.name or "<root>")
        return at.error(message)


class FlatSpec(NamedTuple):
    """A journal of a flattened tree: its complete spec, expected mod revision, and delete mark."""

    spec: pb.JournalSpec
    expect_mod_revision: int
    delete: bool


# Decoding.


def load(text: str, file: str = "<stdin>", *, fast: bool = False) -> Node:
    """Decode a journalspace YAML document strictly: unknown fields and ill-typed values are errors.

    With `fast`, nodes carry no line numbers (see `strict.load`); `load_journals` uses it.
    """
    doc, at = strict.load(text, file, fast=fast)
    if doc is None:
        raise at.error("empty document (expected a journalspace node)")
    return _decode_node(doc, at)


def _decode_node(value: Any, at: At) -> Node:
    fields = strict.mapping(value, at, NODE_FIELDS)
    node = Node(at=at, fields_at={key: where for key, (_, where) in fields.items()})
    spec = node.spec
    for key, (item, where) in fields.items():
        if key == "comment":
            node.comment = strict.string(item, where)
        elif key == "delete":
            node.delete = strict.boolean(item, where)
        elif key == "name":
            spec.name = strict.string(item, where)
        elif key == "replication":
            spec.replication = strict.integer(item, where, *INT32)
        elif key == "labels":
            spec.labels.CopyFrom(_decode_labels(item, where))
        elif key == "fragment":
            node.stores_set = _decode_fragment(item, where, spec.fragment)
        elif key == "flags":
            spec.flags = strict.enum(item, where, _FLAGS, allow_number=True)
        elif key == "max_append_rate":
            spec.max_append_rate = strict.integer(item, where, *INT64)
        elif key == "suspend":
            _decode_suspend(item, where, spec)
        elif key == "revision":
            node.revision = strict.integer(item, where, *INT64)
        elif key == "children":
            node.children = [_decode_node(child, child_at) for child, child_at in strict.sequence(item, where)]
    if "name" in fields:
        node.at = fields["name"][1]
    return node


def _decode_labels(value: Any, at: At) -> pb.LabelSet:
    out = pb.LabelSet()
    for item, where in strict.sequence(value, at):
        fields = strict.mapping(item, where, LABEL_FIELDS)
        label = out.labels.add()
        for key, (field_value, field_at) in fields.items():
            if key == "name":
                label.name = strict.string(field_value, field_at)
            elif key == "value":
                label.value = strict.string(field_value, field_at)
            elif key == "prefix":
                label.prefix = bool(strict.boolean(field_value, field_at))
        if "name" not in fields:
            raise where.error("label has no name")
    try:
        validate_label_set(out)
    except ValidationError as err:
        raise at.error(str(err)) from None
    return out


def _decode_fragment(value: Any, at: At, frag: pb.JournalSpec.Fragment) -> bool:
    """Decode into `frag`; return whether `stores` was given."""
    fields = strict.mapping(value if value is not None else {}, at, FRAGMENT_FIELDS)
    for key, (item, where) in fields.items():
        if key == "length":
            frag.length = strict.integer(item, where, *INT64)
        elif key == "compression_codec":
            frag.compression_codec = pb.CompressionCodec.ValueType(
                strict.enum(item, where, _CODECS, allow_number=False)
            )
        elif key == "stores":
            frag.stores.extend(strict.string(store, store_at) for store, store_at in strict.sequence(item, where))
        elif key == "path_postfix_template":
            frag.path_postfix_template = strict.string(item, where)
        elif key in FRAGMENT_DURATIONS:
            ns = strict.duration(item, where)
            if ns:
                getattr(frag, key).CopyFrom(to_proto(ns))
    return "stores" in fields and fields["stores"][0] is not None


def _decode_suspend(value: Any, at: At, spec: pb.JournalSpec) -> None:
    fields = strict.mapping(value if value is not None else {}, at, SUSPEND_FIELDS)
    suspend = spec.suspend
    for key, (item, where) in fields.items():
        if key == "level":
            suspend.level = pb.JournalSpec.Suspend.Level.ValueType(
                strict.enum(item, where, _SUSPEND_LEVELS, allow_number=True)
            )
        elif key == "offset":
            suspend.offset = strict.integer(item, where, *INT64)


# Validation and flattening.


def validate_tree(node: Node) -> None:
    """Require a well-formed tree (Gazette's Node.Validate); specs themselves are not checked."""
    if node.is_dir:
        if node.revision != 0:
            raise node.error(
                f"unexpected revision ({node.revision}) of directory {node.name!r}: "
                "only journals (names not ending in '/') have revisions",
                "revision",
            )
        if not node.children:
            raise node.error(
                f"directory {node.name!r} has no children (names ending in '/' are directories; "
                "a journal name does not end in '/')"
            )
        for i, child in enumerate(node.children):
            if not child.name.startswith(node.name):
                raise child.error(f"expected parent name to prefix child ({node.name} vs {child.name})")
            if i and node.children[i - 1].name >= child.name:
                prev = node.children[i - 1].name
                raise child.error(f"expected children to be ordered by name (index {i}; {prev} vs {child.name})")
            validate_tree(child)
        return
    try:
        validate_journal(node.name)
    except ValidationError as err:
        raise node.error(f"invalid journal name: {err}") from None
    if node.children:
        raise node.error(f"journal {node.name!r} cannot have children (a directory's name ends in '/')", "children")


def push_down(root: Node) -> Node:
    """Return a copy of the tree whose journals carry their inherited fields, and whose directories none.

    A journal's unset fields take its parent's (after the parent's own push-down), labels merge
    by name with the journal's winning, stores are inherited only if not given, `suspend` is
    never inherited, and an unset `delete` takes the parent's.
    """
    out = _copy_nodes(root)
    _push_down(out, pb.JournalSpec(), None)
    return out


def _copy_nodes(node: Node) -> Node:
    """A copy of the tree's nodes, sharing their specs: push-down replaces specs, never changes one
    (a deep copy of a 10,000-journal tree took half a second)."""
    return replace(node, children=[_copy_nodes(child) for child in node.children])


def _push_down(node: Node, parent: pb.JournalSpec, parent_delete: bool | None) -> None:
    node.spec = journalspec.union(node.spec, parent, inherit_stores=not node.stores_set)
    if node.delete is None:
        node.delete = parent_delete
    for child in node.children:
        _push_down(child, node.spec, node.delete)
    if node.is_dir:
        node.spec, node.delete, node.stores_set = pb.JournalSpec(name=node.name), None, False


def journals(root: Node) -> list[Node]:
    """Return the journal (non-directory) nodes of the tree, in order."""
    if not root.is_dir:
        return [root]
    return [journal for child in root.children for journal in journals(child)]


def flatten(root: Node, validate: bool = True) -> list[FlatSpec]:
    """Validate the tree and return its journals, in order, with fields inherited from their parents.

    Each journal is one change: an upsert of its complete spec, or (with `delete: true`) a
    delete, expecting mod revision `revision`. With `validate`, each change must be a valid
    ApplyRequest change, and journal names must be unique.
    """
    return [FlatSpec(node.spec, node.revision, bool(node.delete)) for node in journal_nodes(root, validate)]


def journal_nodes(root: Node, validate: bool = True) -> list[Node]:
    """Like `flatten`, but the journals' nodes (complete specs, with their positions in the file)."""
    validate_tree(root)
    out = journals(push_down(root))
    if validate:
        seen: set[str] = set()
        for node in out:
            if node.name in seen:
                raise node.error(f"journal {node.name!r} appears more than once")
            seen.add(node.name)
            _validate_change(node, FlatSpec(node.spec, node.revision, bool(node.delete)))
    return out


def load_flat(text: str, file: str = "<stdin>") -> list[FlatSpec]:
    """`flatten(load(text, file))`, parsing with the fast loader unless there is an error to locate."""
    return strict.with_positions(lambda fast: flatten(load(text, file, fast=fast)))


def change(flat: FlatSpec) -> pb.ApplyRequest.Change:
    """Return the ApplyRequest change of a flattened journal."""
    if flat.delete:
        return pb.ApplyRequest.Change(expect_mod_revision=flat.expect_mod_revision, delete=flat.spec.name)
    return pb.ApplyRequest.Change(expect_mod_revision=flat.expect_mod_revision, upsert=flat.spec)


def _validate_change(node: Node, flat: FlatSpec) -> None:
    try:
        validate_apply_request(pb.ApplyRequest(changes=[change(flat)]))
    except ValidationError as err:
        # Drop the `Changes[0].Upsert` context: the message names the change.
        context = [c for c in err.context[1:2] if c not in ("Upsert", "Delete")] + list(err.context[2:])
        message = str(ValidationError(err.message, context))
        what = "delete of" if flat.delete else "spec of"
        key = "revision" if "ExpectModRevision" in message else "name"
        raise node.error(f"invalid {what} journal {flat.spec.name!r}: {message}", key) from None


# Hoisting.


def hoist(journals: Iterable[tuple[pb.JournalSpec, int]]) -> Node:
    """Return the minimal tree of (spec, mod revision) pairs, which `flatten` maps back to them.

    Journals are grouped by their longest shared `/`-bounded name prefixes; each directory takes
    the fields common to all its children, which then omit them. One journal is a lone node.
    """
    nodes = [Node(spec=journalspec.copy(spec), revision=revision) for spec, revision in journals]
    nodes.sort(key=lambda n: n.name)
    tree = _extract_tree(nodes)
    _hoist(tree)
    return tree


def hoist_tree(root: Node) -> Node:
    """Return a copy of a pushed-down tree in which each directory holds its children's common fields."""
    out = copy.deepcopy(root)
    _hoist(out)
    return out


def _extract_tree(nodes: list[Node]) -> Node:
    """Group runs of adjacent names sharing the longest prefix under directories, until one root remains."""
    if not nodes:
        return Node()
    nodes = list(nodes)
    # shared[i]: the shared prefix length of nodes[i - 1] and nodes[i]; shared[0] is never the longest.
    shared = [-1] + [_shared_prefix(nodes[i].name, nodes[i - 1].name) for i in range(1, len(nodes))]
    while len(nodes) > 1:
        # The first run of adjacent pairs sharing the longest prefix (max and index scan in C).
        longest = max(shared)
        first = shared.index(longest)
        begin, end = first - 1, first + 1
        while end < len(nodes) and shared[end] == longest:
            end += 1
        parent = Node(spec=pb.JournalSpec(name=nodes[begin].name[:longest]), children=nodes[begin:end])
        nodes[begin:end] = [parent]
        shared[begin:end] = [_shared_prefix(parent.name, nodes[begin - 1].name) if begin else -1]
        if begin + 1 < len(nodes):
            shared[begin + 1] = _shared_prefix(nodes[begin + 1].name, parent.name)
    return nodes[0]


def _shared_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of `a` and `b` which ends in `/` (0 if none)."""
    if len(a) > len(b):
        a, b = b, a
    length = 0
    while (slash := a.find("/", length)) != -1 and a[: slash + 1] == b[: slash + 1]:
        length = slash + 1
    return length


def _hoist(node: Node) -> None:
    """Bottom-up, give each directory its children's common fields and remove those from the children."""
    if not node.is_dir:
        return
    for child in node.children:
        _hoist(child)
    name = node.name
    # Siblings often differ only in name (and suspend): intersect and subtract such a run once.
    keys = [_fields_key(child.spec) for child in node.children]
    for i, child in enumerate(node.children):
        if i == 0:
            node.delete, node.spec = child.delete, journalspec.copy(child.spec)
        else:
            if node.delete != child.delete:
                node.delete = None
            if i == 1 or keys[i] != keys[i - 1]:  # Else intersecting with the same fields again is a no-op.
                node.spec = journalspec.intersect(node.spec, child.spec)
    node.spec.name = name
    node.spec.ClearField("suspend")
    previous: pb.JournalSpec | None = None
    for i, child in enumerate(node.children):
        if node.delete is not None:
            child.delete = None
        if previous is not None and keys[i] == keys[i - 1]:
            # subtract() keeps the child's own name and suspend, and computes the rest from the same fields.
            out = journalspec.copy(previous)
            out.name = child.spec.name
            out.ClearField("suspend")
            if child.spec.HasField("suspend"):
                out.suspend.CopyFrom(child.spec.suspend)
            child.spec = out
        else:
            child.spec = journalspec.subtract(child.spec, node.spec)
        previous = child.spec


def _fields_key(spec: pb.JournalSpec) -> bytes:
    """The spec's fields other than name and suspend, as comparable bytes."""
    rest = journalspec.copy(spec)
    rest.name = ""
    rest.ClearField("suspend")
    return rest.SerializeToString(deterministic=True)


# Encoding.


def dump(node: Node) -> str:
    """Encode a tree as YAML, omitting unset fields (so a hoisted tree round-trips through `load`)."""
    encoded = _encode_node(node)
    fast = _Emitter.dump(encoded)
    if fast is not None:
        return fast
    yaml = YAML(typ="rt")
    yaml.width = 4096  # Never fold long names or store URLs.
    out = io.StringIO()
    yaml.dump(encoded, out)
    return out.getvalue()


class _Unsupported(Exception):
    pass


class _Emitter:
    """The block YAML ruamel writes for an encoded tree, written directly (ruamel takes seconds for
    10,000 journals), for trees whose strings all print plain; None (use ruamel) for any other value."""

    _PLAIN = re.compile(r"[A-Za-z0-9_/][A-Za-z0-9_./:=?&%+@~-]*")
    _resolver = VersionedResolver()

    def __init__(self) -> None:
        self.out: list[str] = []

    @classmethod
    def dump(cls, doc: CommentedMap) -> str | None:
        emitter = cls()
        try:
            emitter.mapping(doc, "", "")
        except _Unsupported:
            return None
        return "".join(emitter.out)

    def mapping(self, doc: CommentedMap, first: str, indent: str) -> None:
        """Write `doc`'s items, the first after `first` (e.g. a sequence's `- `), the others at `indent`."""
        if not doc:
            raise _Unsupported
        lead = first
        for key, value in doc.items():
            if isinstance(value, CommentedMap):
                self.out.append(f"{lead}{key}:\n")
                self.mapping(value, indent + "  ", indent + "  ")
            elif isinstance(value, CommentedSeq):
                if not value:
                    raise _Unsupported
                self.out.append(f"{lead}{key}:\n")
                for item in value:
                    if isinstance(item, CommentedMap):
                        self.mapping(item, indent + "- ", indent + "  ")
                    else:
                        self.out.append(f"{indent}- {self.scalar(item)}\n")
            else:
                self.out.append(f"{lead}{key}: {self.scalar(value)}\n")
            lead = indent

    def scalar(self, value: object) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            return str(value)
        if isinstance(value, DoubleQuotedScalarString) and value == "":
            return '""'
        if (
            type(value) is str
            and self._PLAIN.fullmatch(value)
            and not value.endswith(":")
            and self._resolver.resolve(ScalarNode, value, (True, False)) == "tag:yaml.org,2002:str"
        ):
            return value
        raise _Unsupported


def _encode_node(node: Node) -> CommentedMap:
    out = CommentedMap()
    spec = node.spec
    if node.comment:
        out["comment"] = node.comment
    if node.delete is not None:
        out["delete"] = node.delete
    if spec.name:
        out["name"] = spec.name
    if spec.replication:
        out["replication"] = spec.replication
    if spec.labels.labels:
        out["labels"] = CommentedSeq(_encode_label(label) for label in spec.labels.labels)
    fragment = _encode_fragment(spec.fragment, node.stores_set)
    if fragment:
        out["fragment"] = fragment
    if spec.flags:
        out["flags"] = _enum_name(pb.JournalSpec.Flag, spec.flags)
    if spec.max_append_rate:
        out["max_append_rate"] = spec.max_append_rate
    if spec.suspend.level or spec.suspend.offset:
        suspend = CommentedMap()
        if spec.suspend.level:
            suspend["level"] = _enum_name(pb.JournalSpec.Suspend.Level, spec.suspend.level)
        if spec.suspend.offset:
            suspend["offset"] = spec.suspend.offset
        out["suspend"] = suspend
    if node.revision:
        out["revision"] = node.revision
    if node.children:
        out["children"] = CommentedSeq(_encode_node(child) for child in node.children)
    return out


def _encode_label(label: pb.Label) -> CommentedMap:
    out = CommentedMap()
    out["name"] = label.name
    out["value"] = label.value or DoubleQuotedScalarString("")
    if label.prefix:
        out["prefix"] = True
    return out


def _encode_fragment(frag: pb.JournalSpec.Fragment, stores_set: bool) -> CommentedMap:
    out = CommentedMap()
    if frag.length:
        out["length"] = frag.length
    if frag.compression_codec:
        out["compression_codec"] = _enum_name(pb.CompressionCodec, frag.compression_codec)
    if frag.stores or stores_set:
        out["stores"] = CommentedSeq(frag.stores)
    for key in FRAGMENT_DURATIONS:
        ns = from_proto(getattr(frag, key))
        if ns:
            out[key] = format_duration(ns)
    if frag.path_postfix_template:
        out["path_postfix_template"] = frag.path_postfix_template
    return out


def _enum_name(enum: Any, number: int) -> str | int:
    """The enum value's name, or its number if it has none."""
    try:
        return str(enum.Name(number))
    except ValueError:
        return number
