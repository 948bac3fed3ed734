"""`gazctl shards list` and `apply`: shards with their status as tables, JSON, proto text and
shardspace YAML; shardspace files applied through the Shard API's Apply."""

from __future__ import annotations

import logging
import sys
from enum import StrEnum
from typing import Annotated

import typer

from broker.client import JournalClient, apply_transactions, list_journals
from broker.protocol import labels
from broker.protocol import pb as bpb
from cluster.server.logs import LogFormat
from consumer.protocol import pb
from consumer.protocol.shard_spec import recovery_log, reduce_replica_status
from gazctl import tables
from gazctl.commands.common import (
    BrokerAddressOption,
    ConsumerAddressOption,
    LogFormatOption,
    LogLevel,
    LogLevelOption,
    MaxTxnSizeOption,
    reported,
    setup,
)
from gazctl.commands.journals.specs import _read_specs
from gazctl.commands.shards._app import app
from gazctl.commands.shards.lag import fetch_lag
from gazctl.editor import edit_until_applied
from gazctl.errors import GazctlError
from gazctl.protojson import jsonpb
from gazctl.prototext import marshal_text
from gazctl.selectors import (
    RequiredShardSelectorOption,
    ShardSelectorOption,
    parse_shard_selector,
    require_shard_selector,
)
from gazctl.shard_client import ShardClient, run
from gazctl.specs import shardspace

log = logging.getLogger("gazctl")

NONE = "<none>"


class ListFormat(StrEnum):
    """Output formats of `shards list`."""

    table = "table"
    yaml = "yaml"
    json = "json"
    proto = "proto"


def _logging(ctx: typer.Context, log_level: LogLevel | None, log_format: LogFormat | None) -> None:
    """Configure logging from the shared options (the broker address they resolve is not used)."""
    setup(ctx, None, log_level, log_format)


