"""The journals and shards of word-count.

Journals, under a name prefix (default `examples/word-count/`):

- `<prefix>deltas/part-000` … : partitions of `word_count.NGramCount` deltas (labelled
  `content-type: application/x-protobuf-fixed` and `app.gazette.dev/message-type:
  word_count.NGramCount`), which Publish writes to (ModuloMapping on the n-gram);
- `<prefix>recovery/logs/<shard id>`: each shard's recovery log (`content-type:
  application/x-gazette-recoverylog`), to which its SQLite store is recorded.

Shards: one counter shard per partition, `<shard prefix>part-000` … reading that partition, with
its recovery log under `<prefix>recovery/logs` and hints under `--hint-prefix`.

`apply()` (and `python -m examples.word_count apply`) creates or overwrites them: the journals
through a broker, the shard specs in the consumer's etcd keyspace (by default
`gazette consume examples.word_count:counter`'s, `/gazette/consumers/examples.word_count.counter.Counter`).
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
from examples.word_count.messages import MESSAGE_TYPE

DEFAULT_PREFIX: Final = "examples/word-count/"
DEFAULT_ETCD_PREFIX: Final = "/gazette/consumers/examples.word_count.counter.Counter"
"""`gazette consume examples.word_count:counter`'s default keyspace root."""
DEFAULT_SHARD_PREFIX: Final = "word-count-"
DEFAULT_HINT_PREFIX: Final = "/gazette/hints/word-count"
DELTAS_DIR: Final = "deltas/"
LOGS_DIR: Final = "recovery/logs"


def delta_journals(prefix: str = DEFAULT_PREFIX, partitions: int = 4) -> list[str]:
    return [f"{prefix}{DELTAS_DIR}part-{i:03d}" for i in range(partitions)]


def shard_ids(partitions: int = 4, shard_prefix: str = DEFAULT_SHARD_PREFIX) -> list[str]:
    return [f"{shard_prefix}part-{i:03d}" for i in range(partitions)]


def recovery_log_prefix(prefix: str = DEFAULT_PREFIX) -> str:
    return prefix + LOGS_DIR


def partitions_selector(prefix: str = DEFAULT_PREFIX) -> pb.LabelSelector:
    """The n-gram partitions under `prefix`."""
    return parse_selector(f"{lbl.MESSAGE_TYPE}={MESSAGE_TYPE},{lbl.META_PREFIX}={prefix}{DELTAS_DIR}")


def _journal(name: str, content_type: str, replication: int, message_type: str | None) -> pb.JournalSpec:
    values = {lbl.CONTENT_TYPE: content_type}
    if message_type:
        values[lbl.MESSAGE_TYPE] = message_type
    spec = pb.JournalSpec(name=name, replication=replication)
    spec.labels.CopyFrom(lbl.label_set_from_mapping(values))
    spec.fragment.length = 4 * 1024 * 1024
    spec.fragment.compression_codec = pb.SNAPPY
    spec.fragment.refresh_interval.seconds = 30
    return spec


