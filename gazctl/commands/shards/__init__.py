"""`gazctl shards`: consumer shards through the Shard API of a `gazette consume` process.

- specs: `list` (with `--lag`), `apply`, `edit`
- unassign: `unassign`
- recovery: `prune`, `recover` (recovery logs, through shards' hints)
"""

from gazctl.commands.shards import recovery, specs, unassign
from gazctl.commands.shards._app import app

__all__ = ["app", "recovery", "specs", "unassign"]
