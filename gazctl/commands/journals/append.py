"""`gazctl journals append` (not built yet)."""

from __future__ import annotations

from gazctl.commands.journals._app import app

__all__ = ["app"]
