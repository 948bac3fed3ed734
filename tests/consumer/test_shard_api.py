"""The Shard gRPC API (consumer/api.py) against real services: in-process ConsumerServices on the
session's etcd and the module's broker, each serving `consumer.Shard` on a grpc.aio server of its
own on a loopback port (its advertised endpoint), as Gazette's shard_api_test.go.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from broker.client import AppendService, JournalClient
from broker.protocol import pb as bpb
from cluster.keyspace import assignment_key
from consumer.api import ShardAPI, add_shard_service
from consumer.message import Publisher
from consumer.protocol import pb as cpb
from consumer.protocol import pb_grpc as cpb_grpc
from consumer.protocol import recoverylog_pb
from consumer.recoverylog import decode_hints, encode_hints
from consumer.service import ConsumerService
from tests.support.apps import NDJSON, CountingApp, Event, create_tables, read_counts
from tests.support.harness import journal_spec
from tests.support.journals import create_journal, unique
from tests.support.waiting import until

Code = cpb.ReplicaStatus.Code
T = TypeVar("T")
WAIT = 60.0


@dataclass
class Node:
    """A ConsumerService and its Shard API on a loopback port."""

    service: ConsumerService
    server: grpc.aio.Server
    api: ShardAPI
    channel: grpc.aio.Channel
    stub: cpb_grpc.ShardStub
    endpoint: str

    async def close(self) -> None:
        await self.service.stop()
        await self.server.stop(None)
        await self.api.close()
        await self.channel.close()


async def start_node(etcd: Any, root: str, suffix: str, client: JournalClient, app: CountingApp) -> Node:
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    endpoint = f"http://127.0.0.1:{port}"
    spec = cpb.ConsumerSpec(shard_limit=100)
    spec.process_spec.id.zone, spec.process_spec.id.suffix = "local", suffix
    spec.process_spec.endpoint = endpoint
    service = ConsumerService(etcd, root, spec, client, app, lease_ttl=10.0, watch_delay=0.01, exit_timeout=0.5)
    api = ShardAPI(service)
    add_shard_service(api, server)
    await server.start()
    await service.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    return Node(service, server, api, channel, cpb_grpc.ShardStub(channel), endpoint)


def shard_spec(shard_id: str, *sources: str, **labels: str) -> cpb.ShardSpec:
    spec = cpb.ShardSpec(id=shard_id, max_txn_duration=Duration(nanos=100_000_000))
    for journal in sorted(sources):
        spec.sources.add(journal=journal)
    for name, value in sorted(labels.items()):
        spec.labels.labels.add(name=name, value=value)
    return spec


def upsert(spec: cpb.ShardSpec, revision: int = 0) -> cpb.ApplyRequest.Change:
    return cpb.ApplyRequest.Change(upsert=spec, expect_mod_revision=revision)


def delete(shard_id: str, revision: int) -> cpb.ApplyRequest.Change:
    return cpb.ApplyRequest.Change(delete=shard_id, expect_mod_revision=revision)


def selector(include: dict[str, str] | None = None, exclude: dict[str, str] | None = None) -> bpb.LabelSelector:
    sel = bpb.LabelSelector()
    for name, value in sorted((include or {}).items()):
        sel.include.labels.add(name=name, value=value)
    for name, value in sorted((exclude or {}).items()):
        sel.exclude.labels.add(name=name, value=value)
    return sel


async def listed(node: Node, sel: bpb.LabelSelector | None = None) -> dict[str, cpb.ListResponse.Shard]:
    resp = await node.stub.List(cpb.ListRequest(selector=sel or bpb.LabelSelector()))
    assert resp.status == cpb.OK
    return {s.spec.id: s for s in resp.shards}


async def expect_error(call: Any, code: grpc.StatusCode, *texts: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value
    details = info.value.details() or ""
    for text in texts:
        assert text in details, details
    return details


def primary_of(shard: cpb.ListResponse.Shard) -> tuple[str, int]:
    """(member suffix, status code) of the shard's primary, ("", IDLE) without one."""
    if shard.route.primary < 0:
        return "", Code.IDLE
    return shard.route.members[shard.route.primary].suffix, shard.status[shard.route.primary].code


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "counts.db"
    create_tables(path)
    return path


