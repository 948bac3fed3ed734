"""`gazette serve` with no etcd flag embeds etcd; a second broker joins it; both exit on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from broker.protocol import pb
from tests.support.harness import BrokerProcess, apply_specs, free_port, journal_spec, wait_for_primary


def _etcd_children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid and b"etcd" in cmdline:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_embedded_etcd_and_second_broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    etcd_port, peer_port = free_port(), free_port()
    extra = ["--etcd.embedded-port", str(etcd_port), "--etcd.embedded-peer-port", str(peer_port)]
    first = BrokerProcess(tmp_path, None, "/embedded", *extra).wait_ready()
    assert "started embedded etcd" in first.logs()
    [etcd_pid] = _etcd_children(first.proc.pid)

    second = BrokerProcess(tmp_path, None, "/embedded", *extra).wait_ready()
    assert "using the etcd already running" in second.logs()
    assert _etcd_children(second.proc.pid) == []

    channel, stub = second.stub()
    with channel:
        assert apply_specs(stub, journal_spec("embedded/j", replication=2)).status == pb.OK
        wait_for_primary(stub, "embedded/j")
        members = [
            (m.zone, m.suffix)
            for r in stub.List(pb.ListRequest()) for j in r.journals for m in j.route.members
        ]
        # An append through either broker replicates to both, and both serve it.
        for i in range(3):
            resp = stub.Append(iter([pb.AppendRequest(journal="embedded/j"),
                                     pb.AppendRequest(content=f"line {i}\n".encode()), pb.AppendRequest()]))
            assert resp.status == pb.OK, resp
    assert sorted(members) == sorted([("local", first.broker_id), ("local", second.broker_id)])
    for broker in (first, second):
        channel, stub = broker.stub()
        with channel:
            content = b"".join(r.content for r in stub.Read(pb.ReadRequest(journal="embedded/j", do_not_proxy=True)))
        assert content == b"line 0\nline 1\nline 2\n"

    assert second.stop(signal.SIGTERM) == 0
    assert first.stop(signal.SIGTERM) == 0
    deadline = time.monotonic() + 10
    while _alive(etcd_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(etcd_pid), "the embedded etcd outlived its broker"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--broker.id", "abc"], "Invalid value for --broker.id: invalid length (3; expected 4 <= length <= 128)"),
        (["--broker.zone", "a@b"], "Invalid value for --broker.zone: not a valid token (a@b)"),
        (["--broker.limit", "-1"], "Invalid value for --broker.limit: must be >= 0, not -1"),
        (["--broker.limit", "200000"], "Invalid value for --broker.limit: invalid JournalLimit (200000;"),
    ],
)
def test_identity_flags_checked_before_anything_starts(flags: list[str], message: str, tmp_path: Path) -> None:
    # Peers refuse a 3-byte suffix on every replicated append: the broker must not start with one.
    out = subprocess.run(
        [sys.executable, "-m", "broker", "serve", "--etcd.address", "http://127.0.0.1:1",
         "--broker.state-dir", str(tmp_path), *flags],
        capture_output=True, text=True, timeout=30, env={**os.environ, "COLUMNS": "200"},
    )
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert not list(tmp_path.iterdir())  # Nothing was started or written.


def test_sigusr1_logs_every_task_and_keeps_serving(tmp_path: Path, etcd_endpoint: str) -> None:
    broker = BrokerProcess(tmp_path, etcd_endpoint, "/test/sigusr1").wait_ready()
    try:
        broker.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while "asyncio tasks (SIGUSR1)" not in broker.logs() and time.monotonic() < deadline:
            time.sleep(0.1)
        logs = broker.logs()
        assert "asyncio tasks (SIGUSR1)" in logs
        assert "run_pulses" in logs and "run_allocator" in logs  # The stacks name what each task runs.
        broker.wait_ready(timeout=5)  # Still serving.
    finally:
        assert broker.stop() == 0, broker.logs()


def test_sigterm_while_waiting_for_the_member_key_ends_the_start(tmp_path: Path, etcd_endpoint: str) -> None:
    """A broker started under the ID of one still serving waits for that member key (as a restarted
    pod waits out its old lease); SIGTERM then ends the start: exit 0 at once rather than death by
    the signal, the lease it took revoked, and the serving broker untouched."""
    prefix = f"/test/{uuid.uuid4().hex}"
    serving = BrokerProcess(tmp_path / "a", etcd_endpoint, prefix, broker_id="same-id").wait_ready()
    try:
        waiting = BrokerProcess(tmp_path / "b", etcd_endpoint, prefix, broker_id="same-id")
        try:
            deadline = time.monotonic() + 30
            while "is held under another lease" not in waiting.logs():
                assert time.monotonic() < deadline and waiting.proc.poll() is None, waiting.logs()
                time.sleep(0.05)
            assert waiting.stop(signal.SIGTERM, timeout=15) == 0, waiting.logs()
        finally:
            if waiting.proc.poll() is None:
                waiting.stop(signal.SIGKILL)
        logs = waiting.logs()
        assert "signalled while starting: exiting" in logs and "Traceback" not in logs, logs
        revoked = re.search(r"released \S+ \(lease ([0-9a-f]+)\)", logs)
        held = re.search(r"announced \S+ under lease ([0-9a-f]+)", serving.logs())
        assert revoked and held and revoked.group(1) != held.group(1), logs
        serving.wait_ready(timeout=5)
    finally:
        assert serving.stop() == 0, serving.logs()
