"""Consumer stores: where a shard keeps its state and checkpoint (`consumer.store.Store`).

`SQLStore` keeps them in a SQL database through any DB-API 2 driver (PostgreSQL with psycopg 3,
or SQLite, the single-machine default), fenced by the checkpoint table's `fence` column.
"""

from consumer.stores.errors import FenceError, StoreClosedError, StoreDependencyError, StoreError
from consumer.stores.sql import CHECKPOINT_TABLE, SQLResult, SQLStore, SQLTransaction, create_checkpoint_table

__all__ = [
    "CHECKPOINT_TABLE",
    "FenceError",
    "SQLResult",
    "SQLStore",
    "SQLTransaction",
    "StoreClosedError",
    "StoreDependencyError",
    "StoreError",
    "create_checkpoint_table",
]
