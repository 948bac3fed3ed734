"""`gazctl plan` and `gazctl sync` against a real broker: spec trees in directories (and git checkouts)."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from ruamel.yaml import YAML

from broker.protocol import labels, pb
from gazctl.specs.gitops.source import COMMIT, MANAGED_BY, normalize_remote
from tests.support.harness import ROOT, BrokerProcess, run_gazctl

FRAGMENT = """\
fragment:
  length: 1048576
  compression_codec: SNAPPY
  stores:
  - file:///
  refresh_interval: 1m0s
"""


def topic(prefix: str, parts: int, length: int = 1048576, extra_label: str = "") -> str:
    """A journalspace tree of `parts` journals under `prefix`."""
    children = "".join(f"- name: {prefix}part-{i:03}\n" for i in range(parts))
    label = f"- name: app.gazette.dev/tag\n  value: {extra_label}\n" if extra_label else ""
    return (
        f"name: {prefix}\nreplication: 1\nlabels:\n{label}- name: content-type\n  value: application/x-ndjson\n"
        + FRAGMENT.replace("1048576", str(length)) + f"children:\n{children}"
    )


def gazctl(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return run_gazctl(broker, *args)


def plan_doc(broker: BrokerProcess, directory: Path, *args: str) -> dict[str, Any]:
    done = gazctl(broker, "plan", str(directory), "--format", "json", *args)
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def listed(broker: BrokerProcess, selector: str) -> dict[str, pb.ListResponse.Journal]:
    done = gazctl(broker, "journals", "list", "-l", selector, "--format", "proto")
    assert done.returncode == 0, done.stderr
    return {j.spec.name: j for j in text_format.Parse(done.stdout, pb.ListResponse()).journals}


def sync(broker: BrokerProcess, directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = gazctl(broker, "sync", str(directory), *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_create_update_delete_through_tree_changes(broker: BrokerProcess, tmp_path: Path) -> None:
    tree = tmp_path / "specs"
    tree.mkdir()
    (tree / "a.yaml").write_text(topic("cud/a/", 3))
    (tree / "b.yaml").write_text(topic("cud/b/", 1))

    doc = plan_doc(broker, tree, "--owner", "cud-repo")
    assert doc["summary"] == {"create": 4, "update": 0, "delete": 0, "drift": 0, "unchanged": 0, "orphaned": 0}
    assert [c["action"] for c in doc["changes"]] == ["create"] * 4
    text = gazctl(broker, "plan", str(tree), "--owner", "cud-repo").stdout
    assert "+ create cud/a/part-000" in text and "fragment.length: 1048576" in text
    assert "Plan: 4 to create, 0 to update, 0 to delete; 0 unchanged." in text

    sync(broker, tree, "--owner", "cud-repo")
    journals = listed(broker, "prefix=cud/")
    assert sorted(journals) == ["cud/a/part-000", "cud/a/part-001", "cud/a/part-002", "cud/b/part-000"]
    assert all(labels.value_of(j.spec.labels, MANAGED_BY) == "cud-repo" for j in journals.values())

    # Running sync again changes nothing: no write, so no revision moves.
    again = sync(broker, tree, "--owner", "cud-repo")
    assert "No changes" in again.stdout
    assert {n: j.mod_revision for n, j in listed(broker, "prefix=cud/").items()} == {
        n: j.mod_revision for n, j in journals.items()}

    # An update, field by field.
    (tree / "b.yaml").write_text(topic("cud/b/", 1, length=2097152, extra_label="hot"))
    doc = plan_doc(broker, tree, "--owner", "cud-repo")
    (change,) = doc["changes"]
    assert change["journal"] == "cud/b/part-000" and change["action"] == "update" and not change["drift"]
    assert change["fields"] == [
        {"field": "fragment.length", "old": 1048576, "new": 2097152},
        {"field": "labels.app.gazette.dev/tag", "old": None, "new": ["hot"]},
    ]
    assert "fragment.length: 1048576 -> 2097152" in gazctl(broker, "plan", str(tree), "--owner", "cud-repo").stdout
    sync(broker, tree, "--owner", "cud-repo")
    assert listed(broker, "name=cud/b/part-000")["cud/b/part-000"].spec.fragment.length == 2097152

    # A journal leaves the tree: kept without --prune, deleted with it.
    (tree / "a.yaml").write_text(topic("cud/a/", 2))
    doc = plan_doc(broker, tree, "--owner", "cud-repo")
    assert doc["changes"] == [] and doc["orphans"] == ["cud/a/part-002"]
    doc = plan_doc(broker, tree, "--owner", "cud-repo", "--prune")
    assert [(c["journal"], c["action"]) for c in doc["changes"]] == [("cud/a/part-002", "delete")]
    sync(broker, tree, "--owner", "cud-repo", "--prune")
    assert "cud/a/part-002" not in listed(broker, "prefix=cud/")


def test_drift_names_the_field(broker: BrokerProcess, tmp_path: Path) -> None:
    tree = tmp_path / "specs"
    tree.mkdir()
    (tree / "d.yaml").write_text(topic("drift/", 2))
    sync(broker, tree, "--owner", "drift-repo")

    # Someone edits a managed journal by hand.
    yaml = gazctl(broker, "journals", "list", "-l", "name=drift/part-001", "--format", "yaml").stdout
    edited = yaml.replace("length: 1048576", "length: 4096")
    done = run_gazctl(broker, "journals", "apply", input=edited)
    assert done.returncode == 0, done.stderr

    doc = plan_doc(broker, tree, "--owner", "drift-repo")
    (change,) = doc["changes"]
    assert change["journal"] == "drift/part-001" and change["drift"] is True
    assert change["fields"] == [{"field": "fragment.length", "old": 4096, "new": 1048576}]
    text = gazctl(broker, "plan", str(tree), "--owner", "drift-repo").stdout
    assert "~ update drift/part-001 (drift: edited outside the spec tree" in text
    assert "(1 drifted)" in text

    status = gazctl(broker, "sync", str(tree), "--owner", "drift-repo", "--status")
    assert status.returncode == 0 and "drifted (edited outside the tree): drift/part-001" in status.stdout
    sync(broker, tree, "--owner", "drift-repo")  # Reverts the drift.
    assert plan_doc(broker, tree, "--owner", "drift-repo")["changes"] == []


def test_prune_only_owned_journals_and_guard(broker: BrokerProcess, tmp_path: Path) -> None:
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.mkdir()
    theirs.mkdir()
    (mine / "t.yaml").write_text(topic("prune/mine/", 12))
    (theirs / "t.yaml").write_text(topic("prune/theirs/", 2))
    sync(broker, mine, "--owner", "mine")
    sync(broker, theirs, "--owner", "theirs")
    # A journal nobody manages, created by hand.
    assert run_gazctl(broker, "journals", "apply", input=topic("prune/hand/", 1)).returncode == 0

    # The tree shrinks to one journal: 11 prunes are more than --max-prune (10).
    (mine / "t.yaml").write_text(topic("prune/mine/", 1))
    refused = gazctl(broker, "sync", str(mine), "--owner", "mine", "--prune")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert "11 journals managed by mine, more than --max-prune 10" in refused.stderr
    assert len(listed(broker, "prefix=prune/mine/")) == 12  # Nothing was deleted.

    # A tree with none of the owned journals left would delete all of them: refused at any limit.
    (mine / "t.yaml").write_text(topic("prune/other/", 1))
    every = gazctl(broker, "plan", str(mine), "--owner", "mine", "--prune", "--max-prune", "100")
    assert every.returncode == 1 and "every journal managed by mine (12)" in every.stderr

    (mine / "t.yaml").write_text(topic("prune/mine/", 1))
    sync(broker, mine, "--owner", "mine", "--prune", "--max-prune", "11")
    left = listed(broker, "prefix=prune/")
    assert sorted(left) == ["prune/hand/part-000", "prune/mine/part-000", "prune/theirs/part-000",
                            "prune/theirs/part-001"]

    # A tree may not take over another tree's journal.
    (mine / "u.yaml").write_text(topic("prune/theirs/", 1))
    conflict = gazctl(broker, "plan", str(mine), "--owner", "mine")
    assert conflict.returncode == 1 and "journal 'prune/theirs/part-000' is managed by 'theirs'" in conflict.stderr


def test_sync_of_a_stale_plan_changes_nothing(broker: BrokerProcess, tmp_path: Path) -> None:
    tree = tmp_path / "specs"
    tree.mkdir()
    (tree / "s.yaml").write_text(topic("stale/", 2))
    sync(broker, tree, "--owner", "stale-repo")
    (tree / "s.yaml").write_text(topic("stale/", 4, length=2097152))  # 2 updates, 2 creates.
    saved = tmp_path / "plan.json"
    planned = gazctl(broker, "plan", str(tree), "--owner", "stale-repo", "--out", str(saved))
    assert planned.returncode == 0, planned.stderr

    # Between plan and sync, someone changes a planned journal.
    yaml = gazctl(broker, "journals", "list", "-l", "name=stale/part-000", "--format", "yaml").stdout
    assert run_gazctl(broker, "journals", "apply", input=yaml.replace("1m0s", "2m0s")).returncode == 0
    before = listed(broker, "prefix=stale/")

    done = gazctl(broker, "sync", str(tree), "--owner", "stale-repo", "--plan", str(saved))
    assert done.returncode == 1 and "the cluster changed since the plan was made" in done.stderr
    after = listed(broker, "prefix=stale/")
    assert sorted(after) == ["stale/part-000", "stale/part-001"]  # No create went through either.
    assert {n: j.mod_revision for n, j in after.items()} == {n: j.mod_revision for n, j in before.items()}

    # A saved plan is for its tree only.
    (tree / "s.yaml").write_text(topic("stale/", 5))
    moved = gazctl(broker, "sync", str(tree), "--owner", "stale-repo", "--plan", str(saved))
    assert moved.returncode == 1 and "the spec tree changed since the plan was made" in moved.stderr

    # Planned afresh, it applies.
    (tree / "s.yaml").write_text(topic("stale/", 4, length=2097152))
    assert gazctl(broker, "plan", str(tree), "--owner", "stale-repo", "--out", str(saved)).returncode == 0
    sync(broker, tree, "--owner", "stale-repo", "--plan", str(saved))
    assert len(listed(broker, "prefix=stale/")) == 4


def test_batches_and_dry_run(broker: BrokerProcess, tmp_path: Path) -> None:
    tree = tmp_path / "specs"
    tree.mkdir()
    (tree / "x.yaml").write_text(topic("batch-sync/", 5))
    dry = gazctl(broker, "sync", str(tree), "--owner", "batch", "--dry-run")
    assert dry.returncode == 0 and "5 to create" in dry.stdout
    assert listed(broker, "prefix=batch-sync/") == {}
    done = sync(broker, tree, "--owner", "batch", "--max-txn-size", "2")
    assert "in 3 transactions of at most 2" in done.stderr and "Applied transaction 3 of 3" in done.stderr
    assert len(listed(broker, "prefix=batch-sync/")) == 5


def test_exit_codes(broker: BrokerProcess, tmp_path: Path) -> None:
    tree = tmp_path / "specs"
    tree.mkdir()
    (tree / "e.yaml").write_text(topic("exit/", 1))
    assert gazctl(broker, "plan", str(tree), "--owner", "exit").returncode == 0
    assert gazctl(broker, "plan", str(tree), "--owner", "exit", "--detailed-exitcode").returncode == 3
    assert gazctl(broker, "sync", str(tree), "--owner", "exit", "--dry-run", "--detailed-exitcode").returncode == 3
    sync(broker, tree, "--owner", "exit")
    assert gazctl(broker, "plan", str(tree), "--owner", "exit", "--detailed-exitcode").returncode == 0
    (tree / "e.yaml").write_text("name: exit/\nchildren: []\n")
    assert gazctl(broker, "plan", str(tree), "--owner", "exit", "--detailed-exitcode").returncode == 1
    assert gazctl(broker, "plan").returncode == 2  # Usage: DIR is required.
    assert gazctl(broker, "plan", str(tree), "--max-prune", "-1").returncode == 2


def test_git_provenance_and_owner(broker: BrokerProcess, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "specs").mkdir(parents=True)
    (repo / "specs" / "g.yaml").write_text(topic("git/", 1))

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(repo), "-c", "user.email=ci@example.com", "-c", "user.name=CI",
                               *args], capture_output=True, text=True, check=True)
        return done.stdout.strip()

    git("init", "-q")
    git("remote", "add", "origin", "git@github.com:acme/journal-specs.git")
    git("add", ".")
    git("commit", "-qm", "first")
    head = git("rev-parse", "HEAD")

    sync(broker, repo / "specs")
    (journal,) = listed(broker, "prefix=git/").values()
    assert labels.value_of(journal.spec.labels, MANAGED_BY) == "github.com/acme/journal-specs"
    assert labels.value_of(journal.spec.labels, COMMIT) == head
    status = gazctl(broker, "sync", str(repo / "specs"), "--status")
    assert status.returncode == 0
    assert "Owner github.com/acme/journal-specs: 1 managed journal(s)." in status.stdout
    assert f"commit {head}: 1 journal(s)" in status.stdout

    # A new commit that changes no spec changes no journal.
    (repo / "README.md").write_text("specs\n")
    git("add", ".")
    git("commit", "-qm", "docs")
    assert "No changes" in sync(broker, repo / "specs").stdout


def test_remote_urls_normalize_to_one_owner() -> None:
    for url in ("git@github.com:acme/specs.git", "https://github.com/acme/specs", "ssh://git@github.com:22/acme/specs.git",
                "https://token@github.com/acme/specs.git"):
        assert normalize_remote(url) == "github.com/acme/specs", url


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"a.yaml": "name: bad/\nchildren:\n- name: bad/x\n  replication: [1\n"}, "a.yaml:5:1: invalid YAML"),
        ({"a.yaml": topic("bad/", 1).replace("part-000", "part 000")},
         "a.yaml:13:9: children[0].name: invalid journal name"),
        ({"a.yaml": topic("bad/", 1).replace("refresh_interval", "refresh_intervall")},
         "a.yaml:11:3: fragment.refresh_intervall: unknown field 'refresh_intervall'"),
        ({"a.yaml.j2": "name: bad/x\n{{ undefined_variable }}\n"}, "a.yaml.j2:2: template error: 'undefined_variable'"),
        ({"a.yaml.j2": "name: bad/x\n{% for %}\n"}, "a.yaml.j2:2: template syntax error"),
        ({"a.yaml": topic("bad/", 2), "b.yaml": topic("bad/", 1)},
         "b.yaml:13:9: children[0].name: journal 'bad/part-000' is also declared at"),
        ({"a.yaml": topic("bad/", 1).replace("children:", "revision: 3\nchildren:")},
         "a.yaml:12:11: revision: `revision` is not allowed in a spec repository"),
    ],
)
def test_invalid_trees_fail_before_reaching_the_cluster(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    tree = tmp_path / "specs"
    tree.mkdir()
    for name, text in files.items():
        (tree / name).write_text(text)
    # No broker listens there: the tree's error comes first, so nothing was sent.
    done = run_gazctl(None, "plan", str(tree), "--owner", "x", "--broker.address", "http://127.0.0.1:1", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and expected in done.stderr, done.stderr
    assert "UNAVAILABLE" not in done.stderr


def test_reconcile_workflow_uses_real_flags() -> None:
    workflow = YAML(typ="safe").load((ROOT / ".github" / "workflows" / "reconcile.yaml").read_text())
    assert set(workflow["jobs"]) == {"plan", "sync"}
    assert workflow["env"]["BROKER_ADDRESS"] == "${{ secrets.GAZETTE_BROKER_ADDRESS }}"
    calls = [
        shlex.split(line.strip().split(">")[0])
        for job in workflow["jobs"].values() for step in job["steps"] if "run" in step
        for line in step["run"].splitlines() if line.strip().startswith("gazctl ")
    ]
    assert {call[1] for call in calls} == {"plan", "sync"}
    for call in calls:
        help_text = run_gazctl(None, call[1], "--help").stdout
        for flag in (arg for arg in call if arg.startswith("--")):
            assert flag in help_text, (call, flag)
