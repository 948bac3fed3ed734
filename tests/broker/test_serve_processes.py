"""`gazette serve --broker.processes N` (issue 37): one supervisor per host runs N broker processes, each a
cluster member of its own (`<id>-<i>` on `<port>+i`), on one etcd (the supervisor's embedded one, if it
embeds). Real processes throughout: journals' primaries spread over both members, appends and reads through
either port land (proxied to the primary when needed), SIGTERM stops both and exits 0, a child killed
stops the other and fails the supervisor with a one-line error, and a killed supervisor leaves no child.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import typer

from broker.cli import check_ports
from broker.processes import parse_processes, plan_members
from broker.protocol import pb, pb_grpc
from tests.support.harness import ROOT, BrokerProcess, append, apply_specs, free_port, journal_spec, list_routes

JOURNALS = [f"procs/j{i}" for i in range(8)]


def two_free_ports() -> int:
    """A port P such that P and P+1 were both free a moment ago."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two adjacent free ports")


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/ready", timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def wait_for(
    what: str, check: Callable[[], bool], proc: subprocess.Popen[bytes], logs: Path, timeout: float = 30.0,
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None, f"the supervisor exited {proc.returncode} before {what}:\n{logs.read_text()}"
        assert time.monotonic() < deadline, f"not {what} after {timeout}s:\n{logs.read_text()}"
        time.sleep(0.05)


def child_pids(text: str) -> dict[str, int]:
    """The pid of each member the supervisor started, from its log."""
    started = r"started broker process \d+ \(member (\S+?)[,)].* pid=(\d+)"
    return {m.group(1): int(m.group(2)) for m in re.finditer(started, text)}


def serving_ports(text: str) -> dict[str, int]:
    """The port each member advertised, from its `broker serving` line."""
    return {m.group(2): int(m.group(1))
            for m in re.finditer(r"broker serving endpoint=http://127\.0\.0\.1:(\d+) .*member=(\S+)", text)}


def alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def supervisor(tmp: Path, *args: str, etcd: str | None) -> tuple[subprocess.Popen[bytes], Path]:
    """`gazette serve --broker.processes 2 ARGS` (the console script's app), its stderr to a file."""
    log = tmp / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BROKER_", "ETCD_", "LOG_"))}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "gazette", "serve", "--broker.processes", "2", "--broker.bind", "127.0.0.1",
           "--broker.host", "127.0.0.1", "--broker.state-dir", str(tmp / "state"),
           "--etcd.prefix", f"/test/{uuid.uuid4().hex}", "--etcd.lease", "5s", *args]
    if etcd:
        cmd += ["--etcd.address", etcd]
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=out, env=env, cwd=ROOT), log


def test_two_members_share_the_journals_and_stop_on_sigterm(etcd_endpoint: str, tmp_path: Path) -> None:
    port = two_free_ports()
    broker = BrokerProcess(tmp_path, etcd_endpoint, f"/test/{uuid.uuid4().hex}", "--broker.processes", "2",
                           "--etcd.lease", "5s", "--broker.max-grpc-recv-size", "65536", broker_id="procs", port=port)
    try:
        broker.wait_ready()
        deadline = time.monotonic() + 30
        while not ready(port + 1):
            assert broker.proc.poll() is None and time.monotonic() < deadline, broker.logs()
            time.sleep(0.05)
        channel, stub = broker.stub()
        with channel:
            assert apply_specs(stub, *(journal_spec(j) for j in JOURNALS)).status == pb.OK

        def stubs(p: int) -> tuple[grpc.Channel, pb_grpc.JournalStub]:
            chan = grpc.insecure_channel(f"127.0.0.1:{p}")
            return chan, pb_grpc.JournalStub(chan)

        routes: dict[str, pb.Route] = {}
        deadline = time.monotonic() + 30
        while not (len(routes) == len(JOURNALS) and all(r.primary >= 0 for r in routes.values())):
            assert time.monotonic() < deadline, routes
            time.sleep(0.1)
            routes = list_routes([lambda: stubs(port)], JOURNALS, 5.0)
        primaries = {name: (r.members[r.primary].suffix, r.endpoints[r.primary]) for name, r in routes.items()}
        # Two members, each advertising its own port, and each the primary of some journals.
        assert set(primaries.values()) == {("procs-0", f"http://127.0.0.1:{port}"),
                                           ("procs-1", f"http://127.0.0.1:{port + 1}")}, primaries

        # Appends through either port land, over gRPC and HTTP PUT: one of the two is always proxied.
        for name in JOURNALS:
            for p in (port, port + 1):
                chan, s = stubs(p)
                with chan:
                    assert append(s, name, f"grpc via {p}\n".encode()).status == pb.OK
                req = urllib.request.Request(f"http://127.0.0.1:{p}/{name}", data=f"put via {p}\n".encode(),
                                             method="PUT")
                with urllib.request.urlopen(req, timeout=10) as resp:
                    assert resp.status == 204
        expected = "".join(f"grpc via {p}\nput via {p}\n" for p in (port, port + 1)).encode()
        for name in JOURNALS:
            for p in (port, port + 1):  # Reads through either port too (GET as the README's curl).
                with urllib.request.urlopen(f"http://127.0.0.1:{p}/{name}", timeout=10) as resp:
                    assert resp.read() == expected, (name, p)
        # Every other flag reached both members (in its environment variable).
        for p in (port, port + 1):
            chan, s = stubs(p)
            with chan, pytest.raises(grpc.RpcError) as caught:
                append(s, JOURNALS[0], b"x" * 100_000)
            assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, p
        pids = child_pids(broker.logs())
        assert set(pids) == {"procs-0", "procs-1"}, broker.logs()
    finally:
        rc = broker.stop(signal.SIGTERM)
    logs = broker.logs()
    assert rc == 0, logs
    for member in ("procs-0", "procs-1"):  # Each stopped as a broker does, its lines naming it.
        assert re.search(rf"broker stopped .*member={member}\b", logs), logs
    assert not [pid for pid in pids.values() if alive(pid)]
    assert "Traceback" not in logs


