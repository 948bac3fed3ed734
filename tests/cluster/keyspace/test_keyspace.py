"""The keyspace mirror against a real etcd: load, watch, revision, route."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aetcd
import pytest

from broker.protocol import pb
from cluster.keyspace.errors import KeyFormatError, KeySpaceClosedError
from cluster.keyspace.etcd import EtcdProcess
from cluster.keyspace.keyspace import (
    Assignment,
    KeySpace,
    assignment_key,
    compare_mod,
    decode_route,
    delete_op,
    derive_route,
    item_key,
    member_key,
    parse_assignment_key,
    parse_item_key,
    parse_member_key,
    put_op,
    txn,
)
from tests.support.harness import free_port

ROOT = "/gazette/cluster"


def broker_spec(zone: str, suffix: str, limit: int = 1024, endpoint: str = "") -> pb.BrokerSpec:
    spec = pb.BrokerSpec(journal_limit=limit)
    spec.process_spec.id.zone, spec.process_spec.id.suffix = zone, suffix
    spec.process_spec.endpoint = endpoint or f"http://{suffix}:8080"
    return spec


def route_of(*members: tuple[str, str], primary: int) -> pb.Route:
    route = pb.Route(primary=primary)
    for zone, suffix in members:
        route.members.add(zone=zone, suffix=suffix)
    return route


@pytest.fixture
async def keyspace(etcd_client: Any, etcd_prefix: str) -> AsyncIterator[KeySpace]:
    ks = KeySpace(etcd_client, etcd_prefix)
    yield ks
    await ks.close()


def test_keys_round_trip() -> None:
    assert item_key(ROOT, "a/b") == "/gazette/cluster/items/a/b"
    assert member_key(ROOT, "z", "s") == "/gazette/cluster/members/z#s"
    assert assignment_key(ROOT, "a/b", "z", "s", 3) == "/gazette/cluster/assign/a/b#z#s#3"
    assert parse_item_key(ROOT, item_key(ROOT, "a/b")) == "a/b"
    assert parse_member_key(ROOT, member_key(ROOT, "z", "s")) == ("z", "s")
    assert parse_assignment_key(ROOT, assignment_key(ROOT, "a/b", "z", "s", 3)) == ("a/b", "z", "s", 3)
    for bad in ("/gazette/cluster/members/zs", "/gazette/cluster/members/z#s#x", "/other/members/z#s"):
        with pytest.raises(KeyFormatError):
            parse_member_key(ROOT, bad)
    with pytest.raises(KeyFormatError):
        parse_assignment_key(ROOT, "/gazette/cluster/assign/a#z#s#x")


def test_route_derivation() -> None:
    def a(zone: str, suffix: str, slot: int) -> Assignment:
        return Assignment("j", zone, suffix, slot, pb.Route(primary=-1), "", 1, 1, 0)

    assert derive_route([a("b", "y", 0), a("a", "x", 1)]) == route_of(("a", "x"), ("b", "y"), primary=1)
    assert derive_route([a("a", "x", 2)]) == route_of(("a", "x"), primary=-1)
    assert decode_route(b"") == pb.Route(primary=-1)


async def test_load(etcd_client: Any, etcd_prefix: str, keyspace: KeySpace) -> None:
    await etcd_client.put(
        item_key(etcd_prefix, "j/one").encode(), pb.JournalSpec(name="j/one", replication=2).SerializeToString()
    )
    await etcd_client.put(item_key(etcd_prefix, "j/bad").encode(), b"\xff\xff not protobuf")
    await etcd_client.put(
        item_key(etcd_prefix, "j/misnamed").encode(), pb.JournalSpec(name="other").SerializeToString()
    )
    await etcd_client.put(member_key(etcd_prefix, "z1", "b").encode(), broker_spec("z1", "b").SerializeToString())
    await etcd_client.put(member_key(etcd_prefix, "z0", "a").encode(), broker_spec("z0", "a").SerializeToString())
    consistent = route_of(("z0", "a"), ("z1", "b"), primary=1).SerializeToString()
    await etcd_client.put(assignment_key(etcd_prefix, "j/one", "z1", "b", 0).encode(), consistent)
    put = await etcd_client.put(assignment_key(etcd_prefix, "j/one", "z0", "a", 1).encode(), b"")

    await keyspace.load()

    assert set(keyspace.journals) == {"j/one"}
    assert keyspace.journals["j/one"].spec.replication == 2
    assert set(keyspace.members) == {("z0", "a"), ("z1", "b")}
    assert keyspace.members[("z1", "b")].key == member_key(etcd_prefix, "z1", "b")
    found = keyspace.assignments("j/one")
    assert [(a.zone, a.suffix, a.slot) for a in found] == [("z0", "a", 1), ("z1", "b", 0)]
    assert found[0].route == pb.Route(primary=-1)
    assert keyspace.revision == put.header.revision
    header = keyspace.etcd_header()
    assert header.revision == put.header.revision and header.cluster_id and header.member_id and header.raft_term

    route = keyspace.route("j/one")
    assert list(route.members) == list(route_of(("z0", "a"), ("z1", "b"), primary=1).members)
    assert route.primary == 1
    assert list(route.endpoints) == ["http://a:8080", "http://b:8080"]
    assert not keyspace.is_consistent("j/one")
    assert keyspace.route("absent") == pb.Route(primary=-1)


async def test_watch_puts_and_deletes(etcd_client: Any, etcd_prefix: str, keyspace: KeySpace) -> None:
    await keyspace.load()
    keyspace.watch()
    calls: list[int] = []
    remove = keyspace.add_observer(lambda: calls.append(keyspace.revision))

    key = item_key(etcd_prefix, "w")
    put = await etcd_client.put(key.encode(), pb.JournalSpec(name="w", replication=1).SerializeToString())
    await asyncio.wait_for(keyspace.wait_for_revision(put.header.revision), 5)
    item = keyspace.journals["w"]
    assert item.mod_revision == item.create_revision == put.header.revision
    assert keyspace.revision == put.header.revision
    assert calls and calls[-1] == put.header.revision

    # A change outside the root does not move the mirror's revision.
    outside = await etcd_client.put(b"/elsewhere/" + etcd_prefix.encode(), b"x")
    await asyncio.sleep(0.2)
    assert keyspace.revision == put.header.revision < outside.header.revision

    deleted = await etcd_client.delete(key.encode())
    await asyncio.wait_for(keyspace.wait_for_revision(deleted.header.revision), 5)
    assert "w" not in keyspace.journals
    assert keyspace.revision == deleted.header.revision

    remove()
    seen = len(calls)
    put = await etcd_client.put(key.encode(), pb.JournalSpec(name="w").SerializeToString())
    await asyncio.wait_for(keyspace.wait_for_revision(put.header.revision), 5)
    assert len(calls) == seen


async def test_watch_batches_one_transaction(etcd_client: Any, etcd_prefix: str, keyspace: KeySpace) -> None:
    await keyspace.load()
    keyspace.watch()
    generation = keyspace.generation
    route = route_of(("z", "a"), ("z", "b"), primary=0).SerializeToString()
    ok, revision = await txn(
        etcd_client,
        [],
        [
            put_op(assignment_key(etcd_prefix, "j", "z", "a", 0), route),
            put_op(assignment_key(etcd_prefix, "j", "z", "b", 1), route),
        ],
    )
    assert ok
    await asyncio.wait_for(keyspace.wait_for_change(generation), 5)
    assert keyspace.generation == generation + 1
    assert keyspace.revision == revision
    assert keyspace.is_consistent("j")
    assert keyspace.route("j", endpoints=False) == route_of(("z", "a"), ("z", "b"), primary=0)
    assert list(keyspace.route("j").endpoints) == ["", ""]

    # A guarded transaction fails against a stale ModRevision.
    ok, _ = await txn(etcd_client, [compare_mod(assignment_key(etcd_prefix, "j", "z", "a", 0), revision - 1)], [])
    assert not ok


async def test_revisions_without_events_under_the_root_are_reached(
    etcd_client: Any, etcd_prefix: str, keyspace: KeySpace
) -> None:
    # A transaction that changes nothing (an Apply of no changes, a delete of an absent key) has the
    # revision of etcd's last write, here one outside the root: no event under the root brings it,
    # so the mirror asks etcd whether anything under it changed (the Apply RPCs of the fuzzing hung here).
    await keyspace.load()
    keyspace.watch()
    generation = keyspace.generation
    await etcd_client.put(b"/elsewhere/" + etcd_prefix.encode(), b"x")
    ok, empty = await txn(etcd_client, [], [])
    ok2, noop = await txn(etcd_client, [], [delete_op(item_key(etcd_prefix, "absent"))])
    assert ok and ok2 and noop == empty > keyspace.revision
    await asyncio.wait_for(keyspace.wait_for_revision(noop), 5)
    assert keyspace.revision == noop
    assert keyspace.generation == generation  # Nothing changed: no batch, no observer call.

    # A revision that did change something under the root (a put, a delete) is reached only by its
    # events: asked of a mirror that does not watch, etcd says so.
    put = await etcd_client.put(item_key(etcd_prefix, "q").encode(), pb.JournalSpec(name="q").SerializeToString())
    still = KeySpace(etcd_client, etcd_prefix)
    await still.load()
    deleted = await etcd_client.delete(item_key(etcd_prefix, "q").encode())
    assert not await still._unchanged_through(deleted.header.revision)
    put = await etcd_client.put(item_key(etcd_prefix, "r").encode(), pb.JournalSpec(name="r").SerializeToString())
    assert not await still._unchanged_through(put.header.revision)
    await asyncio.wait_for(keyspace.wait_for_revision(put.header.revision), 5)
    assert "q" not in keyspace.journals and "r" in keyspace.journals
    generation = keyspace.generation

    # Events still come through, and their revisions are reached as before.
    put = await etcd_client.put(item_key(etcd_prefix, "p").encode(), pb.JournalSpec(name="p").SerializeToString())
    await asyncio.wait_for(keyspace.wait_for_revision(put.header.revision), 5)
    assert "p" in keyspace.journals and keyspace.generation == generation + 1


async def test_close_releases_waiters(keyspace: KeySpace) -> None:
    await keyspace.load()
    keyspace.watch()
    waiter = asyncio.ensure_future(keyspace.wait_for_change())
    await asyncio.sleep(0.05)
    await keyspace.close()
    with pytest.raises(KeySpaceClosedError):
        await asyncio.wait_for(waiter, 5)


async def test_a_waiter_cancelled_by_an_observer_of_its_change_ends_cancelled(
    etcd_client: Any, etcd_prefix: str, keyspace: KeySpace
) -> None:
    """A shard closed by the batch that also wakes its wait (the mirror sets its change event, then
    runs the observers that close shards) must stop: Python 3.11's asyncio.wait_for returned the
    woken wait's result instead, and the shard served on while its close waited forever."""
    await keyspace.load()
    keyspace.watch()
    resumed: list[str] = []

    async def wait_then_serve() -> None:
        await keyspace.wait_for_change_within(30.0)
        resumed.append("served on after its cancellation")

    waiter = asyncio.ensure_future(wait_then_serve())
    remove = keyspace.add_observer(waiter.cancel)
    await asyncio.sleep(0.05)
    put = await etcd_client.put(item_key(etcd_prefix, "c").encode(), pb.JournalSpec(name="c").SerializeToString())
    await asyncio.wait_for(keyspace.wait_for_revision(put.header.revision), 5)
    remove()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(waiter, 5)
    assert resumed == []


