"""The consumer runtime against real parts: etcd, a broker, SQLStores on a SQLite file.

A ConsumerService announces itself, runs the allocator and serves its assigned shards; shards
count messages by key (tests/support/apps.py) read-committed, exactly once, across restarts,
failures and hand-offs between services.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf.duration_pb2 import Duration

from broker.client import AppendService, JournalClient
from cluster.keyspace import item_key, member_key
from consumer.message import Flags, Publisher, get_flags, read_committed
from consumer.protocol import pb as cpb
from consumer.replica import MAX_ETCD_ERR_LEN, TRUNCATED, failed_status, status_backoff
from consumer.service import ConsumerService
from tests.support.apps import NDJSON, CountingApp, Event, create_tables, read_counts, read_counts_by_shard
from tests.support.harness import journal_spec
from tests.support.journals import create_journal, unique
from tests.support.waiting import until

Code = cpb.ReplicaStatus.Code
T = TypeVar("T")


# -- helpers ------------------------------------------------------------------------------------


def consumer_spec(suffix: str, limit: int = 100) -> cpb.ConsumerSpec:
    spec = cpb.ConsumerSpec(shard_limit=limit)
    spec.process_spec.id.zone, spec.process_spec.id.suffix = "local", suffix
    spec.process_spec.endpoint = f"http://{suffix}.test:8080"
    return spec


def shard_spec(shard_id: str, *sources: str) -> cpb.ShardSpec:
    spec = cpb.ShardSpec(id=shard_id, max_txn_duration=Duration(nanos=100_000_000))
    for journal in sorted(sources):
        spec.sources.add(journal=journal)
    return spec


async def put_shard(etcd: Any, root: str, spec: cpb.ShardSpec) -> None:
    await etcd.put(item_key(root, spec.id).encode(), spec.SerializeToString())


def statuses(service: ConsumerService) -> dict[str, dict[int, tuple[str, int]]]:
    """Per shard: slot -> (member suffix, status code), from the service's mirror."""
    out: dict[str, dict[int, tuple[str, int]]] = {}
    for a in service.keyspace.all_assignments():
        out.setdefault(a.item_id, {})[a.slot] = (a.suffix, int(a.value.code))
    return out


def primaries(service: ConsumerService, *shards: str) -> dict[str, str | None]:
    """Per shard, the member suffix whose slot-0 replica reports PRIMARY (None otherwise), when
    the shard has no other assignment."""
    found = statuses(service)
    out: dict[str, str | None] = {}
    for shard in shards:
        slots = found.get(shard, {})
        suffix, code = slots.get(0, ("", 0))
        out[shard] = suffix if code == Code.PRIMARY and len(slots) == 1 else None
    return out


async def new_source(client: JournalClient, name: str) -> str:
    spec = journal_spec(unique(name), content_type=NDJSON)
    await create_journal(client, spec)
    return spec.name


async def publish(svc: AppendService, journal: str, *keys: str, txn: bool = False) -> None:
    """Publish one message per key to `journal`: self-committed, or in one transaction committed
    at the end."""
    pub = Publisher(svc)
    appends = []
    for key in keys:
        if txn:
            appends.append(pub.publish_uncommitted(lambda _m: (journal, NDJSON), Event(Key=key, Value="x")))
        else:
            appends.append(pub.publish_committed(lambda _m: (journal, NDJSON), Event(Key=key, Value="x")))
    if txn:
        _, acks = pub.commit()
        appends.extend(acks)
    for aa in appends:
        await aa


async def derived_messages(client: JournalClient, journal: str) -> list[tuple[str, str]]:
    out = []
    async for env in read_committed(client, journal, 0, lambda _j: Event(), block=False):
        if get_flags(env.uuid) != Flags.ACK_TXN:
            out.append((env.message.Key, env.message.Value))
    return out


def expected_derived(counts: dict[str, int], every: int) -> Counter[tuple[str, str]]:
    return Counter((key, str(n)) for key, total in counts.items() for n in range(every, total + 1, every))


