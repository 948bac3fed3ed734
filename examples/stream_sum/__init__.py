"""stream-sum: Gazette's exactly-once crash-test application, in Python (consumer digest 9.4).

- `Chunker` publishes random streams of `Chunk`s (each ending with an empty chunk) and verifies
  each stream's `Sum` as read-committed readers see it, failing on a wrong, missing or
  duplicated sum.
- `Summer` (the consumer application; `summer` below, runnable as `gazette consume
  examples.stream_sum:summer`) folds each stream's chunks into a running CRC-64 in a SQLStore
  and publishes the final `Sum`; a chunk out of sequence fails its shard.
- `specs` builds the journals (`<prefix>chunks/part-NNN`, `<prefix>sums/part-NNN`) and one
  summer shard per chunk partition; `journals.yaml` is the same journalspace for gazctl.

Both sides turn an exactly-once violation into a failure a test (or a chaos harness) detects:
a FAILED shard, or a chunker error.
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
