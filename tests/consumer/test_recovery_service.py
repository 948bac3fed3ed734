"""Recovery logs in the consumer runtime, in-process (ConsumerServices against a real etcd and
broker): recorded hints stored by the primary and used by the next one, and a primary handed off in
place to a hot standby while rebalancing (the demoted primary becomes a standby, playing the log).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from broker.client import AppendService, JournalClient
from broker.protocol import labels
from consumer.protocol import pb as cpb
from consumer.recoverylog import fetch_hints
from consumer.service import ConsumerService
from tests.consumer.test_service import consumer_spec, publish, put_shard, shard_spec, statuses, until
from tests.support.apps import NDJSON, RecordedCountingApp
from tests.support.harness import journal_spec
from tests.support.journals import create_journal, unique

Code = cpb.ReplicaStatus.Code


def service(etcd: Any, root: str, suffix: str, client: JournalClient, app: Any, **kwargs: Any) -> ConsumerService:
    kwargs.setdefault("lease_ttl", 10.0)
    kwargs.setdefault("watch_delay", 0.01)
    return ConsumerService(etcd, root, consumer_spec(suffix), client, app, **kwargs)


async def recorded_shard(client: JournalClient, source: str, shard_id: str, hot_standbys: int) -> cpb.ShardSpec:
    """A shard of `source` with a recovery log (created here) and hints under a unique prefix."""
    log_prefix = unique("recovery-svc/logs")
    await create_journal(client, journal_spec(f"{log_prefix}/{shard_id}",
                                              content_type=labels.CONTENT_TYPE_RECOVERY_LOG))
    spec = shard_spec(shard_id, source)
    spec.recovery_log_prefix, spec.hint_prefix, spec.hint_backups = log_prefix, f"/{unique('hints')}", 2
    spec.hot_standbys = hot_standbys
    return spec


def committed(tmp: Path, shard: str) -> dict[str, int] | None:
    path = tmp / f"{shard}.committed.json"
    if not path.exists():
        return None
    state: dict[str, int] = json.loads(path.read_text())["state"]
    return state


async def test_primary_stores_recorded_hints_and_the_next_primary_plays_from_them(
    etcd_client: Any, etcd_prefix: str, client: JournalClient, appender: AppendService, tmp_path: Path
) -> None:
    source = unique("recovery-svc/src")
    await create_journal(client, journal_spec(source, content_type=NDJSON))
    spec = await recorded_shard(client, source, "shard-h", 0)
    await put_shard(etcd_client, etcd_prefix, spec)
    app = RecordedCountingApp(tmp_path)

    first = service(etcd_client, etcd_prefix, "cons-h1", client, app, exit_timeout=0.2, hints_interval=0.2)
    await first.start()
    try:
        await until(lambda: statuses(first).get("shard-h"), lambda s: s == {0: ("cons-h1", Code.PRIMARY)}, "PRIMARY")
        replica = first.replicas["shard-h"]
        assert replica.recorder is not None and replica.recovery_stats is not None
        assert not replica.recovery_stats.hinted and not replica.recovery_stats.was_standby
        recorded_dir = replica.recorder.dir
        await publish(appender, source, "a", "b", "a")
        await until(lambda: committed(tmp_path, "shard-h"), lambda c: c == {"a": 2, "b": 1}, "the first commits")
        # The periodic tick stores recorded hints between transactions (one more triggers it).
        await asyncio.sleep(0.3)
        await publish(appender, source, "c")
        await until(lambda: committed(tmp_path, "shard-h"), lambda c: c == {"a": 2, "b": 1, "c": 1}, "commits")

        async def primary_nodes() -> int:
            fetched = await fetch_hints(etcd_client, spec)
            return len(fetched.primary.live_nodes) if fetched.primary is not None else 0

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while await primary_nodes() == 0:
            assert loop.time() < deadline, "no recorded hints stored"
            await asyncio.sleep(0.05)
        await publish(appender, source, "a")
        await until(lambda: committed(tmp_path, "shard-h"), lambda c: c == {"a": 3, "b": 1, "c": 1}, "commits")
    finally:
        await first.stop()  # A lone member: it keeps the shard until exit_timeout, then stops cleanly.
    assert not os.path.exists(recorded_dir), "the recorded directory is removed"

    fetched = await fetch_hints(etcd_client, spec)
    assert fetched.primary is not None and fetched.primary.live_nodes, "stored at the clean stop"
    [backup0, backup1] = fetched.backups
    assert backup0 is not None and not backup0.live_nodes and backup1 is None

    second = service(etcd_client, etcd_prefix, "cons-h2", client, app)
    await second.start()
    try:
        await until(lambda: statuses(second).get("shard-h"), lambda s: s == {0: ("cons-h2", Code.PRIMARY)},
                    "PRIMARY again")
        stats = second.replicas["shard-h"].recovery_stats
        assert stats is not None and stats.hinted, "played from the stored hints"
        recovered = json.loads((tmp_path / "shard-h.recovered.json").read_text())["state"]
        assert recovered == {"a": 3, "b": 1, "c": 1}
        await publish(appender, source, "b")
        await until(lambda: committed(tmp_path, "shard-h"), lambda c: c == {"a": 3, "b": 2, "c": 1}, "resumed")
        fetched = await fetch_hints(etcd_client, spec)
        [backup0, backup1] = fetched.backups
        assert backup0 is not None and backup0.live_nodes, "the second recovery's hints"
        assert backup1 is not None and not backup1.live_nodes, "the first recovery's, rotated"
    finally:
        await second.stop()
    await etcd_client.delete_prefix(spec.hint_prefix.encode())


async def test_rebalancing_hands_a_primary_to_its_hot_standby_in_place(
    etcd_client: Any, etcd_prefix: str, client: JournalClient, appender: AppendService, tmp_path: Path
) -> None:
    source = unique("recovery-svc/src")
    await create_journal(client, journal_spec(source, content_type=NDJSON))
    specs = [await recorded_shard(client, source, f"shard-{i}", 1) for i in range(2)]
    for spec in specs:
        await put_shard(etcd_client, etcd_prefix, spec)
    app = RecordedCountingApp(tmp_path)
    shards = [s.id for s in specs]

    first = service(etcd_client, etcd_prefix, "cons-r1", client, app)
    second = service(etcd_client, etcd_prefix, "cons-r2", client, app)
    await first.start()
    try:
        await until(lambda: statuses(first), lambda s: all(s.get(i) == {0: ("cons-r1", Code.PRIMARY)} for i in shards),
                    "both primaries on the first")
        await publish(appender, source, "x", "y", "x")
        for shard in shards:
            await until(lambda shard=shard: committed(tmp_path, shard), lambda c: c == {"x": 2, "y": 1}, "counts")

        # The second joins: each shard gets a standby there, then one primary moves to it in place.
        await second.start()

        def balanced(s: dict[str, dict[int, tuple[str, int]]]) -> bool:
            owners = sorted(s.get(i, {}).get(0, ("", 0))[0] for i in shards)
            # Slot by slot: right after the allocator's hand-off the new slot 0 still holds its
            # STANDBY value and the old primary's slot its PRIMARY, until each replica reports.
            return owners == ["cons-r1", "cons-r2"] and all(
                sorted((slot > 0, code) for slot, (_, code) in s.get(i, {}).items())
                == [(False, Code.PRIMARY), (True, Code.STANDBY)] for i in shards
            )

        found = await until(lambda: statuses(first), balanced, "one primary each, each with a STANDBY")
        [moved] = [i for i in shards if found[i][0][0] == "cons-r2"]
        stats = second.replicas[moved].recovery_stats
        assert stats is not None and stats.was_standby, "the hot standby was promoted"
        demoted = first.replicas[moved]
        assert demoted.slot != 0 and demoted.recorder is None and demoted.tailing, "the old primary plays as standby"

        await publish(appender, source, "y", "z")
        for shard in shards:
            await until(lambda shard=shard: committed(tmp_path, shard), lambda c: c == {"x": 2, "y": 2, "z": 1},
                        "counts after the hand-off")
    finally:
        await asyncio.gather(first.abort(revoke_lease=True), second.abort(revoke_lease=True))
    for spec in specs:
        await etcd_client.delete_prefix(spec.hint_prefix.encode())


async def test_a_recovery_log_that_is_not_one_fails_the_shard_naming_it(
    etcd_client: Any, etcd_prefix: str, client: JournalClient, tmp_path: Path
) -> None:
    source = unique("recovery-svc/src")
    await create_journal(client, journal_spec(source, content_type=NDJSON))
    spec = shard_spec("shard-bad", source)
    log_prefix = unique("recovery-svc/not-logs")
    await create_journal(client, journal_spec(f"{log_prefix}/shard-bad", content_type=NDJSON))
    spec.recovery_log_prefix, spec.hint_prefix, spec.hot_standbys = log_prefix, f"/{unique('hints')}", 1
    await put_shard(etcd_client, etcd_prefix, spec)

    first = service(etcd_client, etcd_prefix, "cons-b1", client, RecordedCountingApp(tmp_path))
    await first.start()
    try:
        found = await until(lambda: statuses(first).get("shard-bad"), lambda s: bool(s) and s[0][1] == Code.FAILED,
                            "FAILED")
        assert found == {0: ("cons-b1", Code.FAILED)}
        [assignment] = first.keyspace.assignments("shard-bad")
        [error] = assignment.value.errors
        assert error.startswith("completeRecovery: playLog: ") or error.startswith("playLog: "), error
        assert (f"expected label content-type value application/x-gazette-recoverylog (got {NDJSON})" in error
                and f"{log_prefix}/shard-bad" in error), error
    finally:
        await first.abort(revoke_lease=True)
