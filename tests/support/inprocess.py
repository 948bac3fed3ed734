"""Brokers assembled in the test's own event loop, against the session's real etcd.

Each `InProcessBroker` is what `gazette serve` runs (`broker.server.BrokerCore`: keyspace mirror,
persistence, resolver and replicas, BrokerState, the Journal servicer, the member announcement),
serving gRPC on a loopback port, minus three things a test wants to control itself:

- no allocator: `InProcessCluster.assign` writes a journal's assignments (primary first), so a
  test decides the route and changes it when it likes;
- no pulses: nothing appends behind the test's back;
- no one-port listener or HTTP gateway: peers and test clients speak gRPC to the port directly.

Tests reach into a broker's replicas, spools and pipelines directly, and drive the append FSM
(`broker.append.Append`) with `append` or step by step.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import grpc

from broker.append import Append
from broker.protocol import pb, pb_grpc
from broker.replica import Replica
from broker.resolver import Resolver
from broker.server import BrokerCore
from broker.service import add_journal_service
from broker.state import BrokerState
from broker.stores import StoreRegistry
from broker.stores.memory import drop_bucket
from cluster.keyspace import Announcement, KeySpace, assignment_key, delete_op, item_key, put_op, txn
from cluster.keyspace.keyspace import WATCH_DELAY, assignments_prefix
from cluster.server.channels import CHANNEL_OPTIONS
from cluster.server.process import grpc_server_options

ZONE = "local"
SETTLE = 10.0
"""Seconds a broker's mirror may take to reach a revision the test wrote, before the test fails."""


class InProcessBroker:
    """One broker in this event loop: `await start()`, use, then `await stop()`."""

    def __init__(
        self,
        client: Any,
        root: str,
        suffix: str,
        spool_dir: Path,
        *,
        zone: str = ZONE,
        watch_delay: float = WATCH_DELAY,
        max_append_rate: int = 0,
        min_append_rate: int = 0,
        max_replication: int = 9,
    ) -> None:
        self.client = client
        self.root = root
        self.local_id = pb.ProcessSpec.ID(zone=zone, suffix=suffix)
        self.spool_dir = spool_dir
        self.keyspace = KeySpace(client, root, watch_delay=watch_delay)
        self.core = BrokerCore(
            client, root, self.keyspace, self.local_id, StoreRegistry(), str(spool_dir),
            max_append_rate=max_append_rate, min_append_rate=min_append_rate, max_replication=max_replication,
        )
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.announcement: Announcement | None = None
        self._watch: asyncio.Task[None] | None = None
        self._channel: grpc.aio.Channel | None = None
        self._stopped = False

    @property
    def suffix(self) -> str:
        return self.local_id.suffix

    @property
    def state(self) -> BrokerState:
        return self.core.state

    @property
    def resolver(self) -> Resolver:
        return self.core.resolver

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def lease(self) -> int:
        """The member's etcd lease (its assignments are held under it)."""
        assert self.announcement is not None
        return self.announcement.lease_id

    async def start(self, port: int = 0) -> InProcessBroker:
        """Load the mirror, serve gRPC on a loopback port (`port`, or any free one), announce and join."""
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        await self.keyspace.load()
        self.server = self._serve(port)
        await self.server.start()
        self.announcement = Announcement(
            self.client, self.root, self.core.broker_spec(self.endpoint, 1024), ttl=20.0
        )
        self._watch = await self.core.join(self.announcement)
        return self

    def _serve(self, port: int) -> grpc.aio.Server:
        server = grpc.aio.server(options=grpc_server_options(64 << 20))
        add_journal_service(self.core.service, server)
        self.port = server.add_insecure_port(f"127.0.0.1:{port}")
        assert self.port, f"cannot bind 127.0.0.1:{port}"
        return server

    def replica(self, journal: str) -> Replica:
        """This broker's replica of `journal` (it must be assigned here)."""
        replica = self.resolver.replicas.get(journal)
        assert replica is not None, f"{journal} has no replica on {self.suffix}"
        return replica

    def stub(self) -> pb_grpc.JournalStub:
        """A Journal stub of this broker's port."""
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}", options=CHANNEL_OPTIONS)
        return pb_grpc.JournalStub(self._channel)

    async def read(self, journal: str, offset: int = 0) -> bytes:
        """The journal's committed content from `offset`, through a non-blocking Read RPC, once
        readers are given all the replica's spool committed (a replica serves a commit once its
        primary's confirmation, sent before the append's reply, has arrived)."""
        replica = self.resolver.replicas.get(journal)
        if replica is not None:
            spool = replica.spool
            deadline = asyncio.get_running_loop().time() + SETTLE
            while spool.acknowledged.end < spool.end and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.005)
        out = bytearray()
        async for resp in self.stub().Read(pb.ReadRequest(journal=journal, offset=offset, block=False)):
            if resp.status not in (pb.OK, pb.OFFSET_NOT_YET_AVAILABLE):
                raise AssertionError(f"read of {journal} from {self.suffix}: {pb.Status.Name(resp.status)}")
            out += resp.content
        return bytes(out)

    async def kill(self) -> None:
        """Stop serving at once, as a crashed process would: in-flight RPCs are cancelled. The member
        key and its assignments stay (a dead process keeps them until its lease expires)."""
        if self.server is not None:
            server, self.server = self.server, None
            await server.stop(None)

    async def restart_serving(self) -> None:
        """Serve again on the same port after `kill` (the process "comes back" with its state)."""
        assert self.server is None, "still serving"
        self.server = self._serve(self.port)
        await self.server.start()

    async def stop(self) -> None:
        """Stop serving and release everything: replicas, mirror, member key (and assignments), channels."""
        if self._stopped:
            return
        self._stopped = True
        await self.kill()
        await self.resolver.stop()
        await self.keyspace.close()
        if self.announcement is not None:
            await self.announcement.release()
        await self.state.dialer.close()
        await self.core.persistence.close()
        if self._channel is not None:
            await self._channel.close()


