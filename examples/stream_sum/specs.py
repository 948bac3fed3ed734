"""The journals and shards of stream-sum, built in Python (the YAML beside this module says the same
for `gazctl journals apply`).

Journals, under a name prefix (default `examples/stream-sum/`):

- `<prefix>chunks/part-000` … : partitions of `stream_sum.Chunk`, which chunkers publish to
  (ModuloMapping on the stream ID);
- `<prefix>sums/part-000` … : partitions of `stream_sum.Sum`, which summers publish final sums to
  (ModuloMapping on the stream ID) and chunkers verify.

All are labelled `content-type: application/x-ndjson` and `app.gazette.dev/message-type`.
Shards: one summer shard per chunk partition, `<shard prefix>part-000` … reading that partition.
"""

from __future__ import annotations

from typing import Final

from google.protobuf.duration_pb2 import Duration

from broker.protocol import labels as lbl
from broker.protocol import pb
from broker.protocol.selectors import parse_selector
from consumer.protocol import pb as cpb
from examples.stream_sum.messages import CHUNK_MESSAGE_TYPE, SUM_MESSAGE_TYPE

DEFAULT_PREFIX: Final = "examples/stream-sum/"
DEFAULT_SHARD_PREFIX: Final = "stream-sum-summer-"
CHUNKS_DIR: Final = "chunks/"
SUMS_DIR: Final = "sums/"


def partition_name(prefix: str, directory: str, index: int) -> str:
    return f"{prefix}{directory}part-{index:03d}"


def chunk_journals(prefix: str = DEFAULT_PREFIX, partitions: int = 4) -> list[str]:
    return [partition_name(prefix, CHUNKS_DIR, i) for i in range(partitions)]


def sum_journals(prefix: str = DEFAULT_PREFIX, partitions: int = 2) -> list[str]:
    return [partition_name(prefix, SUMS_DIR, i) for i in range(partitions)]


def _journal(name: str, message_type: str, replication: int) -> pb.JournalSpec:
    spec = pb.JournalSpec(name=name, replication=replication)
    spec.labels.CopyFrom(
        lbl.label_set_from_mapping({lbl.CONTENT_TYPE: lbl.CONTENT_TYPE_JSON_LINES, lbl.MESSAGE_TYPE: message_type})
    )
    spec.fragment.length = 4 * 1024 * 1024
    spec.fragment.compression_codec = pb.SNAPPY
    spec.fragment.refresh_interval.seconds = 30
    return spec


def journal_specs(
    prefix: str = DEFAULT_PREFIX, chunk_partitions: int = 4, sum_partitions: int = 2, replication: int = 1
) -> list[pb.JournalSpec]:
    """The chunk and sum partitions (no fragment stores: add the brokers' `stores` to persist)."""
    return [_journal(n, CHUNK_MESSAGE_TYPE, replication) for n in chunk_journals(prefix, chunk_partitions)] + [
        _journal(n, SUM_MESSAGE_TYPE, replication) for n in sum_journals(prefix, sum_partitions)
    ]


def partitions_selector(message_type: str, prefix: str = DEFAULT_PREFIX) -> pb.LabelSelector:
    """Journals of `message_type` whose names start with `prefix`."""
    return parse_selector(f"{lbl.MESSAGE_TYPE}={message_type},{lbl.META_PREFIX}={prefix}")


def shard_specs(
    prefix: str = DEFAULT_PREFIX,
    chunk_partitions: int = 4,
    shard_prefix: str = DEFAULT_SHARD_PREFIX,
    *,
    max_txn_ms: int = 100,
    hot_standbys: int = 0,
) -> list[cpb.ShardSpec]:
    """One summer shard per chunk partition, with no recovery log (the store is a SQLStore)."""
    out = []
    for i, journal in enumerate(chunk_journals(prefix, chunk_partitions)):
        spec = cpb.ShardSpec(id=f"{shard_prefix}part-{i:03d}", hot_standbys=hot_standbys)
        spec.max_txn_duration.CopyFrom(Duration(nanos=max_txn_ms * 1_000_000))
        spec.sources.add(journal=journal)
        out.append(spec)
    return out


__all__ = [
    "CHUNKS_DIR",
    "DEFAULT_PREFIX",
    "DEFAULT_SHARD_PREFIX",
    "SUMS_DIR",
    "chunk_journals",
    "journal_specs",
    "partition_name",
    "partitions_selector",
    "shard_specs",
    "sum_journals",
]
