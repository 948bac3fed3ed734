"""`gazctl journals list/apply/edit`, run as a user runs them, against a real broker."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from google.protobuf import text_format

from broker.protocol import pb
from tests.support.harness import ROOT, BrokerProcess, run_gazctl, table_rows

TREE = """\
# Two topics under one directory.
name: specs/
replication: 1
labels:
- name: content-type
  value: application/x-ndjson
fragment:
  length: 131072
  compression_codec: SNAPPY
  stores:
  - file:///
  refresh_interval: 30s
children:
- name: specs/clicks/
  labels:
  - name: app.gazette.dev/message-type
    value: Click
  children:
  - name: specs/clicks/part-000
  - name: specs/clicks/part-001
- name: specs/views
  labels:
  - name: app.gazette.dev/message-type
    value: View
  - name: app.gazette.dev/tag
    value: hot
"""


SMALL = "replication: 1\nfragment:\n  length: 1024\n  compression_codec: NONE\n  refresh_interval: 30s\n"


def _apply(broker: BrokerProcess, text: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_gazctl(broker, "journals", "apply", *args, input=text)


def _listed(broker: BrokerProcess, selector: str) -> pb.ListResponse:
    done = run_gazctl(broker, "journals", "list", "-l", selector, "--format", "proto")
    assert done.returncode == 0, done.stderr
    return text_format.Parse(done.stdout, pb.ListResponse())


def test_list_formats_and_columns(broker: BrokerProcess) -> None:
    applied = _apply(broker, TREE)
    assert applied.returncode == 0, applied.stderr

    table = run_gazctl(
        broker, "journals", "list", "-l", "prefix=specs/", "--rf", "--stores", "-L", "app.gazette.dev/message-type",
        "-L", "app.gazette.dev/tag",
    )
    assert table.returncode == 0, table.stderr
    rows = table_rows(table.stdout)
    assert rows[0] == ["NAME", "RF", "STORES", "APP . GAZETTE . DEV / MESSAGE - TYPE", "APP . GAZETTE . DEV / TAG"]
    assert rows[1:] == [
        ["specs/clicks/part-000", "1", "file:///", "Click", "<none>"],
        ["specs/clicks/part-001", "1", "file:///", "Click", "<none>"],
        ["specs/views", "1", "file:///", "View", "hot"],
    ]

    resp = _listed(broker, "app.gazette.dev/message-type=Click")
    assert [j.spec.name for j in resp.journals] == ["specs/clicks/part-000", "specs/clicks/part-001"]
    assert all(j.mod_revision > 0 for j in resp.journals)

    as_json = run_gazctl(broker, "journals", "list", "-l", "name=specs/views", "--format", "json")
    doc = json.loads(as_json.stdout)
    assert [j["spec"]["name"] for j in doc["journals"]] == ["specs/views"]
    assert doc["journals"][0]["spec"]["fragment"]["compression_codec"] == "SNAPPY"


def test_list_yaml_round_trips_through_apply(broker: BrokerProcess) -> None:
    listed = run_gazctl(broker, "journals", "list", "-l", "prefix=specs/", "--format", "yaml")
    assert listed.returncode == 0, listed.stderr
    before = _listed(broker, "prefix=specs/")
    again = _apply(broker, listed.stdout)
    assert again.returncode == 0, again.stderr
    after = _listed(broker, "prefix=specs/")
    # A no-op apply rewrites nothing it need not: specs are unchanged (revisions move on).
    assert [j.spec for j in after.journals] == [j.spec for j in before.journals]

    # The listing is now stale: applying it again fails on the revision, naming the cause.
    stale = _apply(broker, listed.stdout)
    assert stale.returncode == 1
    assert stale.stderr.count("\n") == 1 and "ETCD_TRANSACTION_FAILED" in stale.stderr
    assert "revision" in stale.stderr


def test_apply_errors_name_the_line_and_field(broker: BrokerProcess, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: specs/bad\nreplication: 1\nfragment:\n  length: 1024\n  flush_interval: 5 minutes\n")
    done = run_gazctl(broker, "journals", "apply", "--specs", str(bad))
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: {bad}:5:") and "flush_interval" in done.stderr
    assert done.stderr.count("\n") == 1

    missing = run_gazctl(broker, "journals", "apply", "--specs", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 1 and "nope.yaml" in missing.stderr

    dry = run_gazctl(broker, "journals", "apply", "--dry-run", input=TREE.replace("specs/", "dry/"))
    assert dry.returncode == 0, dry.stderr
    request = text_format.Parse(dry.stdout, pb.ApplyRequest())
    assert [c.upsert.name for c in request.changes] == ["dry/clicks/part-000", "dry/clicks/part-001", "dry/views"]
    assert not _listed(broker, "prefix=dry/").journals  # Nothing was applied.


def test_apply_in_batches(broker: BrokerProcess) -> None:
    children = "".join(f"- name: batch/j{i:02}\n" for i in range(7))
    tree = f"name: batch/\n{SMALL}children:\n{children}"
    done = _apply(broker, tree, "--max-txn-size", "3", "--log.level", "debug")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("applied batch") == 3
    assert len(_listed(broker, "prefix=batch/").journals) == 7

    # Three new journals, then the seven again (which exist, so revision 0 fails): the first
    # transaction applies, the second fails and says what the first applied.
    more = "".join(f"- name: batch/a{i}\n" for i in range(3)) + children
    failed = _apply(broker, f"name: batch/\n{SMALL}children:\n{more}", "--max-txn-size", "3")
    assert failed.returncode == 1 and failed.stderr.count("\n") == 1, failed.stderr
    assert "ETCD_TRANSACTION_FAILED (3 of 10 changes were applied by earlier transactions)" in failed.stderr
    assert len(_listed(broker, "prefix=batch/").journals) == 10


def test_list_watch_prints_each_change(broker: BrokerProcess) -> None:
    tree = f"name: watched/a\n{SMALL}"
    assert _apply(broker, tree).returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "gazctl", "journals", "list", "-l", "prefix=watched/", "--format", "json", "--watch",
         "--broker.address", broker.url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )
    stdout = proc.stdout
    assert stdout is not None

    def next_object() -> Any:
        """The next JSON object: Gazette's jsonpb writes them one after another, with nothing between."""
        text = ""
        while True:
            char = stdout.read(1)
            assert char, "gazctl exited"
            text += char
            if char == "}":
                try:
                    return json.loads(text)
                except json.JSONDecodeError:
                    continue

    try:
        first = next_object()
        assert [j["spec"]["name"] for j in first["journals"]] == ["watched/a"]
        assert _apply(broker, tree.replace("watched/a", "watched/b")).returncode == 0
        second = next_object()
        assert [j["spec"]["name"] for j in second["journals"]] == ["watched/a", "watched/b"]
    finally:
        proc.terminate()
        proc.wait(10)