@pytest.fixture
async def node(etcd_client: Any, etcd_prefix: str, client: JournalClient, db: Path) -> AsyncIterator[Node]:
    n = await start_node(etcd_client, etcd_prefix, "cons-a", client, CountingApp(db, "", every=1 << 62,
                                                                                fail_on=frozenset({"boom"})))
    try:
        yield n
    finally:
        await n.close()


async def new_source(client: JournalClient, name: str) -> str:
    spec = journal_spec(unique(name), content_type=NDJSON)
    await create_journal(client, spec)
    return spec.name


# -- Apply and List -------------------------------------------------------------------------------


async def test_apply_checks_revisions_in_one_transaction_and_list_selects(node: Node) -> None:
    one, two = shard_spec("shard-one", app="count", tier="a"), shard_spec("shard-two", app="count", tier="b")
    resp = await node.stub.Apply(cpb.ApplyRequest(changes=[upsert(one), upsert(two)]))
    assert resp.status == cpb.OK and resp.header.etcd.revision > 0
    assert resp.header.process_id.suffix == "cons-a" and resp.header.route.primary == -1
    created = resp.header.etcd.revision
    shards = await listed(node)  # The response waited until the mirror read the revision.
    assert sorted(shards) == ["shard-one", "shard-two"]
    assert shards["shard-one"].spec == one and shards["shard-one"].mod_revision == created
    assert shards["shard-one"].create_revision == created

    # A stale revision fails the whole transaction: the valid change beside it is not applied.
    three = shard_spec("shard-three")
    changed = shard_spec("shard-one", app="count", tier="c")
    resp = await node.stub.Apply(cpb.ApplyRequest(changes=[upsert(three), upsert(changed, created - 1)]))
    assert resp.status == cpb.ETCD_TRANSACTION_FAILED
    resp = await node.stub.Apply(cpb.ApplyRequest(changes=[upsert(one)]))
    assert resp.status == cpb.ETCD_TRANSACTION_FAILED, "0 creates, and the shard exists"
    assert sorted(await listed(node)) == ["shard-one", "shard-two"]

    # The current revision, and -1 (no check), succeed.
    resp = await node.stub.Apply(cpb.ApplyRequest(changes=[upsert(changed, created), upsert(three, -1)]))
    assert resp.status == cpb.OK
    shards = await listed(node)
    assert shards["shard-one"].spec == changed and shards["shard-one"].mod_revision == resp.header.etcd.revision
    assert shards["shard-one"].create_revision == created

    # Selectors over the labels, with the meta-label `id`.
    assert sorted(await listed(node, selector({"id": "shard-two"}))) == ["shard-two"]
    assert sorted(await listed(node, selector({"app": "count"}))) == ["shard-one", "shard-two"]
    assert sorted(await listed(node, selector({"app": "count"}, {"tier": "c"}))) == ["shard-two"]
    assert sorted(await listed(node, selector(exclude={"id": "shard-one"}))) == ["shard-three", "shard-two"]
    assert await listed(node, selector({"app": "other"})) == {}

    # Deletes: a stale revision fails, the current one or -1 succeed.
    revision = (await listed(node))["shard-two"].mod_revision
    resp = await node.stub.Apply(cpb.ApplyRequest(changes=[delete("shard-two", revision + 100)]))
    assert resp.status == cpb.ETCD_TRANSACTION_FAILED
    resp = await node.stub.Apply(cpb.ApplyRequest(changes=[delete("shard-two", revision), delete("shard-three", -1)]))
    assert resp.status == cpb.OK
    assert sorted(await listed(node)) == ["shard-one"]


async def test_list_reports_routes_and_statuses(node: Node, etcd_client: Any, etcd_prefix: str,
                                                client: JournalClient, db: Path) -> None:
    other = await start_node(etcd_client, etcd_prefix, "cons-b", client, CountingApp(db, "", every=1 << 62))
    try:
        spec = shard_spec("shard-hot")
        spec.hot_standbys = 1
        assert (await node.stub.Apply(cpb.ApplyRequest(changes=[upsert(spec)]))).status == cpb.OK

        def settled(shards: dict[str, cpb.ListResponse.Shard]) -> bool:
            shard = shards.get("shard-hot")
            return shard is not None and sorted(s.code for s in shard.status) == [Code.STANDBY, Code.PRIMARY]

        shard = (await until(lambda: listed(other), settled, "a primary and a standby"))["shard-hot"]
        assert [m.suffix for m in shard.route.members] == ["cons-a", "cons-b"]
        assert list(shard.route.endpoints) == [node.endpoint, other.endpoint]
        assert len(shard.status) == len(shard.route.members)
        assert shard.status[shard.route.primary].code == Code.PRIMARY
    finally:
        await other.close()


