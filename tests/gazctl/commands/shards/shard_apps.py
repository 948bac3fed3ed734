"""An application `gazette consume` loads in the `gazctl shards` tests
(`tests.gazctl.commands.shards.shard_apps:gated_app`).

`gated_app` counts messages as `tests.support.cli_apps:app` does (its SQLite file is
$GAZETTE_TEST_COUNTS_DB), but while the file $GAZETTE_TEST_GATE names exists it begins no
transaction: a consumer that has fallen behind its source journals for exactly as long as a test
says, with its last transaction committed (so its read-through offset holds still).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from tests.support.cli_apps import EnvCountingApp

GATE_ENV = "GAZETTE_TEST_GATE"


class GatedCountingApp(EnvCountingApp):
    """An EnvCountingApp whose transactions wait to begin while the gate file exists."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = os.environ.get(GATE_ENV, "")

    async def begin_txn(self, shard: Any, store: Any) -> None:
        while self.gate and os.path.exists(self.gate):
            await asyncio.sleep(0.05)


gated_app = GatedCountingApp()
