"""Gazette's `gazctl shards prune` rule (cmd/gazctl/gazctlcmd/shards_prune.go, `gazctl.prune.HintedLogs`)
applied to the hints real `gazette consume` processes store, for a JSONFileStore and a SQLiteStore
(recorded through its VFS): which recoveries leave a hint slot that skips the log, whether Gazette
warns, and that deleting what the rule prunes leaves a log a new primary recovers exactly from.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Sequence
from typing import Any

import pytest

from broker.client import AppendService, JournalClient, fragments_request
from consumer.protocol import pb as cpb
from consumer.recoverylog import FSMHints
from gazctl.prune import HintedLogs, all_fragments, hint_slots, prunable_fragments, prune_plans
from tests.consumer import test_recovery_cli as recovery
from tests.consumer.test_consume_cli import publish
from tests.consumer.test_recovery_cli import Cluster, counts
from tests.gazctl.commands.shards.test_shards_recovery_cli import persisted, small_fragment_log
from tests.support.harness import BrokerProcess

cluster = recovery.cluster
Code = cpb.ReplicaStatus.Code


def fold(cluster: Cluster, resp: cpb.GetHintsResponse) -> HintedLogs:
    hinted = HintedLogs()
    primary, backups = hint_slots(resp)
    hinted.add_shard(cluster.shard, cluster.recovery_log, primary, backups)
    return hinted


async def serve_round(cluster: Cluster, appender: AppendService, member: str, keys: list[str],
                      batches: Sequence[Sequence[str]]) -> cpb.GetHintsResponse:
    """`member` serves as primary: commit `batches` (one transaction each), then wait until the
    primary stored recorded hints with live files (each hints interval, between transactions)."""
    channel, stub = cluster.stub(member)
    async with channel:
        await cluster.wait_statuses(stub, {Code.PRIMARY: 1}, primary=member)
        for batch in batches:
            keys.extend(batch)
            await cluster.stat_through(stub, await publish(appender, cluster.source, *batch))
            await cluster.wait_committed(counts(*keys))
        before = (await recovery.get_hints(stub, cluster.shard)).primary_hints
        for _ in range(100):
            resp = await recovery.get_hints(stub, cluster.shard)
            if resp.primary_hints != before and resp.primary_hints.hints.live_nodes:
                return resp
            keys.append("tick")
            await cluster.stat_through(stub, await publish(appender, cluster.source, "tick"))
            await asyncio.sleep(0.1)
    raise AssertionError(f"{member} never stored recorded hints\n{cluster.all_logs()}")


@pytest.mark.parametrize("store", ["json", "sqlite"])
async def test_gazettes_prune_rule_over_a_shards_hints_and_the_pruned_log_recovers(
    cluster: Cluster, client: JournalClient, appender: AppendService, broker: BrokerProcess, store: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    child_env = recovery.child_env
    monkeypatch.setattr(recovery, "child_env", lambda **kw: {**child_env(**kw), "CONSUMER_HINTS_INTERVAL": "0.2"})
    cluster.store = store
    await small_fragment_log(cluster, client)
    spec = cluster.spec(0)
    spec.hint_backups = 2
    keys: list[str] = []
    batches = [[f"{store}-{i % 4}-" + "v" * (i * 13 % 90) for i in range(j, j + 30)] for j in range(0, 90, 30)]

    await cluster.start("prune-1")
    channel, stub = cluster.stub("prune-1")
    async with channel:
        assert (await stub.Apply(cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(upsert=spec)]))).status == cpb.OK
    # 1st recovery, of an empty log: backup.0 holds hints without live files (as Gazette's consumer
    # stores them). The first slot Gazette folds is empty: the log is skipped without a warning.
    resp = await serve_round(cluster, appender, "prune-1", keys, batches)
    primary, backups = hint_slots(resp)
    assert primary is not None and primary.live_nodes and backups[0] is not None and not backups[0].live_nodes
    assert backups[1] is None
    hinted = fold(cluster, resp)
    assert hinted.skipped and hinted.segments == {} and hinted.warned() == []

    # 2nd recovery (after a SIGTERM hand-off): backup.0 has live files, backup.1 is the empty one.
    # backup.0 is folded, then the log is skipped: the case Gazette warns of ("skipping journal
    # because a shard is missing hints that cover it ...").
    await cluster.start("prune-2")
    assert await asyncio.to_thread(cluster.consumers["prune-1"].stop, signal.SIGTERM) == 0
    resp = await serve_round(cluster, appender, "prune-2", keys, batches)
    primary, backups = hint_slots(resp)
    assert [bool(b is not None and b.live_nodes) for b in backups] == [True, False]
    assert fold(cluster, resp).warned() == [cluster.recovery_log]

    # 3rd recovery: every slot has live files: nothing skips the log, and its fragments between
    # the hinted live segments are pruned.
    await cluster.start("prune-3")
    assert await asyncio.to_thread(cluster.consumers["prune-2"].stop, signal.SIGTERM) == 0
    resp = await serve_round(cluster, appender, "prune-3", keys, batches)
    primary, backups = hint_slots(resp)
    assert primary is not None and all(b is not None and b.live_nodes for b in backups), resp
    hinted = fold(cluster, resp)
    assert hinted.skipped == {} and hinted.prunable() == [cluster.recovery_log]
    await persisted(client, cluster.recovery_log, 4)
    listed = await all_fragments(client, fragments_request(cluster.recovery_log))
    plan = prunable_fragments(cluster.recovery_log, [f.spec for f in listed.fragments],
                              hinted.segments[cluster.recovery_log])
    assert plan.aged, f"the dead files' fragments are prunable: {hinted.segments}"
    assert len(plan.aged) < plan.stats.fragments_total
    assert broker.file_root is not None
    await prune_plans([plan], str(broker.file_root), dry_run=False)

    # A new primary recovers the exact state from the pruned log (from the primary hints).
    await cluster.start("prune-4")
    assert await asyncio.to_thread(cluster.consumers["prune-3"].stop, signal.SIGTERM) == 0
    channel, stub = cluster.stub("prune-4")
    async with channel:
        await cluster.wait_statuses(stub, {Code.PRIMARY: 1}, primary="prune-4")
        recovered = cluster.state("recovered")
        assert recovered is not None and recovered["pid"] == cluster.consumers["prune-4"].proc.pid
        assert recovered["state"] == counts(*keys)
        await cluster.stat_through(stub, await publish(appender, cluster.source, "after"))
        await cluster.wait_committed(counts(*keys, "after"))


async def test_get_hints_fields_are_gazettes(cluster: Cluster, etcd_client: Any) -> None:
    """GetHints of a real `gazette consume`, field by field as Gazette's ShardGetHints answers
    (consumer/shard_api.go): status, an unrouted header, primary_hints always on the wire (its
    hints unset where the key is empty), one backup_hints entry per backup key, no extension."""
    await cluster.start("hints-a")
    channel, stub = cluster.stub("hints-a")
    raw_call = channel.unary_unary("/consumer.Shard/GetHints", request_serializer=None, response_deserializer=None)

    async def get(shard: str) -> cpb.GetHintsResponse:
        raw = await raw_call(cpb.GetHintsRequest(shard=shard).SerializeToString(), timeout=recovery.WAIT)
        resp = cpb.GetHintsResponse.FromString(raw)
        assert resp.HasField("primary_hints"), f"primary_hints is non-nullable in Gazette: {raw.hex()}"
        assert resp.extension == b""
        listed = await stub.List(cpb.ListRequest(), timeout=recovery.WAIT)
        assert resp.header.process_id == listed.header.process_id and resp.header.process_id.suffix == "hints-a"
        assert resp.header.route.primary == -1 and not resp.header.route.members
        assert resp.header.etcd.cluster_id and resp.header.etcd.member_id and resp.header.etcd.revision > 0
        return resp

    async with channel:
        # An unknown shard, and a malformed ID (Gazette validates no GetHintsRequest): not found.
        for shard in ("no-such-shard", "x"):
            resp = await get(shard)
            assert resp.status == cpb.SHARD_NOT_FOUND and not resp.primary_hints.HasField("hints")
            assert not resp.backup_hints
        # No hints stored yet (a disabled shard is never assigned): every slot empty.
        spec = cluster.spec(0)
        spec.disable = True
        assert (await stub.Apply(cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(upsert=spec)]))).status == cpb.OK
        resp = await get(cluster.shard)
        assert resp.status == cpb.OK and not resp.primary_hints.HasField("hints")
        assert len(resp.backup_hints) == 2 and not any(b.HasField("hints") for b in resp.backup_hints)
        # Primary hints only (stored by Apply), without backup keys.
        hints = FSMHints(log=cluster.recovery_log)
        hints.live_nodes.add(fnode=1).segments.add(author=7, first_seq_no=1, last_seq_no=3, first_offset=0,
                                                   last_offset=120)
        spec.hint_backups = 0
        change = cpb.ApplyRequest.Change(upsert=spec, expect_mod_revision=-1, primary_hints=hints)
        assert (await stub.Apply(cpb.ApplyRequest(changes=[change]))).status == cpb.OK
        resp = await get(cluster.shard)
        assert resp.primary_hints.hints == hints and list(resp.backup_hints) == []
        # Backups: the shard, enabled without primary hints, recovers its empty log, storing the
        # recovered hints (its log, no live files) at backup.0; backup.1 stays empty.
        await etcd_client.delete(f"{spec.hint_prefix}/{spec.id}.primary".encode())
        spec.disable, spec.hint_backups = False, 2
        change = cpb.ApplyRequest.Change(upsert=spec, expect_mod_revision=-1)
        assert (await stub.Apply(cpb.ApplyRequest(changes=[change]))).status == cpb.OK
        await cluster.wait_statuses(stub, {Code.PRIMARY: 1})
        resp = await get(cluster.shard)
        assert not resp.primary_hints.HasField("hints")
        [b0, b1] = resp.backup_hints
        assert b0.hints == FSMHints(log=cluster.recovery_log) and not b1.HasField("hints")
