"""The LAG column of `gazctl shards list --lag`, as Gazette's (`getLag` in
`cmd/gazctl/gazctlcmd/shards_list.go`): for each journal the shard's primary says it has read
through (its Stat's `read_through`), `journal:lag`, the journal's write head less that offset,
joined by `, `. Gazette walks a Go map, in no particular order; these are sorted by journal.
A failed Stat (e.g. a shard without a primary) or a failed read of a write head fails the listing,
as in Gazette."""

from __future__ import annotations

from broker.client import JournalClient
from consumer.protocol import pb
from gazctl.bounded import map_bounded
from gazctl.errors import GazctlError
from gazctl.heads import write_head
from gazctl.shard_client import ShardClient


async def fetch_lag(shards: ShardClient, journals: JournalClient, listed: pb.ListResponse) -> list[str]:
    """The LAG cell of every listed shard, in listing order."""

    async def read_through(shard: pb.ListResponse.Shard) -> dict[str, int]:
        stat = await shards.stat(shard.spec.id)
        if stat.status != pb.OK:
            raise GazctlError(f"failed to stat shard {shard.spec.id}: {pb.Status.Name(stat.status)}")
        return dict(stat.read_through)

    offsets = await map_bounded(list(listed.shards), read_through)
    names = sorted({name for through in offsets for name in through})
    heads = dict(zip(names, await map_bounded(names, lambda name: write_head(journals, name)), strict=True))
    return [", ".join(f"{name}:{heads[name] - at}" for name, at in sorted(through.items())) for through in offsets]
