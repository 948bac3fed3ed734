"""Renderings of a journals ListResponse: a table, stable JSON, and the hoisted journalspace YAML."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from rich import box
from rich.table import Table
from rich.text import Text

from broker.protocol import labels, pb
from gazctl.specs import journalspace

NONE = "<none>"
SUSPENDED = " <S>"


def table(
    resp: pb.ListResponse,
    rf: bool = False,
    primary: bool = False,
    replicas: bool = False,
    stores: bool = False,
    label_columns: Sequence[str] = (),
) -> Table:
    """Return a table of journals: Name, then RF, Primary, Replicas, Stores and label columns if asked."""
    out = Table(box=box.ASCII, show_edge=True, highlight=False)
    out.add_column("NAME", overflow="fold")
    for on, header in ((rf, "RF"), (primary, "PRIMARY"), (replicas, "REPLICAS"), (stores, "STORES")):
        if on:
            out.add_column(header, overflow="fold")
    for name in label_columns:
        out.add_column(name.upper(), overflow="fold")

    for journal in resp.journals:
        spec, route = journal.spec, journal.route
        row = [spec.name]
        if rf:
            row.append(str(spec.replication))
        if primary:
            cell = route.members[route.primary].suffix if 0 <= route.primary < len(route.members) else NONE
            row.append(cell + (SUSPENDED if spec.suspend.level != pb.JournalSpec.Suspend.NONE else ""))
        if replicas:
            row.append(",".join(m.suffix for i, m in enumerate(route.members) if i != route.primary))
        if stores:
            row.append(spec.fragment.stores[0] if spec.fragment.stores else NONE)
        for name in label_columns:
            values = labels.values_of(spec.labels, name)
            row.append(",".join(values) if values else NONE)
        out.add_row(*(Text(cell) for cell in row))
    return out


def to_yaml(resp: pb.ListResponse) -> str:
    """Return the journals as the minimal journalspace tree, with each journal's mod revision."""
    return journalspace.dump(journalspace.hoist((j.spec, j.mod_revision) for j in resp.journals))


def to_json(resp: pb.ListResponse) -> str:
    """Return one JSON object of the response: proto field names, defaults included, in field order."""
    doc = json_format.MessageToDict(resp, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return json.dumps(_in_field_order(resp.DESCRIPTOR, doc))


def _in_field_order(descriptor: Descriptor, doc: dict[str, Any]) -> dict[str, Any]:
    """Reorder the keys of a MessageToDict result by field number, recursively."""
    out: dict[str, Any] = {}
    for field in sorted(descriptor.fields, key=lambda f: f.number):
        if field.name not in doc:
            continue
        value = doc[field.name]
        sub = field.message_type
        if sub is not None and field.type == FieldDescriptor.TYPE_MESSAGE and not _is_wkt(sub):
            if isinstance(value, list):
                value = [_in_field_order(sub, v) for v in value]
            elif isinstance(value, dict):
                value = _in_field_order(sub, value)
        out[field.name] = value
    return out


def _is_wkt(descriptor: Descriptor) -> bool:
    return descriptor.full_name.startswith("google.protobuf.")
