"""Renderings of a journals ListResponse: Gazette's table and JSON, and the hoisted journalspace YAML."""

from __future__ import annotations

from collections.abc import Sequence

from broker.protocol import labels, pb
from gazctl import tables
from gazctl.protojson import jsonpb
from gazctl.specs import journalspace

NONE = "<none>"
SUSPENDED = " <S>"


def table_text(
    resp: pb.ListResponse,
    rf: bool = False,
    primary: bool = False,
    replicas: bool = False,
    stores: bool = False,
    label_columns: Sequence[str] = (),
) -> str:
    """The table of journals Gazette's `journals list` prints (`cmd/gazctl/gazctlcmd/journals_list.go`):
    Name, then RF, Primary, Replicas, Stores and label columns if asked."""
    return tables.render(*_table_cells(resp, rf, primary, replicas, stores, label_columns))


def _table_cells(
    resp: pb.ListResponse,
    rf: bool,
    primary: bool,
    replicas: bool,
    stores: bool,
    label_columns: Sequence[str],
) -> tuple[list[str], list[list[str]]]:
    """The headers and the rows of cells of `table`."""
    headers = ["Name"]
    for on, header in ((rf, "RF"), (primary, "Primary"), (replicas, "Replicas"), (stores, "Stores")):
        if on:
            headers.append(header)
    headers.extend(label_columns)

    rows = []
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
        rows.append(row)
    return headers, rows


def to_yaml(resp: pb.ListResponse) -> str:
    """Return the journals as the minimal journalspace tree, with each journal's mod revision."""
    return journalspace.dump(journalspace.hoist((j.spec, j.mod_revision) for j in resp.journals))


def to_json(resp: pb.ListResponse) -> str:
    """The response as Gazette's `journals list -o json` writes it: gogo jsonpb with OrigName and
    EmitDefaults, one line, no newline (see `gazctl/protojson.py`)."""
    return jsonpb(resp)


