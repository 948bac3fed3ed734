"""The journals and shards of stream-sum, built in Python (the YAML beside this module says the same
for `gazctl journals apply`).

Journals, under a name prefix (default `examples/stream-sum/`):

- `<prefix>chunks/part-000` … : partitions of `stream_sum.Chunk`, which chunkers publish to
  (ModuloMapping on the stream ID);
- `<prefix>sums/part-000` … : partitions of `stream_sum.Sum`, which summers publish final sums to
  (ModuloMapping on the stream ID) and chunkers verify.

All are labelled `content-type: application/x-ndjson` and `app.gazette.dev/message-type`.
Shards: one summer shard per chunk partition, `<shard prefix>part-000` … reading that partition.

`store_kinds` (e.g. `("sqlite", "json")`, cycled over the shards) labels the shards `store: <kind>`,
which chooses the summer's store (see `summer`): a recorded kind (`sqlite`, `json`) gives the
shard a recovery log, `<prefix>recovery/logs/<shard id>` (labelled
`content-type: application/x-gazette-recoverylog`), and hints under `hint_prefix`.

`apply()` (and `python -m examples.stream_sum apply`) creates or overwrites them: the journals
through a broker, the shard specs in the consumer's etcd keyspace::

    python -m examples.stream_sum apply --broker.address http://localhost:8080 \
        --etcd.address http://localhost:2379 --stores file:///

The keyspace root defaults to `gazette consume examples.stream_sum:summer`'s default
`--etcd.prefix`, `/gazette/consumers/examples.stream_sum.summer.Summer`.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import Any, Final

from google.protobuf.duration_pb2 import Duration

from broker.protocol import labels as lbl
from broker.protocol import pb
from broker.protocol.selectors import parse_selector
from consumer.protocol import pb as cpb
from examples.stream_sum.messages import CHUNK_MESSAGE_TYPE, SUM_MESSAGE_TYPE

STORE_LABEL: Final = "store"
"""The shard label choosing the summer's store (`summer.STORE_LABEL`)."""

DEFAULT_PREFIX: Final = "examples/stream-sum/"
DEFAULT_ETCD_PREFIX: Final = "/gazette/consumers/examples.stream_sum.summer.Summer"
"""`gazette consume examples.stream_sum:summer`'s default keyspace root."""
DEFAULT_SHARD_PREFIX: Final = "stream-sum-summer-"
CHUNKS_DIR: Final = "chunks/"
SUMS_DIR: Final = "sums/"
LOGS_DIR: Final = "recovery/logs"
DEFAULT_HINT_PREFIX: Final = "/gazette/hints/stream-sum"
RECORDED_KINDS: Final = ("sqlite", "json")
"""Store kinds recorded to a recovery log."""


def partition_name(prefix: str, directory: str, index: int) -> str:
    return f"{prefix}{directory}part-{index:03d}"


def chunk_journals(prefix: str = DEFAULT_PREFIX, partitions: int = 4) -> list[str]:
    return [partition_name(prefix, CHUNKS_DIR, i) for i in range(partitions)]


def sum_journals(prefix: str = DEFAULT_PREFIX, partitions: int = 2) -> list[str]:
    return [partition_name(prefix, SUMS_DIR, i) for i in range(partitions)]


def recovery_log_prefix(prefix: str = DEFAULT_PREFIX) -> str:
    return prefix + LOGS_DIR


def store_kind_of(index: int, store_kinds: Sequence[str]) -> str | None:
    """The store kind of the index-th shard: `store_kinds` cycled (None without any)."""
    return store_kinds[index % len(store_kinds)] if store_kinds else None


def _journal(name: str, message_type: str | None, replication: int) -> pb.JournalSpec:
    spec = pb.JournalSpec(name=name, replication=replication)
    if message_type is None:
        values = {lbl.CONTENT_TYPE: lbl.CONTENT_TYPE_RECOVERY_LOG}
    else:
        values = {lbl.CONTENT_TYPE: lbl.CONTENT_TYPE_JSON_LINES, lbl.MESSAGE_TYPE: message_type}
    spec.labels.CopyFrom(lbl.label_set_from_mapping(values))
    spec.fragment.length = 4 * 1024 * 1024
    spec.fragment.compression_codec = pb.SNAPPY
    spec.fragment.refresh_interval.seconds = 30
    return spec


def journal_specs(
    prefix: str = DEFAULT_PREFIX, chunk_partitions: int = 4, sum_partitions: int = 2, replication: int = 1,
    *, store_kinds: Sequence[str] = (), shard_prefix: str = DEFAULT_SHARD_PREFIX,
) -> list[pb.JournalSpec]:
    """The chunk and sum partitions, and the recovery logs of shards with a recorded store (no
    fragment stores: add the brokers' `stores` to persist)."""
    logs = [
        _journal(f"{recovery_log_prefix(prefix)}/{shard_prefix}part-{i:03d}", None, replication)
        for i in range(chunk_partitions) if store_kind_of(i, store_kinds) in RECORDED_KINDS
    ]
    return [_journal(n, CHUNK_MESSAGE_TYPE, replication) for n in chunk_journals(prefix, chunk_partitions)] + [
        _journal(n, SUM_MESSAGE_TYPE, replication) for n in sum_journals(prefix, sum_partitions)
    ] + logs


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
    store_kinds: Sequence[str] = (),
    hint_prefix: str = DEFAULT_HINT_PREFIX,
) -> list[cpb.ShardSpec]:
    """One summer shard per chunk partition. Without `store_kinds` they have no recovery log (the
    store is a SQLStore); else each is labelled `store: <kind>` (cycled), and a recorded kind gets
    a recovery log and hints."""
    out = []
    for i, journal in enumerate(chunk_journals(prefix, chunk_partitions)):
        spec = cpb.ShardSpec(id=f"{shard_prefix}part-{i:03d}", hot_standbys=hot_standbys)
        spec.max_txn_duration.CopyFrom(Duration(nanos=max_txn_ms * 1_000_000))
        spec.sources.add(journal=journal)
        kind = store_kind_of(i, store_kinds)
        if kind is not None:
            spec.labels.labels.add(name=STORE_LABEL, value=kind)
            if kind in RECORDED_KINDS:
                spec.recovery_log_prefix = recovery_log_prefix(prefix)
                spec.hint_prefix = hint_prefix
                spec.hint_backups = 2
        out.append(spec)
    return out