async def test_watch_recovers_from_compaction(etcd_client: Any, etcd_prefix: str, keyspace: KeySpace) -> None:
    await keyspace.load()
    for name in ("c1", "c2"):
        put = await etcd_client.put(item_key(etcd_prefix, name).encode(), pb.JournalSpec(name=name).SerializeToString())
    await etcd_client.compact(put.header.revision)
    keyspace.watch()
    await asyncio.wait_for(keyspace.wait_for_revision(put.header.revision), 5)
    assert set(keyspace.journals) == {"c1", "c2"}


async def test_watch_survives_etcd_restart(tmp_path: Path) -> None:
    proc = EtcdProcess(tmp_path / "data", client_port=free_port(), peer_port=free_port())
    proc.start()
    client = aetcd.Client(host=proc.host, port=proc.client_port)
    keyspace = KeySpace(client, "/r", watch_delay=0)
    try:
        proc.wait_ready()
        await keyspace.load()
        keyspace.watch()
        await proc.stop_async()
        proc.start()
        await asyncio.to_thread(proc.wait_ready)
        # The client's channel reconnects with a backoff of its own.
        for _ in range(100):
            with contextlib.suppress(aetcd.exceptions.ConnectionFailedError):
                put = await client.put(
                    item_key("/r", "after").encode(), pb.JournalSpec(name="after").SerializeToString()
                )
                break
            await asyncio.sleep(0.1)
        await asyncio.wait_for(keyspace.wait_for_revision(put.header.revision), 15)
        assert "after" in keyspace.journals
    finally:
        await keyspace.close()
        await client.close()
        proc.stop()


