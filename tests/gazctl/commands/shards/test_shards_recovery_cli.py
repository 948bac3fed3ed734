"""`gazctl shards recover` and `gazctl shards prune` on a real recovery log: a shard whose store
is recorded to its log (`tests.support.cli_apps:recorded_app`, real `gazette consume` processes,
a real broker with a file:// store), played into a local directory, and pruned of the fragments
its hints no longer need, after which the shard still recovers its exact state."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

from broker.client import AppendService, JournalClient, apply_journals, fragments_request, list_fragments, list_journals
from broker.protocol import labels
from broker.protocol import pb as bpb
from consumer.protocol import pb as cpb
from tests.consumer import test_recovery_cli as recovery
from tests.consumer.test_consume_cli import publish
from tests.consumer.test_recovery_cli import Cluster, counts
from tests.support.harness import BrokerProcess, free_port, journal_spec, one_line_error, run_gazctl

Code = cpb.ReplicaStatus.Code

# The recovery tests' fixture: a Cluster (a source journal, a recovery log and the consumers serving a shard).
cluster = recovery.cluster


def gazctl(cluster: Cluster, consumer: str, *args: str) -> tuple[int, str, str]:
    done = run_gazctl(cluster.broker, "shards", *args, env={"CONSUMER_ADDRESS": cluster.consumers[consumer].url})
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout, done.stderr


async def small_fragment_log(cluster: Cluster, client: JournalClient) -> None:
    """Re-apply the shard's recovery log with tiny fragments kept in the broker's file:// store, so
    every few commits roll a fragment which is then persisted."""
    spec = journal_spec(cluster.recovery_log, content_type=labels.CONTENT_TYPE_RECOVERY_LOG)
    spec.fragment.length = 1024
    spec.fragment.stores.append("file:///")
    selector = bpb.LabelSelector(include=bpb.LabelSet(labels=[bpb.Label(name="name", value=cluster.recovery_log)]))
    [journal] = (await list_journals(client, selector)).journals
    await apply_journals(client, [bpb.ApplyRequest.Change(upsert=spec, expect_mod_revision=journal.mod_revision)])


async def persisted(client: JournalClient, journal: str, at_least: int) -> list[bpb.Fragment]:
    """Wait until `journal` has `at_least` persisted fragments; return them all."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while True:
        resp = await list_fragments(client, fragments_request(journal))
        done = [f.spec for f in resp.fragments if f.spec.backing_store]
        if len(done) >= at_least:
            return [f.spec for f in resp.fragments]
        assert loop.time() < deadline, resp
        await asyncio.sleep(0.2)


def store_state(directory: Path) -> dict[str, int]:
    """The user state in a JSONFileStore's state.json: the second of its three JSON documents."""
    decoder, text = json.JSONDecoder(), (directory / "state.json").read_text()
    _, end = decoder.raw_decode(text)
    state, _ = decoder.raw_decode(text, end + 1)
    assert isinstance(state, dict)
    return state


async def hints_stored(cluster: Cluster, consumer: str, appender: AppendService, keys: list[str]) -> None:
    """Wait until the primary stored recorded hints (each hints interval, between transactions:
    a message is published each round to run one), with live files."""
    channel, stub = cluster.stub(consumer)
    async with channel:
        for _ in range(100):
            hints = await recovery.get_hints(stub, cluster.shard)
            if hints.primary_hints.HasField("hints") and hints.primary_hints.hints.live_nodes:
                return
            keys.append("tick")
            await cluster.stat_through(stub, await publish(appender, cluster.source, "tick"))
            await asyncio.sleep(0.2)
    raise AssertionError("the primary never stored its recorded hints")


