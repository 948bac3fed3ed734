"""`gazctl shards` against a primary with a hot standby, run as a user runs it against a real broker
and two real `gazette consume` processes (`tests.gazctl.commands.shards.shard_apps:gated_app`, a
counter that can be held back): `list --lag` of a consumer that is behind, then of the member that
took its shard over, then of a shard with no member; `unassign` moving a primary to its standby;
`list --replicas` showing the standby; `edit` keeping the user's comments and refusing a save over
someone else's change; `--max-txn-size`; the consumer address from flags (before and after the
command), `gazctl.ini` and `~/.config/gazette/gazctl.ini`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import grpc
import pytest

from consumer.protocol import pb as cpb
from consumer.protocol import pb_grpc as cpb_grpc
from gazctl.editor import ERROR_HEADER
from tests.consumer.test_consume_cli import ConsumerProcess
from tests.gazctl.commands.shards.shard_apps import GATE_ENV
from tests.gazctl.commands.shards.test_shards_cli import JOURNALS, table_rows
from tests.support.apps import create_tables
from tests.support.harness import BrokerProcess, free_port, gazctl_env, one_line_error, run_gazctl

APP = "tests.gazctl.commands.shards.shard_apps:gated_app"
WAIT = 60.0
SOURCE = "shards-more/events"


class GatedConsumer(ConsumerProcess):
    """A `gazette consume` child running `gated_app` (ConsumerProcess runs `cli_apps:app`), whose
    transactions wait while the file `gate` exists."""

    def __init__(self, tmp: Path, broker: BrokerProcess, etcd: str, prefix: str, db: Path, consumer_id: str,
                 gate: Path, *extra: str) -> None:
        super().__init__(tmp, broker, etcd, prefix, db, consumer_id, *extra, app=APP, env={GATE_ENV: str(gate)})


class Target(Protocol):
    """Where gazctl is pointed: a consumer's URL, and its broker's."""

    @property
    def url(self) -> str: ...

    @property
    def broker_url(self) -> str: ...


def stopped_cleanly(proc: ConsumerProcess, sig: int = signal.SIGTERM) -> None:
    rc = proc.stop(sig)
    assert rc == 0, proc.logs()[-6000:]
    assert "Traceback" not in proc.logs(), proc.logs()[-6000:]


def gazctl(at: Target | str, *args: str, input: str | None = None,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`gazctl ARGS` with $CONSUMER_ADDRESS `at` (a URL, or a consumer's) and $BROKER_ADDRESS its broker's."""
    base = {"CONSUMER_ADDRESS": at} if isinstance(at, str) else {
        "CONSUMER_ADDRESS": at.url, "BROKER_ADDRESS": at.broker_url}
    done = run_gazctl(None, *args, input=input, env={**base, **(env or {})})
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    return done


def ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done


def listing(address: Target | str, selector: str) -> dict[str, object]:
    done = ok(gazctl(address, "shards", "list", "-l", selector, "--format", "json"))
    doc: dict[str, object] = json.loads(done.stdout)
    return doc


def members(address: Target | str, shard: str) -> tuple[str, dict[str, str]]:
    """The suffix of the shard's primary ("" if none) and each member's status, as `list --format json` says."""
    [item] = listing(address, f"id={shard}")["shards"]  # type: ignore[misc]
    route = item["route"]
    suffixes = [m["suffix"] for m in route.get("members", [])]
    statuses = {s: st["code"] for s, st in zip(suffixes, item.get("status", []), strict=False)}
    primary = route.get("primary", -1)
    return (suffixes[primary] if 0 <= primary < len(suffixes) else ""), statuses


def wait_members(address: Target | str, shard: str, expect: dict[str, str], timeout: float = WAIT) -> None:
    """Wait until the shard's members and their statuses are exactly `expect`."""
    deadline = time.monotonic() + timeout
    while (got := members(address, shard)[1]) != expect:
        assert time.monotonic() < deadline, got
        time.sleep(0.1)


def append_events(broker: BrokerProcess, journal: str, keys: list[str]) -> int:
    """Append one JSON event per key; the length in bytes of what was appended."""
    lines = "".join(f'{{"Key":"{k}","Value":"x"}}\n' for k in keys)
    ok(run_gazctl(broker, "journals", "append", "-l", f"name={journal}", input=lines))
    return len(lines.encode())


