"""`gazette consume MODULE:ATTR` as a user runs it: a real `gazette serve` (the module's broker, on
the session's etcd) and real consumer processes running `tests.support.cli_apps:app`, driven
through the consumer's one port (the Shard gRPC API, `/debug/ready`, `/debug/metrics`).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from broker.client import AppendService, JournalClient
from consumer.message import Publisher
from consumer.process import application_name, default_prefix, load_application
from consumer.protocol import pb as cpb
from consumer.protocol import pb_grpc as cpb_grpc
from tests.support.apps import NDJSON, Event, create_tables, read_counts
from tests.support.cli_apps import COUNTS_DB_ENV, EnvCountingApp
from tests.support.harness import ROOT, BrokerProcess, free_port, journal_spec, one_line_error, wait_http_ready
from tests.support.journals import create_journal, unique

APP = "tests.support.cli_apps:app"
WAIT = 60.0


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CONSUMER_", "ETCD_", "BROKER_", "LOG_"))}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


class ConsumerProcess:
    """One `python -m consumer consume` child (what the `gazette` console script runs)."""

    def __init__(self, tmp: Path, broker: BrokerProcess, etcd: str, prefix: str, db: Path, consumer_id: str,
                 *extra: str, app: str = APP, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.broker_url = broker.url
        self.log_path = tmp / f"consumer-{consumer_id}-{self.port}.log"
        args = [
            sys.executable, "-m", "consumer", "consume", app,
            "--consumer.id", consumer_id, "--consumer.port", str(self.port), "--consumer.host", "127.0.0.1",
            "--consumer.bind", "127.0.0.1", "--broker.address", broker.url, "--etcd.address", etcd,
            "--etcd.prefix", prefix, "--etcd.lease", "10", "--log.level", "debug", *extra,
        ]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=child_env(**{COUNTS_DB_ENV: str(db), **(env or {})}), cwd=ROOT)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> None:
        wait_http_ready("consumer", f"http://127.0.0.1:{self.port}", self.proc, self.logs, timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            self._log.close()

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/debug/metrics", timeout=5) as resp:
            text: str = resp.read().decode()
            return text


async def publish(svc: AppendService, journal: str, *keys: str) -> int:
    """Publish one self-committed message per key; returns the journal offset after the last."""
    pub = Publisher(svc)
    appends = [pub.publish_committed(lambda _m: (journal, NDJSON), Event(Key=k, Value="x")) for k in keys]
    for aa in appends:
        await aa
    return max(aa.end for aa in appends)


async def stat_through(stub: cpb_grpc.ShardStub, shard: str, journal: str, offset: int) -> cpb.StatResponse:
    """Stat `shard` until it answers OK having read `journal` through `offset` (the shard may not yet
    have a primary)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while True:
        resp: cpb.StatResponse = await stub.Stat(
            cpb.StatRequest(shard=shard, read_through={journal: offset}), timeout=WAIT
        )
        if resp.status == cpb.OK:
            return resp
        assert resp.status in (cpb.NO_SHARD_PRIMARY, cpb.SHARD_STOPPED), resp
        if loop.time() > deadline:
            pytest.fail(f"shard {shard} has no primary: {resp}")
        await asyncio.sleep(0.1)


def run_consume(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gazette", *args], capture_output=True, text=True,
                          env=child_env(COLUMNS="200"), cwd=ROOT, timeout=timeout)


# -- a consumer process end to end ----------------------------------------------------------------


