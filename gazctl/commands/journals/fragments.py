"""`gazctl journals fragments` and `prune`: list the fragments of journals, and delete aged ones."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated

import typer

from broker.client import JournalClient, Suspended, fragments_request, list_journals
from broker.protocol import pb
from broker.protocol.validation import duration_ns
from broker.specs.durations import DurationError, parse_duration
from gazctl.bounded import map_bounded
from gazctl.commands.common import BrokerAddressOption, LogFormatOption, LogLevelOption, progress, reported, setup
from gazctl.commands.journals._app import app
from gazctl.errors import GazctlError
from gazctl.fragments_table import table_text, to_json_line
from gazctl.prototext import marshal_text
from gazctl.prune import JournalPrune, aged_fragments, all_fragments, log_fields, prune_plans
from gazctl.selectors import RequiredSelectorOption, SelectorOption, parse_list_selector, require_selector

log = logging.getLogger("gazctl")

Journal = pb.ListResponse.Journal


class FragmentsFormat(StrEnum):
    """Output formats of `journals fragments`."""

    table = "table"
    json = "json"
    proto = "proto"


@app.command("fragments")
def fragments_command(
    ctx: typer.Context,
    selector: SelectorOption = "",
    output: Annotated[
        FragmentsFormat,
        typer.Option(
            "--format",
            "-o",
            help="Output format: a humanized table; one JSON fragment per line; or each journal's"
            " FragmentsResponse as proto text",
            case_sensitive=False,
        ),
    ] = FragmentsFormat.table,
    from_unix: Annotated[
        int,
        typer.Option(
            "--from", min=0, help="Restrict to fragments created at or after this time, in unix seconds since epoch"
        ),
    ] = 0,
    to_unix: Annotated[
        int,
        typer.Option("--to", min=0, help="Restrict to fragments created before this time, in unix seconds since epoch"),
    ] = 0,
    url_ttl: Annotated[
        str,
        typer.Option(
            "--url-ttl",
            help="Provide a signed GET URL with the given TTL (a duration, e.g. 30m or 1h; 0s: no URL)",
        ),
    ] = "0s",
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """List fragments of selected journals.

    The --selector determines the journals whose fragments are listed; fully suspended journals
    are skipped. --from and --to select fragments by the modification time their store reports
    (usually when they were persisted), in Unix seconds; a fragment not yet persisted is listed
    only without --to. With --url-ttl the broker signs a GET URL of each persisted fragment, to
    read it straight from its store.
    """
    with reported():
        settings = setup(ctx, broker_address, log_level, log_format)
        parsed = parse_list_selector(selector)
        ttl = _parse_ttl(url_ttl)
        if to_unix and to_unix < from_unix:
            raise GazctlError(f"--to {to_unix} is before --from {from_unix}")

        async def fetch(client: JournalClient) -> list[pb.FragmentsResponse]:
            listed = await list_journals(client, parsed)
            journals = _unsuspended(listed.journals)
            with progress() as bar:
                task = bar.add_task("listing fragments", total=len(journals))
                return await map_bounded(
                    journals,
                    lambda j: all_fragments(
                        client,
                        fragments_request(
                            j.spec.name, begin_mod_time=from_unix, end_mod_time=to_unix, signature_ttl=ttl
                        ),
                    ),
                    done=lambda: bar.advance(task),
                )

        responses = settings.run(fetch)
        if output is FragmentsFormat.json:
            for resp in responses:
                for entry in resp.fragments:
                    sys.stdout.write(to_json_line(entry) + "\n")
        elif output is FragmentsFormat.proto:
            for resp in responses:
                sys.stdout.write(marshal_text(resp))
        else:
            sys.stdout.write(table_text(responses, now=time.time(), urls=ttl is not None))
        sys.stdout.flush()


@app.command("prune")
def prune_command(
    ctx: typer.Context,
    selector: RequiredSelectorOption = "",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List the fragments which would be pruned, without deleting them")
    ] = False,
    file_root: Annotated[
        str | None,
        typer.Option(
            "--file-root",
            help="Directory the brokers' file:// stores are rooted at (their --broker.file-root); required to"
            " prune fragments of file:// stores",
            show_default=False,
        ),
    ] = None,
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Delete fragments of matching journals which are older than their configured retention.

    A fragment is pruned when it is persisted and at least the journal's fragment.retention old
    (by its store's modification time). A journal without a retention (0s) keeps everything.
    Fragments are deleted from their stores directly. There is a caveat: several fragments may
    cover the same offsets, but brokers track only the largest of them, and prune deletes only
    tracked fragments. Smaller ones stay untouched; prune again once the brokers' fragment
    listing has refreshed. A fully suspended journal has no fragments to list: prune fails on it
    before deleting anything, as Gazette's fails on it (select journals without it). Each pruned
    fragment is printed on stdout (try it with --dry-run first), and each journal's counts are
    logged at info.
    """
    with reported():
        settings = setup(ctx, broker_address, log_level, log_format)
        parsed = require_selector(selector)
        now = time.time()

        async def collect(client: JournalClient) -> list[JournalPrune]:
            listed = await list_journals(client, parsed)
            if not listed.journals:
                raise GazctlError(f"no journals match --selector {selector!r}")

            async def one(journal: Journal) -> JournalPrune:
                try:
                    resp = await all_fragments(client, fragments_request(journal.spec.name))
                except Suspended:
                    # As Gazette's `journals prune` (`cmd/gazctl/gazctlcmd/journals_prune.go`), which exits 1 with
                    # `failed to fetch fragments err=SUSPENDED`; here nothing is deleted before it.
                    raise GazctlError(
                        f"failed to fetch fragments of journal {journal.spec.name}: SUSPENDED (it is fully suspended;"
                        " nothing was pruned)"
                    ) from None
                retention = duration_ns(journal.spec.fragment.retention) / 1e9
                if retention <= 0:
                    # Deliberately unlike Gazette's prune, which deletes every persisted fragment here.
                    log.info("journal has no retention: it keeps every fragment", extra={"journal": journal.spec.name})
                return aged_fragments(journal.spec.name, (f.spec for f in resp.fragments), retention, now)

            return await map_bounded(list(listed.journals), one)

        plans = settings.run(collect)
        total = asyncio.run(prune_plans(plans, file_root or "", dry_run=dry_run))
        log.info("finished pruning all journals", extra={"dry_run": dry_run, **log_fields(total)})


def _parse_ttl(text: str) -> float | None:
    """Parse --url-ttl into seconds; None for 0 (no signed URLs)."""
    try:
        ns = parse_duration(text)
    except DurationError as err:
        raise GazctlError(f"invalid --url-ttl {text!r}: {err}") from None
    if ns < 0:
        raise GazctlError(f"invalid --url-ttl {text!r}: must not be negative")
    return ns / 1e9 if ns else None


def _unsuspended(journals: Sequence[Journal]) -> list[Journal]:
    """The journals which are not fully suspended: those have no replicas to list fragments of."""
    out = []
    for journal in journals:
        if journal.spec.suspend.level == pb.JournalSpec.Suspend.FULL:
            log.info("skipping fully suspended journal", extra={"journal": journal.spec.name})
        else:
            out.append(journal)
    return out
