"""`gazctl journals append`: append an input to journals, whole or record by record."""

from __future__ import annotations

import io
import logging
import sys
from typing import Annotated

import typer

from gazctl.appending import Framing, Mapping, Totals, append_input, check_options
from gazctl.commands.common import BrokerAddressOption, LogFormatOption, LogLevelOption, reported, setup
from gazctl.commands.journals._app import app
from gazctl.errors import GazctlError
from gazctl.selectors import RequiredSelectorOption, require_selector

log = logging.getLogger("gazctl")


@app.command("append")
def append_command(
    ctx: typer.Context,
    selector: RequiredSelectorOption = "",
    input_path: Annotated[
        str, typer.Option("--input", "-i", help="Input file path; '-' reads stdin")
    ] = "-",
    framing: Annotated[
        Framing,
        typer.Option(
            "--framing",
            "-f",
            help="Framing of records in the input: none (the whole input is one record), lines, or fixed"
            " (Gazette's 8-byte fixed-frame header, then the payload)",
            case_sensitive=False,
        ),
    ] = Framing.none,
    mapping: Annotated[
        Mapping,
        typer.Option(
            "--mapping",
            "-m",
            help="Mapping of records to journals: random; modulo or rendezvous of a partition key preceding each"
            " record; or direct, by a journal name preceding each record",
            case_sensitive=False,
        ),
    ] = Mapping.random,
    base64_keys: Annotated[
        bool, typer.Option("--base64", help="Partition keys (and direct journal names) are base64 (lines framing only)")
    ] = False,
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Append content to one or more journals of a --selector.

    With --framing none (which needs --mapping random) the whole input is appended atomically to
    one random journal of the selector; `-l name=my/journal` picks one journal. With lines or
    fixed framing each record is appended whole, with its delimiter (newline or fixed-frame
    header), and records of one journal keep their input order.

    With --mapping modulo or rendezvous each record is preceded by a partition key in the same
    framing (e.g. 'key\\nrecord\\n'), which picks its journal among the selected ones in name
    order, as Gazette's mapping functions do. With direct, each record is preceded by the name of
    its journal, which must be one of the selector's. --log.level debug shows each decision, and
    info the records and bytes appended to each journal.

    An input error (e.g. a truncated last record) fails naming the record and its input offset,
    after appending the whole records before it.
    """
    with reported():
        settings = setup(ctx, broker_address, log_level, log_format)
        parsed = require_selector(selector)
        check_options(framing, mapping, base64_keys)
        source = "stdin" if input_path == "-" else input_path
        stream = _open(input_path)
        try:
            totals = settings.run(
                lambda client: append_input(
                    client, parsed, stream, framing=framing, mapping=mapping, base64_keys=base64_keys,
                    selector_text=selector, source=source,
                )
            )
        finally:
            if stream is not sys.stdin.buffer:
                stream.close()
        _log_totals(totals)


def _open(path: str) -> io.BufferedIOBase:
    if path == "-":
        stdin: io.BufferedIOBase = sys.stdin.buffer  # type: ignore[assignment]
        return stdin
    try:
        return open(path, "rb")  # Closed by the caller, after the append.
    except OSError as err:
        raise GazctlError(f"cannot open --input {path!r}: {err.strerror}") from None


def _log_totals(totals: dict[str, Totals]) -> None:
    for journal, t in sorted(totals.items()):
        log.info("appended", extra={"journal": journal, "records": t.records, "bytes": t.bytes})
