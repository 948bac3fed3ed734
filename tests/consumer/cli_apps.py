"""Application objects that `gazette consume` can load by name in tests (`tests.consumer.cli_apps:app`).

`app` is a CountingApp (tests/consumer/apps.py) whose SQLite file and derived journal come from
the environment of the consumer process: $GAZETTE_TEST_COUNTS_DB (created with its tables when
missing) and $GAZETTE_TEST_DERIVED (no derived messages when unset). `recorded_app` is a RecordedCountingApp
mirroring its state to $GAZETTE_TEST_STATE_DIR, in the store $GAZETTE_TEST_STORE names.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from consumer.stores import SQLStore
from tests.consumer.apps import CountingApp, RecordedCountingApp, create_tables

COUNTS_DB_ENV = "GAZETTE_TEST_COUNTS_DB"
DERIVED_ENV = "GAZETTE_TEST_DERIVED"
STATE_DIR_ENV = "GAZETTE_TEST_STATE_DIR"
STORE_ENV = "GAZETTE_TEST_STORE"


class EnvCountingApp(CountingApp):
    """A CountingApp configured from the environment; its SQLite file gets its tables on first use."""

    def __init__(self) -> None:
        derived = os.environ.get(DERIVED_ENV, "")
        super().__init__(Path(os.environ.get(COUNTS_DB_ENV, "counts.db")), derived, every=5 if derived else 1 << 62)

    async def new_store(self, shard: Any, recorder: Any) -> SQLStore:
        if not self.db.exists():
            create_tables(self.db)
        return await super().new_store(shard, recorder)


app = EnvCountingApp()

not_an_app = object()
"""An object without the Application methods."""


class EnvRecordedCountingApp(RecordedCountingApp):
    """A RecordedCountingApp mirroring its state to $GAZETTE_TEST_STATE_DIR (if set), with the store
    $GAZETTE_TEST_STORE names (json, the default, or sqlite)."""

    def __init__(self) -> None:
        state_dir = os.environ.get(STATE_DIR_ENV, "")
        super().__init__(Path(state_dir) if state_dir else None, os.environ.get(STORE_ENV) or "json")


recorded_app = EnvRecordedCountingApp()
"""Counts into a store recorded to the shard's recovery log (`tests.consumer.cli_apps:recorded_app`)."""
