"""The `gazctl shards` Typer app, which each command module of this package adds its commands to."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="shards",
    help="Interact with consumer shards: list and apply specs, unassign primaries."
    " Commands talk to a `gazette consume` process (--consumer.address).",
    no_args_is_help=True,
    add_completion=False,
)