EDITOR = textwrap.dedent(
    """\
    import os, sys
    from pathlib import Path
    path, calls = Path(sys.argv[1]), Path(os.environ["EDIT_CALLS"])
    n = int(calls.read_text()) + 1 if calls.exists() else 1
    calls.write_text(str(n))
    text = path.read_text()
    Path(os.environ["EDIT_CALLS"] + f".{n}").write_text(text)  # What the editor was shown.
    mode = os.environ["EDIT_MODE"]
    if mode == "length":
        text = text.replace("length: 131072", "length: 262144")
    elif mode == "unchanged":
        pass
    elif mode == "fix-after-error":
        if n == 1:
            text = text.replace("replication: 1", "replication: 1\\nbogus_field: 3")
        else:
            text = text.replace("bogus_field: 3\\n", "").replace("length: 131072", "length: 65536")
    path.write_text(text)
    """
)


def _edit(broker: BrokerProcess, tmp_path: Path, mode: str, selector: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "editor.py"
    script.write_text(EDITOR)
    env = {"GAZ_EDITOR": f"{sys.executable} {script}", "EDIT_MODE": mode, "EDIT_CALLS": str(tmp_path / "calls")}
    return run_gazctl(broker, "journals", "edit", "-l", selector, env=env)


def test_edit_applies_the_change(broker: BrokerProcess, tmp_path: Path) -> None:
    done = _edit(broker, tmp_path, "length", "name=specs/views")
    assert done.returncode == 0, done.stderr
    shown = (tmp_path / "calls.1").read_text()
    assert "name: specs/views" in shown and "revision:" in shown
    (journal,) = _listed(broker, "name=specs/views").journals
    assert journal.spec.fragment.length == 262144


def test_edit_without_change_aborts(broker: BrokerProcess, tmp_path: Path) -> None:
    before = _listed(broker, "name=specs/clicks/part-000").journals[0].mod_revision
    done = _edit(broker, tmp_path, "unchanged", "name=specs/clicks/part-000")
    assert done.returncode == 0 and "edit cancelled" in done.stderr
    assert _listed(broker, "name=specs/clicks/part-000").journals[0].mod_revision == before


def test_edit_reopens_with_the_error(broker: BrokerProcess, tmp_path: Path) -> None:
    done = _edit(broker, tmp_path, "fix-after-error", "name=specs/clicks/part-001")
    assert done.returncode == 0, done.stderr
    reopened = (tmp_path / "calls.2").read_text()
    assert reopened.startswith("# The edit failed to apply")
    assert "bogus_field" in reopened.splitlines()[1]  # The error names the unknown field.
    (journal,) = _listed(broker, "name=specs/clicks/part-001").journals
    assert journal.spec.fragment.length == 65536


def test_edit_requires_a_selector(broker: BrokerProcess) -> None:
    done = run_gazctl(broker, "journals", "edit")
    assert done.returncode == 1 and "--selector" in done.stderr


def test_unreachable_broker_is_one_line(tmp_path: Path) -> None:
    done = run_gazctl(None, "journals", "list", "--broker.address", "http://127.0.0.1:1", cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert "UNAVAILABLE" in done.stderr and "--broker.address" in done.stderr
    bad = run_gazctl(None, "journals", "list", "-l", "a in (", cwd=tmp_path)
    assert bad.returncode == 1 and "invalid --selector 'a in ('" in bad.stderr