async def apply(
    client: Any,
    etcd: Any,
    etcd_prefix: str = DEFAULT_ETCD_PREFIX,
    prefix: str = DEFAULT_PREFIX,
    *,
    chunk_partitions: int = 4,
    sum_partitions: int = 2,
    replication: int = 1,
    stores: Sequence[str] = (),
    shard_prefix: str = DEFAULT_SHARD_PREFIX,
    store_kinds: Sequence[str] = (),
    hint_prefix: str = DEFAULT_HINT_PREFIX,
) -> tuple[list[pb.JournalSpec], list[cpb.ShardSpec]]:
    """Create (or overwrite) the journals through `client` (a JournalClient) and put the shard
    specs into the keyspace at `etcd_prefix` with `etcd` (an aetcd client); returns both.
    `stores` are the journals' fragment stores; `store_kinds` the summers' (see `shard_specs`)."""
    from broker.client import apply_journals, upsert
    from cluster.keyspace import item_key

    journals = journal_specs(prefix, chunk_partitions, sum_partitions, replication, store_kinds=store_kinds,
                             shard_prefix=shard_prefix)
    for spec in journals:
        spec.fragment.stores[:] = list(stores)
    await apply_journals(client, [upsert(spec, -1) for spec in journals])
    shards = shard_specs(prefix, chunk_partitions, shard_prefix, store_kinds=store_kinds, hint_prefix=hint_prefix)
    for shard in shards:
        await etcd.put(item_key(etcd_prefix.rstrip("/"), shard.id).encode(), shard.SerializeToString())
    return journals, shards


def main(argv: list[str] | None = None) -> int:
    """`python -m examples.stream_sum apply`: apply the journals and shards (see the module's doc)."""
    parser = argparse.ArgumentParser(prog="python -m examples.stream_sum apply",
                                     description="Create stream-sum's journals and summer shards.")
    parser.add_argument("--broker.address", dest="broker", default="http://localhost:8080")
    parser.add_argument("--etcd.address", dest="etcd", default="http://localhost:2379")
    parser.add_argument("--etcd.prefix", dest="etcd_prefix", default=DEFAULT_ETCD_PREFIX)
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="journal name prefix (default %(default)s)")
    parser.add_argument("--chunk-partitions", type=int, default=4)
    parser.add_argument("--sum-partitions", type=int, default=2)
    parser.add_argument("--replication", type=int, default=1)
    parser.add_argument("--stores", nargs="*", default=[], help="fragment stores, e.g. file:///")
    parser.add_argument("--store-kinds", nargs="*", default=[], choices=["sql", "sqlite", "json"],
                        help="the summers' stores, cycled over the shards (labelled store: KIND; sqlite and json "
                        "are recorded to recovery logs); default: sql")
    parser.add_argument("--hint-prefix", default=DEFAULT_HINT_PREFIX)
    args = parser.parse_args(argv)

    async def run() -> None:
        import aetcd

        from broker.client import JournalClient
        from cluster.keyspace.etcd import parse_address

        host, port = parse_address(args.etcd)
        etcd = aetcd.Client(host=host, port=port)
        await etcd.connect()
        try:
            async with JournalClient(args.broker) as client:
                journals, shards = await apply(
                    client, etcd, args.etcd_prefix, args.prefix, chunk_partitions=args.chunk_partitions,
                    sum_partitions=args.sum_partitions, replication=args.replication, stores=args.stores,
                    store_kinds=args.store_kinds, hint_prefix=args.hint_prefix,
                )
        finally:
            await etcd.close()
        for j in journals:
            print(f"journal {j.name}")
        for s in shards:
            kind = [lb.value for lb in s.labels.labels if lb.name == STORE_LABEL]
            print(f"shard {s.id} <- {s.sources[0].journal}" + (f" (store {kind[0]})" if kind else ""))

    asyncio.run(run())
    return 0


__all__ = [
    "CHUNKS_DIR",
    "DEFAULT_ETCD_PREFIX",
    "DEFAULT_HINT_PREFIX",
    "DEFAULT_PREFIX",
    "DEFAULT_SHARD_PREFIX",
    "RECORDED_KINDS",
    "STORE_LABEL",
    "SUMS_DIR",
    "apply",
    "chunk_journals",
    "journal_specs",
    "main",
    "partition_name",
    "partitions_selector",
    "recovery_log_prefix",
    "shard_specs",
    "store_kind_of",
    "sum_journals",
]
