"""`gazctl attach-uuids` (not built yet)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add `attach-uuids` to the root app."""
