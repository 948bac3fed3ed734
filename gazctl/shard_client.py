"""What the `gazctl shards` commands and `plan`/`sync` share: the shard selector and calls of the
Shard API of a consumer process, whose failures become one-line GazctlErrors. (Outside the
`shards` command package, so that `plan` and `sync` run without importing its commands.)

The consumer address is the first of `--consumer.address` (after the command, else before it),
`$CONSUMER_ADDRESS`, `Address` of `[shards.Consumer]` in the first gazctl.ini found, and Gazette's
default `http://localhost:8080`.
`gazette consume` listens on a random port unless given `--consumer.port`: the address must name
a running consumer process (any member of the consumer group; each serves the whole Shard API).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TypeVar

import grpc

from broker.client.config import dial_target
from broker.errors import ConfigError
from broker.protocol import pb as bpb
from consumer.protocol import pb, pb_grpc
from gazctl.commands.common import credentials, resolve_consumer
from gazctl.errors import GazctlError

log = logging.getLogger("gazctl")

T = TypeVar("T")

MAX_MESSAGE_SIZE = 16 << 20
"""As Gazette's gazctl, replies of up to 16 MiB are accepted."""

STALE_REVISION_HINT = (
    " (a shard's current revision differs from the spec's `revision`: it was changed, created or"
    " deleted since it was listed; list the shards again, or use `revision: -1` to overwrite)"
)


class ShardClient:
    """Calls of the Shard API of one consumer process."""

    def __init__(self, address: str, stub: pb_grpc.ShardStub) -> None:
        self.address = address
        self.stub = stub

    async def call(self, rpc: str, request: object, detail: str = "") -> object:
        try:
            return await getattr(self.stub, rpc)(request)
        except grpc.aio.AioRpcError as err:
            code = err.code()
            hint = ""
            if code == grpc.StatusCode.UNAVAILABLE:
                hint = " (is a `gazette consume` process listening there? set --consumer.address or $CONSUMER_ADDRESS)"
            elif code == grpc.StatusCode.UNIMPLEMENTED:
                hint = " (that address serves no Shard API: is it a broker rather than a consumer process?)"
            extra = f" ({detail})" if detail else ""
            raise GazctlError(f"consumer {self.address}: {rpc}: {code.name}: {err.details()}{extra}{hint}") from None

    async def list(self, selector: bpb.LabelSelector) -> pb.ListResponse:
        resp = await self.call("List", pb.ListRequest(selector=selector))
        assert isinstance(resp, pb.ListResponse)
        if resp.status != pb.OK:
            raise GazctlError(f"consumer {self.address}: List: {pb.Status.Name(resp.status)}")
        return resp

    async def apply(self, changes: Sequence[pb.ApplyRequest.Change], max_txn_size: int = 0) -> pb.ApplyResponse:
        """Apply as one transaction, or in transactions of at most `max_txn_size` changes; return the last reply.

        A failed transaction leaves the ones before it applied, and its error says how many changes they held.
        """
        size = max_txn_size if max_txn_size > 0 else max(len(changes), 1)
        resp = pb.ApplyResponse()
        for begin in range(0, len(changes), size):
            batch = changes[begin : begin + size]
            earlier = f"{begin} of {len(changes)} changes were applied by earlier transactions" if begin else ""
            reply = await self.call("Apply", pb.ApplyRequest(changes=batch), earlier)
            assert isinstance(reply, pb.ApplyResponse)
            resp = reply
            if resp.status != pb.OK:
                name = pb.Status.Name(resp.status)
                detail = f" ({earlier})" if earlier else ""
                hint = STALE_REVISION_HINT if resp.status == pb.ETCD_TRANSACTION_FAILED else ""
                raise GazctlError(f"{name}{detail}{hint}")
            log.debug("applied batch", extra={"changes": len(batch), "revision": resp.header.etcd.revision})
        return resp

    async def stat(self, shard: str) -> pb.StatResponse:
        """The shard's Stat, whatever its status (a shard without a primary answers NO_SHARD_PRIMARY)."""
        resp = await self.call("Stat", pb.StatRequest(shard=shard), f"shard {shard}")
        assert isinstance(resp, pb.StatResponse)
        return resp

    async def get_hints(self, shard: str) -> pb.GetHintsResponse:
        """The shard's recorded (primary) and recovered (backup) hints, each unset where none is stored."""
        resp = await self.call("GetHints", pb.GetHintsRequest(shard=shard), f"shard {shard}")
        assert isinstance(resp, pb.GetHintsResponse)
        if resp.status != pb.OK:
            raise GazctlError(f"consumer {self.address}: GetHints of shard {shard}: {pb.Status.Name(resp.status)}")
        return resp

    async def unassign(self, shards: Sequence[str], only_failed: bool, dry_run: bool) -> pb.UnassignResponse:
        resp = await self.call("Unassign", pb.UnassignRequest(shards=shards, only_failed=only_failed, dry_run=dry_run))
        assert isinstance(resp, pb.UnassignResponse)
        if resp.status != pb.OK:
            raise GazctlError(f"{pb.Status.Name(resp.status)} (the shards' assignments changed; try again)")
        return resp


@asynccontextmanager
async def connect(address_flag: str | None) -> AsyncIterator[ShardClient]:
    """A client of the resolved consumer address, for use within a running event loop."""
    address = resolve_consumer(address_flag)
    log.debug("resolved consumer address", extra={"address": address.value, "source": address.source})
    try:
        target = dial_target(address.value)
    except ConfigError as err:
        raise ConfigError(str(err).replace("invalid broker address", "invalid consumer address")) from None
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_SIZE)]
    creds = credentials("consumer")
    async with creds.tls.channel(target.target, tls=target.tls, options=options) as channel:
        yield ShardClient(address.value, creds.authorize(pb_grpc.ShardStub(channel)))


def run(address_flag: str | None, work: Callable[[ShardClient], Awaitable[T]]) -> T:
    """Resolve the consumer address and run `work` with a client of it in a fresh event loop."""

    async def main() -> T:
        async with connect(address_flag) as client:
            return await work(client)

    return asyncio.run(main())