async def test_apply_and_list_validation_errors(node: Node) -> None:
    bad = grpc.StatusCode.INVALID_ARGUMENT  # An invalid request is an RPC error, not a status in the body.
    await expect_error(node.stub.Apply(cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change()])), bad,
                       "Changes[0]", "neither Upsert nor Delete")
    await expect_error(node.stub.Apply(cpb.ApplyRequest(changes=[upsert(cpb.ShardSpec(id="shard-x"))])), bad,
                       "Changes[0].Upsert", "MaxTxnDuration")
    await expect_error(node.stub.Apply(cpb.ApplyRequest(changes=[upsert(shard_spec("x"))])), bad, "Id")
    await expect_error(node.stub.Apply(cpb.ApplyRequest(changes=[upsert(shard_spec("shard-x"), -2)])), bad,
                       "ExpectModRevision")
    await expect_error(node.stub.Apply(cpb.ApplyRequest(changes=[delete("shard-x", 0)])), bad, "ExpectModRevision")
    await expect_error(node.stub.Apply(cpb.ApplyRequest(changes=[upsert(shard_spec("shard-x", id="x"))])), bad,
                       'cannot include label "id"')
    await expect_error(node.stub.List(cpb.ListRequest(selector=selector({"bad name!": "v"}))), bad, "Selector")
    assert await listed(node) == {}


# -- Stat ----------------------------------------------------------------------------------------


async def test_stat_resolves_waits_for_read_through_and_proxies(
    node: Node, etcd_client: Any, etcd_prefix: str, client: JournalClient, appender: AppendService, db: Path
) -> None:
    source = await new_source(client, "api/src")
    spec = shard_spec("shard-stat", source)
    disabled = shard_spec("shard-off")
    disabled.disable = True
    resp = await node.stub.Apply(cpb.ApplyRequest(changes=[upsert(spec), upsert(disabled)]))
    assert resp.status == cpb.OK

    missing = await node.stub.Stat(cpb.StatRequest(shard="shard-nope"))
    assert missing.status == cpb.SHARD_NOT_FOUND and missing.header.process_id.suffix == "cons-a"
    off = await node.stub.Stat(cpb.StatRequest(shard="shard-off"))
    assert off.status == cpb.NO_SHARD_PRIMARY

    await until(lambda: listed(node), lambda s: primary_of(s["shard-stat"]) == ("cons-a", Code.PRIMARY), "PRIMARY")

    # read_through blocks until the shard has read that far; offsets of other journals are ignored.
    pub = Publisher(appender)
    appends = [pub.publish_committed(lambda _m: (source, NDJSON), Event(Key=k)) for k in ("x", "y", "x")]
    for aa in appends:
        await aa
    head = max(aa.end for aa in appends)
    stat = await node.stub.Stat(
        cpb.StatRequest(shard="shard-stat", read_through={source: head, "not/a/source": 123}), timeout=WAIT
    )
    assert stat.status == cpb.OK and stat.read_through[source] >= head
    assert "not/a/source" not in stat.read_through
    assert stat.header.process_id.suffix == "cons-a" and stat.header.route.members[0].suffix == "cons-a"
    assert read_counts(db) == {"x": 2, "y": 1}

    # Beyond the head: waits, here until the deadline.
    await expect_error(
        node.stub.Stat(cpb.StatRequest(shard="shard-stat", read_through={source: head + 10_000}), timeout=0.5),
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )

    # Another process proxies to the primary, which refuses to proxy again.
    other = await start_node(etcd_client, etcd_prefix, "cons-b", client, CountingApp(db, "", every=1 << 62))
    try:
        proxied = await other.stub.Stat(cpb.StatRequest(shard="shard-stat", read_through={source: head}),
                                        timeout=WAIT)
        assert proxied.status == cpb.OK and proxied.read_through[source] >= head
        assert proxied.header.process_id.suffix == "cons-a"
        header = bpb.Header()
        header.CopyFrom(proxied.header)
        header.process_id.suffix = "cons-b"  # Addressed to cons-b, which is not the primary.
        not_primary = await other.stub.Stat(cpb.StatRequest(shard="shard-stat", header=header))
        assert not_primary.status == cpb.NOT_SHARD_PRIMARY and not_primary.header.process_id.suffix == "cons-b"
        header.etcd.cluster_id += 1
        await expect_error(other.stub.Stat(cpb.StatRequest(shard="shard-stat", header=header)),
                           grpc.StatusCode.FAILED_PRECONDITION, "ClusterId doesn't match")
    finally:
        await other.close()

    bad = grpc.StatusCode.INVALID_ARGUMENT
    await expect_error(node.stub.Stat(cpb.StatRequest(shard="x")), bad, "Shard")
    await expect_error(node.stub.Stat(cpb.StatRequest(shard="shard-stat", read_through={source: -1})), bad,
                       "ReadThrough")


