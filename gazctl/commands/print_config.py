"""`gazctl print-config` (not built yet)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add `print-config` to the root app."""