async def test_watch_applies_a_lone_event_at_once_and_a_burst_once_per_delay(
    etcd_client: Any, etcd_prefix: str
) -> None:
    delay = 2.0
    keyspace = KeySpace(etcd_client, etcd_prefix, watch_delay=delay)
    try:
        await keyspace.load()
        keyspace.watch()
        generation = keyspace.generation
        loop = asyncio.get_running_loop()

        # After a quiet spell, an event is applied at once: no waiting out the delay. Timed from etcd's answer
        # to the put (it sends the watch event as it answers): a slow round trip is not the mirror's delay.
        started = loop.time()
        first = await etcd_client.put(
            item_key(etcd_prefix, "lone").encode(), pb.JournalSpec(name="lone").SerializeToString()
        )
        put_at = loop.time()
        await asyncio.wait_for(keyspace.wait_for_revision(first.header.revision), 5)
        assert loop.time() - put_at < delay / 2
        assert keyspace.generation == generation + 1

        # Events that follow within the delay are gathered into one batch, applied a delay after the last.
        revisions = []
        for name in ("burst-1", "burst-2", "burst-3"):
            put = await etcd_client.put(
                item_key(etcd_prefix, name).encode(), pb.JournalSpec(name=name).SerializeToString()
            )
            revisions.append(put.header.revision)
        await asyncio.wait_for(keyspace.wait_for_revision(revisions[-1]), 10)
        assert loop.time() - started >= delay * 0.9
        assert keyspace.generation == generation + 2
        assert {"lone", "burst-1", "burst-2", "burst-3"} <= set(keyspace.journals)
    finally:
        await keyspace.close()
