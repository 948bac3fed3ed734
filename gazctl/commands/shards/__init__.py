"""`gazctl shards`: consumer shards through the Shard API of a `gazette consume` process.

- specs: `list`, `apply`
- unassign: `unassign`
"""

from gazctl.commands.shards import specs, unassign
from gazctl.commands.shards._app import app

__all__ = ["app", "specs", "unassign"]