async def test_consume_counts_stops_on_sigterm_and_resumes(
    broker: BrokerProcess, etcd_endpoint: str, client: JournalClient, appender: AppendService, tmp_path: Path
) -> None:
    source = journal_spec(unique("cli/src"), content_type=NDJSON)
    await create_journal(client, source)
    db = tmp_path / "counts.db"
    create_tables(db)
    prefix = f"/test/{uuid.uuid4().hex}"

    first = ConsumerProcess(tmp_path, broker, etcd_endpoint, prefix, db, "cons-one")
    try:
        await asyncio.to_thread(first.wait_ready)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{first.port}") as channel:
            stub = cpb_grpc.ShardStub(channel)
            spec = cpb.ShardSpec(id="cli-shard", max_txn_duration=Duration(nanos=100_000_000))
            spec.sources.add(journal=source.name)
            spec.labels.labels.add(name="app", value="counter")
            applied = await stub.Apply(cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(upsert=spec)]))
            assert applied.status == cpb.OK and applied.header.etcd.revision > 0
            again = await stub.Apply(cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(upsert=spec)]))
            assert again.status == cpb.ETCD_TRANSACTION_FAILED, "expect_mod_revision 0: the shard exists"

            head = await publish(appender, source.name, "a", "a", "b", "a", "b")
            stat = await stat_through(stub, "cli-shard", source.name, head)
            assert stat.read_through[source.name] >= head
            assert stat.header.process_id.suffix == "cons-one"
            assert read_counts(db) == {"a": 3, "b": 2}

            listed = await stub.List(cpb.ListRequest())
            [shard] = listed.shards
            assert shard.spec == spec and shard.mod_revision == applied.header.etcd.revision
            assert list(shard.route.endpoints) == [first.url]
            assert [s.code for s in shard.status] == [cpb.ReplicaStatus.PRIMARY]

        metrics = await asyncio.to_thread(first.metrics)
        assert 'gazette_shard_up{shard="cli-shard",status="PRIMARY"} 1.0' in metrics
        assert 'gazette_consumer_shards{status="PRIMARY"} 1.0' in metrics
        assert f'gazette_shard_transactions_total{{shard="{prefix}/items/cli-shard"}}' in metrics
    finally:
        rc = await asyncio.to_thread(first.stop, signal.SIGTERM)
    assert rc == 0, first.logs()
    assert "Traceback" not in first.logs()

    # Published while no consumer runs; a restarted process (same ID) resumes from the checkpoint.
    head = await publish(appender, source.name, "a", "c", "c")
    second = ConsumerProcess(tmp_path, broker, etcd_endpoint, prefix, db, "cons-one")
    try:
        await asyncio.to_thread(second.wait_ready)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{second.port}") as channel:
            stub = cpb_grpc.ShardStub(channel)
            await stat_through(stub, "cli-shard", source.name, head)
        assert read_counts(db) == {"a": 4, "b": 2, "c": 2}, "no message counted twice, none lost"
    finally:
        rc = await asyncio.to_thread(second.stop, signal.SIGINT)
    assert rc == 0, second.logs()


async def test_sigterm_while_waiting_for_the_member_key_ends_the_start(
    broker: BrokerProcess, etcd_endpoint: str, tmp_path: Path
) -> None:
    """A consumer started under the ID of one still serving waits for that member key (up to a
    lease TTL once the other is gone); SIGTERM then ends its start: exit 0 at once, not death by the
    signal, and the serving consumer is untouched."""
    db = tmp_path / "counts.db"
    create_tables(db)
    prefix = f"/test/{uuid.uuid4().hex}"
    serving = ConsumerProcess(tmp_path, broker, etcd_endpoint, prefix, db, "same-id")
    waiting: ConsumerProcess | None = None
    try:
        await asyncio.to_thread(serving.wait_ready)
        waiting = ConsumerProcess(tmp_path, broker, etcd_endpoint, prefix, db, "same-id")
        await until_logged(waiting.logs, "is held under another lease")
        rc = await asyncio.to_thread(waiting.stop, signal.SIGTERM, 15.0)
        assert rc == 0, waiting.logs()
        assert "signalled while starting: exiting" in waiting.logs()
        assert "Traceback" not in waiting.logs() and "graceful exit failed" not in waiting.logs()
        await asyncio.to_thread(serving.wait_ready, 5.0)
    finally:
        if waiting is not None and waiting.proc.poll() is None:
            waiting.stop(signal.SIGKILL)
        rc = await asyncio.to_thread(serving.stop, signal.SIGTERM)
    assert rc == 0, serving.logs()


