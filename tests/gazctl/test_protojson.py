"""gazctl.protojson against json_format.MessageToDict: the same values, keys in field-number order."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from broker.protocol import pb
from consumer.protocol import pb as cpb
from gazctl.protojson import MessageDicts, message_to_dict


def reference(message: Message, with_defaults: bool) -> Any:
    """MessageToDict, with each message's keys put in field-number order."""
    doc = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=with_defaults
    )
    return ordered(message.DESCRIPTOR, doc)


def ordered(descriptor: Any, doc: Any) -> Any:
    if not isinstance(doc, dict) or descriptor.full_name.startswith("google.protobuf."):
        return doc
    out = {}
    for field in sorted(descriptor.fields, key=lambda f: f.number):
        if field.name in doc:
            value, sub = doc[field.name], field.message_type
            if sub is not None and not sub.GetOptions().map_entry:
                value = [ordered(sub, v) for v in value] if isinstance(value, list) else ordered(sub, value)
            out[field.name] = value
    return out


def journal_listing(n: int) -> pb.ListResponse:
    resp = pb.ListResponse()
    for i in range(n):
        j = resp.journals.add(mod_revision=100 + i)
        j.spec.name = f"topic/part-{i:03d}"
        j.spec.replication = 3
        j.spec.labels.labels.add(name="topic", value="topic")
        j.spec.fragment.length = 1 << 29
        j.spec.fragment.compression_codec = pb.SNAPPY
        j.spec.fragment.stores.append("s3://bucket/")
        j.spec.fragment.refresh_interval.seconds = 300
        j.route.members.add(zone="a", suffix="broker")
        j.route.primary = i % 2 - 1  # -1: no primary, a field at a non-default value.
    return resp


def test_documents_equal_message_to_dict_in_field_order() -> None:
    shards = cpb.ListResponse()
    for i in range(3):
        s = shards.shards.add(mod_revision=i)
        s.spec.id = f"shard-{i}"
        s.spec.sources.add(journal=f"j/{i}", min_offset=i)
        s.spec.max_txn_duration.nanos = 50_000_000
        s.status.add(code=cpb.ReplicaStatus.PRIMARY, errors=["x"] if i else [])
        s.status.add(code=99)  # type: ignore[arg-type]  # A value this schema does not name: its number.
    checkpoint = cpb.Checkpoint()  # Maps, of scalars and of messages.
    checkpoint.sources["j/1"].read_through = 7
    checkpoint.ack_intents["j/2"] = b"\x00ack"
    for message in (journal_listing(4), shards, checkpoint, pb.ListResponse()):
        for with_defaults in (False, True):
            got = message_to_dict(message, with_defaults=with_defaults)
            assert json.dumps(got) == json.dumps(reference(message, with_defaults)), (message, with_defaults)


def test_equal_sub_messages_are_converted_once_and_shared() -> None:
    dicts = MessageDicts()
    listing = journal_listing(3)
    docs = [dicts.of(j.spec) for j in listing.journals]
    assert docs[0]["fragment"] is docs[1]["fragment"] is docs[2]["fragment"]
    assert docs[0]["name"] != docs[1]["name"]
    assert docs[0]["fragment"]["refresh_interval"] == "300s"  # A Duration is its JSON string.
