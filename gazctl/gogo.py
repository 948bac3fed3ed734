"""What Gazette's Go structs look like for its protobuf messages, where that changes what Go prints.

Gazette generates its Go types with gogoproto options (`broker/protocol/protocol.proto`,
`consumer/protocol/protocol.proto` in gazette/core) that this project's `.proto` files leave out.
Three of them change the JSON and text that gazctl prints (`gazctl/protojson.py`,
`gazctl/prototext.py`):

- `(gogoproto.nullable) = false`: the message field is a Go struct, not a pointer, so it is always
  there (jsonpb writes `{...}` rather than `null`; the text format writes `name: <...>` even when
  empty; encoding/json has no `omitempty` on it).
- `(gogoproto.stdduration) = true`: a `google.protobuf.Duration` field is a Go `time.Duration`
  (an int64 of nanoseconds): the text format skips it when zero, encoding/json writes nanoseconds.
  Every Duration of these two packages is one; only `FragmentsRequest.signatureTTL` is also nullable.
- Everything else is as protoc-gen-go makes it: singular messages are pointers (`null` when unset).
"""

from __future__ import annotations

from typing import Any

NON_NULLABLE: frozenset[str] = frozenset({
    # broker/protocol/protocol.proto
    "protocol.LabelSet.labels",
    "protocol.LabelSelector.include",
    "protocol.LabelSelector.exclude",
    "protocol.JournalSpec.labels",
    "protocol.JournalSpec.fragment",
    "protocol.JournalSpec.Fragment.refresh_interval",
    "protocol.JournalSpec.Fragment.retention",
    "protocol.JournalSpec.Fragment.flush_interval",
    "protocol.ProcessSpec.id",
    "protocol.BrokerSpec.process_spec",
    "protocol.Fragment.sum",
    "protocol.AppendResponse.header",
    "protocol.ListRequest.selector",
    "protocol.ListResponse.header",
    "protocol.ListResponse.Journal.spec",
    "protocol.ListResponse.Journal.route",
    "protocol.ListResponse.journals",
    "protocol.ApplyRequest.changes",
    "protocol.ApplyResponse.header",
    "protocol.FragmentsResponse.header",
    "protocol.FragmentsResponse._Fragment.spec",
    "protocol.FragmentsResponse.fragments",
    "protocol.Route.members",
    "protocol.Header.process_id",
    "protocol.Header.route",
    "protocol.Header.etcd",
    "protocol.FragmentStoreHealthResponse.header",
    # consumer/protocol/protocol.proto
    "consumer.ShardSpec.sources",
    "consumer.ShardSpec.max_txn_duration",
    "consumer.ShardSpec.min_txn_duration",
    "consumer.ShardSpec.labels",
    "consumer.ConsumerSpec.process_spec",
    "consumer.Checkpoint.sources",
    "consumer.Checkpoint.Source.producers",
    "consumer.Checkpoint.Source.ProducerEntry.state",
    "consumer.ListRequest.selector",
    "consumer.ListResponse.header",
    "consumer.ListResponse.shards",
    "consumer.ListResponse.Shard.spec",
    "consumer.ListResponse.Shard.route",
    "consumer.ListResponse.Shard.status",
    "consumer.ApplyRequest.changes",
    "consumer.ApplyResponse.header",
    "consumer.StatResponse.header",
    "consumer.GetHintsResponse.header",
    "consumer.GetHintsResponse.primary_hints",
    "consumer.GetHintsResponse.backup_hints",
})
"""Fields declared `(gogoproto.nullable) = false` in Gazette's protos (singular and repeated)."""

# Descriptors are typed Any: protobuf's stubs type them as two unrelated classes.
_STDDURATION_PACKAGES = ("protocol.", "consumer.")


def non_nullable(field: Any) -> bool:
    """Whether Gazette's Go struct holds the field by value (see NON_NULLABLE)."""
    return field.full_name in NON_NULLABLE


def is_duration(field: Any) -> bool:
    """Whether the field is a `google.protobuf.Duration`."""
    return field.message_type is not None and field.message_type.full_name == "google.protobuf.Duration"


def std_duration(field: Any) -> bool:
    """Whether Gazette's Go struct holds the Duration field as a `time.Duration` (stdduration)."""
    return is_duration(field) and field.full_name.startswith(_STDDURATION_PACKAGES)


def is_map(field: Any) -> bool:
    """Whether the field is a protobuf map (a Go map)."""
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def map_fields(field: Any) -> tuple[Any, Any]:
    """The key and value fields of a map field's entries."""
    entry: Any = field.message_type
    return entry.fields_by_name["key"], entry.fields_by_name["value"]


__all__ = ["NON_NULLABLE", "is_duration", "is_map", "map_fields", "non_nullable", "std_duration"]