def fences(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(db, timeout=30.0)
    try:
        return {fqn: int(f) for fqn, f in conn.execute("SELECT shard_fqn, fence FROM gazette_checkpoints")}
    finally:
        conn.close()


def service(etcd: Any, root: str, suffix: str, client: JournalClient, app: CountingApp,
            **kwargs: Any) -> ConsumerService:
    kwargs.setdefault("lease_ttl", 10.0)
    kwargs.setdefault("watch_delay", 0.01)
    return ConsumerService(etcd, root, consumer_spec(suffix), client, app, **kwargs)


# -- units --------------------------------------------------------------------------------------


def test_failed_status_truncates_and_backoff() -> None:
    assert failed_status(ValueError("boom")) == cpb.ReplicaStatus(code=Code.FAILED, errors=["boom"])
    long = failed_status("x" * (MAX_ETCD_ERR_LEN + 10))
    assert long.errors[0] == "x" * MAX_ETCD_ERR_LEN + TRUNCATED
    assert failed_status(RuntimeError()).errors == ["RuntimeError"]
    assert [status_backoff(i) for i in range(8)] == [0.05, 0.05, 0.1, 0.1, 1.0, 1.0, 5.0, 5.0]


# -- against etcd and a broker ------------------------------------------------------------------


async def test_shard_consumes_exactly_once_and_resumes_after_restart(
    etcd_client: Any, etcd_prefix: str, client: JournalClient, appender: AppendService, tmp_path: Path
) -> None:
    root = etcd_prefix
    src_a, src_b = await new_source(client, "svc/src-a"), await new_source(client, "svc/src-b")
    derived = await new_source(client, "svc/derived")
    db = tmp_path / "counts.db"
    create_tables(db)
    await put_shard(etcd_client, root, shard_spec("shard-one", src_a, src_b))

    app = CountingApp(db, derived, every=3)
    first = service(etcd_client, root, "cons-c1", client, app, exit_timeout=0.5)
    await first.start()
    try:
        await until(lambda: primaries(first, "shard-one"), lambda p: p == {"shard-one": "cons-c1"}, "PRIMARY")
        replica = first.replicas["shard-one"]
        assert replica.fqn == f"{root}/items/shard-one"

        # Self-committed messages on both sources, a committed transaction, and a transaction
        # never committed (its messages are never read-committed).
        await publish(appender, src_a, *["k1"] * 4, "k2")
        await publish(appender, src_b, *["k1"] * 2, "k3")
        await publish(appender, src_b, "k2", "k2", txn=True)
        ghost = Publisher(appender)
        await ghost.publish_uncommitted(lambda _m: (src_a, NDJSON), Event(Key="ghost"))
        expected = {"k1": 6, "k2": 3, "k3": 1}
        await until(lambda: read_counts(db), lambda c: c == expected, "counts")

        # The resolver: the local primary, with its store, once it read through the sources' heads.
        res = await first.resolver.resolve("shard-one", read_through=dict(replica.progress.read_through))
        assert res.status == cpb.Status.OK and res.shard is replica and res.store is not None
        assert res.header.process_id.suffix == "cons-c1"
        res.done()
        missing = await first.resolver.resolve("shard-nope")
        assert missing.status == cpb.Status.SHARD_NOT_FOUND and missing.header.process_id.suffix == "cons-c1"
    finally:
        await first.stop()
    assert (await etcd_client.get(member_key(root, "local", "cons-c1").encode())) is None, "lease released"
    assert first.resolver.stopped and not first.replicas

    # Messages published while no consumer runs, then a second service resumes from the checkpoint.
    await publish(appender, src_a, "k1", "k3", "k3")
    expected = {"k1": 7, "k2": 3, "k3": 3}
    app2 = CountingApp(db, derived, every=3)
    second = service(etcd_client, root, "cons-c2", client, app2, exit_timeout=0.5)
    await second.start()
    try:
        await until(lambda: primaries(second, "shard-one"), lambda p: p == {"shard-one": "cons-c2"}, "PRIMARY")
        await until(lambda: read_counts(db), lambda c: c == expected, "counts after restart")
        for aa in ghost.commit()[1]:  # The ghost transaction commits now: counted once.
            await aa
        expected["ghost"] = 1
        await until(lambda: read_counts(db), lambda c: c == expected, "counts after the late commit")
        assert fences(db) == {f"{root}/items/shard-one": 2}, "restored once by each service"
        assert Counter(await derived_messages(client, derived)) == expected_derived(expected, 3)
    finally:
        await second.stop()


async def test_failing_application_marks_shard_failed(
    etcd_client: Any, etcd_prefix: str, client: JournalClient, appender: AppendService, tmp_path: Path
) -> None:
    root = etcd_prefix
    src_bad, src_good = await new_source(client, "svc/bad"), await new_source(client, "svc/good")
    derived = await new_source(client, "svc/derived")
    db = tmp_path / "counts.db"
    create_tables(db)
    await put_shard(etcd_client, root, shard_spec("shard-bad", src_bad))
    await put_shard(etcd_client, root, shard_spec("shard-good", src_good))
    app = CountingApp(db, derived, fail_on=frozenset({"boom"}))
    svc = service(etcd_client, root, "cons-c1", client, app, exit_timeout=0.5)
    await svc.start()
    try:
        both = {"shard-bad": "cons-c1", "shard-good": "cons-c1"}
        await until(lambda: primaries(svc, *both), lambda p: p == both, "PRIMARY")
        await publish(appender, src_good, "ok")
        await publish(appender, src_bad, "fine", "boom")

        def bad_status() -> cpb.ReplicaStatus:
            return next(a.value for a in svc.keyspace.assignments("shard-bad") if a.slot == 0)

        status = await until(bad_status, lambda s: s.code == Code.FAILED, "FAILED")
        assert list(status.errors) == ["runTransactions: app.ConsumeMessage: cannot count key 'boom'"]
        # The service keeps serving its other shard; the failed one committed nothing of its
        # failed transaction and stays assigned, FAILED.
        await publish(appender, src_good, "ok")
        await until(lambda: read_counts(db), lambda c: c == {"ok": 2}, "counts")
        assert primaries(svc, "shard-good") == {"shard-good": "cons-c1"}
        assert statuses(svc)["shard-bad"] == {0: ("cons-c1", Code.FAILED)}
        res = await svc.resolver.resolve("shard-bad")
        assert res.status == cpb.Status.SHARD_STOPPED
        assert svc.replicas["shard-bad"].error == status.errors[0]
    finally:
        await svc.stop()


async def test_two_services_share_shards_and_hand_them_over(
    etcd_client: Any, etcd_prefix: str, client: JournalClient, appender: AppendService, tmp_path: Path
) -> None:
    root = etcd_prefix
    shards = [f"shard-{i}" for i in range(4)]
    sources = {s: await new_source(client, f"svc/{s}") for s in shards}
    derived = await new_source(client, "svc/derived")
    db = tmp_path / "counts.db"
    create_tables(db)
    expected: dict[str, dict[str, int]] = {s: {} for s in shards}

    async def batch(n: int) -> None:
        for s in shards:
            keys = [f"{s}-k{j % 3}" for j in range(n)]
            await publish(appender, sources[s], *keys)
            for k in keys:
                expected[s][k] = expected[s].get(k, 0) + 1

    def counts_match() -> dict[str, dict[str, int]]:
        return read_counts_by_shard(db)

    one = service(etcd_client, root, "cons-c1", client, CountingApp(db, derived, every=4), exit_timeout=30.0)
    two = service(etcd_client, root, "cons-c2", client, CountingApp(db, derived, every=4), exit_timeout=30.0)
    await one.start()
    await two.start()
    try:
        for s in shards:
            await put_shard(etcd_client, root, shard_spec(s, sources[s]))

        def balanced(p: dict[str, str | None]) -> bool:
            return Counter(p.values()) == Counter({"cons-c1": 2, "cons-c2": 2})

        await until(lambda: primaries(one, *shards), balanced, "two primaries each")
        await until(lambda: primaries(two, *shards), balanced, "c2's view")
        await batch(5)
        await batch(7)
        await until(counts_match, lambda c: c == expected, "counts")
        assert sorted(two.replicas) == sorted(s for s, m in primaries(two, *shards).items() if m == "cons-c2")

        await one.stop()  # c2 takes its shards over, through standbys.
        await until(lambda: primaries(two, *shards), lambda p: set(p.values()) == {"cons-c2"}, "c2 primary of all")
        assert not one.replicas
        await batch(6)
        await until(counts_match, lambda c: c == expected, "counts after hand-over")
        totals: dict[str, int] = {k: n for per in expected.values() for k, n in per.items()}
        assert Counter(await derived_messages(client, derived)) == expected_derived(totals, 4)
    finally:
        await one.stop()
        await two.stop()


async def test_joining_service_takes_primaries_through_standbys(
    etcd_client: Any, etcd_prefix: str, client: JournalClient, appender: AppendService, tmp_path: Path
) -> None:
    """Shards with a hot standby: a service that joins later becomes their STANDBY, then the primary
    of half of them by in-place hand-offs (the old primary is demoted to a STANDBY), counting on."""
    root = etcd_prefix
    shards = [f"shard-{i}" for i in range(4)]
    sources = {s: await new_source(client, f"svc/{s}") for s in shards}
    derived = await new_source(client, "svc/derived")
    db = tmp_path / "counts.db"
    create_tables(db)
    expected: dict[str, dict[str, int]] = {s: {} for s in shards}

    async def batch(n: int) -> None:
        for s in shards:
            keys = [f"{s}-k{j % 2}" for j in range(n)]
            await publish(appender, sources[s], *keys)
            for k in keys:
                expected[s][k] = expected[s].get(k, 0) + 1

    def layout(svc: ConsumerService) -> dict[str, dict[int, tuple[str, int]]]:
        found = statuses(svc)
        return {s: found.get(s, {}) for s in shards}

    def settled(found: dict[str, dict[int, tuple[str, int]]]) -> bool:
        # A primary at slot 0 and a standby (the old primary, re-keyed to a free slot, or the
        # standby added for it).
        for slots in found.values():
            if len(slots) != 2 or 0 not in slots or slots[0][1] != Code.PRIMARY:
                return False
            if [code for slot, (_, code) in slots.items() if slot != 0] != [Code.STANDBY]:
                return False
        return Counter(slots[0][0] for slots in found.values()) == Counter({"cons-c1": 2, "cons-c2": 2})

    one = service(etcd_client, root, "cons-c1", client, CountingApp(db, derived, every=4), exit_timeout=30.0)
    two = service(etcd_client, root, "cons-c2", client, CountingApp(db, derived, every=4), exit_timeout=30.0)
    await one.start()
    try:
        for s in shards:
            spec = shard_spec(s, sources[s])
            spec.hot_standbys = 1
            await put_shard(etcd_client, root, spec)
        await until(lambda: primaries(one, *shards), lambda p: set(p.values()) == {"cons-c1"}, "c1 primary of all")
        await batch(5)
        await two.start()
        await batch(7)  # Published while primaries move.
        found = await until(lambda: layout(one), settled, "a primary and a standby each, two primaries per service")
        await until(lambda: layout(two), lambda f: f == found, "c2's view")
        await batch(3)
        await until(lambda: read_counts_by_shard(db), lambda c: c == expected, "counts")
        for svc, suffix in ((one, "cons-c1"), (two, "cons-c2")):
            served = sorted(s for s, r in svc.replicas.items() if r.serving)
            assert served == sorted(s for s, slots in found.items() if slots[0][0] == suffix)
        totals: dict[str, int] = {k: n for per in expected.values() for k, n in per.items()}
        assert Counter(await derived_messages(client, derived)) == expected_derived(totals, 4)
    finally:
        await one.stop()
        await two.stop()


async def test_lost_lease_stops_serving(
    etcd_client: Any, etcd_prefix: str, client: JournalClient, tmp_path: Path
) -> None:
    """A service whose lease is gone (revoked here) stops serving its shards and does not come back."""
    root = etcd_prefix
    src = await new_source(client, "svc/lease")
    db = tmp_path / "counts.db"
    create_tables(db)
    await put_shard(etcd_client, root, shard_spec("shard-lease", src))
    svc = service(etcd_client, root, "cons-c1", client, CountingApp(db, src), lease_ttl=3.0, exit_timeout=0.5)
    await svc.start()
    try:
        await until(lambda: primaries(svc, "shard-lease"), lambda p: p == {"shard-lease": "cons-c1"}, "PRIMARY")
        replica = svc.replicas["shard-lease"]
        await etcd_client.revoke_lease(svc.announcement.lease_id)
        await asyncio.wait_for(svc.lost.wait(), 15.0)
        await until(lambda: (dict(svc.replicas), replica.serving), lambda v: v == ({}, False), "replicas closed")
        assert svc.resolver.stopped
    finally:
        await svc.stop()


async def test_unknown_source_journal_fails_the_shard_naming_it(
    etcd_client: Any, etcd_prefix: str, client: JournalClient, appender: AppendService, tmp_path: Path
) -> None:
    root = etcd_prefix
    src_good = await new_source(client, "svc/known")
    missing = f"{src_good}-missing"
    db = tmp_path / "counts.db"
    create_tables(db)
    await put_shard(etcd_client, root, shard_spec("shard-unknown", src_good, missing))
    svc = service(etcd_client, root, "cons-u1", client, CountingApp(db, ""), exit_timeout=0.5)
    await svc.start()
    try:

        def status() -> cpb.ReplicaStatus | None:
            return next((a.value for a in svc.keyspace.assignments("shard-unknown") if a.slot == 0), None)

        failed = await until(status, lambda s: s is not None and s.code == Code.FAILED, "FAILED")
        assert failed is not None
        assert len(failed.errors) == 1 and missing in failed.errors[0] and "does not exist" in failed.errors[0]
        assert svc.replicas["shard-unknown"].error == failed.errors[0]
    finally:
        await svc.stop()
