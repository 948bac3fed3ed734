"""`gazctl shards list/apply/unassign`, run as a user runs them, against a real broker and a real
`gazette consume` process (`tests.support.cli_apps:app`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import text_format

from consumer.protocol import pb
from gazctl.config import resolve_consumer_address
from gazctl.specs import shardspace
from tests.consumer.test_consume_cli import ConsumerProcess
from tests.support.harness import BrokerProcess, free_port, one_line_error, run_gazctl, table_rows

SOURCE = "shards-cli/events"
SHARD = "shards-cli-000"

JOURNALS = f"""\
name: {SOURCE}
replication: 1
labels:
- name: content-type
  value: application/x-ndjson
fragment:
  length: 131072
  compression_codec: NONE
  refresh_interval: 30s
"""

SHARDS = f"""\
# One shard counting the events journal.
common:
  max_txn_duration: 100ms
  labels:
  - name: app
    value: shards-cli
shards:
- id: {SHARD}
  sources:
  - journal: {SOURCE}
"""


@pytest.fixture(scope="module")
def consumer(
    broker: BrokerProcess, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConsumerProcess]:
    tmp = tmp_path_factory.mktemp("shards-cli")
    applied = run_gazctl(broker, "journals", "apply", input=JOURNALS)
    assert applied.returncode == 0, applied.stderr
    proc = ConsumerProcess(tmp, broker, etcd_endpoint, f"/test/{uuid.uuid4().hex}", tmp / "counts.db", "shards-cli")
    try:
        proc.wait_ready()
        yield proc
    finally:
        rc = proc.stop()
        assert rc == 0, proc.logs()
        assert "Traceback" not in proc.logs()


def shards(consumer: ConsumerProcess, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_gazctl(None, "shards", *args, input=input,
                      env={"CONSUMER_ADDRESS": consumer.url, "BROKER_ADDRESS": consumer.broker_url})


def listed(consumer: ConsumerProcess, selector: str = "app=shards-cli") -> pb.ListResponse:
    done = shards(consumer, "list", "-l", selector, "--format", "proto")
    assert done.returncode == 0, done.stderr
    return text_format.Parse(done.stdout, pb.ListResponse())


def wait_primary(consumer: ConsumerProcess, timeout: float = 60.0) -> list[list[str]]:
    deadline = time.monotonic() + timeout
    while True:
        done = shards(consumer, "list", "-l", f"id={SHARD}", "--primary", "--replicas", "--rf", "-L", "app")
        assert done.returncode == 0, done.stderr
        rows = table_rows(done.stdout)
        if rows[1:] and rows[1][1] == "PRIMARY":
            return rows
        assert time.monotonic() < deadline, done.stdout
        time.sleep(0.2)


def test_apply_list_unassign_delete(consumer: ConsumerProcess, tmp_path: Path) -> None:
    specs = tmp_path / "shards.yaml"
    specs.write_text(SHARDS)

    dry = shards(consumer, "apply", "--specs", str(specs), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    request = text_format.Parse(dry.stdout, pb.ApplyRequest())
    [change] = request.changes
    assert change.expect_mod_revision == 0 and change.upsert.id == SHARD
    assert [s.journal for s in change.upsert.sources] == [SOURCE]
    assert change.upsert.max_txn_duration.ToMilliseconds() == 100
    assert listed(consumer).shards == [], "--dry-run applies nothing"

    applied = shards(consumer, "apply", "--specs", str(specs))
    assert applied.returncode == 0, applied.stderr
    again = shards(consumer, "apply", "--specs", str(specs))
    one_line_error(again, "ETCD_TRANSACTION_FAILED", "revision")

    rows = wait_primary(consumer)
    assert rows[0] == ["ID", "STATUS", "RF", "PRIMARY", "REPLICAS", "APP"]
    assert rows[1:] == [[SHARD, "PRIMARY", "1", "shards-cli:PRIMARY", "", "shards-cli"]]

    plain = shards(consumer, "list")
    assert table_rows(plain.stdout) == [["ID", "STATUS"], [SHARD, "PRIMARY"]]

    resp = listed(consumer)
    [shard] = resp.shards
    assert shard.spec.id == SHARD and shard.mod_revision > 0
    assert [s.code for s in shard.status] == [pb.ReplicaStatus.PRIMARY]
    assert [m.suffix for m in shard.route.members] == ["shards-cli"]

    as_json = shards(consumer, "list", "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    assert doc["status"] == "OK"
    assert [s["spec"]["id"] for s in doc["shards"]] == [SHARD]
    assert doc["shards"][0]["status"][0]["code"] == "PRIMARY"

    as_yaml = shards(consumer, "list", "--format", "yaml")
    assert as_yaml.returncode == 0, as_yaml.stderr
    space = shardspace.load(as_yaml.stdout, "listed")
    assert [s.spec.id for s in space.shards] == [SHARD]
    assert space.shards[0].revision == shard.mod_revision
    assert "max_txn_duration: 100ms" in as_yaml.stdout

    # The listing applies as a no-op update; applied again, its revision is stale and it is refused.
    noop = shards(consumer, "apply", input=as_yaml.stdout)
    assert noop.returncode == 0, noop.stderr
    [after] = listed(consumer).shards
    assert after.spec == shard.spec and after.mod_revision > shard.mod_revision
    stale = shards(consumer, "apply", input=as_yaml.stdout)
    one_line_error(stale, "ETCD_TRANSACTION_FAILED", "revision: -1")

    # Nothing failed: --failed unassigns nothing, and the primary stays.
    none = shards(consumer, "unassign", "-l", "app=shards-cli", "--failed")
    assert none.returncode == 0, none.stderr
    assert none.stdout == "" and "unassigned 0 shards" in none.stderr
    dry_unassign = shards(consumer, "unassign", "-l", f"id={SHARD}", "--dry-run")
    assert dry_unassign.returncode == 0, dry_unassign.stderr
    assert dry_unassign.stdout == f"{SHARD}\n" and "would unassign 1 shard" in dry_unassign.stderr
    [still] = listed(consumer).shards
    assert still.mod_revision == after.mod_revision
    assert [s.code for s in still.status] == [pb.ReplicaStatus.PRIMARY]
    missing_selector = shards(consumer, "unassign", "--failed")
    one_line_error(missing_selector, "--selector (-l) is required")

    # delete: true removes it.
    current = shards(consumer, "list", "--format", "yaml").stdout
    deleted = shards(consumer, "apply", input=current.replace(f"- id: {SHARD}", f"- delete: true\n  id: {SHARD}"))
    assert deleted.returncode == 0, deleted.stderr
    assert listed(consumer).shards == []
    empty = shards(consumer, "list")
    assert table_rows(empty.stdout) == [["ID", "STATUS"]]


@pytest.mark.parametrize(
    ("text", "line", "expected"),
    [
        ("shards:\n- id: shard-a\n  sources: [\n", 4, "invalid YAML"),
        ("common:\n  max_txn_duration: 1s\nshards:\n- id: shard-a\n  hot_standby: 1\n", 5, "unknown field"),
        ("common:\n  max_txn_duration: soon\nshards:\n- id: shard-a\n", 2, "max_txn_duration"),
        ("shards:\n- id: shard-a\n  sources:\n  - journal: a/b\n", 2, "MaxTxnDuration"),
        ("common:\n  max_txn_duration: 1s\nshards:\n- id: a\n", 4, "Id: invalid length"),
        (
            "common:\n  max_txn_duration: 1s\nshards:\n- id: shard-a\n"
            "  sources:\n  - journal: b/bbb\n  - journal: a/aaa\n",
            6,
            "Sources.Journal not in unique, sorted order",
        ),
        ("common:\n  max_txn_duration: 1s\nshards:\n- id: shard-a\n  delete: true\n", 4, "ExpectModRevision"),
        ("common:\n  max_txn_duration: 1s\nshards:\n- id: shard-a\n- id: shard-a\n", 5, "appears more than once"),
        ("common:\n  id: shard-a\n", 2, "unknown field 'id'"),
    ],
)
def test_invalid_specs_are_one_line_errors_naming_file_and_line(
    tmp_path: Path, text: str, line: int, expected: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    # No consumer listens there: nothing is sent before the file validates.
    env = {"CONSUMER_ADDRESS": f"http://127.0.0.1:{free_port()}"}
    done = run_gazctl(None, "shards", "apply", "--specs", str(bad), env=env)
    error = one_line_error(done, expected)
    assert error.startswith(f"error: {bad}:{line}:"), error


def test_unreachable_consumer_and_bad_address() -> None:
    address = f"http://127.0.0.1:{free_port()}"
    done = run_gazctl(None, "shards", "list", "--consumer.address", address)
    one_line_error(done, f"consumer {address}", "UNAVAILABLE", "--consumer.address")
    bad = run_gazctl(None, "shards", "list", env={"CONSUMER_ADDRESS": "localhost:8080"})
    one_line_error(bad, "invalid consumer address 'localhost:8080'")
    selector = run_gazctl(None, "shards", "list", "-l", "app in (", env={"CONSUMER_ADDRESS": address})
    one_line_error(selector, "invalid --selector")


def test_consumer_address_flag_env_ini_default(tmp_path: Path) -> None:
    (tmp_path / "gazctl.ini").write_text(
        "[journals.Broker]\nAddress = http://broker:1\n[shards.Consumer]\nAddress = http://consumer:2\n"
    )
    home = tmp_path / "home"
    home.mkdir()
    assert resolve_consumer_address("http://flag:3", {"CONSUMER_ADDRESS": "http://env:4"}, tmp_path, home).value == (
        "http://flag:3"
    )
    assert resolve_consumer_address(None, {"CONSUMER_ADDRESS": "http://env:4"}, tmp_path, home).value == "http://env:4"
    from_ini = resolve_consumer_address(None, {}, tmp_path, home)
    assert from_ini.value == "http://consumer:2" and from_ini.source == str(tmp_path / "gazctl.ini")
    assert resolve_consumer_address(None, {}, home, home).value == "http://localhost:8080"


LAG_SOURCE = "shards-cli/lag-events"
LAG_SHARD = "shards-cli-lag"
LAG_SPECS = f"""\
common:
  max_txn_duration: 100ms
  labels:
  - name: app
    value: shards-cli-lag
