"""`gazctl shards unassign`: remove shards' primary (or only failed) assignments, so the allocator
assigns them again, through the Shard API's Unassign."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from gazctl.commands.common import ConsumerAddressOption, LogFormatOption, LogLevelOption, reported, setup
from gazctl.commands.shards._app import app
from gazctl.selectors import RequiredShardSelectorOption, require_shard_selector
from gazctl.shard_client import ShardClient, run

log = logging.getLogger("gazctl")

BATCH = 100
"""Shards per Unassign request, as Gazette's gazctl."""


@app.command("unassign")
def unassign_command(
    ctx: typer.Context,
    selector: RequiredShardSelectorOption = "",
    failed: Annotated[
        bool, typer.Option("--failed", help="Only remove FAILED assignments (of primaries and standbys)")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print which shards would be unassigned, and change nothing")
    ] = False,
    consumer_address: ConsumerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Unassign the selected shards: remove their primary assignment, and every FAILED one.

    The allocator then assigns them again (a standby usually takes over as primary). With
    --failed only FAILED assignments are removed, so healthy shards are left alone. The IDs of
    the shards unassigned (or, with --dry-run, that would be) are printed one a line.
    """
    with reported():
        setup(ctx, None, log_level, log_format)
        parsed = require_shard_selector(selector)

        async def work(client: ShardClient) -> list[str]:
            listed = await client.list(parsed)
            ids = [shard.spec.id for shard in listed.shards]
            done: list[str] = []
            for begin in range(0, len(ids), BATCH):
                resp = await client.unassign(ids[begin : begin + BATCH], only_failed=failed, dry_run=dry_run)
                done.extend(resp.shards)
            return done

        unassigned = run(consumer_address, work)
        for shard_id in unassigned:
            sys.stdout.write(shard_id + "\n")
        verb = "would unassign" if dry_run else "unassigned"
        sys.stderr.write(f"{verb} {len(unassigned)} shard{'' if len(unassigned) == 1 else 's'}\n")
