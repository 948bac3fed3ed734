"""`gazctl shards prune` across shards, as Gazette's (`cmd/gazctl/gazctlcmd/shards_prune.go`): a real
broker (file:// store), etcd and a `gazette consume` serving the Shard API. The shards are disabled
and their hints applied, so their recovery logs hold plain appended fragments: a forked shard's
hints name segments of other logs (recoverylog.proto's `Segment.log`), which protect those logs'
fragments and get a log no shard records to pruned; a shard without hints leaves its log whole
(warned), as does an unhealthy fragment store (warned, its hints never read) and a full suspension.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from broker.client import JournalClient, append, apply_journals, list_journals
from broker.fragment.names import content_name, content_path
from broker.protocol import labels
from broker.protocol import pb as bpb
from consumer.protocol import pb as cpb
from consumer.protocol import recoverylog_pb2 as rpb
from tests.consumer import test_recovery_cli as recovery
from tests.consumer.test_recovery_cli import Cluster
from tests.gazctl.commands.shards.test_shards_recovery_cli import gazctl, persisted
from tests.support.harness import BrokerProcess, journal_spec
from tests.support.journals import create_journal, unique

cluster = recovery.cluster

CHUNK = 1100
"""Each append rolls the fragment before it (length 1024): fragments [0,1100) ... [3300,4400)."""
UNHEALTHY = "s3://no-such-bucket/?endpoint=http://127.0.0.1:9"
"""A store whose endpoint refuses connections: FragmentStoreHealth answers unhealthy."""


def forked_hints(log: str, *segments: tuple[str, int, int]) -> rpb.FSMHints:
    """Hints of `log` with one live Fnode per (log, first offset, last offset), in seq-no order;
    a segment of another log is a fork's (the last is `log`'s own, as hints require)."""
    out = rpb.FSMHints(log=log)
    for i, (seg_log, first, last) in enumerate(segments):
        seq = 2 * i + 1
        out.live_nodes.add(fnode=seq, segments=[rpb.Segment(
            author=7, first_seq_no=seq, last_seq_no=seq + 1, first_offset=first, last_offset=last,
            log="" if seg_log == log else seg_log)])
    return out


async def recovery_log(client: JournalClient, name: str) -> list[bpb.Fragment]:
    """A recovery log of four appended chunks, the first three fragments persisted."""
    spec = journal_spec(name, content_type=labels.CONTENT_TYPE_RECOVERY_LOG)
    spec.fragment.length = 1024
    spec.fragment.stores.append("file:///")
    await create_journal(client, spec)
    for i in range(4):
        await append(client, name, bytes([65 + i]) * CHUNK)
    fragments = await persisted(client, name, 3)
    assert [(f.begin, f.end) for f in fragments] == [(i * CHUNK, (i + 1) * CHUNK) for i in range(4)]
    return fragments


async def respec(client: JournalClient, name: str, change: str) -> None:
    """Add the unhealthy store to the journal's spec, or suspend it fully."""
    selector = bpb.LabelSelector(include=bpb.LabelSet(labels=[bpb.Label(name="name", value=name)]))
    [journal] = (await list_journals(client, selector)).journals
    spec = journal.spec
    if change == "unhealthy":
        spec.fragment.stores.append(UNHEALTHY)
    else:
        spec.suspend.level, spec.suspend.offset = bpb.JournalSpec.Suspend.FULL, 4 * CHUNK
    await apply_journals(client, [bpb.ApplyRequest.Change(upsert=spec, expect_mod_revision=journal.mod_revision)])


