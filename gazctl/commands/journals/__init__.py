"""`gazctl journals`: one module per group of sub-commands, each adding its commands to `app`.

- specs: `list`, `apply`, `edit`
- read: `read`
- append: `append`
- fragments: `fragments`, `prune`
- maintenance: `reset-head`, `suspend`, `store-health`
"""

from gazctl.commands.journals import append, fragments, maintenance, read, specs
from gazctl.commands.journals._app import app

__all__ = ["app", "append", "fragments", "maintenance", "read", "specs"]