def shard_yaml(shard: str, app: str, *extra: str, source: str = SOURCE) -> str:
    fields = "".join(f"  {line}\n" for line in extra)
    return (f"common:\n  max_txn_duration: 100ms\n  labels:\n  - name: app\n    value: {app}\n"
            f"shards:\n- id: {shard}\n{fields}  sources:\n  - journal: {source}\n")


# -- list --lag: a consumer behind, the member that took over, and no member ---------------------

LAG_SOURCE = "shards-more/lag-events"
LAG_SHARD = "shards-more-lag"


def lag_row(view: ConsumerProcess) -> list[str] | None:
    """The shard's row of `list --lag --primary` (ID, STATUS, PRIMARY, LAG); None when the listing fails
    because the shard has no primary to Stat, as Gazette's does."""
    done = gazctl(view, "shards", "list", "-l", f"id={LAG_SHARD}", "--lag", "--primary")
    if done.returncode == 1 and "failed to stat shard" in done.stderr:
        return None
    [_, row] = table_rows(ok(done).stdout)
    return row


def stat(view: ConsumerProcess) -> cpb.StatResponse:
    """The shard's Stat, asked of `view` (which proxies it to the primary)."""
    with grpc.insecure_channel(f"127.0.0.1:{view.port}") as channel:
        resp: cpb.StatResponse = cpb_grpc.ShardStub(channel).Stat(cpb.StatRequest(shard=LAG_SHARD), timeout=WAIT)
    return resp


def wait_lag(view: ConsumerProcess, lag: int | None, primary: str | None) -> str:
    """Wait until `list --lag` says the shard's primary `primary` (None: any) is `lag` bytes behind
    (None: it has no primary, and the listing fails); return the primary's suffix."""
    deadline = time.monotonic() + WAIT
    while True:
        row = lag_row(view)
        got = row[2].split(":")[0] if row is not None else ""
        if lag is None and row is None:
            return ""
        if row is not None and row[3] == f"{LAG_SOURCE}:{lag}" and (got == primary or (primary is None and got)):
            return got
        assert time.monotonic() < deadline, row
        time.sleep(0.1)


def test_list_lag_of_a_consumer_behind_its_successor_and_no_member(
    broker: BrokerProcess, etcd_endpoint: str, tmp_path: Path
) -> None:
    ok(run_gazctl(broker, "journals", "apply", input=JOURNALS.replace("shards-cli/events", LAG_SOURCE)))
    prefix, db, gate = f"/test/{uuid.uuid4().hex}", tmp_path / "counts.db", tmp_path / "gate"
    create_tables(db)
    # gazctl asks `view`, a member that takes no shards (--consumer.limit 0): it proxies Stat to the primary.
    view = GatedConsumer(tmp_path, broker, etcd_endpoint, prefix, db, "lag-view", gate, "--consumer.limit", "0")
    procs = {name: GatedConsumer(tmp_path, broker, etcd_endpoint, prefix, db, name, gate)
             for name in ("lag-a", "lag-b")}
    try:
        for proc in (view, *procs.values()):
            proc.wait_ready()
        ok(gazctl(view, "shards", "apply", input=shard_yaml(LAG_SHARD, "lag", source=LAG_SOURCE)))
        head_a = append_events(broker, LAG_SOURCE, [f"a{i}" for i in range(5)])
        first = wait_lag(view, 0, None)
        second = "lag-b" if first == "lag-a" else "lag-a"

        # Held back: it reads the next events but begins no transaction, so it stays read through head_a.
        gate.touch()
        head_b = head_a + append_events(broker, LAG_SOURCE, [f"b{i}" for i in range(7)])
        wait_lag(view, head_b - head_a, first)
        stated = stat(view)
        assert stated.status == cpb.OK and stated.header.process_id.suffix == first
        assert dict(stated.read_through) == {LAG_SOURCE: head_a}, "gazctl's LAG is from the Shard API's Stat"
        assert lag_row(view) == [LAG_SHARD, "PRIMARY", f"{first}:PRIMARY", f"{LAG_SOURCE}:{head_b - head_a}"]

        # Its process stops, handing the shard to the other member, which resumes from the
        # checkpoint (still held back): --lag shows the new primary's offsets.
        stopped_cleanly(procs[first])
        wait_lag(view, head_b - head_a, second)
        stated = stat(view)
        assert stated.header.process_id.suffix == second and dict(stated.read_through) == {LAG_SOURCE: head_a}

        # Released, it catches up: lag 0.
        gate.unlink()
        wait_lag(view, 0, second)
        assert dict(stat(view).read_through) == {LAG_SOURCE: head_b}

        # No member left that may serve it: no Stat to ask, and the listing fails, as Gazette's.
        stopped_cleanly(procs[second])
        wait_lag(view, None, "")
        assert stat(view).status == cpb.NO_SHARD_PRIMARY
    finally:
        gate.unlink(missing_ok=True)
        for proc in (*procs.values(), view):
            if proc.proc.poll() is None:
                stopped_cleanly(proc)


