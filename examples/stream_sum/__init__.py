"""stream-sum: Gazette's exactly-once crash-test application, in Python (Gazette's `examples/stream-sum`).

- `Chunker` publishes random streams of `Chunk`s (each ending with an empty chunk) and verifies
  each stream's `Sum` as read-committed readers see it, failing on a wrong, missing or
  duplicated sum.
- `Summer` (the consumer application; `summer` below, runnable as `gazette consume
  examples.stream_sum:summer`) folds each stream's chunks into a running CRC-64 in its store
  and publishes the final `Sum`; a chunk out of sequence fails its shard. The shard's `store`
  label chooses the store: a SQLStore (no label, or `sql`), or one recorded to the shard's
  recovery log, `sqlite` (SQLiteStore) or `json` (JSONFileStore).
- `specs` builds the journals (`<prefix>chunks/part-NNN`, `<prefix>sums/part-NNN`) and one
  summer shard per chunk partition (`python -m examples.stream_sum apply` applies both).

Both sides turn an exactly-once violation into a failure a test (or a chaos harness) detects:
a FAILED shard, or a chunker error.

Running it by hand (a broker at :8080 with its embedded etcd at :2379)::

    python -m examples.stream_sum apply --stores file:///       # journals, and shards in etcd
    STREAM_SUM_SQLITE_DIR=/tmp/sums gazette consume examples.stream_sum:summer --etcd.lease 5
    STREAM_SUM_SQLITE_DIR=/tmp/sums gazette consume examples.stream_sum:summer --etcd.lease 5
    python -m examples.stream_sum chunk --streams -1              # until Ctrl-C; exit 1 on a bad sum

then `kill -9` and restart consumers at will: a FAILED shard (`gazctl`/etcd) or a chunker exit
status 1 is an exactly-once violation. With `STREAM_SUM_POSTGRES_DSN` set, every summer shares
one PostgreSQL database instead of per-shard SQLite files (which must then be on one machine).
"""

from examples.stream_sum import crc64
from examples.stream_sum.chunker import Chunker, ChunkerError, ChunkerStats
from examples.stream_sum.messages import CHUNK_MESSAGE_TYPE, SUM_MESSAGE_TYPE, Chunk, Sum
from examples.stream_sum.specs import journal_specs, shard_specs
from examples.stream_sum.summer import OutOfSequence, Summer, SumStore

summer = Summer()
"""The application object of `gazette consume examples.stream_sum:summer`, configured from the
environment (`STREAM_SUM_POSTGRES_DSN`, `STREAM_SUM_SQLITE_DIR`, `STREAM_SUM_PREFIX`)."""

__all__ = [
    "CHUNK_MESSAGE_TYPE",
    "SUM_MESSAGE_TYPE",
    "Chunk",
    "Chunker",
    "ChunkerError",
    "ChunkerStats",
    "OutOfSequence",
    "Sum",
    "SumStore",
    "Summer",
    "crc64",
    "journal_specs",
    "shard_specs",
    "summer",
]
