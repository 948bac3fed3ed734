"""`gazctl journals list`, `apply` and `edit`: journal specs as tables, JSON, proto text and YAML trees."""

from __future__ import annotations

import logging
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from broker.client import JournalClient, apply_journals, list_journals, watch_journals
from broker.protocol import pb
from broker.specs import strict
from gazctl.commands.common import (
    BrokerAddressOption,
    LogFormatOption,
    LogLevelOption,
    MaxTxnSizeOption,
    Settings,
    reported,
    setup,
)
from gazctl.commands.journals._app import app
from gazctl.editor import edit_until_applied
from gazctl.errors import GazctlError
from gazctl.listing import table_text, to_json, to_yaml
from gazctl.prototext import marshal_text
from gazctl.selectors import RequiredSelectorOption, SelectorOption, parse_list_selector, require_selector
from gazctl.specs import journalspace

log = logging.getLogger("gazctl")


class ListFormat(StrEnum):
    """Output formats of `journals list`."""

    table = "table"
    yaml = "yaml"
    json = "json"
    proto = "proto"


@app.command("list")
def list_command(
    ctx: typer.Context,
    selector: SelectorOption = "",
    output: Annotated[
        ListFormat,
        typer.Option(
            "--format",
            "-o",
            help="Output format: a table; the journalspace YAML tree with revisions (input of `apply`);"
            " one JSON document of the ListResponse; or its proto text",
            case_sensitive=False,
        ),
    ] = ListFormat.table,
    primary: Annotated[bool, typer.Option("--primary", "-p", help="Show the primary broker (table)")] = False,
    replicas: Annotated[bool, typer.Option("--replicas", "-r", help="Show replica brokers (table)")] = False,
    rf: Annotated[bool, typer.Option("--rf", help="Show the replication factor (table)")] = False,
    stores: Annotated[bool, typer.Option("--stores", help="Show the first fragment store (table)")] = False,
    label_columns: Annotated[
        list[str] | None,
        typer.Option("--label-columns", "-L", help="Show a column of this label's values (repeatable; table)"),
    ] = None,
    watch: Annotated[
        bool, typer.Option("--watch", help="Keep running, and print the listing again each time it changes")
    ] = False,
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """List journals matching a selector, with their routes.

    The table shows NAME and the columns asked for; a suspended journal's primary is marked <S>.
    `list --format yaml` prints the minimal hoisted tree with each journal's revision: applying
    it unchanged is a no-op, and a modified copy updates exactly what changed.
    """

    def render(resp: pb.ListResponse) -> None:
        if output is ListFormat.yaml:
            sys.stdout.write(to_yaml(resp))
        elif output is ListFormat.json:
            sys.stdout.write(to_json(resp))  # As Gazette's: no newline after the object.
        elif output is ListFormat.proto:
            sys.stdout.write(marshal_text(resp))
        else:
            sys.stdout.write(table_text(
                resp, rf=rf, primary=primary, replicas=replicas, stores=stores, label_columns=label_columns or ()
            ))
        sys.stdout.flush()

    async def watch_and_render(client: JournalClient) -> None:
        first = True
        async for snapshot in watch_journals(client, parsed):
            if not first and output is ListFormat.yaml:
                sys.stdout.write("---\n")  # One YAML document per listing.
            first = False
            render(snapshot)

    with reported():
        settings = setup(ctx, broker_address, log_level, log_format)
        parsed = parse_list_selector(selector)
        if watch:
            settings.run(watch_and_render)
        else:
            render(settings.run(lambda client: list_journals(client, parsed)))


@app.command("apply")
def apply_command(
    ctx: typer.Context,
    specs: Annotated[str, typer.Option("--specs", help="Journalspace YAML file to apply, or '-' for stdin")] = "-",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the ApplyRequest (proto text) instead of applying it")
    ] = False,
    max_txn_size: MaxTxnSizeOption = 0,
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Apply a journalspace YAML tree: create, update and delete journals.

    Each journal is checked against its `revision` (0 or absent: it must not exist yet; -1: any
    revision; N: its current revision must be N). Without --max-txn-size all changes are one
    transaction: either every change applies or none does. With it, each batch is its own
    transaction, and a failed batch leaves the ones before it applied.
    """
    with reported():
        settings = setup(ctx, broker_address, log_level, log_format)
        text, file = _read_specs(specs)
        changes = _changes(text, file)
        if dry_run:
            sys.stdout.write(marshal_text(pb.ApplyRequest(changes=changes)))
            return
        revision = _apply(settings, changes, max_txn_size)
        log.info("successfully applied", extra={"revision": revision, "changes": len(changes)})


@app.command("edit")
def edit_command(
    ctx: typer.Context,
    selector: RequiredSelectorOption = "",
    max_txn_size: MaxTxnSizeOption = 0,
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Edit the specs of the selected journals in an editor, then apply them.

    The journals are listed as a journalspace YAML tree and opened in $GAZ_EDITOR, else $EDITOR,
    else vi. Saving applies the tree, checked against each journal's revision. If the apply
    fails, the editor opens again with the error at the top; saving no change, or an empty
    file, aborts without applying anything.
    """
    with reported():
        settings = setup(ctx, broker_address, log_level, log_format)
        parsed = require_selector(selector)
        listed = settings.run(lambda client: list_journals(client, parsed))
        if not listed.journals:
            raise GazctlError(f"no journals match --selector {selector!r}")

        def apply_text(text: str) -> int:
            return _apply(settings, _changes(text, "<edited>"), max_txn_size)

        revision = edit_until_applied(to_yaml(listed), apply_text)
        if revision is None:
            sys.stderr.write("edit cancelled: no changes were made\n")
            return
        log.info("successfully applied", extra={"revision": revision})


def _changes(text: str, file: str) -> list[pb.ApplyRequest.Change]:
    return [journalspace.change(flat) for flat in journalspace.load_flat(text, file)]


def _apply(settings: Settings, changes: list[pb.ApplyRequest.Change], max_txn_size: int) -> int:
    """Apply `changes` (see `apply`); return the etcd revision of the last transaction."""
    if not changes:
        raise GazctlError("the spec tree has no journals to apply")
    resp = settings.run(lambda client: apply_journals(client, changes, max_txn_size=max_txn_size))
    return int(resp.header.etcd.revision)


def _read_specs(specs: str) -> tuple[str, str]:
    """Return the text of the specs file (or stdin, for `-`) and its name for error messages."""
    if specs == "-":
        stdin = getattr(sys.stdin, "buffer", None)
        return (strict.decode_utf8(stdin.read(), "<stdin>") if stdin else sys.stdin.read()), "<stdin>"
    try:
        data = Path(specs).read_bytes()
    except OSError as err:
        raise GazctlError(f"cannot read --specs {specs}: {err.strerror or err}") from None
    return strict.decode_utf8(data, specs), specs
