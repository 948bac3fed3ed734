"""`gazctl shards prune` and `recover`: the recovery logs of shards, through their hints.

`prune` deletes the fragments of recovery logs that no live file of the shards' hints (primary
and backups) has data in; `recover` plays a shard's recovery log into a local directory, to
inspect its store offline. Both read hints through the Shard API's GetHints.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from broker.client import JournalClient, JournalNotFound, fragments_request
from consumer.protocol import pb
from consumer.protocol.shard_spec import recovery_log
from consumer.recoverylog import FSMHints, Player, RecoveryLogError, pick_first_hints
from gazctl.bounded import map_bounded
from gazctl.commands.common import (
    BrokerAddressOption,
    ConsumerAddressOption,
    LogFormatOption,
    LogLevelOption,
    reported,
    setup,
)
from gazctl.commands.shards._app import app
from gazctl.errors import GazctlError
from gazctl.prune import JournalPrune, all_fragments, log_fields, prune_plans, unhinted_fragments
from gazctl.selectors import RequiredShardSelectorOption, parse_shard_selector, require_shard_selector
from gazctl.shard_client import ShardClient, run

log = logging.getLogger("gazctl")


def stored_hints(resp: pb.GetHintsResponse) -> list[FSMHints | None]:
    """The primary hints, then each backup's, None where the key holds none."""
    out: list[FSMHints | None] = [resp.primary_hints.hints if resp.primary_hints.HasField("hints") else None]
    out.extend(b.hints if b.HasField("hints") else None for b in resp.backup_hints)
    return out


@app.command("prune")
def prune_command(
    ctx: typer.Context,
    selector: RequiredShardSelectorOption = "",
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run/--no-dry-run",
            help="Perform a dry-run: list the fragments that would be deleted, and their bytes, without deleting"
            " them (--no-dry-run, the default, deletes them)",
        ),
    ] = False,
    file_root: Annotated[
        str | None,
        typer.Option(
            "--file-root",
            help="Directory the brokers' file:// stores are rooted at (their --broker.file-root); required to"
            " delete fragments of file:// stores",
            show_default=False,
        ),
    ] = None,
    consumer_address: ConsumerAddressOption = None,
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Delete the recovery-log fragments the selected shards no longer need.

    For each shard with a recovery log, its hints (the primary's, and every backup's) name the
    log segments holding live file data; a persisted fragment overlapping none of them is never
    read by a recovering replica, and is pruned. A log is left whole if any of its shard's hint
    slots is empty or has no live files, so the oldest backup sets the floor. By default this is
    a dry run: each prunable fragment is printed (`would prune`, journal, fragment, bytes, mod
    time, store) with the totals; pass --no-dry-run to delete them from their stores.
    """
    with reported():
        settings = setup(ctx, broker_address, log_level, log_format)
        parsed = require_shard_selector(selector)

        async def hints_of(client: ShardClient) -> list[tuple[str, list[FSMHints]]]:
            listed = await client.list(parsed)
            if not listed.shards:
                raise GazctlError(f"no shards match --selector {selector!r}")
            logs: list[tuple[str, list[FSMHints]]] = []
            for shard in listed.shards:
                log_name = recovery_log(shard.spec)
                if not log_name:
                    log.info("shard has no recovery log", extra={"shard": shard.spec.id})
                    continue
                hints = stored_hints(await client.get_hints(shard.spec.id))
                if any(h is None or not h.live_nodes for h in hints):
                    log.info(
                        "keeping the whole recovery log: a hint slot is empty or has no live files",
                        extra={"shard": shard.spec.id, "journal": log_name},
                    )
                    continue
                logs.append((log_name, [h for h in hints if h is not None]))
            return logs

        logs = run(consumer_address, hints_of)

        async def plan(journals: JournalClient) -> list[JournalPrune]:
            async def one(item: tuple[str, list[FSMHints]]) -> JournalPrune:
                name, hints = item
                try:
                    resp = await all_fragments(journals, fragments_request(name))
                except JournalNotFound:
                    raise GazctlError(f"recovery log {name} does not exist") from None
                try:
                    return unhinted_fragments(name, (f.spec for f in resp.fragments), hints)
                except RecoveryLogError as err:
                    raise GazctlError(f"hints of recovery log {name}: {err}") from None

            return await map_bounded(logs, one)

        plans = settings.run(plan)
        total = asyncio.run(
            prune_plans(plans, file_root or "", dry_run=dry_run, what="recovery log", verb="delete")
        )
        verb = "would prune" if dry_run else "pruned"
        sys.stderr.write(
            f"{verb} {total.fragments_pruned} of {total.fragments_total} fragments, {total.bytes_pruned} of"
            f" {total.bytes_total} bytes, of {total.journals} recovery log{'' if total.journals == 1 else 's'}\n"
        )
        log.info("finished pruning recovery logs", extra={"dry_run": dry_run, **log_fields(total)})


@app.command("recover")
def recover_command(
    ctx: typer.Context,
    shard_id: Annotated[str, typer.Option("--id", help="ID of the shard whose recovery log to play")] = "",
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir", "-d", help="Directory to play the log into (created; must not hold files)", show_default=False
        ),
    ] = None,
    consumer_address: ConsumerAddressOption = None,
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Play a shard's recovery log into a local directory, as a recovering replica would.

    Playback starts from the shard's hints (the primary's, else the newest backup's, else the
    start of the log) and ends at the log's current write head, leaving the store's files in
    --dir, e.g. to open its SQLite database offline. The running shard is not disturbed (the
    player only appends an empty write barrier to learn the head).
    """
    with reported():
        settings = setup(ctx, broker_address, log_level, log_format)
        if not shard_id:
            raise GazctlError("--id is required: the shard whose recovery log to play")
        if directory is None:
            raise GazctlError("--dir (-d) is required: the directory to play the recovery log into")
        if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
            raise GazctlError(f"--dir {directory} is not an empty directory: recover plays into a new or empty one")
        parsed = parse_shard_selector(f"id={shard_id}", "--id")

        async def hints_of(client: ShardClient) -> tuple[str, FSMHints]:
            listed = await client.list(parsed)
            if not listed.shards:
                raise GazctlError(f"shard {shard_id} does not exist")
            log_name = recovery_log(listed.shards[0].spec)
            if not log_name:
                raise GazctlError(f"shard {shard_id} has no recovery log (its spec has no recovery_log_prefix)")
            return log_name, pick_first_hints(stored_hints(await client.get_hints(shard_id)), log_name)

        log_name, hints = run(consumer_address, hints_of)

        async def play(journals: JournalClient) -> None:
            player = Player()
            player.finish_at_write_head()
            try:
                await player.play(hints, directory, journals)
            except RecoveryLogError as err:
                raise GazctlError(f"playing recovery log {log_name} of shard {shard_id}: {err}") from None

        settings.run(play)
        files = sorted(p for p in directory.rglob("*") if p.is_file())
        for path in files:
            sys.stdout.write(f"{path.relative_to(directory)}\t{path.stat().st_size}\n")
        sys.stderr.write(
            f"recovered {len(files)} file{'' if len(files) == 1 else 's'} of shard {shard_id} into"
            f" {os.fspath(directory)}\n"
        )