# -- Unassign -------------------------------------------------------------------------------------


async def test_unassign_removes_primaries_and_failed(
    node: Node, client: JournalClient, appender: AppendService, etcd_client: Any, etcd_prefix: str
) -> None:
    good, bad = await new_source(client, "api/good"), await new_source(client, "api/bad")
    resp = await node.stub.Apply(cpb.ApplyRequest(changes=[upsert(shard_spec("shard-good", good)),
                                                           upsert(shard_spec("shard-bad", bad))]))
    assert resp.status == cpb.OK
    await until(lambda: listed(node), lambda s: all(primary_of(x)[1] == Code.PRIMARY for x in s.values()),
                "both PRIMARY")
    await Publisher(appender).publish_committed(lambda _m: (bad, NDJSON), Event(Key="boom"))
    await until(lambda: listed(node), lambda s: primary_of(s["shard-bad"])[1] == Code.FAILED, "FAILED")
    failed_key = assignment_key(etcd_prefix, "shard-bad", "local", "cons-a", 0)
    [failed] = node.service.keyspace.assignments("shard-bad")

    both = ["shard-good", "shard-bad", "shard-nope"]
    dry = await node.stub.Unassign(cpb.UnassignRequest(shards=both, dry_run=True))
    assert dry.status == cpb.OK and list(dry.shards) == ["shard-good", "shard-bad"]
    only_failed = await node.stub.Unassign(cpb.UnassignRequest(shards=both, only_failed=True, dry_run=True))
    assert list(only_failed.shards) == ["shard-bad"]
    assert (await etcd_client.get(failed_key.encode())) is not None, "a dry run changes nothing"

    good_before = (await listed(node))["shard-good"]
    done = await node.stub.Unassign(cpb.UnassignRequest(shards=both, only_failed=True))
    assert done.status == cpb.OK and list(done.shards) == ["shard-bad"]
    # The FAILED assignment was deleted (the allocator then assigns the shard again: a new key).
    again = await etcd_client.get(failed_key.encode())
    assert again is None or again.create_revision > failed.create_revision
    shards = await listed(node)
    assert shards["shard-good"].mod_revision == good_before.mod_revision
    assert primary_of(shards["shard-good"]) == ("cons-a", Code.PRIMARY), "only_failed keeps the healthy primary"

    done = await node.stub.Unassign(cpb.UnassignRequest(shards=["shard-good"]))
    assert done.status == cpb.OK and list(done.shards) == ["shard-good"]
    # Reassigned by the allocator, and served again from its checkpoint.
    await until(lambda: listed(node), lambda s: primary_of(s["shard-good"]) == ("cons-a", Code.PRIMARY),
                "PRIMARY again")

    await expect_error(node.stub.Unassign(cpb.UnassignRequest(shards=["x"])), grpc.StatusCode.INVALID_ARGUMENT,
                       "Shards[0]")


# -- GetHints -------------------------------------------------------------------------------------


def sample_hints(log: str) -> recoverylog_pb.FSMHints:
    hints = recoverylog_pb.FSMHints(log=log)
    node = hints.live_nodes.add(fnode=3)
    node.segments.add(author=0x1234, first_seq_no=3, first_offset=100, first_checksum=77, last_seq_no=9,
                      last_offset=400)
    hints.properties.add(path="/IDENTITY", content="abc")
    return hints


def test_hints_json_is_gazettes_and_round_trips() -> None:
    hints = sample_hints("recovery/logs/shard-h")
    value = encode_hints(hints)
    assert value.startswith(b'{"log":"recovery/logs/shard-h","live_nodes":[{"fnode":3,"segments":[{"author":4660,')
    assert decode_hints(value) == hints
    assert encode_hints(recoverylog_pb.FSMHints()) == b'{"live_nodes":null,"properties":null}'
    assert decode_hints(hints.SerializeToString()) == hints, "protobuf values are read too"