async def test_recover_and_prune_a_shards_recovery_log(
    cluster: Cluster,
    client: JournalClient,
    appender: AppendService,
    broker: BrokerProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Consumers store their primaries' recorded hints every half second.
    child_env = recovery.child_env
    monkeypatch.setattr(recovery, "child_env", lambda **kw: {**child_env(**kw), "CONSUMER_HINTS_INTERVAL": "0.5"})
    await small_fragment_log(cluster, client)
    spec = cluster.spec(0)
    spec.hint_backups = 0  # Only the primary's recorded hints.
    await cluster.start("prune-a")
    channel, stub = cluster.stub("prune-a")
    keys: list[str] = []
    async with channel:
        assert (await stub.Apply(cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(upsert=spec)]))).status == cpb.OK
        await cluster.wait_statuses(stub, {Code.PRIMARY: 1})
        # Each commit rewrites state.json: the files of earlier commits are dead in the log.
        for i in range(12):
            batch = [f"k{i % 3}", f"k{i % 5}"]
            keys.extend(batch)
            head = await publish(appender, cluster.source, *batch)
            await cluster.stat_through(stub, head)
            await cluster.wait_committed(counts(*keys))

    # recover: the log played into a new directory holds the committed state.
    code, out, err = gazctl(cluster, "prune-a", "recover", "--id", cluster.shard, "--dir", str(tmp_path / "played"))
    assert code == 0, err
    assert store_state(tmp_path / "played") == counts(*keys)
    assert "state.json\t" in out and f"of shard {cluster.shard}" in err
    code, _, err = gazctl(cluster, "prune-a", "recover", "--id", cluster.shard, "--dir", str(tmp_path / "played"))
    assert code == 1 and "not an empty directory" in err
    code, _, err = gazctl(cluster, "prune-a", "recover", "--id", "no-such-shard", "--dir", str(tmp_path / "x"))
    assert code == 1 and "does not exist" in err

    await hints_stored(cluster, "prune-a", appender, keys)
    fragments = await persisted(client, cluster.recovery_log, 4)
    selected = ("-l", f"id={cluster.shard}")
    code, out, err = gazctl(cluster, "prune-a", "prune", *selected, "--dry-run", "--log.level", "info")
    assert code == 0, err
    would = [line.split("\t") for line in out.splitlines()]
    assert would and all(line[0] == "would prune" and line[1] == cluster.recovery_log for line in would), out
    assert "finished pruning logs for all shards shardsTotal=1 " in err
    assert f"fragmentsPruned={len(would)}" in err
    assert len(would) < len([f for f in fragments if f.backing_store]), "the live file's fragments are kept"
    assert broker.file_root is not None
    root = Path(broker.file_root)
    names = [line[2] for line in would]
    assert all(list(root.rglob(name)) for name in names), "a dry run deletes nothing"

    # As Gazette's `shards prune`, it deletes unless --dry-run: here it needs the stores' file root.
    code, out, err = gazctl(cluster, "prune-a", "prune", "-l", f"id={cluster.shard}")
    assert code == 1 and "--file-root" in err
    code, out, err = gazctl(cluster, "prune-a", "prune", "-l", f"id={cluster.shard}", "--file-root", str(root))
    assert code == 0, err
    assert sorted(line.split("\t")[2] for line in out.splitlines()) == sorted(names)
    assert not any(list(root.rglob(name)) for name in names)

    # The pruned log still recovers the exact state, offline and in a new primary.
    code, _, err = gazctl(cluster, "prune-a", "recover", "--id", cluster.shard, "-d", str(tmp_path / "after"))
    assert code == 0, err
    assert store_state(tmp_path / "after") == counts(*keys)
    await asyncio.to_thread(cluster.consumers["prune-a"].stop, signal.SIGKILL)
    await cluster.start("prune-b")
    channel, stub = cluster.stub("prune-b")
    async with channel:
        await cluster.wait_statuses(stub, {Code.PRIMARY: 1}, primary="prune-b")
        more = ["k9"]
        head = await publish(appender, cluster.source, *more)
        await cluster.stat_through(stub, head)
        await cluster.wait_committed(counts(*keys, *more))


async def test_an_exiting_primary_stores_its_recorded_hints(cluster: Cluster, appender: AppendService) -> None:
    # The default hints interval (5 minutes) never elapses here: only the exit stores hints.
    await cluster.start("exit-a")
    channel, stub = cluster.stub("exit-a")
    async with channel:
        spec = cluster.spec(0)
        assert (await stub.Apply(cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(upsert=spec)]))).status == cpb.OK
        await cluster.wait_statuses(stub, {Code.PRIMARY: 1})
        keys = ["a", "b", "a"]
        await cluster.stat_through(stub, await publish(appender, cluster.source, *keys))
        await cluster.wait_committed(counts(*keys))
        assert not (await recovery.get_hints(stub, cluster.shard)).primary_hints.HasField("hints")
    await cluster.start("exit-b")
    assert await asyncio.to_thread(cluster.consumers["exit-a"].stop, signal.SIGTERM) == 0
    channel, stub = cluster.stub("exit-b")
    async with channel:
        await cluster.wait_statuses(stub, {Code.PRIMARY: 1}, primary="exit-b")
        hints = await recovery.get_hints(stub, cluster.shard)
        assert hints.primary_hints.HasField("hints") and hints.primary_hints.hints.live_nodes


def test_recover_takes_d_for_dir(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "file").write_text("x")
    # Refused before any consumer is asked: -d is --dir.
    env = {"CONSUMER_ADDRESS": f"http://127.0.0.1:{free_port()}"}
    done = run_gazctl(None, "shards", "recover", "--id", "some-shard", "-d", str(taken), env=env)
    one_line_error(done, f"--dir {taken} is not an empty directory")
    one_line_error(run_gazctl(None, "shards", "recover", "--id", "some-shard", env=env), "--dir (-d) is required")
    usage = run_gazctl(None, "shards", "recover", "--help", env={**env, "COLUMNS": "200"})
    assert usage.returncode == 0 and "Traceback" not in usage.stderr, usage.stderr
    assert "-d" in usage.stdout