def test_a_child_killed_stops_the_other_and_fails_the_supervisor(tmp_path: Path) -> None:
    proc, log = supervisor(tmp_path, "--broker.port", "0", "--broker.id", "crash", "--etcd.embedded-port",
                           str(free_port()), "--etcd.embedded-peer-port", str(free_port()), etcd=None)
    try:
        wait_for("both serving", lambda: len(serving_ports(log.read_text())) == 2, proc, log)
        text = log.read_text()
        # etcd is embedded once, by the supervisor (before any member logs); both members use it.
        assert text.count("started embedded etcd") == 1 and "member=" not in text.split("started embedded etcd")[0]
        assert len(re.findall(r"using etcd at http://127\.0\.0\.1:\d+ \(from --etcd\.address\) member=", text)) == 2
        ports = serving_ports(text)
        # Port 0: each child listens on a free port of its own, and advertises it.
        assert len(set(ports.values())) == 2 and all(ready(p) for p in ports.values()), ports
        pids = child_pids(text)
        etcd = [pid for pid in children_of(proc.pid) if pid not in pids.values()]
        assert len(etcd) == 1, etcd
        os.kill(pids["crash-1"], signal.SIGKILL)
        rc = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert rc == 1, text
    error = text.strip().splitlines()[-1]
    assert error == (f"error: broker process 1 (member crash-1), pid {pids['crash-1']}, exited on its own with "
                     "signal SIGKILL; its log: stderr lines with member=crash-1; stopped the others"), text
    assert re.search(r"broker stopped .*member=crash-0\b", text), text  # The other stopped gracefully,
    assert not alive(pids["crash-0"]) and not alive(etcd[0])  # and then the embedded etcd.


def test_a_member_whose_port_is_taken_fails_the_host_in_one_line(etcd_endpoint: str, tmp_path: Path) -> None:
    port = two_free_ports()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 1))
        taken.listen()
        proc, log = supervisor(tmp_path, "--broker.port", str(port), "--broker.id", "taken", etcd=etcd_endpoint)
        try:
            rc = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text()
    assert rc == 1 and "Traceback" not in text, text
    assert f"error: starting the broker failed: cannot listen on 127.0.0.1:{port + 1}: address already in use" in text
    assert re.search(r"error: broker process 1 \(member taken-1, port \d+\), pid \d+, exited on its own with status 1; "
                     r"its log: stderr lines with member=taken-1; stopped the others$", text), text


def test_a_killed_supervisor_leaves_no_child(etcd_endpoint: str, tmp_path: Path) -> None:
    # The session's etcd, and the default 20 s lease: nothing but their supervisor's death ends the children.
    proc, log = supervisor(tmp_path, "--broker.port", "0", "--broker.id", "orphan", "--etcd.lease", "20s",
                           etcd=etcd_endpoint)
    try:
        wait_for("both serving", lambda: len(serving_ports(log.read_text())) == 2, proc, log)
        pids = list(child_pids(log.read_text()).values())
        assert len(pids) == 2 and sorted(children_of(proc.pid)) == sorted(pids)
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 5
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in pids if alive(pid)], "children outlived their supervisor"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def children_of(pid: int) -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(int(p.name)) == pid]


def _parent(pid: int) -> int:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError):
        return -1


def test_a_bad_process_count_is_a_one_line_error(tmp_path: Path) -> None:
    env = {**os.environ, "BROKER_PROCESSES": "none"}  # The environment variable, as the flag.
    done = subprocess.run([sys.executable, "-m", "gazette", "serve", "--etcd.address", "http://127.0.0.1:1",
                           "--broker.state-dir", str(tmp_path)], capture_output=True, text=True, timeout=60, env=env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: Invalid value for --broker.processes: 'none' is not a number of processes: "
                               "give auto (one per core) or a whole number, 1 or more"), lines[0]
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("value", "count"), [("auto", len(os.sched_getaffinity(0))), (" AUTO", None), ("3", 3),
                                              ("1", 1), ("0", ValueError), ("-1", ValueError), ("2.5", ValueError)])
def test_process_counts(value: str, count: int | type[ValueError] | None) -> None:
    if count is ValueError:
        with pytest.raises(ValueError, match="is not a number of processes"):
            parse_processes(value)
    else:
        assert parse_processes(value) == (count or len(os.sched_getaffinity(0)))


def test_members_of_a_host() -> None:
    members = plan_members(3, "pod", 8080, 9090, Path("/state"))
    assert [(m.broker_id, m.port, m.debug_port, m.state_dir) for m in members] == [
        ("pod-0", 8080, 9090, Path("/state/broker-0")), ("pod-1", 8081, 9091, Path("/state/broker-1")),
        ("pod-2", 8082, 9092, Path("/state/broker-2"))]
    assert [(m.port, m.debug_port) for m in plan_members(2, "pod", 0, None, Path("/s"))] == [(0, None), (0, None)]
    with pytest.raises(typer.BadParameter, match=r"3 processes need --broker.port 65534 to 65536, past 65535"):
        check_ports(65534, None, 3)
    with pytest.raises(typer.BadParameter, match=r"2 processes need --debug.port 65535 to 65536"):
        check_ports(8080, 65535, 2)
