"""Consumer stores: where a shard keeps its state and checkpoint (`consumer.store.Store`).

`SQLStore` keeps them in a SQL database through any DB-API 2 driver (PostgreSQL with psycopg 3,
or SQLite, the single-machine default), fenced by the checkpoint table's `fence` column.

Local stores keep the state on the shard's local disk, every file operation recorded to its
recovery log (and fenced by the log's author register): `JSONFileStore` (a small JSON state) and
`SQLiteStore` (a SQLite database recorded through an apsw VFS, `RecordedVFS`).
"""

from consumer.stores.errors import (
    ConsumerStoreError,
    FenceError,
    ForeignStoreError,
    StoreClosedError,
    StoreDependencyError,
)
from consumer.stores.json_file import JSONFileStore, checkpoint_from_json, checkpoint_to_json
from consumer.stores.sql import CHECKPOINT_TABLE, SQLResult, SQLStore, SQLTransaction, create_checkpoint_table
from consumer.stores.sqlite_vfs import RecordedVFS, SQLiteStore

__all__ = [
    "CHECKPOINT_TABLE",
    "ConsumerStoreError",
    "FenceError",
    "ForeignStoreError",
    "JSONFileStore",
    "RecordedVFS",
    "SQLResult",
    "SQLStore",
    "SQLTransaction",
    "SQLiteStore",
    "StoreClosedError",
    "StoreDependencyError",
    "checkpoint_from_json",
    "checkpoint_to_json",
    "create_checkpoint_table",
]