@app.command("list")
def list_command(
    ctx: typer.Context,
    selector: ShardSelectorOption = "",
    output: Annotated[
        ListFormat,
        typer.Option(
            "--format",
            "-o",
            help="Output format: a table; the shardspace YAML with revisions (input of `apply`);"
            " one JSON document of the ListResponse; or its proto text",
            case_sensitive=False,
        ),
    ] = ListFormat.table,
    primary: Annotated[
        bool, typer.Option("--primary", "-p", help="Show the primary consumer and its status (table)")
    ] = False,
    replicas: Annotated[
        bool, typer.Option("--replicas", "-r", help="Show the standby consumers and their status (table)")
    ] = False,
    rf: Annotated[bool, typer.Option("--rf", help="Show the replication factor (table)")] = False,
    label_columns: Annotated[
        list[str] | None,
        typer.Option("--label-columns", "-L", help="Show a column of this label's values (repeatable; table)"),
    ] = None,
    lag: Annotated[
        bool,
        typer.Option(
            "--lag",
            help="Show the amount of unread data for each shard: a LAG column of `journal:bytes` for each journal"
            " its primary has read through (table)",
        ),
    ] = False,
    consumer_address: ConsumerAddressOption = None,
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """List shards matching a selector, with their status.

    The table shows ID and STATUS (the highest status of the shard's replicas: IDLE, BACKFILL,
    STANDBY, PRIMARY or FAILED), then the columns asked for; a member is shown as
    `consumer-id:STATUS`. With --lag, a LAG column lists `journal:bytes` for each journal the
    shard's primary has read through: the journal's write head less the shard's offset (a shard
    without a primary fails the listing, as in Gazette). --lag changes only the table.
    `list --format yaml` prints the shardspace with each shard's revision: applying it unchanged
    is a no-op, and a modified copy updates exactly what changed.
    """
    with reported():
        settings = setup(ctx, broker_address, log_level, log_format)
        parsed = parse_shard_selector(selector)
        with_lag = lag and output is ListFormat.table  # Gazette looks lag up only for its table.

        async def listing(client: ShardClient) -> tuple[pb.ListResponse, list[str]]:
            resp = await client.list(parsed)
            if not with_lag:
                return resp, []
            async with settings.client() as journals:
                return resp, await fetch_lag(client, journals, resp)

        resp, lags = run(consumer_address, listing)
        if output is ListFormat.yaml:
            sys.stdout.write(to_yaml(resp))
        elif output is ListFormat.json:
            sys.stdout.write(jsonpb(resp))  # As Gazette's: no newline after the object.
        elif output is ListFormat.proto:
            sys.stdout.write(marshal_text(resp))
        else:
            headers, rows = table_cells(resp, rf, primary, replicas, label_columns or ())
            if with_lag:
                headers.append("Lag")
                for row, cell in zip(rows, lags, strict=True):
                    row.append(cell)
            sys.stdout.write(tables.render(headers, rows))
        sys.stdout.flush()


def table_cells(
    resp: pb.ListResponse, rf: bool, primary: bool, replicas: bool, label_columns: tuple[str, ...] | list[str]
) -> tuple[list[str], list[list[str]]]:
    """The headers and rows of the table, as Gazette's `shards list` (`cmd/gazctl/gazctlcmd/shards_list.go`)."""
    headers = ["ID", "Status"]
    for on, header in ((rf, "RF"), (primary, "Primary"), (replicas, "Replicas")):
        if on:
            headers.append(header)
    headers.extend(label_columns)
    rows = []
    for shard in resp.shards:
        status = pb.ReplicaStatus()
        primary_cell, replica_cells = NONE, []
        for i, member in enumerate(shard.route.members):
            cell = member.suffix
            if i < len(shard.status):
                cell += ":" + pb.ReplicaStatus.Code.Name(shard.status[i].code)
                status = reduce_replica_status(status, shard.status[i])
            if i == shard.route.primary:
                primary_cell = cell
            else:
                replica_cells.append(cell)
        row = [shard.spec.id, pb.ReplicaStatus.Code.Name(status.code)]
        if rf:
            row.append("0" if shard.spec.disable else str(shard.spec.hot_standbys + 1))
        if primary:
            row.append(primary_cell)
        if replicas:
            row.append(",".join(replica_cells))
        for name in label_columns:
            values = labels.values_of(shard.spec.labels, name)
            row.append(",".join(values) if values else NONE)
        rows.append(row)
    return headers, rows


async def missing_journals(client: JournalClient, flats: list[shardspace.FlatShard]) -> list[tuple[str, str, str]]:
    """(shard id, YAML key, journal) of each source or recovery-log journal of an upserted shard
    that does not exist, in file order."""
    exists = {journal.spec.name for journal in (await list_journals(client, bpb.LabelSelector())).journals}
    out = []
    for flat in flats:
        if flat.delete:
            continue
        for source in flat.spec.sources:
            if source.journal not in exists:
                out.append((flat.spec.id, "sources", source.journal))
        log_name = recovery_log(flat.spec)
        if log_name and log_name not in exists:
            out.append((flat.spec.id, "recovery_log_prefix", log_name))
    return out


def to_yaml(resp: pb.ListResponse) -> str:
    """The shards as a shardspace: common fields hoisted, each shard with its mod revision."""
    return shardspace.dump(shardspace.hoist((s.spec, s.mod_revision) for s in resp.shards))


@app.command("apply")
def apply_command(
    ctx: typer.Context,
    specs: Annotated[str, typer.Option("--specs", help="Shardspace YAML file to apply, or '-' for stdin")] = "-",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the ApplyRequest (proto text) instead of applying it")
    ] = False,
    max_txn_size: MaxTxnSizeOption = 0,
    check_journals: Annotated[
        bool,
        typer.Option(
            "--check-journals/--no-check-journals",
            help="Refuse shards whose source or recovery-log journals do not exist (asks the broker)",
        ),
    ] = True,
    consumer_address: ConsumerAddressOption = None,
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Apply a shardspace YAML: create, update and delete shards.

    The file has a `common` spec, whose fields each shard inherits unless it sets them, and a list
    of `shards`. Each shard is checked against its `revision` (0 or absent: it must not exist yet;
    -1: any revision; N: its current revision must be N); `delete: true` deletes it. Every shard
    is validated before anything is sent. Without --max-txn-size all changes are one transaction;
    with it, each batch is its own, and a failed batch leaves the ones before it applied.
    """
    with reported():
        settings = setup(ctx, broker_address, log_level, log_format)
        text, file = _read_specs(specs)
        flats = shardspace.load_flat(text, file)
        if check_journals:
            missing = settings.run(lambda client: missing_journals(client, flats))
            if missing:
                shard_id, key, journal = missing[0]
                what = "source" if key == "sources" else "recovery log"
                raise shardspace.error_at(
                    text, file, shard_id, key,
                    f"shard {shard_id!r}: {what} journal {journal} does not exist (create it first, or pass"
                    " --no-check-journals)",
                )
        changes = [shardspace.change(flat) for flat in flats]
        if dry_run:
            sys.stdout.write(marshal_text(pb.ApplyRequest(changes=changes)))
            return
        if not changes:
            raise GazctlError(f"{file}: the shardspace has no shards to apply")
        resp = run(consumer_address, lambda client: client.apply(changes, max_txn_size))
        log.info("successfully applied", extra={
            "revision": resp.header.etcd.revision, "changes": len(changes),
            "transactions": apply_transactions(len(changes), max_txn_size),
        })


@app.command("edit")
def edit_command(
    ctx: typer.Context,
    selector: RequiredShardSelectorOption = "",
    max_txn_size: MaxTxnSizeOption = 0,
    consumer_address: ConsumerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Edit the specs of the selected shards in an editor, then apply them.

    The shards are listed as a shardspace YAML (as `list --format yaml` prints it) and opened in
    $GAZ_EDITOR, else $EDITOR, else vi. Saving applies it, checked against each shard's revision.
    If the apply fails, the editor opens again with the error at the top (your text and comments
    kept); saving no change, or an empty file, aborts without applying anything.
    """
    with reported():
        _logging(ctx, log_level, log_format)
        parsed = require_shard_selector(selector)
        listed = run(consumer_address, lambda client: client.list(parsed))
        if not listed.shards:
            raise GazctlError(f"no shards match --selector {selector!r}")

        def apply_text(text: str) -> tuple[int, int]:
            changes = [shardspace.change(flat) for flat in shardspace.load_flat(text, "<edited>")]
            if not changes:
                raise GazctlError("the shardspace has no shards to apply")
            resp = run(consumer_address, lambda client: client.apply(changes, max_txn_size))
            return int(resp.header.etcd.revision), len(changes)

        applied = edit_until_applied(to_yaml(listed), apply_text, name="shards")
        if applied is None:
            sys.stderr.write("edit cancelled: no changes were made\n")
            return
        revision, count = applied
        log.info("successfully applied", extra={
            "revision": revision, "changes": count, "transactions": apply_transactions(count, max_txn_size),
        })