async def test_prune_unions_forks_and_skips_what_gazette_skips(
    cluster: Cluster, client: JournalClient, broker: BrokerProcess
) -> None:
    prefix, tag = unique("shards-prune"), uuid.uuid4().hex[:8]
    logs = {name: f"{prefix}/shard-{name}" for name in ("a", "b", "c", "e", "f", "parent")}
    listed = {name: await recovery_log(client, log) for name, log in logs.items()}
    await respec(client, logs["e"], "unhealthy")
    await respec(client, logs["f"], "suspend")
    tail = (3 * CHUNK, 4 * CHUNK)
    hints = {
        "a": forked_hints(logs["a"], (logs["a"], *tail)),
        # b forked from a, from c, and from a log no selected shard records ("parent").
        "b": forked_hints(logs["b"], (logs["parent"], *tail), (logs["a"], 0, 1000), (logs["c"], 0, 500),
                          (logs["b"], *tail)),
        "c": None,  # Never stored hints: its log is left whole, though b names it.
        # Its store is unhealthy: its log is left whole. Gazette's prune would not read its hints; ours
        # does, and keeps the parent log's fragment its fork still reads.
        "e": forked_hints(logs["e"], (logs["parent"], CHUNK, 2 * CHUNK), (logs["e"], *tail)),
        "f": forked_hints(logs["f"], (logs["f"], *tail)),
    }
    await cluster.start("prune-loop")
    channel, stub = cluster.stub("prune-loop")
    async with channel:
        changes = []
        for name, hinted in hints.items():
            spec = cluster.spec(0)
            spec.id, spec.recovery_log_prefix, spec.hint_backups, spec.disable = f"shard-{name}", prefix, 0, True
            spec.labels.labels.add(name="prune", value=tag)
            change = cpb.ApplyRequest.Change(upsert=spec)
            if hinted is not None:
                change.primary_hints.CopyFrom(hinted)
            changes.append(change)
        assert (await stub.Apply(cpb.ApplyRequest(changes=changes))).status == cpb.OK

    def pruned(name: str, *indexes: int) -> list[tuple[str, str]]:
        return [(logs[name], content_name(listed[name][i])) for i in indexes]

    # a's [0,1100) is b's; the parent log is pruned up to b's segment of it, but for e's; b up to its tail.
    expected = sorted([*pruned("a", 1, 2), *pruned("b", 0, 1, 2), *pruned("parent", 0, 2)])
    code, out, err = gazctl(cluster, "prune-loop", "prune", "-l", f"prune={tag}", "--dry-run")
    assert code == 0, err
    lines = [line.split("\t") for line in out.splitlines()]
    assert all(line[0] == "would prune" for line in lines), out
    assert sorted((line[1], line[2]) for line in lines) == expected, out
    # At Gazette's default level (warn), its two warnings, in its order: the shard loop's, the logs'.
    warnings = err.splitlines()
    assert len(warnings) == 2, err
    assert "fragment store is unhealthy" in warnings[0] and f"journal={logs['e']}" in warnings[0]
    assert f"store={UNHEALTHY}" in warnings[0] and "status=FRAGMENT_STORE_UNHEALTHY" in warnings[0]
    assert "skipping journal because a shard is missing hints that cover it or has unhealthy store" in warnings[1]
    assert warnings[1].endswith(f"journal={logs['c']}")

    root = broker.file_root
    assert root is not None
    code, out, err = gazctl(cluster, "prune-loop", "prune", "-l", f"prune={tag}", "--file-root", str(root),
                            "--log.level", "debug")
    assert code == 0, err
    assert sorted(tuple(line.split("\t")[1:3]) for line in out.splitlines()) == expected
    assert f"skipping suspended recovery log journal={logs['f']}" in err
    # Gazette's counts: 12 fragments of a, b and parent; c missing hints and f suspended are skipped.
    [summary] = [line for line in err.splitlines() if "finished pruning logs for all shards" in line]
    assert summary.endswith(
        "shardsTotal=5 fragmentsTotal=12 fragmentsPruned=7 fragmentsKept=5 bytesTotal=13200 bytesPruned=7700"
        " bytesKept=5500 skippedJournals=2 failedToRemove=0 permissionDenied=0"), summary
    finished = [line.split("journal=")[1] for line in err.splitlines() if "finished pruning log " in line]
    assert finished == [logs["a"], logs["b"], logs["parent"]]
    for name, fragments in listed.items():
        for spec in fragments[:3]:
            stored = (Path(root) / content_path(spec)).exists()
            assert stored == ((logs[name], content_name(spec)) not in expected), (name, spec)