def shard_specs(
    prefix: str = DEFAULT_PREFIX,
    partitions: int = 4,
    shard_prefix: str = DEFAULT_SHARD_PREFIX,
    *,
    hint_prefix: str = DEFAULT_HINT_PREFIX,
    max_txn_ms: int = 1000,
    hot_standbys: int = 0,
) -> list[cpb.ShardSpec]:
    """One counter shard per partition, each with a recovery log (its SQLite store is recorded)."""
    out = []
    for shard_id, journal in zip(shard_ids(partitions, shard_prefix), delta_journals(prefix, partitions),
                                 strict=True):
        spec = cpb.ShardSpec(id=shard_id, recovery_log_prefix=recovery_log_prefix(prefix), hint_prefix=hint_prefix,
                             hint_backups=2, hot_standbys=hot_standbys)
        spec.max_txn_duration.CopyFrom(Duration(seconds=max_txn_ms // 1000, nanos=(max_txn_ms % 1000) * 1_000_000))
        spec.sources.add(journal=journal)
        out.append(spec)
    return out


def journal_specs(
    prefix: str = DEFAULT_PREFIX, partitions: int = 4, shard_prefix: str = DEFAULT_SHARD_PREFIX,
    replication: int = 1,
) -> list[pb.JournalSpec]:
    """The delta partitions and the shards' recovery logs (no fragment stores: add the brokers')."""
    deltas = [_journal(n, lbl.CONTENT_TYPE_PROTO_FIXED, replication, MESSAGE_TYPE)
              for n in delta_journals(prefix, partitions)]
    logs = [_journal(f"{recovery_log_prefix(prefix)}/{s}", lbl.CONTENT_TYPE_RECOVERY_LOG, replication, None)
            for s in shard_ids(partitions, shard_prefix)]
    return deltas + logs


async def apply(
    client: Any,
    etcd: Any,
    etcd_prefix: str = DEFAULT_ETCD_PREFIX,
    prefix: str = DEFAULT_PREFIX,
    *,
    partitions: int = 4,
    replication: int = 1,
    stores: Sequence[str] = (),
    shard_prefix: str = DEFAULT_SHARD_PREFIX,
    hint_prefix: str = DEFAULT_HINT_PREFIX,
    max_txn_ms: int = 1000,
    hot_standbys: int = 0,
) -> tuple[list[pb.JournalSpec], list[cpb.ShardSpec]]:
    """Create (or overwrite) the journals through `client` (a JournalClient) and put the shard
    specs into the keyspace at `etcd_prefix` with `etcd` (an aetcd client); returns both."""
    from broker.client import apply_journals, upsert
    from cluster.keyspace import item_key

    journals = journal_specs(prefix, partitions, shard_prefix, replication)
    for spec in journals:
        spec.fragment.stores[:] = list(stores)
    await apply_journals(client, [upsert(spec, -1) for spec in journals])
    shards = shard_specs(prefix, partitions, shard_prefix, hint_prefix=hint_prefix, max_txn_ms=max_txn_ms,
                         hot_standbys=hot_standbys)
    for shard in shards:
        await etcd.put(item_key(etcd_prefix.rstrip("/"), shard.id).encode(), shard.SerializeToString())
    return journals, shards


def main(argv: list[str] | None = None) -> int:
    """`python -m examples.word_count apply`: apply the journals and shards (see the module's doc)."""
    parser = argparse.ArgumentParser(prog="python -m examples.word_count apply",
                                     description="Create word-count's journals and counter shards.")
    parser.add_argument("--broker.address", dest="broker", default="http://localhost:8080")
    parser.add_argument("--etcd.address", dest="etcd", default="http://localhost:2379")
    parser.add_argument("--etcd.prefix", dest="etcd_prefix", default=DEFAULT_ETCD_PREFIX)
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="journal name prefix (default %(default)s)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--replication", type=int, default=1)
    parser.add_argument("--hint-prefix", default=DEFAULT_HINT_PREFIX)
    parser.add_argument("--hot-standbys", type=int, default=0)
    parser.add_argument("--stores", nargs="*", default=[], help="fragment stores, e.g. file:///")
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
                    client, etcd, args.etcd_prefix, args.prefix, partitions=args.partitions,
                    replication=args.replication, stores=args.stores, hint_prefix=args.hint_prefix,
                    hot_standbys=args.hot_standbys,
                )
        finally:
            await etcd.close()
        for j in journals:
            print(f"journal {j.name}")
        for s in shards:
            print(f"shard {s.id} <- {s.sources[0].journal}")

    asyncio.run(run())
    return 0


__all__ = [
    "DEFAULT_ETCD_PREFIX",
    "DEFAULT_HINT_PREFIX",
    "DEFAULT_PREFIX",
    "DEFAULT_SHARD_PREFIX",
    "apply",
    "delta_journals",
    "journal_specs",
    "main",
    "partitions_selector",
    "recovery_log_prefix",
    "shard_ids",
    "shard_specs",
]
