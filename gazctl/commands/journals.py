"""`gazctl journals`: list journals and apply journalspace spec trees."""

from __future__ import annotations

import logging
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from google.protobuf import text_format
from rich.console import Console

from broker.protocol import pb
from broker.protocol.validation import validate_list_request
from gazctl.client import apply_in_batches, journal_client, list_journals
from gazctl.commands.common import (
    BrokerAddressOption,
    LogFormatOption,
    LogLevelOption,
    reported,
    setup,
)
from gazctl.errors import GazctlError
from gazctl.listing import table, to_json, to_yaml
from gazctl.selectors import parse_selector
from gazctl.specs import journalspace

log = logging.getLogger("gazctl")

app = typer.Typer(
    name="journals",
    help="Interact with broker journals.",
    no_args_is_help=True,
    add_completion=False,
)


class ListFormat(StrEnum):
    """Output formats of `journals list`."""

    table = "table"
    yaml = "yaml"
    json = "json"


@app.command("list")
def list_command(
    ctx: typer.Context,
    selector: Annotated[
        str,
        typer.Option("--selector", "-l", help="Label selector of journals, e.g. 'topic=foo,prefix=a/b/'"),
    ] = "",
    output: Annotated[
        ListFormat, typer.Option("--format", "-o", help="Output format", case_sensitive=False)
    ] = ListFormat.table,
    primary: Annotated[bool, typer.Option("--primary", "-p", help="Show the primary broker (table)")] = False,
    replicas: Annotated[bool, typer.Option("--replicas", "-r", help="Show replica brokers (table)")] = False,
    rf: Annotated[bool, typer.Option("--rf", help="Show the replication factor (table)")] = False,
    stores: Annotated[bool, typer.Option("--stores", help="Show the first fragment store (table)")] = False,
    label_columns: Annotated[
        list[str] | None,
        typer.Option("--label-columns", "-L", help="Show a column of this label's values (repeatable; table)"),
    ] = None,
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """List journals matching a selector, as a table, a journalspace YAML tree (with revisions), or JSON.

    `list --format yaml` output is valid input of `apply`: applying it unchanged is a no-op.
    """
    with reported():
        settings = setup(ctx, broker_address, log_level, log_format)
        request = pb.ListRequest(selector=_selector(selector))
        with journal_client(settings.target) as stub:
            resp = list_journals(stub, request.selector)
        if output is ListFormat.yaml:
            sys.stdout.write(to_yaml(resp))
        elif output is ListFormat.json:
            sys.stdout.write(to_json(resp) + "\n")
        else:
            _stdout_console().print(
                table(resp, rf=rf, primary=primary, replicas=replicas, stores=stores, label_columns=label_columns or ())
            )


@app.command("apply")
def apply_command(
    ctx: typer.Context,
    specs: Annotated[str, typer.Option("--specs", help="Journalspace YAML file to apply, or '-' for stdin")] = "-",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the ApplyRequest (proto text) instead of applying it")
    ] = False,
    max_txn_size: Annotated[
        int,
        typer.Option(
            "--max-txn-size",
            min=0,
            help="Apply in transactions of at most this many changes (0: one transaction)",
        ),
    ] = 0,
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Apply a journalspace YAML tree: create, update and delete journals.

    Each journal is checked against its `revision` (0: must not exist yet; -1: any revision).
    With --max-txn-size, batches are separate transactions: a failed batch leaves earlier ones applied.
    """
    with reported():
        settings = setup(ctx, broker_address, log_level, log_format)
        text, file = _read_specs(specs)
        changes = [journalspace.change(flat) for flat in journalspace.flatten(journalspace.load(text, file))]
        if dry_run:
            sys.stdout.write(text_format.MessageToString(pb.ApplyRequest(changes=changes)))
            return
        with journal_client(settings.target) as stub:
            resp = apply_in_batches(stub, changes, max_txn_size)
        log.info("successfully applied", extra={"revision": resp.header.etcd.revision, "changes": len(changes)})


def _selector(text: str) -> pb.LabelSelector:
    try:
        selector = parse_selector(text) if text else pb.LabelSelector()
        validate_list_request(pb.ListRequest(selector=selector))
    except ValueError as err:  # SelectorError and ValidationError.
        raise GazctlError(f"invalid --selector {text!r}: {err}") from None
    return selector


def _read_specs(specs: str) -> tuple[str, str]:
    """Return the text of the specs file (or stdin, for `-`) and its name for error messages."""
    if specs == "-":
        return sys.stdin.read(), "<stdin>"
    try:
        return Path(specs).read_text(encoding="utf-8"), specs
    except (OSError, UnicodeDecodeError) as err:
        raise GazctlError(f"cannot read --specs {specs}: {err}") from None


def _stdout_console() -> Console:
    """A console for data on stdout; when not a terminal, wide enough never to fold a cell."""
    console = Console(file=sys.stdout, highlight=False)
    if not console.is_terminal:
        console = Console(file=sys.stdout, highlight=False, width=1 << 16)
    return console