class InProcessCluster:
    """In-process brokers under one keyspace root of the real etcd, and the test's control of it."""

    def __init__(self, client: Any, root: str, tmp: Path) -> None:
        self.client = client
        self.root = root
        self.tmp = tmp
        self.brokers: list[InProcessBroker] = []
        self.bucket = f"test-{uuid.uuid4().hex}"
        self.store_url = f"memory://{self.bucket}/"
        """A `memory://` store of this cluster's own (dropped at close)."""

    async def add_broker(self, suffix: str, **kwargs: Any) -> InProcessBroker:
        """Start a broker with id `local/<suffix>` in this cluster."""
        broker = InProcessBroker(self.client, self.root, suffix, self.tmp / f"spool-{suffix}", **kwargs)
        self.brokers.append(broker)
        return await broker.start()

    async def put_spec(self, spec: pb.JournalSpec, *, wait_for: Iterable[InProcessBroker] | None = None) -> int:
        """Write `spec` straight to etcd (as Apply would, without its validation, so that specs may name
        `memory://` stores) and wait until the brokers of `wait_for` (default: all) see it; returns the
        revision."""
        _ok, revision = await txn(self.client, [], [put_op(item_key(self.root, spec.name), spec.SerializeToString())])
        await self.settle(revision, wait_for)
        return revision

    async def assign(
        self, journal: str, *members: InProcessBroker, wait_for: Iterable[InProcessBroker] | None = None
    ) -> int:
        """Make `members` the journal's route, the first one primary: every old assignment is deleted
        and each member gets an empty one (as the allocator creates it) at slot 0, 1, ... under its
        lease. Waits until the brokers of `wait_for` (default: all) see it; returns the revision."""
        keys = [
            assignment_key(self.root, journal, member.local_id.zone, member.suffix, slot)
            for slot, member in enumerate(members)
        ]
        old = await self.client.get_prefix(assignments_prefix(self.root, journal).encode())
        ops = [delete_op(kv.key.decode()) for kv in old if kv.key.decode() not in keys]
        ops += [put_op(key, b"", lease=member.lease) for key, member in zip(keys, members, strict=True)]
        _ok, revision = await txn(self.client, [], ops)
        await self.settle(revision, wait_for)
        return revision

    async def assignment_values(self, journal: str) -> dict[str, pb.Route]:
        """The journal's assignment values in etcd, by key."""
        found = await self.client.get_prefix(assignments_prefix(self.root, journal).encode())
        out = {}
        for kv in found:
            route = pb.Route()
            route.ParseFromString(kv.value)
            out[kv.key.decode()] = route
        return out

    async def spec(self, journal: str) -> tuple[pb.JournalSpec, int]:
        """The journal's spec in etcd and its mod revision."""
        got = await self.client.get(item_key(self.root, journal).encode())
        assert got is not None, f"{journal} has no spec"
        return pb.JournalSpec.FromString(got.value), got.mod_revision

    async def settle(self, revision: int, brokers: Iterable[InProcessBroker] | None = None) -> None:
        """Wait until the mirrors of `brokers` (default: all) have applied `revision`."""
        for broker in self.brokers if brokers is None else brokers:
            await asyncio.wait_for(broker.keyspace.wait_for_revision(revision), SETTLE)

    async def close(self) -> None:
        # Stop serving everywhere before tearing replicas down, so that no pipeline waits on a peer.
        for broker in self.brokers:
            await broker.kill()
        for broker in self.brokers:
            await broker.stop()
        drop_bucket(self.bucket)


async def content(*parts: bytes, then: BaseException | None = None) -> AsyncIterator[bytes]:
    """An append's content chunks, as the service hands them to `Append.stream` after the commit
    marker; with `then`, the client stream fails with it after the last part instead."""
    for part in parts:
        yield part
    if then is not None:
        raise then


async def append(broker: InProcessBroker, journal: str, *parts: bytes, **params: Any) -> pb.AppendResponse:
    """One committed append of `parts` on `broker`, driving the FSM directly: its status response,
    or the OK response of `stream`. A proxy decision fails the test."""
    fsm = Append(broker.state, pb.AppendRequest(journal=journal, **params))
    await fsm.prepare()
    if fsm.response is not None:
        return fsm.response
    assert fsm.proxy is None, f"{broker.suffix} would proxy {journal} to {fsm.proxy.header.process_id}"
    return await fsm.stream(content(*parts))
