"""word-count: Gazette's n-gram counting example, in Python (Gazette's `examples/word-count`).

- `Counter` (the consumer application; `counter` below, runnable as `gazette consume
  examples.word_count:counter`) keeps running n-gram counts in a SQLite store recorded to each
  shard's recovery log, and serves the `word_count.NGram` gRPC API (Publish, Query) and its HTTP
  equivalent on the consumer's port (`init_application`; see docs/consumers.md, "Building APIs").
  Query is answered by the shard's primary: a process that is not proxies it there.
- `NGramCount` (messages): the protobuf message of word_count.proto, fixed-framed.
- `specs`: the delta partitions (`<prefix>deltas/part-NNN`), the recovery logs and one shard per
  partition (`python -m examples.word_count apply`).
- `client`: `python -m examples.word_count publish|query`.

Running it by hand (a broker at :8080 with its embedded etcd at :2379)::

    python -m examples.word_count apply --stores file:///
    gazette consume examples.word_count:counter --consumer.port 8081
    gazette consume examples.word_count:counter --consumer.port 8082
    python -m examples.word_count publish "How much wood would a wood chuck chuck"
    python -m examples.word_count query "wood chuck" --consumer.address http://localhost:8082
    curl 'http://localhost:8081/word_count/query?prefix=wood'
"""

from examples.word_count.counter import Counter, CountStore, n_grams, tokenize
from examples.word_count.messages import MESSAGE_TYPE, NGramCount
from examples.word_count.specs import journal_specs, shard_specs

counter = Counter()
"""The application object of `gazette consume examples.word_count:counter`, configured from the
environment (`WORD_COUNT_N`, `WORD_COUNT_PREFIX`)."""

__all__ = [
    "MESSAGE_TYPE",
    "CountStore",
    "Counter",
    "NGramCount",
    "counter",
    "journal_specs",
    "n_grams",
    "shard_specs",
    "tokenize",
]
