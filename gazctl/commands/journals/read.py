"""`gazctl journals read`: read journals of a selector into one output, whole appends at a time."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, BinaryIO

import typer
from rich.progress import Progress

from gazctl.commands.common import (
    BrokerAddressOption,
    LogFormatOption,
    LogLevelOption,
    Settings,
    progress,
    reported,
    setup,
)
from gazctl.commands.journals._app import app
from gazctl.errors import GazctlError
from gazctl.reading import ReadOptions, check_journals_exist, load_offsets, read_journals, write_offsets
from gazctl.selectors import RequiredSelectorOption, require_selector

__all__ = ["app"]

log = logging.getLogger("gazctl")


@app.command("read")
def read_command(
    ctx: typer.Context,
    selector: RequiredSelectorOption = "",
    block: Annotated[
        bool, typer.Option("--block", "-b", help="Do not exit on journal EOF; wait for new data until signaled")
    ] = False,
    tail: Annotated[
        bool, typer.Option("--tail", help="Start reading from the journal write-head (rather than offset 0)")
    ] = False,
    output: Annotated[str, typer.Option("--output", "-o", help="Output file path. Use '-' for stdout")] = "-",
    offsets: Annotated[
        str | None,
        typer.Option("--offsets", help="Path from which initial journal offsets are read at startup (must exist)"),
    ] = None,
    offsets_out: Annotated[
        str | None, typer.Option("--offsets-out", help="Path to which final journal offsets are written at exit")
    ] = None,
    file_root: Annotated[
        str | None,
        typer.Option(
            "--file-root",
            help="Filesystem path which roots the file:// fragment store: persisted fragments are read from it"
            " directly, not through a broker",
        ),
    ] = None,
    from_unix: Annotated[
        int,
        typer.Option(
            "--from", min=0, help="Skip over fragments persisted before this time, in unix seconds since epoch"
        ),
    ] = 0,
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Read the contents of one or more journals.

    Matched journals are read concurrently, and their content is multiplexed into the output
    file (or stdout) in whole-fragment chunks: so long as appends reflect whole message
    boundaries, so does the merged output. Journals suspended fully (FULL) are skipped.

    Journals are read until the write head (as of when their read began) is reached, or until
    gazctl is signaled (Ctrl-C or SIGTERM). With --block, reads wait at the write head and stream
    content as it commits, and the --selector is watched: reads start and stop as journals start
    and stop matching it.

    By default reads begin at byte offset 0. --offsets (which must exist) is a JSON mapping of
    journal name to offset at which to begin. --offsets-out is where the offsets at which reading
    stopped are written at exit (the end of content, Ctrl-C or SIGTERM); offsets of --offsets not
    read are kept. If it is the same path as --offsets, the prior file is moved to '<path>.previous'.

    With --tail, a journal not in --offsets begins at its current write head; with --block, a
    journal created after the read started is read from its beginning, as all of it is new.

    Examples:

    # Read all available journal content:
    gazctl journals read -l name=my/journal

    # Streaming read from the tail of current (and future) journals matching my-label:
    gazctl journals read -l my-label --block --tail

    # Read new content since the last invocation:
    echo "{}" > offsets.json  # Must already exist.
    gazctl journals read -l my-label -o output --offsets offsets.json --offsets-out offsets.json
    """
    with reported():
        settings = setup(ctx, broker_address, log_level, log_format)
        parsed = require_selector(selector)
        begin = load_offsets(offsets) if offsets is not None else {}
        if file_root is not None and not Path(file_root).is_dir():
            raise GazctlError(f"--file-root {file_root} is not a directory")
        options = ReadOptions(
            selector=parsed, block=block, tail=tail, begin_offsets=begin, do_not_proxy=file_root is not None,
            begin_mod_time=from_unix,
        )
        with ExitStack() as stack:
            out: BinaryIO = sys.stdout.buffer
            if output != "-":
                try:
                    out = stack.enter_context(open(output, "wb"))
                except OSError as err:
                    raise GazctlError(f"cannot open --output {output}: {err}") from None
            # A bar of journals read to their head; a --block read has no end to show progress toward.
            bar = stack.enter_context(progress()) if not block else None
            ended = asyncio.run(_read(settings, options, out, offsets, offsets_out, file_root, bar))
            if output != "-":
                out.flush()
                os.fsync(out.fileno())
        if offsets_out is not None:
            write_offsets(offsets_out, ended)


async def _read(
    settings: Settings,
    options: ReadOptions,
    out: BinaryIO,
    offsets: str | None,
    offsets_out: str | None,
    file_root: str | None,
    bar: Progress | None,
) -> dict[str, int]:
    """Check --offsets, move it aside if it is also --offsets-out, then read; return the offsets reached."""
    # Reading fragments directly (do_not_proxy) needs each journal's route: a broker outside it would refuse.
    async with settings.client(file_root=file_root, route_cache=file_root is not None) as client:
        if offsets is not None:
            await check_journals_exist(client, options.begin_offsets, offsets)
            if offsets_out is not None and Path(offsets).resolve() == Path(offsets_out).resolve():
                # Keeps the prior offsets, and shows a crash plainly (--offsets goes missing).
                os.replace(offsets, f"{offsets}.previous")
        if bar is None:
            return await read_journals(client, options, out)
        task = bar.add_task("reading journals", total=0, visible=False)
        reads = 0

        def started(journal: str) -> None:
            nonlocal reads
            reads += 1
            bar.update(task, total=reads, visible=reads > 1)  # Worth a bar only for many journals.

        def done(journal: str) -> None:
            bar.advance(task)

        return await read_journals(client, options, out, on_start=started, on_done=done)