shards:
- id: {LAG_SHARD}
  sources:
  - journal: {LAG_SOURCE}
- id: {LAG_SHARD}-off
  disable: true
  sources:
  - journal: {LAG_SOURCE}
"""

SHARD_EDITOR = """\
import os, sys
from pathlib import Path
path, calls = Path(sys.argv[1]), Path(os.environ["EDIT_CALLS"])
n = int(calls.read_text()) + 1 if calls.exists() else 1
calls.write_text(str(n))
text = path.read_text()
Path(os.environ["EDIT_CALLS"] + f".{n}").write_text(text)  # What the editor was shown.
if os.environ["EDIT_MODE"] == "fix-after-error":
    if n == 1:
        text = text.replace("max_txn_duration: 100ms", "max_txn_duration: soon")
    else:
        text = text.replace("max_txn_duration: soon", "max_txn_duration: 250ms")
path.write_text(text)
"""


def lag_table(consumer: ConsumerProcess, broker: BrokerProcess, selector: str) -> subprocess.CompletedProcess[str]:
    return run_gazctl(broker, "shards", "list", "-l", selector, "--lag", "--primary",
                      env={"CONSUMER_ADDRESS": consumer.url})


def test_list_lag_and_edit(consumer: ConsumerProcess, broker: BrokerProcess, tmp_path: Path) -> None:
    applied = run_gazctl(broker, "journals", "apply", input=JOURNALS.replace(SOURCE, LAG_SOURCE))
    assert applied.returncode == 0, applied.stderr
    assert shards(consumer, "apply", input=LAG_SPECS).returncode == 0

    lines = "".join(f'{{"Key":"k{i}","Value":"x"}}\n' for i in range(5))
    appended = run_gazctl(broker, "journals", "append", "-l", f"name={LAG_SOURCE}", input=lines)
    assert appended.returncode == 0, appended.stderr
    # Gazette's `shards list --lag` (shards_list.go): a LAG column of `journal:write head - read through`
    # for each journal the primary's Stat has read through.
    cell = f"{LAG_SOURCE}:0"
    deadline = time.monotonic() + 60
    while (table := lag_table(consumer, broker, f"id={LAG_SHARD}")).returncode != 0 or cell not in table.stdout:
        assert time.monotonic() < deadline, (table.stdout, table.stderr)
        time.sleep(0.2)
    assert table.stdout == (
        "┌────────────────┬─────────┬────────────────────┬─────────────────────────┐\n"
        "│       ID       │ STATUS  │      PRIMARY       │           LAG           │\n"
        "├────────────────┼─────────┼────────────────────┼─────────────────────────┤\n"
        "│ shards-cli-lag │ PRIMARY │ shards-cli:PRIMARY │ shards-cli/lag-events:0 │\n"
        "└────────────────┴─────────┴────────────────────┴─────────────────────────┘\n"
    )
    # A shard without a primary has no Stat to ask: the listing fails, as Gazette's ("failed to stat shard").
    one_line_error(lag_table(consumer, broker, "app=shards-cli-lag"), f"failed to stat shard {LAG_SHARD}-off")
    # --lag changes only the table, as in Gazette.
    as_yaml = shards(consumer, "list", "-l", "app=shards-cli-lag", "--format", "yaml")
    assert shards(consumer, "list", "-l", "app=shards-cli-lag", "--lag", "--format", "yaml").stdout == as_yaml.stdout

    # edit: a bad edit reopens the editor with the error; the fixed text applies.
    script = tmp_path / "editor.py"
    script.write_text(SHARD_EDITOR)
    env = {"CONSUMER_ADDRESS": consumer.url, "GAZ_EDITOR": f"{sys.executable} {script}",
           "EDIT_MODE": "fix-after-error", "EDIT_CALLS": str(tmp_path / "calls")}
    edited = run_gazctl(None, "shards", "edit", "-l", f"id={LAG_SHARD}", env=env)
    assert edited.returncode == 0, edited.stderr
    assert f"- id: {LAG_SHARD}" in (tmp_path / "calls.1").read_text()
    reopened = (tmp_path / "calls.2").read_text()
    assert reopened.startswith("# The edit failed to apply") and "max_txn_duration" in reopened.splitlines()[1]
    [shard] = listed(consumer, f"id={LAG_SHARD}").shards
    assert shard.spec.max_txn_duration.ToMilliseconds() == 250

    unchanged = run_gazctl(None, "shards", "edit", "-l", f"id={LAG_SHARD}",
                           env={**env, "EDIT_MODE": "unchanged", "EDIT_CALLS": str(tmp_path / "calls-b")})
    assert unchanged.returncode == 0 and "edit cancelled" in unchanged.stderr
    one_line_error(shards(consumer, "edit"), "--selector (-l) is required")
    one_line_error(shards(consumer, "edit", "-l", "id=no-such-shard"), "no shards match")

    current = shards(consumer, "list", "-l", "app=shards-cli-lag", "--format", "yaml").stdout
    gone = shards(consumer, "apply", input=current.replace("- id: ", "- delete: true\n  id: "))
    assert gone.returncode == 0, gone.stderr


def test_apply_refuses_shards_of_missing_journals(consumer: ConsumerProcess, tmp_path: Path) -> None:
    specs = tmp_path / "missing.yaml"
    missing = SHARDS.replace(SHARD, "shards-cli-missing")
    specs.write_text(missing.replace(f"journal: {SOURCE}", "journal: no/such/journal"))
    done = shards(consumer, "apply", "--specs", str(specs))
    one_line_error(done, f"{specs}:10:3: shards[0].sources", "journal no/such/journal does not exist",
                   "--no-check-journals")
    assert listed(consumer, "id=shards-cli-missing").shards == [], "nothing reached etcd"

    with_log = "  max_txn_duration: 100ms\n  recovery_log_prefix: no/logs\n  hint_prefix: /hints\n"
    logged = SHARDS.replace(SHARD, "shards-cli-nolog").replace("  max_txn_duration: 100ms\n", with_log)
    one_line_error(shards(consumer, "apply", input=logged), "recovery log journal no/logs/shards-cli-nolog")

    unchecked = shards(consumer, "apply", "--specs", str(specs), "--no-check-journals", "--dry-run")
    assert unchecked.returncode == 0, unchecked.stderr


def test_unassign_failed_restarts_a_failed_shard(consumer: ConsumerProcess, tmp_path: Path) -> None:
    # A shard whose source journal does not exist yet FAILS; once the journal exists,
    # `unassign --failed` removes the failed assignment and the allocator starts it again.
    source, shard = "shards-cli/late-events", "shards-cli-late"
    spec = SHARDS.replace(SHARD, shard).replace(f"journal: {SOURCE}", f"journal: {source}")
    applied = shards(consumer, "apply", "--no-check-journals", input=spec)
    assert applied.returncode == 0, applied.stderr

    def status() -> str:
        rows = table_rows(shards(consumer, "list", "-l", f"id={shard}").stdout)
        return rows[1][1] if rows[1:] else ""

    deadline = time.monotonic() + 60
    while status() != "FAILED":
        assert time.monotonic() < deadline, status()
        time.sleep(0.2)
    created = run_gazctl(None, "journals", "apply", input=JOURNALS.replace(SOURCE, source),
                         env={"BROKER_ADDRESS": consumer.broker_url})
    assert created.returncode == 0, created.stderr
    done = shards(consumer, "unassign", "-l", f"id={shard}", "--failed")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{shard}\n" and "unassigned 1 shard" in done.stderr
    while status() != "PRIMARY":
        assert time.monotonic() < deadline, status()
        time.sleep(0.2)
    current = shards(consumer, "list", "-l", f"id={shard}", "--format", "yaml").stdout
    gone = shards(consumer, "apply", input=current.replace("- id: ", "- delete: true\n  id: "))
    assert gone.returncode == 0, gone.stderr
