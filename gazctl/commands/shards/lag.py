"""How far each shard trails its source journals: the write head of each source journal (from its
broker), the offset the shard's last committed transaction read through (its primary's Stat), and
the bytes between them, as `kafka-consumer-groups --describe` shows consumer-group lag."""

from __future__ import annotations

import dataclasses

from broker.client import JournalClient, JournalNotFound
from consumer.protocol import pb
from gazctl.bounded import map_bounded
from gazctl.heads import write_head
from gazctl.shard_client import ShardClient


@dataclasses.dataclass(frozen=True)
class SourceLag:
    """One source journal of one shard. None: unknown (the journal does not exist, or the shard
    has no primary to say what it read)."""

    shard: str
    journal: str
    write_head: int | None
    read_through: int | None

    @property
    def lag(self) -> int | None:
        """Bytes written to the journal that the shard has not yet read through."""
        if self.write_head is None or self.read_through is None:
            return None
        return max(0, self.write_head - self.read_through)

    def as_dict(self) -> dict[str, object]:
        return {
            "shard": self.shard,
            "journal": self.journal,
            "write_head": self.write_head,
            "read_through": self.read_through,
            "lag": self.lag,
        }


async def fetch_lag(shards: ShardClient, journals: JournalClient, listed: pb.ListResponse) -> list[SourceLag]:
    """The lag of every source of every listed shard, in listing then source order."""
    names = sorted({source.journal for shard in listed.shards for source in shard.spec.sources})

    async def head(journal: str) -> int | None:
        try:
            return await write_head(journals, journal)
        except JournalNotFound:
            return None

    async def progress(shard: pb.ListResponse.Shard) -> dict[str, int] | None:
        if not shard.spec.sources:
            return {}
        stat = await shards.stat(shard.spec.id)
        return dict(stat.read_through) if stat.status == pb.OK else None

    heads = dict(zip(names, await map_bounded(names, head), strict=True))
    through = await map_bounded(list(listed.shards), progress)
    out = []
    for shard, read in zip(listed.shards, through, strict=True):
        for source in shard.spec.sources:
            # A source not yet read from is read through where reading starts: its min_offset.
            offset = None if read is None else read.get(source.journal, source.min_offset)
            out.append(SourceLag(shard.spec.id, source.journal, heads[source.journal], offset))
    return out