async def until_logged(logs: Callable[[], str], text: str, timeout: float = WAIT) -> None:
    """Wait until `text` is in `logs()`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while text not in logs():
        if loop.time() > deadline:
            pytest.fail(f"{text!r} was not logged within {timeout}s:\n{logs()}")
        await asyncio.sleep(0.05)


async def test_gazette_flags_durations_debug_port_and_cors(
    broker: BrokerProcess, etcd_endpoint: str, etcd_client: Any, tmp_path: Path
) -> None:
    """Gazette's runconsumer flags: Go durations (flag and environment), `--debug.port` with
    `--debug.private`, and `--consumer.allow-origin` answering a CORS preflight."""
    db = tmp_path / "counts.db"
    create_tables(db)
    debug_port, origin = free_port(), "https://reader.example"
    proc = ConsumerProcess(
        tmp_path, broker, etcd_endpoint, f"/test/{uuid.uuid4().hex}", db, "cons-flags",
        "--etcd.lease", "1m30s", "--debug.port", str(debug_port), "--debug.private",
        "--consumer.allow-origin", origin, env={"CONSUMER_WATCH_DELAY": "30ms", "CONSUMER_HINTS_INTERVAL": "1m"},
    )
    try:
        await asyncio.to_thread(
            wait_http_ready, "consumer", f"http://127.0.0.1:{debug_port}", proc.proc, proc.logs
        )
        lease = re.search(r"under lease ([0-9a-f]+)", proc.logs())
        assert lease is not None, proc.logs()
        assert (await etcd_client.get_lease_info(int(lease.group(1), 16))).grantedTTL == 90
        with pytest.raises(urllib.error.HTTPError):  # Not the debug route on the public port.
            urllib.request.urlopen(f"{proc.url}/debug/ready", timeout=5)
        preflight = urllib.request.Request(f"{proc.url}/some/route", method="OPTIONS", headers={"Origin": origin})
        with urllib.request.urlopen(preflight, timeout=5) as resp:
            assert resp.status == 200 and resp.headers["Access-Control-Allow-Origin"] == origin
    finally:
        rc = await asyncio.to_thread(proc.stop)
    assert rc == 0, proc.logs()


# -- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("no_such_module_xyz:app", ["could not import module 'no_such_module_xyz'"]),
        ("tests.support.cli_apps:nope", ["module 'tests.support.cli_apps' has no attribute 'nope'"]),
        ("tests.support.cli_apps:not_an_app", ["is not a consumer Application", "new_store"]),
        ("tests.support.apps:CountingApp", ["is a class, not an application object"]),
        ("tests.support.cli_apps", ["is not MODULE:ATTR"]),
    ],
)
def test_bad_application_is_one_line_error(spec: str, expected: list[str]) -> None:
    done = run_consume("consume", spec, "--etcd.address", "http://127.0.0.1:1")
    one_line_error(done, "MODULE:ATTR", *expected, code=2)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--consumer.port", "abc"], ["--consumer.port"]),
        (["--consumer.zone", "bad zone"], ["--consumer.zone", "not a valid token"]),
        (["--consumer.id", "x"], ["--consumer.id"]),
        (["--consumer.limit", "-1"], ["--consumer.limit", "must be >= 0"]),
        (["--consumer.max-hot-standbys", "-2"], ["--consumer.max-hot-standbys"]),
        (["--log.level", "loud"], ["--log.level", "unknown level"]),
        (["--etcd.prefix", "relative"], ["--etcd.prefix"]),
        (["--no-such-flag"], ["No such option: --no-such-flag"]),
        (["--etcd.lease", "5x"], ["--etcd.lease", "give a Go duration such as 20s, 1m30s or 250ms, or seconds"]),
        (["--consumer.watch-delay", "fast"], ["--consumer.watch-delay", "is not a duration"]),
        (["--consumer.hints-interval", "10ms"], ["--consumer.hints-interval", "at least 100ms"]),
        (["--debug.port", "70000"], ["--debug.port", "must be a port number"]),
    ],
)
def test_bad_flags_are_one_line_errors(args: list[str], expected: list[str]) -> None:
    one_line_error(run_consume("consume", APP, *args), *expected, code=2)


def test_unreachable_etcd_is_one_line_error() -> None:
    port = free_port()
    done = run_consume("consume", APP, "--etcd.address", f"http://127.0.0.1:{port}", "--consumer.bind", "127.0.0.1",
                       "--log.level", "error")
    one_line_error(done, "starting the consumer failed", f"127.0.0.1:{port}", "--etcd.address")


def test_gazette_has_serve_and_consume() -> None:
    done = run_consume("--help")
    assert done.returncode == 0 and "serve" in done.stdout and "consume" in done.stdout, done.stdout
    broker_help = subprocess.run([sys.executable, "-m", "broker", "serve", "--help"], capture_output=True,
                                 text=True, env=child_env(), cwd=ROOT, timeout=60)
    assert broker_help.returncode == 0 and "--broker.port" in broker_help.stdout
    consume_help = run_consume("consume", "--help")
    for flag in ("--consumer.zone", "--consumer.id", "--consumer.host", "--consumer.port", "--consumer.limit",
                 "--consumer.max-hot-standbys", "--broker.address", "--etcd.address", "--etcd.prefix",
                 "--etcd.lease", "--log.level", "--log.format"):
        assert flag in consume_help.stdout, flag


def test_load_application_and_default_prefix() -> None:
    app = load_application(APP)
    assert isinstance(app, EnvCountingApp)
    assert application_name(app) == "tests.support.cli_apps.EnvCountingApp"
    assert default_prefix(app) == "/gazette/consumers/tests.support.cli_apps.EnvCountingApp"
