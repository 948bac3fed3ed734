"""The `gazctl journals` Typer app, which each command module of this package adds its commands to."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="journals",
    help="Interact with broker journals: list, apply and edit specs; read, append; fragments and maintenance.",
    no_args_is_help=True,
    add_completion=False,
)
