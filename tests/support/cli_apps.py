"""Application objects that `gazette consume` can load by name in tests (`tests.support.cli_apps:app`).

`app` is a CountingApp (tests/support/apps.py) whose SQLite file and derived journal come from
the environment of the consumer process: $GAZETTE_TEST_COUNTS_DB (created with its tables when
missing) and $GAZETTE_TEST_DERIVED (no derived messages when unset). `recorded_app` is a RecordedCountingApp
mirroring its state to $GAZETTE_TEST_STATE_DIR, in the store $GAZETTE_TEST_STORE names; a message
whose Key is $GAZETTE_TEST_HOLD_KEY is counted, then holds its transaction open for good, and
$GAZETTE_TEST_SQLITE_CACHE_PAGES sets a SQLiteStore's page cache (a small one spills an open
transaction's writes to the recorded database file before its commit).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from consumer.message import Envelope, Publisher
from consumer.stores import SQLiteStore, SQLStore
from tests.support.apps import CountingApp, RecordedCountingApp, create_tables

COUNTS_DB_ENV = "GAZETTE_TEST_COUNTS_DB"
DERIVED_ENV = "GAZETTE_TEST_DERIVED"
STATE_DIR_ENV = "GAZETTE_TEST_STATE_DIR"
STORE_ENV = "GAZETTE_TEST_STORE"
HOLD_KEY_ENV = "GAZETTE_TEST_HOLD_KEY"
CACHE_PAGES_ENV = "GAZETTE_TEST_SQLITE_CACHE_PAGES"


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
    $GAZETTE_TEST_STORE names (json, the default, or sqlite).

    With $GAZETTE_TEST_HOLD_KEY, a message of that Key is counted, the counts of the open
    transaction are mirrored to `<shard>.holding.json` ({"pid", "state"}), and consume_message
    then never returns: the transaction stays open, its writes in the store, until the process
    dies. $GAZETTE_TEST_SQLITE_CACHE_PAGES is a SQLiteStore's `PRAGMA cache_size` (in pages)."""

    def __init__(self) -> None:
        state_dir = os.environ.get(STATE_DIR_ENV, "")
        super().__init__(Path(state_dir) if state_dir else None, os.environ.get(STORE_ENV) or "json")
        self.hold_key = os.environ.get(HOLD_KEY_ENV, "")
        self.cache_pages = int(os.environ.get(CACHE_PAGES_ENV) or 0)

    async def new_store(self, shard: Any, recorder: Any) -> Any:
        store = await super().new_store(shard, recorder)
        if self.cache_pages and isinstance(store, SQLiteStore):
            store.execute(f"PRAGMA cache_size={self.cache_pages}")
        return store

    async def consume_message(self, shard: Any, store: Any, envelope: Envelope[Any], publisher: Publisher) -> None:
        await super().consume_message(shard, store, envelope, publisher)
        if self.hold_key and envelope.message.Key == self.hold_key:
            self._mirror(shard, "holding", self.counts(store))
            await asyncio.Event().wait()  # Holds the transaction open until the process is killed.


recorded_app = EnvRecordedCountingApp()
"""Counts into a store recorded to the shard's recovery log (`tests.support.cli_apps:recorded_app`)."""
