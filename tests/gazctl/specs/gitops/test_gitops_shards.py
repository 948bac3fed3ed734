"""`gazctl plan` and `gazctl sync` over shard trees beside journal trees, against a real etcd, a real
`gazette serve` and real `gazette consume` processes of the examples (stream-sum's summer and
word-count's counter, each its own consumer group, whose Shard API sync applies shards through)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format

from broker.protocol import labels
from broker.protocol import pb as bpb
from consumer.protocol import pb
from gazctl.specs.gitops.source import COMMIT, MANAGED_BY
from gazctl.specs.gitops.tree import load_tree
from tests.support.harness import ROOT, BrokerProcess, free_port, one_line_error, run_gazctl, wait_http_ready

Code = pb.ReplicaStatus.Code


class Consume:
    """`python -m consumer consume APP` (what `gazette consume` runs), on a keyspace root of its own
    (its own consumer group), in a working directory under `tmp`."""

    def __init__(self, tmp: Path, broker: BrokerProcess, etcd: str, app: str, **environ: str) -> None:
        self.port = free_port()
        self.log_path = tmp / "consume.log"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CONSUMER_", "ETCD_", "BROKER_", "LOG_", "STREAM_SUM_", "WORD_COUNT_"))}
        env["PYTHONPATH"] = str(ROOT)
        env.update(environ)
        args = [
            sys.executable, "-m", "consumer", "consume", app,
            "--consumer.id", "consume", "--consumer.port", str(self.port), "--consumer.host", "127.0.0.1",
            "--consumer.bind", "127.0.0.1", "--broker.address", broker.url, "--etcd.address", etcd,
            "--etcd.prefix", f"/test/{uuid.uuid4().hex}", "--etcd.lease", "5", "--consumer.watch-delay", "0.01",
        ]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=tmp)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> None:
        wait_http_ready("consumer", f"http://127.0.0.1:{self.port}", self.proc, self.logs, timeout)

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(30)
        finally:
            self._log.close()


def consume(tmp: Path, broker: BrokerProcess, etcd: str, app: str, **environ: str) -> Iterator[Consume]:
    proc = Consume(tmp, broker, etcd, app, **environ)
    try:
        proc.wait_ready()
        yield proc
    finally:
        rc = proc.stop()
        assert rc == 0, proc.logs()[-4000:]
        assert "Traceback" not in proc.logs(), proc.logs()[-4000:]


@pytest.fixture(scope="module")
def summer(broker: BrokerProcess, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Consume]:
    """stream-sum's summer: the consumer group of the tests' default group too."""
    tmp = tmp_path_factory.mktemp("summer")
    yield from consume(tmp, broker, etcd_endpoint, "examples.stream_sum:summer", STREAM_SUM_SQLITE_DIR=str(tmp))


@pytest.fixture(scope="module")
def counter(broker: BrokerProcess, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Consume]:
    """word-count's counter."""
    yield from consume(tmp_path_factory.mktemp("counter"), broker, etcd_endpoint, "examples.word_count:counter")


def gazctl(broker: BrokerProcess, summer: Consume | None, *args: str, input: str | None = None
           ) -> subprocess.CompletedProcess[str]:
    """gazctl with $CONSUMER_ADDRESS naming `summer` (the default consumer group), if given."""
    return run_gazctl(broker, *args, input=input, env={"CONSUMER_ADDRESS": summer.url} if summer else {})


def ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def plan_doc(broker: BrokerProcess, summer: Consume | None, directory: Path, *args: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(ok(gazctl(broker, summer, "plan", str(directory), "--format", "json",
                                               *args)).stdout)
    return doc


def shards(broker: BrokerProcess, summer: Consume, selector: str = "") -> dict[str, pb.ListResponse.Shard]:
    done = ok(gazctl(broker, summer, "shards", "list", "-l", selector, "--format", "proto"))
    return {s.spec.id: s for s in text_format.Parse(done.stdout, pb.ListResponse()).shards}


def journals(broker: BrokerProcess, selector: str) -> list[str]:
    done = ok(run_gazctl(broker, "journals", "list", "-l", selector, "--format", "proto"))
    return sorted(j.spec.name for j in text_format.Parse(done.stdout, bpb.ListResponse()).journals)


def wait_primary(broker: BrokerProcess, proc: Consume, selector: str, ids: list[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        listed = shards(broker, proc, selector)
        primary = sorted(i for i, s in listed.items() if any(st.code == Code.PRIMARY for st in s.status))
        if primary == sorted(ids):
            return
        failed = [i for i, s in listed.items() if any(st.code == Code.FAILED for st in s.status)]
        assert not failed and time.monotonic() < deadline, (primary, failed, proc.logs()[-3000:])
        time.sleep(0.1)


def set_value(specs: Path, name: str, value: int) -> None:
    values = specs / "values.yaml"
    text = values.read_text()
    start = text.index(f"{name}:")
    end = text.index("\n", start)
    values.write_text(text[:start] + f"{name}: {value}" + text[end:])


def test_example_specs_journals_and_templated_shards(
    broker: BrokerProcess, summer: Consume, counter: Consume, tmp_path: Path
) -> None:
    """specs/ through plan and sync: the journals and both examples' shards (each in its consumer
    group) in one sync; the consumers then run against them; a partition added to the tree gets its
    shard, and removed, both are pruned (owned ones only)."""
    specs = tmp_path / "specs"
    shutil.copytree(ROOT / "specs", specs)
    summer_ids = [f"stream-sum-summer-part-{i:03}" for i in range(4)]
    counter_ids = [f"word-count-part-{i:03}" for i in range(4)]
    groups = ("--owner", "examples", "--consumer", f"stream-sum={summer.url}", "--consumer",
              f"word-count={counter.url}")

    doc = plan_doc(broker, None, specs, *groups)
    assert doc["summary_by_kind"]["journals"]["create"] == 36
    assert doc["summary_by_kind"]["shards"] == {"create": 8, "update": 0, "delete": 0, "drift": 0, "unchanged": 0,
                                                "orphaned": 0}
    assert doc["summary"]["create"] == 44
    created = [c for c in doc["changes"] if c["kind"] == "shard"]
    assert [(c["consumer"], c["shard"]) for c in created] == [
        *(("stream-sum", i) for i in summer_ids), *(("word-count", i) for i in counter_ids)]
    assert {"field": "sources", "old": None, "new": ["examples/stream-sum/chunks/part-000"]} in created[0]["fields"]
    assert {"field": "recovery_log_prefix", "old": None, "new": "examples/word-count/recovery/logs"} in (
        created[4]["fields"])
    text = ok(gazctl(broker, None, "plan", str(specs), *groups)).stdout
    assert "+ create shard stream-sum:stream-sum-summer-part-003" in text
    assert "+ create shard word-count:word-count-part-000" in text
    assert "Plan: journals 36 to create, 0 to update, 0 to delete; 0 unchanged. Shards 8 to create" in text

    done = ok(gazctl(broker, None, "sync", str(specs), *groups))
    assert "44 created" in done.stderr
    assert ok(gazctl(broker, None, "plan", str(specs), *groups, "--detailed-exitcode"))
    listed = shards(broker, summer)
    assert sorted(listed) == summer_ids
    assert sorted(shards(broker, counter)) == counter_ids
    assert [s.journal for s in listed["stream-sum-summer-part-002"].spec.sources] == [
        "examples/stream-sum/chunks/part-002"]
    assert all(labels.value_of(s.spec.labels, MANAGED_BY) == "examples" for s in listed.values())
    assert len(journals(broker, f"{MANAGED_BY}=examples")) == 36
    assert journals(broker, "app.gazette.dev/message-type=QueryLog, app.gazette.dev/region=us-east-1") == [
        f"examples/query-logs/us-east-1/part-{i:03}" for i in range(8)]
    assert journals(broker, "app.gazette.dev/message-type in (Click, Order), app.gazette.dev/region=us-east-1") == [
        "examples/clicks/mobile", "examples/clicks/web", "examples/orders/us-east-1/part-000",
        "examples/orders/us-east-1/part-001"]
    assert journals(broker, "app.gazette.dev/message-type=stream_sum.Sum") == [
        "examples/stream-sum/sums/part-000", "examples/stream-sum/sums/part-001"]

    # The consumers run against what sync made: a chunker's streams are summed and verified, and
    # word-count's shards recover from their logs and count what is published.
    wait_primary(broker, summer, "app=stream-sum-summer", summer_ids)
    wait_primary(broker, counter, "app=word-count-counter", counter_ids)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    chunk = subprocess.run(
        [sys.executable, "-m", "examples.stream_sum", "chunk", "--broker.address", broker.url, "--workers", "1",
         "--streams", "2", "--chunks", "3", "--delay", "20"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
    )
    assert chunk.returncode == 0, chunk.stderr[-3000:] + summer.logs()[-3000:]
    assert "streams=2 verified=2" in chunk.stdout
    word_count = [sys.executable, "-m", "examples.word_count"]
    published = subprocess.run([*word_count, "publish", "--consumer.address", counter.url, "wood chuck wood chuck"],
                               capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert published.returncode == 0, published.stderr + counter.logs()[-3000:]
    deadline = time.monotonic() + 20
    while True:
        query = subprocess.run([*word_count, "query", "--consumer.address", counter.url, "wood chuck"],
                               capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
        if "2\twood chuck" in query.stdout or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert "2\twood chuck" in query.stdout, query.stdout + query.stderr

    # A partition more: its journal and its shard, in one sync.
    set_value(specs, "stream_sum_chunk_partitions", 5)
    doc = plan_doc(broker, None, specs, *groups)
    assert [(c["kind"], c.get("journal") or c.get("shard"), c["action"]) for c in doc["changes"]] == [
        ("journal", "examples/stream-sum/chunks/part-004", "create"),
        ("shard", "stream-sum-summer-part-004", "create"),
    ]
    ok(gazctl(broker, None, "sync", str(specs), *groups))
    wait_primary(broker, summer, "app=stream-sum-summer", [*summer_ids, "stream-sum-summer-part-004"])

    # A shard nobody manages, made by hand, reading the same partition: prune leaves it alone.
    hand = ("common:\n  max_txn_duration: 1s\n  disable: true\nshards:\n- id: by-hand-part-004\n  sources:\n"
            "  - journal: examples/stream-sum/chunks/part-004\n")
    ok(gazctl(broker, summer, "shards", "apply", input=hand))

    # The partition leaves the tree: kept without --prune, then pruned (shard first, then journal).
    set_value(specs, "stream_sum_chunk_partitions", 4)
    doc = plan_doc(broker, None, specs, *groups)
    assert doc["changes"] == [] and doc["orphans"] == ["examples/stream-sum/chunks/part-004"]
    assert doc["orphan_shards"] == ["stream-sum:stream-sum-summer-part-004"]
    text = ok(gazctl(broker, None, "plan", str(specs), *groups, "--prune")).stdout
    assert "- delete shard stream-sum:stream-sum-summer-part-004" in text
    assert "- delete examples/stream-sum/chunks/part-004" in text
    ok(gazctl(broker, None, "sync", str(specs), *groups, "--prune"))
    assert sorted(shards(broker, summer)) == ["by-hand-part-004", *summer_ids]
    assert "examples/stream-sum/chunks/part-004" not in journals(broker, "prefix=examples/stream-sum/")
    assert plan_doc(broker, None, specs, *groups, "--prune")["changes"] == []
    ok(gazctl(broker, summer, "shards", "apply", input=hand.replace("- id:", "- delete: true\n  revision: -1\n  id:")))

    # Every group of the tree needs an address.
    missing = gazctl(broker, None, "plan", str(specs), "--owner", "examples", "--consumer", f"stream-sum={summer.url}")
    one_line_error(missing, "no address of consumer group 'word-count': pass --consumer word-count=URL or set"
                            " $CONSUMER_ADDRESS_WORD_COUNT")


TREE_JOURNALS = """\
name: {prefix}
replication: 1
labels:
- name: content-type
  value: application/x-ndjson
- name: topic
  value: {topic}
fragment:
  length: 1048576
  compression_codec: SNAPPY
  refresh_interval: 1m0s
children:
- name: {prefix}part-000
- name: {prefix}part-001
"""

TREE_SHARDS = """\
common:
  max_txn_duration: 1s
  disable: true
  labels:
  - name: app
    value: {topic}
shards:
- id: {topic}-{{base}}
  for_each_journal: topic={topic}
  labels:
  - name: partition
    value: "{{base}}"
"""


def write_tree(tree: Path, topic: str, **files: str) -> None:
    tree.mkdir(exist_ok=True)
    (tree / "journals.yaml").write_text(TREE_JOURNALS.format(prefix=f"{topic}/", topic=topic))
    (tree / "shards.yaml").write_text(TREE_SHARDS.format(topic=topic))
    for name, text in files.items():
        (tree / name).write_text(text)


def test_unknown_source_journal_fails_before_anything_is_written(
    broker: BrokerProcess, summer: Consume, tmp_path: Path
) -> None:
    tree = tmp_path / "specs"
    write_tree(tree, "unknown-src", **{"more.yaml": (
        "common:\n  max_txn_duration: 1s\n  disable: true\nshards:\n- id: reads-nothing\n  sources:\n"
        "  - journal: unknown-src/nowhere\n")})
    for command in ("plan", "sync"):
        one_line_error(gazctl(broker, summer, command, str(tree), "--owner", "u"),
                       "more.yaml:7:14: shards[0].sources[0].journal: the source journal 'unknown-src/nowhere' of"
                       " shard 'reads-nothing' is neither in the tree nor in the cluster")
    assert journals(broker, "prefix=unknown-src/") == [] and shards(broker, summer, "app=unknown-src") == {}

    # A recovery log is a journal too.
    (tree / "more.yaml").write_text(
        "common:\n  max_txn_duration: 1s\n  disable: true\nshards:\n- id: logged-shard\n"
        "  recovery_log_prefix: unknown-src/logs\n  hint_prefix: /hints\n  sources:\n"
        "  - journal: unknown-src/part-000\n")
    one_line_error(gazctl(broker, summer, "sync", str(tree), "--owner", "u"),
                   "more.yaml:6:24: shards[0].recovery_log_prefix: the recovery log 'unknown-src/logs/logged-shard'")
    assert journals(broker, "prefix=unknown-src/") == []

    # Declared in the tree, it is created in the same sync, before the shard.
    (tree / "logs.yaml").write_text(TREE_JOURNALS.format(prefix="unknown-src/logs/", topic="logs").replace(
        "- name: unknown-src/logs/part-000\n- name: unknown-src/logs/part-001\n",
        "- name: unknown-src/logs/logged-shard\n"))
    ok(gazctl(broker, summer, "sync", str(tree), "--owner", "u"))
    assert "logged-shard" in shards(broker, summer)
    assert "unknown-src/logs/logged-shard" in journals(broker, "prefix=unknown-src/")

    # Pruning a journal a shard of the tree still reads is refused.
    (tree / "journals.yaml").write_text(TREE_JOURNALS.format(prefix="unknown-src/", topic="unknown-src").replace(
        "- name: unknown-src/part-000\n", ""))
    one_line_error(gazctl(broker, summer, "plan", str(tree), "--owner", "u", "--prune"),
                   "more.yaml:9:14: shards[0].sources[0].journal: the source journal 'unknown-src/part-000' of"
                   " shard 'logged-shard'")


def test_shard_drift_status_ownership_and_saved_plans(broker: BrokerProcess, summer: Consume, tmp_path: Path) -> None:
    tree = tmp_path / "specs"
    write_tree(tree, "drift")
    ok(gazctl(broker, summer, "sync", str(tree), "--owner", "drift-repo"))
    listed = shards(broker, summer, "app=drift")
    assert sorted(listed) == ["drift-part-000", "drift-part-001"]
    assert labels.values_of(listed["drift-part-001"].spec.labels, "partition") == ["part-001"]

    # Someone edits a managed shard by hand.
    yaml = ok(gazctl(broker, summer, "shards", "list", "-l", "id=drift-part-001", "--format", "yaml")).stdout
    ok(gazctl(broker, summer, "shards", "apply", input=yaml.replace("max_txn_duration: 1s", "max_txn_duration: 5s")))
    doc = plan_doc(broker, summer, tree, "--owner", "drift-repo")
    (change,) = doc["changes"]
    assert change["kind"] == "shard" and change["shard"] == "drift-part-001" and change["drift"] is True
    assert change["fields"] == [{"field": "max_txn_duration", "old": "5s", "new": "1s"}]
    text = ok(gazctl(broker, summer, "plan", str(tree), "--owner", "drift-repo")).stdout
    assert "~ update shard drift-part-001 (drift: edited outside the spec tree" in text
    status = ok(gazctl(broker, summer, "sync", str(tree), "--owner", "drift-repo", "--status")).stdout
    assert "Owner drift-repo: 2 managed journal(s)." in status and "Owner drift-repo: 2 managed shard(s)." in status
    assert "drifted (edited outside the tree): drift-part-001" in status

    # A saved plan of a shard update goes stale when the shard moves.
    saved = tmp_path / "plan.json"
    ok(gazctl(broker, summer, "plan", str(tree), "--owner", "drift-repo", "--out", str(saved)))
    yaml = ok(gazctl(broker, summer, "shards", "list", "-l", "id=drift-part-001", "--format", "yaml")).stdout
    ok(gazctl(broker, summer, "shards", "apply", input=yaml.replace("max_txn_duration: 5s", "max_txn_duration: 6s")))
    stale = gazctl(broker, summer, "sync", str(tree), "--owner", "drift-repo", "--plan", str(saved))
    one_line_error(stale, "the cluster changed since the plan was made: a planned shard was created")
    ok(gazctl(broker, summer, "plan", str(tree), "--owner", "drift-repo", "--out", str(saved)))
    ok(gazctl(broker, summer, "sync", str(tree), "--owner", "drift-repo", "--plan", str(saved)))
    assert plan_doc(broker, summer, tree, "--owner", "drift-repo")["changes"] == []

    # Provenance: the commit label of a git checkout.
    repo = tmp_path / "repo"
    shutil.copytree(tree, repo / "specs")
    shards_yaml = repo / "specs" / "shards.yaml"
    shards_yaml.write_text(shards_yaml.read_text().replace("max_txn_duration: 1s", "max_txn_duration: 2s"))
    git = ["git", "-C", str(repo), "-c", "user.email=ci@example.com", "-c", "user.name=CI"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "shards"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    # Another owner may not take the shards over.
    one_line_error(gazctl(broker, summer, "plan", str(repo / "specs"), "--owner", "thief"),
                   "is managed by 'drift-repo', not by 'thief'")
    ok(gazctl(broker, summer, "sync", str(repo / "specs"), "--owner", "drift-repo"))
    listed = shards(broker, summer, "app=drift")
    assert {labels.value_of(s.spec.labels, COMMIT) for s in listed.values()} == {head}

    # The prune guard counts shards too: the whole tree's shards need --allow-mass-prune.
    (tree / "shards.yaml").write_text("shards: []\n")
    one_line_error(gazctl(broker, summer, "plan", str(tree), "--owner", "drift-repo", "--prune"),
                   "prune would delete every shard managed by drift-repo (2)")
    ok(gazctl(broker, summer, "sync", str(tree), "--owner", "drift-repo", "--prune", "--allow-mass-prune"))
    assert shards(broker, summer, "app=drift") == {}
    assert len(journals(broker, "prefix=drift/")) == 2


SHARD = "common:\n  max_txn_duration: 1s\nshards:\n"


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"s.yaml": SHARD + "- id: bad-shard\n  sources: [\n"}, "s.yaml:6:1: invalid YAML"),
        ({"s.yaml": SHARD + "- id: bad shard\n"},
         "s.yaml:4:7: shards[0].id: invalid spec of shard 'bad shard': Id: not a valid token (bad shard)"),
        ({"s.yaml": SHARD + "- id: shard-{base}\n  for_each_journal: topic=bad\n",
          "j.yaml": TREE_JOURNALS.format(prefix="bad/", topic="bad").replace("part-001", "part=001")},
         "s.yaml:4:7: shards[0].id: invalid spec of shard 'shard-part=001': Id: not a valid token (shard-part=001)"
         " (made by the template for journal 'bad/part=001')"),
        ({"s.yaml": SHARD + "- id: bad-shard\n  max_txn_durations: 1s\n"},
         "s.yaml:5:3: shards[0].max_txn_durations: unknown field 'max_txn_durations'"),
        ({"s.yaml": SHARD + "- id: bad-shard\n  revision: 3\n"},
         "s.yaml:5:13: shards[0].revision: `revision` is not allowed in a spec repository"),
        ({"s.yaml": "shards:\n- id: bad-shard\n"},
         "s.yaml:2:7: shards[0].id: invalid spec of shard 'bad-shard': invalid MaxTxnDuration (0; expected > 0)"),
        ({"s.yaml": SHARD + "- id: bad-{journal}\n"}, "s.yaml:4:7: shards[0].id: placeholders such as {journal}"),
        ({"s.yaml": SHARD + "- id: shard-{nope}\n  for_each_journal: topic=bad\n"},
         "s.yaml:4:7: shards[0].id: unknown placeholder {nope}"),
        ({"s.yaml": SHARD + "- id: shard-x\n  for_each_journal: topic=bad\n"},
         "s.yaml:4:7: shards[0].id: shard 'shard-x' (made by the template for journal 'bad/part-001') is also"
         " declared at"),
        ({"s.yaml": SHARD + "- id: shard-{base}\n  for_each_journal: 'topic in (bad'\n"},
         "s.yaml:5:21: shards[0].for_each_journal: invalid selector"),
        ({"s.yaml": SHARD + "- id: one-shard\n", "t.yaml.j2": SHARD + "- id: {{ 'one-shard' }}\n"},
         "t.yaml.j2 (rendered):4:7: shards[0].id: shard 'one-shard' is also declared at"),
        ({"s.yaml": "{shards: [{id: bad shard, max_txn_duration: 1s}]}\n"},
         "s.yaml:1:16: shards[0].id: invalid spec of shard 'bad shard'"),
        ({"s.yaml": "consumer: bad group\n" + SHARD + "- id: one-shard\n"},
         "s.yaml:1:11: consumer: invalid consumer name 'bad group'"),
    ],
)
def test_invalid_shard_trees_fail_before_reaching_the_cluster(
    tmp_path: Path, files: dict[str, str], expected: str
) -> None:
    tree = tmp_path / "specs"
    tree.mkdir()
    (tree / "j.yaml").write_text(TREE_JOURNALS.format(prefix="bad/", topic="bad"))
    for name, text in files.items():
        (tree / name).write_text(text)
    # Neither a broker nor a consumer listens there: the tree's error comes first, so nothing was sent.
    done = run_gazctl(None, "plan", str(tree), "--owner", "x", "--broker.address", "http://127.0.0.1:1",
                      "--consumer.address", "http://127.0.0.1:1", cwd=tmp_path)
    line = one_line_error(done, expected)
    assert "UNAVAILABLE" not in line


def test_shard_ids_are_unique_per_consumer_group(tmp_path: Path) -> None:
    tree = tmp_path / "specs"
    tree.mkdir()
    (tree / "j.yaml").write_text(TREE_JOURNALS.format(prefix="grp/", topic="grp"))
    (tree / "a.yaml").write_text(SHARD + "- id: shard-{base}\n  for_each_journal: topic=grp\n")
    (tree / "b.yaml").write_text("consumer: other\n" + SHARD + "- id: shard-{base}\n  for_each_journal: topic=grp\n")
    (tree / "c.yaml").write_text("consumer: empty\nshards: []\n")
    loaded = load_tree(tree)
    assert {group: sorted(s) for group, s in loaded.shards.items()} == {
        "": ["shard-part-000", "shard-part-001"], "empty": [], "other": ["shard-part-000", "shard-part-001"]}
    assert loaded.shards["other"]["shard-part-001"].display == "other:shard-part-001"
    assert [s.journal for s in loaded.shards["other"]["shard-part-001"].spec.sources] == ["grp/part-001"]