# -- two members of one consumer group --------------------------------------------------------------


class Pair:
    """Two consumer processes of one consumer group, and the broker they read."""

    def __init__(self, broker: BrokerProcess, one: GatedConsumer, two: GatedConsumer) -> None:
        self.broker, self.one, self.two = broker, one, two

    @property
    def url(self) -> str:
        return self.one.url

    @property
    def broker_url(self) -> str:
        return self.broker.url


@pytest.fixture(scope="module")
def pair(broker: BrokerProcess, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("shards-more")
    ok(run_gazctl(broker, "journals", "apply", input=JOURNALS.replace("shards-cli/events", SOURCE)))
    prefix, db, gate = f"/test/{uuid.uuid4().hex}", tmp / "counts.db", tmp / "gate"
    create_tables(db)
    one = GatedConsumer(tmp, broker, etcd_endpoint, prefix, db, "pair-one", gate)
    two = GatedConsumer(tmp, broker, etcd_endpoint, prefix, db, "pair-two", gate)
    try:
        one.wait_ready()
        two.wait_ready()
        yield Pair(broker, one, two)
    finally:
        for proc in (one, two):
            stopped_cleanly(proc)


def test_list_replicas_shows_the_hot_standby(pair: Pair) -> None:
    shard = "shards-more-replicas"
    ok(gazctl(pair, "shards", "apply", input=shard_yaml(shard, "replicas", "hot_standbys: 1")))
    deadline = time.monotonic() + WAIT
    while True:
        done = ok(gazctl(pair, "shards", "list", "-l", f"id={shard}", "--primary", "--replicas", "--rf"))
        rows = table_rows(done.stdout)
        if rows[1][3:] and rows[1][4].endswith(":STANDBY"):
            break
        assert time.monotonic() < deadline, rows
        time.sleep(0.1)
    primary, statuses = members(pair, shard)
    standby = "pair-two" if primary == "pair-one" else "pair-one"
    assert statuses == {primary: "PRIMARY", standby: "STANDBY"}
    assert rows == [
        ["ID", "STATUS", "RF", "PRIMARY", "REPLICAS"],
        [shard, "PRIMARY", "2", f"{primary}:PRIMARY", f"{standby}:STANDBY"],
    ]


def test_unassign_moves_a_healthy_primary_to_its_standby(pair: Pair) -> None:
    shard = "shards-more-unassign"
    ok(gazctl(pair, "shards", "apply", input=shard_yaml(shard, "unassign", "hot_standbys: 1")))
    deadline = time.monotonic() + WAIT
    while sorted((primary := members(pair, shard))[1].values()) != ["PRIMARY", "STANDBY"]:
        assert time.monotonic() < deadline, primary
        time.sleep(0.1)
    before = primary[0]
    after = "pair-two" if before == "pair-one" else "pair-one"

    done = ok(gazctl(pair, "shards", "unassign", "-l", f"id={shard}"))
    assert done.stdout == f"{shard}\n" and "unassigned 1 shard" in done.stderr
    # The standby is promoted; the former primary's process becomes its standby.
    wait_members(pair, shard, {after: "PRIMARY", before: "STANDBY"})
    assert members(pair, shard)[0] == after
    rows = table_rows(ok(gazctl(pair, "shards", "list", "-l", f"id={shard}", "--primary")).stdout)
    assert rows[1] == [shard, "PRIMARY", f"{after}:PRIMARY"]


# -- edit -----------------------------------------------------------------------------------------------

EDITOR = """\
import os, subprocess, sys
from pathlib import Path
path, calls = Path(sys.argv[1]), Path(os.environ["EDIT_CALLS"])
n = int(calls.read_text()) + 1 if calls.exists() else 1
calls.write_text(str(n))
text = path.read_text()
Path(f"{calls}.{n}").write_text(text)  # What the editor was shown.
mode = os.environ["EDIT_MODE"]
if mode == "comment" and n == 1:
    text = text.replace("shards:\\n", "# Why: commits are slow on purpose.\\nshards:\\n")
    text = text.replace("max_txn_duration: 100ms", "max_txn_duration: soon")
elif mode == "comment":
    text = text.replace("max_txn_duration: soon", "max_txn_duration: 250ms")
elif mode == "race" and n == 1:
    # Someone else applies a change while the editor is open; then the user saves theirs.
    subprocess.run([sys.executable, "-m", "gazctl", "shards", "apply", "--specs", os.environ["EDIT_RACE"]],
                   check=True)
    text = text.replace("max_txn_duration: 100ms", "max_txn_duration: 500ms")
elif mode == "all":
    text = text.replace("max_txn_duration: 1s", "max_txn_duration: 3s")
path.write_text(text)
"""


def edit(pair: Pair, tmp_path: Path, mode: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "editor.py"
    script.write_text(EDITOR)
    return gazctl(pair, "shards", "edit", *args, env={
        "GAZ_EDITOR": f"{sys.executable} {script}", "EDIT_MODE": mode, "EDIT_CALLS": str(tmp_path / mode), **env})


def max_txn_ms(pair: Pair, selector: str) -> list[int]:
    """The max_txn_duration of each selected shard, in milliseconds, in ID order."""
    shards = listing(pair, selector)["shards"]
    return [round(float(item["spec"]["max_txn_duration"].rstrip("s")) * 1000) for item in shards]  # type: ignore[attr-defined]


def test_edit_keeps_the_users_comment_when_it_reopens_after_an_error(pair: Pair, tmp_path: Path) -> None:
    shard = "shards-more-edit-comment"
    ok(gazctl(pair, "shards", "apply", input=shard_yaml(shard, "edit")))
    done = ok(edit(pair, tmp_path, "comment", "-l", f"id={shard}"))
    assert "edit cancelled" not in done.stderr
    reopened = (tmp_path / "comment.2").read_text()
    assert reopened.startswith(ERROR_HEADER) and "max_txn_duration" in reopened.splitlines()[1]
    assert "# Why: commits are slow on purpose.\nshards:\n" in reopened, "the user's comment is kept"
    assert "max_txn_duration: soon" in reopened, "and so is the user's edit"
    assert max_txn_ms(pair, f"id={shard}") == [250]


def test_edit_refuses_to_overwrite_a_change_made_while_the_editor_was_open(pair: Pair, tmp_path: Path) -> None:
    shard = "shards-more-edit-race"
    ok(gazctl(pair, "shards", "apply", input=shard_yaml(shard, "edit")))
    theirs = ok(gazctl(pair, "shards", "list", "-l", f"id={shard}", "--format", "yaml")).stdout
    race = tmp_path / "theirs.yaml"
    race.write_text(theirs.replace("max_txn_duration: 100ms", "max_txn_duration: 300ms"))

    # The user's save fails on the revision; the editor reopens with the error, and saving it
    # unchanged cancels: their change stands, the user's is not applied.
    done = ok(edit(pair, tmp_path, "race", "-l", f"id={shard}", EDIT_RACE=str(race)))
    assert "edit cancelled: no changes were made" in done.stderr
    reopened = (tmp_path / "race.2").read_text()
    assert reopened.startswith(ERROR_HEADER)
    error = reopened.splitlines()[1]
    assert error.startswith("# error: ETCD_TRANSACTION_FAILED") and "current revision differs" in error, error
    assert "max_txn_duration: 500ms" in reopened
    assert max_txn_ms(pair, f"id={shard}") == [300], "the other apply's change is not overwritten"


# -- --max-txn-size -----------------------------------------------------------------------------------

FIVE = [f"shards-more-txn-{i}" for i in range(5)]


def five_shards() -> str:
    return ("common:\n  max_txn_duration: 1s\n  disable: true\n  labels:\n  - name: app\n    value: txn\nshards:\n"
            + "".join(f"- id: {shard}\n  sources:\n  - journal: {SOURCE}\n" for shard in FIVE))


def logged(done: subprocess.CompletedProcess[str], message: str) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    return [line for line in lines if line["msg"] == message]


def test_max_txn_size_applies_in_batches(pair: Pair, tmp_path: Path) -> None:
    debug = ("--log.level", "debug", "--log.format", "json")
    done = ok(gazctl(pair, "shards", "apply", "--max-txn-size", "2", *debug, input=five_shards()))
    assert [b["changes"] for b in logged(done, "applied batch")] == [2, 2, 1]
    [applied] = logged(done, "successfully applied")
    assert applied["changes"] == 5 and applied["transactions"] == 3
    assert [s["spec"]["id"] for s in listing(pair, "app=txn")["shards"]] == FIVE  # type: ignore[index]

    # edit has the flag too.
    edited = ok(edit(pair, tmp_path, "all", "-l", "app=txn", "--max-txn-size", "2", *debug))
    assert [b["changes"] for b in logged(edited, "applied batch")] == [2, 2, 1]
    assert max_txn_ms(pair, "app=txn") == [3000] * 5

    # A batch that fails leaves the ones before it applied, and says so.
    current = ok(gazctl(pair, "shards", "list", "-l", "app=txn", "--format", "yaml")).stdout
    stale = current.replace("max_txn_duration: 3s", "max_txn_duration: 4s")
    head, _, tail = stale.partition(f"- id: {FIVE[3]}\n")
    tail = "".join("  revision: 1\n" if line.startswith("  revision: ") else line + "\n"
                   for line in tail.splitlines())
    failed = gazctl(pair, "shards", "apply", "--max-txn-size", "2", input=f"{head}- id: {FIVE[3]}\n{tail}")
    one_line_error(failed, "ETCD_TRANSACTION_FAILED", "2 of 5 changes were applied by earlier transactions")
    assert max_txn_ms(pair, "app=txn") == [4000, 4000, 3000, 3000, 3000]


# -- where the consumer address comes from -------------------------------------------------------------


def bare_env(home: Path) -> dict[str, str]:
    """A gazctl environment without $CONSUMER_ADDRESS, with HOME `home`."""
    env = {k: v for k, v in gazctl_env().items() if not k.startswith("CONSUMER_")}
    env["HOME"] = str(home)
    return env


def listed_ids(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert done.returncode == 0, done.stderr
    return [row[0] for row in table_rows(done.stdout)[1:]]


def test_consumer_address_from_flags_and_ini_files(pair: Pair, tmp_path: Path) -> None:
    shard = "shards-more-address"
    ok(gazctl(pair, "shards", "apply", input=shard_yaml(shard, "address")))
    elsewhere = f"http://127.0.0.1:{free_port()}"  # Nothing listens there.
    sel = ("-l", "app=address")

    # The flag, before or after the command, wins over $CONSUMER_ADDRESS (and after over before).
    assert listed_ids(gazctl(elsewhere, "--consumer.address", pair.url, "shards", "list", *sel)) == [shard]
    assert listed_ids(gazctl(elsewhere, "shards", "list", "--consumer.address", pair.url, *sel)) == [shard]
    assert listed_ids(gazctl(elsewhere, "--consumer.address", elsewhere, "shards", "list", *sel,
                             "--consumer.address", pair.two.url)) == [shard]
    one_line_error(gazctl(pair, "--consumer.address", elsewhere, "shards", "list"), f"consumer {elsewhere}")

    def gazctl_in(cwd: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gazctl", *args], capture_output=True, text=True,
                              env=bare_env(home), cwd=cwd, timeout=60)

    # ./gazctl.ini, with $CONSUMER_ADDRESS unset.
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "gazctl.ini").write_text(f"[journals.Broker]\nAddress = {pair.broker.url}\n"
                                     f"[shards.Consumer]\nAddress = {pair.url}\n")
    assert listed_ids(gazctl_in(work, home, "shards", "list", *sel)) == [shard]
    config = gazctl_in(work, home, "print-config")
    assert f"[shards.Consumer]\n; Consumer URL, of `gazctl shards` (--consumer.address, $CONSUMER_ADDRESS)." \
           f" From: {work / 'gazctl.ini'}.\nAddress = {pair.url}\n" in config.stdout
    # ~/.config/gazette/gazctl.ini, from another directory.
    elsewhere_dir = tmp_path / "elsewhere"
    elsewhere_dir.mkdir()
    (home / ".config" / "gazette").mkdir(parents=True)
    (work / "gazctl.ini").rename(home / ".config" / "gazette" / "gazctl.ini")
    (home / ".config" / "gazette" / "gazctl.ini").write_text(f"[shards.Consumer]\nAddress = {pair.two.url}\n")
    assert listed_ids(gazctl_in(elsewhere_dir, home, "shards", "list", *sel)) == [shard]
