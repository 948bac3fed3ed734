"""`gazctl attach-uuids`: put a fresh Gazette message UUID on each line of text inputs."""

from __future__ import annotations

import enum
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import IO, Annotated

import typer

from gazctl.commands.common import reported
from gazctl.errors import GazctlError

DEFAULT_TEMPLATE = "{{.UUID}},{{.Line}}\n"
"""Ends in a newline, as Gazette's (the struct tag's `\\n` is unquoted by Go's reflect)."""
DEFAULT_MAX_LENGTH = 4 * 1024 * 1024
CLOCK_UPDATE_INTERVAL = 0.1
"""Seconds between moving the clock to wall-clock time, as Gazette's attach-uuids does."""

_ACTION = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_FIELD = re.compile(r"\s*\.(UUID|Line)\s*")

class Field(enum.Enum):
    """A field of the template."""

    UUID = "UUID"
    Line = "Line"


Part = bytes | Field
"""A template part: literal bytes, or a field."""


def parse_template(template: str) -> list[Part]:
    """Parse a --template: `{{.UUID}}` and `{{.Line}}` actions among literal text.

    The text is taken literally, as Go's text/template takes it (`cmd/gazctl/gazctlcmd/attach_uuids.go`):
    a `\\n` in the flag's value is a backslash and an `n`; a shell's `$'...\\n'` makes a newline.
    Any other `{{...}}` action raises GazctlError: only these two fields exist.
    """
    parts: list[Part] = []
    pos = 0
    for m in _ACTION.finditer(template):
        field = _FIELD.fullmatch(m.group(1))
        if field is None:
            raise GazctlError(
                f"invalid --template: unsupported action {m.group(0)!r} at character {m.start()}"
                " (only {{.UUID}} and {{.Line}} are supported)"
            )
        if m.start() > pos:
            parts.append(template[pos : m.start()].encode("utf-8"))
        parts.append(Field(field.group(1)))
        pos = m.end()
    rest = template[pos:]
    if "{{" in rest:
        raise GazctlError(f"invalid --template: unclosed action at character {pos + rest.index('{{')}")
    if rest:
        parts.append(rest.encode("utf-8"))
    return parts


def lines(stream: IO[bytes], name: str, max_length: int) -> Iterator[bytes]:
    """The lines of `stream` without their line endings (`\\n` or `\\r\\n`); the last may lack one.

    Raises GazctlError naming `name` and the line number for a line longer than `max_length` bytes.
    """
    number = 0
    while True:
        # Enough for the longest allowed line and its "\r\n": a longer one is caught without reading it all.
        line = stream.readline(max_length + 2)
        if not line:
            return
        number += 1
        if line.endswith(b"\n"):
            line = line[:-1]
        if line.endswith(b"\r"):
            line = line[:-1]
        if len(line) > max_length:
            raise GazctlError(f"{name}: line {number} is longer than --max-length ({max_length} bytes)")
        yield line


def uuid_source() -> Callable[[], bytes]:
    """A function returning a fresh committed (OUTSIDE_TXN) v1 UUID per call, as text.

    One random producer ID; a clock which ticks per UUID and follows wall-clock time.
    """
    # Imported here: the message layer (~0.1 s of imports) would otherwise slow every gazctl command.
    from consumer.message.clock import Clock
    from consumer.message.uuid import Flags, build_uuid, new_producer_id

    producer = new_producer_id()
    clock = Clock.at(time.time_ns())
    updated = time.monotonic()

    def next_uuid() -> bytes:
        nonlocal updated
        now = time.monotonic()
        if now - updated >= CLOCK_UPDATE_INTERVAL:
            clock.update()
            updated = now
        return str(build_uuid(producer, clock.tick(), Flags.OUTSIDE_TXN)).encode("ascii")

    return next_uuid


def attach(
    inputs: list[tuple[str, IO[bytes]]],
    out: IO[bytes],
    template: list[Part],
    *,
    max_length: int,
    skip_header: bool,
    next_uuid: Callable[[], bytes],
) -> int:
    """Write `template` for each line of each input to `out`; return the number of lines written."""
    written = 0
    for name, stream in inputs:
        for i, line in enumerate(lines(stream, name, max_length)):
            if i == 0 and skip_header:
                continue
            uuid = next_uuid()
            out.write(b"".join(p if isinstance(p, bytes) else uuid if p is Field.UUID else line for p in template))
            written += 1
    return written


def register(app: typer.Typer) -> None:
    """Add `attach-uuids` to the root app."""

    @app.command("attach-uuids")
    def attach_uuids_command(
        paths: Annotated[
            list[str] | None,
            typer.Argument(help="Input files, read in turn; none or '-' reads stdin", show_default=False),
        ] = None,
        template: Annotated[
            str,
            typer.Option(
                "--template",
                help="Go text/template for output: {{.UUID}} and {{.Line}} among literal text (use $'...\\n' for a"
                " newline)",
                show_default="{{.UUID}},{{.Line}} and a newline",
            ),
        ] = DEFAULT_TEMPLATE,
        max_length: Annotated[
            int, typer.Option("--max-length", min=1, help="Maximum allowed byte-length of an input line")
        ] = DEFAULT_MAX_LENGTH,
        skip_header: Annotated[
            bool, typer.Option("--skip-header", help="Omit the first line of each input file")
        ] = False,
    ) -> None:
        """Attach a fresh Gazette message UUID to each line of each input, writing them to stdout.

        Each UUID is RFC 4122 v1 compatible, made of one random producer ID for this run, a
        monotonic clock, and the committed flag (OUTSIDE_TXN), so readers process the messages
        at once. Attach UUIDs into a file, then append the file: a restarted append then repeats
        the same UUIDs, which exactly-once readers drop. Each run is a new producer, so combine
        small files first.

        Examples: prefix CSV rows with a UUID: `gazctl attach-uuids in.csv`. Postfix them:
        `--template=$'{{.Line}},{{.UUID}}\\n'`. Wrap JSON lines:
        `--template=$'{"uuid": "{{.UUID}}", "record": {{.Line}}}\\n'`. The template is taken literally,
        as Gazette's: use the shell's `$'...'` quoting for the newline.
        """
        with reported():
            parts = parse_template(template)
            with ExitStack() as stack:
                inputs: list[tuple[str, IO[bytes]]] = []
                for path in paths or ["-"]:
                    if path == "-":
                        inputs.append(("stdin", sys.stdin.buffer))
                        continue
                    try:
                        inputs.append((path, stack.enter_context(open(path, "rb"))))
                    except OSError as err:
                        raise GazctlError(f"cannot open {path!r}: {err.strerror}") from None
                attach(inputs, sys.stdout.buffer, parts, max_length=max_length, skip_header=skip_header,
                       next_uuid=uuid_source())
                sys.stdout.buffer.flush()