async def test_get_hints(node: Node, etcd_client: Any) -> None:
    missing = await node.stub.GetHints(cpb.GetHintsRequest(shard="shard-nope"))
    assert missing.status == cpb.SHARD_NOT_FOUND

    hint_prefix = f"/test-hints/{node.service.root.rsplit('/', 1)[-1]}"
    spec = shard_spec("shard-h")
    spec.recovery_log_prefix, spec.hint_prefix, spec.hint_backups = "recovery/logs", hint_prefix, 2
    assert (await node.stub.Apply(cpb.ApplyRequest(changes=[upsert(spec)]))).status == cpb.OK
    empty = await node.stub.GetHints(cpb.GetHintsRequest(shard="shard-h"))
    assert empty.status == cpb.OK and not empty.primary_hints.HasField("hints")
    assert len(empty.backup_hints) == 2 and not any(b.HasField("hints") for b in empty.backup_hints)

    hints = sample_hints("recovery/logs/shard-h")
    revision = (await listed(node))["shard-h"].mod_revision
    change = upsert(spec, revision)
    change.primary_hints.CopyFrom(hints)
    assert (await node.stub.Apply(cpb.ApplyRequest(changes=[change]))).status == cpb.OK
    stored = await etcd_client.get(f"{hint_prefix}/shard-h.primary".encode())
    assert stored is not None and bytes(stored.value).startswith(b"{"), "stored as JSON, as Gazette"
    got = await node.stub.GetHints(cpb.GetHintsRequest(shard="shard-h"))
    assert got.status == cpb.OK and got.primary_hints.hints == hints
    assert len(got.backup_hints) == 2

    # Hints that do not validate are refused by Apply.
    bad = upsert(spec, -1)
    bad.primary_hints.CopyFrom(hints)
    bad.primary_hints.live_nodes[0].segments[0].log = "recovery/logs/shard-h"  # Duplicates FSMHints.log.
    await expect_error(node.stub.Apply(cpb.ApplyRequest(changes=[bad])), grpc.StatusCode.INVALID_ARGUMENT,
                       "PrimaryHints")
    # So are hints with a delete.
    with_delete = delete("shard-h", -1)
    with_delete.primary_hints.CopyFrom(hints)
    await expect_error(node.stub.Apply(cpb.ApplyRequest(changes=[with_delete])), grpc.StatusCode.INVALID_ARGUMENT,
                       "only with an upsert")
    # Gazette's GetHints validates no request: a malformed ID is not found.
    assert (await node.stub.GetHints(cpb.GetHintsRequest(shard="x"))).status == cpb.SHARD_NOT_FOUND

    # Backups (stored by recoveries) are returned in order; hints of another log are an error naming their key.
    backup = sample_hints("recovery/logs/shard-h")
    backup.live_nodes[0].segments[0].last_seq_no = 11
    await etcd_client.put(f"{hint_prefix}/shard-h.backup.1".encode(), encode_hints(backup))
    got = await node.stub.GetHints(cpb.GetHintsRequest(shard="shard-h"))
    assert got.primary_hints.hints == hints
    assert not got.backup_hints[0].HasField("hints") and got.backup_hints[1].hints == backup
    await etcd_client.put(f"{hint_prefix}/shard-h.backup.0".encode(), encode_hints(sample_hints("other/log")))
    await expect_error(node.stub.GetHints(cpb.GetHintsRequest(shard="shard-h")), grpc.StatusCode.FAILED_PRECONDITION,
                       "hints.Log other/log != ShardSpec.RecoveryLog recovery/logs/shard-h", "shard-h.backup.0")
    await etcd_client.delete_prefix(hint_prefix.encode())


# -- undecodable requests -------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["List", "Stat", "Apply", "GetHints", "Unassign"])
async def test_undecodable_request_is_internal(node: Node, method: str) -> None:
    call = node.channel.unary_unary(f"/consumer.Shard/{method}", request_serializer=None,
                                    response_deserializer=None)
    await expect_error(call(b"\xff\xff\xff"), grpc.StatusCode.INTERNAL, "grpc: error unmarshalling request")
