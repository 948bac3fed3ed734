"""`gazctl shards prune` and `recover`: the recovery logs of shards, through their hints.

`prune` deletes the fragments of recovery logs that no live file of the shards' hints (primary
and backups) has data in; `recover` plays a shard's recovery log into a local directory, to
inspect its store offline. Both read hints through the Shard API's GetHints.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from broker.client import JournalClient
from consumer.protocol import pb
from consumer.protocol.shard_spec import recovery_log
from consumer.recoverylog import FSMHints, Player, RecoveryLogError, pick_first_hints
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
from gazctl.prune import (
    ShardsPruneMetrics,
    fold_shards,
    hint_slots,
    list_hinted_logs,
    prune_hinted_logs,
    recovery_log_stores_healthy,
)
from gazctl.selectors import RequiredShardSelectorOption, parse_shard_selector, require_shard_selector
from gazctl.shard_client import ShardClient, connect, run

log = logging.getLogger("gazctl")


def stored_hints(resp: pb.GetHintsResponse) -> list[FSMHints | None]:
    """The primary hints, then each backup's, None where the key holds none."""
    primary, backups = hint_slots(resp)
    return [primary, *backups]


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

    As Gazette's `shards prune`: each selected shard's hints (every backup's, then the primary's)
    name the log segments holding live file data, under the log each segment is in (a forked
    shard's hints name segments of the log it forked from). Their union, per log, is kept; a
    persisted fragment of a hinted log overlapping none of them is never read by a recovering
    replica, and is deleted. A shard's recovery log is left whole (with a warning if other hints
    name it) when a hint slot of the shard is empty or has no live files, or when a fragment store
    of the log is unhealthy; a fully suspended log is skipped. Select *every* shard using a log:
    the hints of a shard left out do not protect its segments. Each pruned fragment is printed
    (`pruned` or, with --dry-run, `would prune`; journal, fragment, bytes, mod time, store); the
    counts are logged at info level (--log.level=info).
    """
    with reported():
        settings = setup(ctx, broker_address, log_level, log_format)
        parsed = require_shard_selector(selector)

        async def main(journals: JournalClient) -> ShardsPruneMetrics:
            async with connect(consumer_address) as shards:
                listed = await shards.list(parsed)
                if not listed.shards:
                    raise GazctlError(f"no shards match --selector {selector!r}")
                selected = await fold_shards(
                    [(shard.spec.id, recovery_log(shard.spec)) for shard in listed.shards],
                    lambda journal: recovery_log_stores_healthy(journals, journal),
                    shards.get_hints,
                )
            logs = await list_hinted_logs(selected, journals)
            return await prune_hinted_logs(selected, logs, file_root or "", dry_run=dry_run)

        metrics = settings.run(main)
        if metrics.failed_to_remove:
            raise GazctlError(
                f"failed to remove fragments: {metrics.failed_to_remove} could not be deleted (each is warned above)"
            )


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
