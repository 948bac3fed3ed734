"""Member announcement against a real etcd: announce, conflict, exiting, release, lease loss."""

from __future__ import annotations

import asyncio
from typing import Any

from broker.protocol import pb
from cluster.keyspace.announce import Announcement
from cluster.keyspace.keyspace import assignment_key


def broker_spec(zone: str = "z", suffix: str = "b1") -> pb.BrokerSpec:
    spec = pb.BrokerSpec(journal_limit=1024)
    spec.process_spec.id.zone, spec.process_spec.id.suffix = zone, suffix
    spec.process_spec.endpoint = "http://127.0.0.1:8080"
    return spec


async def test_announce_and_release(etcd_client: Any, etcd_prefix: str) -> None:
    ann = Announcement(etcd_client, etcd_prefix, broker_spec(), ttl=5)
    revision = await ann.announce()
    try:
        got = await etcd_client.get(ann.key.encode())
        assert got.lease == ann.lease_id != 0
        assert got.mod_revision == revision
        assert pb.BrokerSpec.FromString(got.value) == broker_spec()
        # Announcing again under the same lease is a no-op.
        assert await ann.announce() == revision

        # Assignments live under the member's lease and go with it.
        assigned = assignment_key(etcd_prefix, "j", "z", "b1", 0).encode()
        await etcd_client.put(assigned, b"", lease=ann.lease_id)
    finally:
        await ann.release()
    assert await etcd_client.get(ann.key.encode()) is None
    assert await etcd_client.get(assigned) is None


async def test_conflict_waits_for_the_other_lease(etcd_client: Any, etcd_prefix: str) -> None:
    first = Announcement(etcd_client, etcd_prefix, broker_spec(), ttl=5)
    await first.announce()
    second = Announcement(etcd_client, etcd_prefix, broker_spec(), ttl=5, retry_interval=0.1)
    pending = asyncio.ensure_future(second.announce())
    try:
        await asyncio.sleep(0.5)
        assert not pending.done()
        await first.release()
        revision = await asyncio.wait_for(pending, 5)
        got = await etcd_client.get(second.key.encode())
        assert got.lease == second.lease_id
        assert got.create_revision == revision
    finally:
        pending.cancel()
        await first.release()
        await second.release()


async def test_set_exiting_keeps_the_lease(etcd_client: Any, etcd_prefix: str) -> None:
    ann = Announcement(etcd_client, etcd_prefix, broker_spec(), ttl=5)
    await ann.announce()
    try:
        revision = await ann.set_exiting()
        got = await etcd_client.get(ann.key.encode())
        assert pb.BrokerSpec.FromString(got.value).exiting
        assert got.mod_revision == revision
        assert got.lease == ann.lease_id
        assert ann.spec.exiting
    finally:
        await ann.release()


async def test_lease_loss_is_reported(etcd_client: Any, etcd_prefix: str) -> None:
    lost = asyncio.Event()
    ann = Announcement(etcd_client, etcd_prefix, broker_spec(), ttl=3, on_lost=lost.set)
    await ann.announce()
    try:
        await etcd_client.revoke_lease(ann.lease_id)
        await asyncio.wait_for(lost.wait(), 5)
        assert ann.lost
    finally:
        await ann.release()


class _SilentEtcd:
    """An etcd client cut off after granting the lease: every refresh waits for ever (a partition
    drops its packets). Pure timing logic: no I/O."""

    def __init__(self) -> None:
        self.refreshes = 0

    async def lease(self, ttl: int) -> Any:
        class Lease:
            id = 0x42

        return Lease()

    async def refresh_lease(self, lease_id: int) -> Any:
        self.refreshes += 1
        await asyncio.Event().wait()


async def test_lease_loss_is_declared_by_the_lease_deadline() -> None:
    """Cut off from etcd, the member declares its lease lost when etcd would expire it (a TTL after
    the grant, as no refresh was granted), not a keepalive iteration later."""
    loop = asyncio.get_running_loop()
    lost = asyncio.Event()
    client = _SilentEtcd()
    ann = Announcement(client, "/root", broker_spec(), ttl=2, on_lost=lost.set)
    granted = loop.time()
    await ann.grant_lease()  # As announce() does first; the member key is not needed here.
    await asyncio.wait_for(lost.wait(), 10)
    declared = loop.time() - granted
    assert ann.lost and client.refreshes >= 1
    assert 1.9 <= declared <= 2.3, f"lease lost declared {declared:.2f}s after the grant, its TTL being 2s"
