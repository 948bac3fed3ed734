"""Starts real `gazette serve` processes on loopback ports for integration tests."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc

from broker.protocol import pb, pb_grpc


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class BrokerProcess:
    """One `gazette serve` child process, its port and its logs."""

    def __init__(
        self, tmp: Path, etcd: str | None, prefix: str, *extra: str, broker_id: str = "", port: int | None = None,
        clock_offset: float = 0.0, env: dict[str, str] | None = None,
    ) -> None:
        # `port` restarts a broker where a stopped one listened, so clients find it again.
        # `clock_offset` shifts the broker's wall clock by that many seconds (tests/support/clock_shift.py).
        self.port = port or free_port()
        self.state_dir = tmp / f"broker-{self.port}"
        restart = 1
        while self.state_dir.exists():
            self.state_dir = tmp / f"broker-{self.port}-{restart}"
            restart += 1
        self.state_dir.mkdir(parents=True)
        self.log_path = self.state_dir / "broker.log"
        self.broker_id = broker_id or f"broker-{self.port}"
        self.file_root = Path(extra[extra.index("--broker.file-root") + 1]) if "--broker.file-root" in extra else None
        """The root of the broker's `file://` store, if it has one."""
        launcher = [str(Path(__file__).with_name("clock_shift.py")), str(clock_offset)] if clock_offset else ["-m"]
        args = [
            sys.executable, *launcher, "broker", "serve",
            "--broker.port", str(self.port), "--broker.host", "127.0.0.1", "--broker.bind", "127.0.0.1",
            "--broker.id", self.broker_id, "--broker.state-dir", str(self.state_dir),
            "--etcd.prefix", prefix, "--log.level", "debug",
            # One process per BrokerProcess, whatever the host's cores (`auto`); a test's own
            # --broker.processes in `extra` comes later, and the last occurrence of a flag wins.
            "--broker.processes", "1", *extra,
        ]
        if etcd:
            args += ["--etcd.address", etcd]
        environ = {k: v for k, v in os.environ.items() if k != "ETCD_ADDRESS"} | (env or {})
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=environ)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> BrokerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                with urllib.request.urlopen(f"{self.url}/debug/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"broker not ready after {timeout}s:\n{self.logs()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
            raise
        finally:
            self._log.close()
        return rc

    def stub(self) -> tuple[grpc.Channel, pb_grpc.JournalStub]:
        channel = grpc.insecure_channel(self.target)
        return channel, pb_grpc.JournalStub(channel)


@contextmanager
def serving_broker(tmp: Path, etcd: str, *extra: str, file_root: bool = False) -> Iterator[BrokerProcess]:
    """A ready broker under a keyspace root of its own (with a `file://` store at `tmp/fragments` if
    `file_root`); stopped on exit, where any exit status but 0 fails the test with the broker's log."""
    if file_root:
        (tmp / "fragments").mkdir(exist_ok=True)
        extra = ("--broker.file-root", str(tmp / "fragments"), *extra)
    proc = BrokerProcess(tmp, etcd, f"/test/{uuid.uuid4().hex}", *extra)
    try:
        yield proc.wait_ready()
    finally:
        rc = proc.stop()
        assert rc == 0, proc.logs()


def wait_http_ready(
    name: str, url: str, proc: subprocess.Popen[bytes], logs: Callable[[], str], timeout: float = 30.0
) -> None:
    """Poll `url`/debug/ready until it answers 200; raise naming `name`, with the tail of `logs()`,
    if the process exits first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{logs()[-6000:]}")
        try:
            with urllib.request.urlopen(f"{url}/debug/ready", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{name} not ready after {timeout}s:\n{logs()[-6000:]}")


def append(stub: pb_grpc.JournalStub, journal: str, content: bytes = b"", **params: object) -> pb.AppendResponse:
    """One Append RPC of `content` (streamed in 1 MiB messages), with `params` set on its first request."""

    def requests() -> Iterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=journal, **params)  # type: ignore[arg-type]
        for i in range(0, len(content), 1 << 20):  # gRPC's default limit is 4 MiB a message.
            yield pb.AppendRequest(content=content[i : i + (1 << 20)])
        yield pb.AppendRequest()

    resp: pb.AppendResponse = stub.Append(requests())
    return resp


def journal_spec(name: str, replication: int = 1, **labels: str) -> pb.JournalSpec:
    """A valid spec with the tutorial's settings and no stores."""
    spec = pb.JournalSpec(name=name, replication=replication)
    spec.fragment.length = 128 * 1024
    spec.fragment.compression_codec = pb.NONE
    spec.fragment.refresh_interval.seconds = 30
    for key, value in sorted(labels.items()):
        spec.labels.labels.add(name=key.replace("_", "-"), value=value)
    return spec


def apply_specs(stub: pb_grpc.JournalStub, *specs: pb.JournalSpec, revision: int = 0) -> pb.ApplyResponse:
    req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=s, expect_mod_revision=revision) for s in specs])
    resp: pb.ApplyResponse = stub.Apply(req)
    return resp


def wait_for_primary(stub: pb_grpc.JournalStub, journal: str, timeout: float = 15.0) -> None:
    """Block until the journal has an assigned primary."""
    deadline = time.monotonic() + timeout
    sel = pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name="name", value=journal)]))
    while time.monotonic() < deadline:
        for resp in stub.List(pb.ListRequest(selector=sel)):
            for j in resp.journals:
                if j.route.primary >= 0:
                    return
        time.sleep(0.05)
    raise TimeoutError(f"journal {journal} has no primary")


ROOT = Path(__file__).resolve().parents[2]


def run_gazctl(
    broker: BrokerProcess | None,
    *args: str,
    input: str | bytes | None = None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """Run `gazctl ARGS` as a user would, with $BROKER_ADDRESS pointing at `broker` (if given).

    Text mode unless `input` is bytes (then stdout/stderr are bytes too, decoded by the caller).
    A `HOME` without a gazctl.ini keeps the developer's own configuration out of the test.
    """
    base = gazctl_env(broker, cwd)
    base.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gazctl", *args],
        input=input, capture_output=True, text=not isinstance(input, bytes), env=base,
        cwd=cwd or ROOT, timeout=timeout,
    )


def gazctl_env(broker: BrokerProcess | None = None, cwd: Path | None = None) -> dict[str, str]:
    """The environment of a gazctl child: HOME is `cwd` (or the repository), $BROKER_ADDRESS names `broker`."""
    base = {k: v for k, v in os.environ.items() if k not in ("BROKER_ADDRESS", "LOG_LEVEL", "LOG_FORMAT")}
    base["HOME"] = str(cwd or ROOT)
    base["PYTHONPATH"] = str(ROOT)  # `python -m gazctl` from any directory runs this checkout's gazctl.
    if broker is not None:
        base["BROKER_ADDRESS"] = broker.url
    return base


def one_line_error(done: subprocess.CompletedProcess[str], *expected: str, code: int = 1) -> str:
    """The one line a CLI run (gazctl, `gazette`) that failed with status `code` wrote to stderr (`note: `
    lines aside), checked to start `error: ` and name each of `expected`; no traceback anywhere."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    lines = [line for line in done.stderr.strip().splitlines() if not line.startswith("note: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def table_rows(text: str) -> list[list[str]]:
    """The cells of each line of a table gazctl printed (tablewriter's box: `│ a │ b │`), header first."""
    return [[c.strip() for c in line[1:-1].split("│")] for line in text.splitlines() if line.startswith("│")]


class LineReader:
    """Collects a child process's output lines on a thread, so a test can wait for one with a timeout."""

    def __init__(self, stream: object) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float = 20.0) -> str:
        """The first line matching `pattern` (a regular expression), waiting for it up to `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if re.search(pattern, line):
                        return line
                left = deadline - time.monotonic()
                assert left > 0, f"no line matching {pattern!r} in {self.lines!r}"
                self._cond.wait(left)


# Clusters whose brokers are killed and restarted as a scheduler does (tests/broker/test_cluster_chaos.py,
# tests/benchmarks/chaos.py).


class ClusterSlot:
    """One place of a BrokerCluster (a pod): its zone and the broker running there now."""

    def __init__(self, zone: str, proc: BrokerProcess, state_dir: Path) -> None:
        self.zone = zone
        self.proc = proc
        self.state_dir = state_dir
        """The state directory of the running broker (a restart under the same ID keeps it)."""
        self.generation = 0
        """How many times the slot's broker was replaced."""

    @property
    def member(self) -> tuple[str, str]:
        """The running broker's (zone, suffix)."""
        return self.zone, self.proc.broker_id


class BrokerCluster:
    """`gazette serve` brokers of one keyspace root, one per zone, sharing a `file://` root at `tmp/fragments`.

    `kill` signals a slot's broker and waits for it to exit; `restart` starts its successor: under the
    same --broker.id, state dir and port (a restarted container), or a new ID, a fresh state dir and a new
    port (a rescheduled pod). Every incarnation's log is kept (`processes`).
    """

    def __init__(
        self, tmp: Path, etcd: str, prefix: str, zones: tuple[str, ...] = ("a", "b", "c"), *,
        lease: float = 5.0, extra: tuple[str, ...] = (),
    ) -> None:
        self.tmp, self.etcd, self.prefix, self.lease, self.extra = tmp, etcd, prefix, lease, extra
        self.file_root = tmp / "fragments"
        self.file_root.mkdir(parents=True, exist_ok=True)
        self.zones = zones
        self.slots: list[ClusterSlot] = []
        self.processes: list[BrokerProcess] = []
        self._ids = 0
        self._ports: set[int] = set()

    def _spawn(self, zone: str, broker_id: str, state_dir: Path | None, port: int | None) -> BrokerProcess:
        args = ["--broker.zone", zone, "--broker.file-root", str(self.file_root), "--etcd.lease", str(self.lease)]
        if state_dir is not None:
            # BrokerProcess passes a fresh --broker.state-dir of its own; the last occurrence of a flag wins.
            args += ["--broker.state-dir", str(state_dir)]
        if port is None:
            port = free_port()
            while port in self._ports:  # Brokers started together must not be handed the same free port.
                port = free_port()
        self._ports.add(port)
        proc = BrokerProcess(self.tmp, self.etcd, self.prefix, *args, *self.extra, broker_id=broker_id, port=port)
        if state_dir is not None:
            proc.state_dir = state_dir  # Its log stays in the directory BrokerProcess made for this incarnation.
        self.processes.append(proc)
        return proc

    def _new_id(self, zone: str) -> str:
        self._ids += 1
        return f"broker-{zone}-{self._ids}"

    def start(self, timeout: float = 60.0) -> BrokerCluster:
        for zone in self.zones:
            proc = self._spawn(zone, self._new_id(zone), None, None)
            self.slots.append(ClusterSlot(zone, proc, proc.state_dir))
        for slot in self.slots:
            slot.proc.wait_ready(timeout)
        return self

    @property
    def urls(self) -> list[str]:
        return [slot.proc.url for slot in self.slots]

    def kill(self, index: int, sig: int = signal.SIGKILL, timeout: float = 30.0) -> int:
        """Signal the slot's broker and wait for it to exit; its exit status (SIGKILL'd after `timeout`)."""
        return self.slots[index].proc.stop(sig, timeout)

    def restart(self, index: int, *, same_id: bool) -> BrokerProcess:
        """Start the slot's next broker (not waiting for it to be ready)."""
        slot = self.slots[index]
        old = slot.proc
        if old.proc.poll() is None:
            raise RuntimeError(f"broker {old.broker_id} is still running")
        if same_id:
            slot.proc = self._spawn(slot.zone, old.broker_id, slot.state_dir, old.port)
        else:
            slot.proc = self._spawn(slot.zone, self._new_id(slot.zone), None, None)
            slot.state_dir = slot.proc.state_dir
        slot.generation += 1
        return slot.proc

    def routes(self, journals: list[str], timeout: float = 5.0) -> dict[str, pb.Route]:
        """The routes of `journals` as the first live broker that answers List lists them."""
        live = [slot.proc.stub for slot in self.slots if slot.proc.proc.poll() is None]
        return list_routes(live, journals, timeout)

    def wait_routed(self, journals: list[str], replication: int, timeout: float = 30.0) -> None:
        """Wait until every journal has a primary and `replication` members, all of them running brokers."""
        deadline = time.monotonic() + timeout
        routes: dict[str, pb.Route] = {}
        while time.monotonic() < deadline:
            running = {slot.member for slot in self.slots if slot.proc.proc.poll() is None}
            routes = self.routes(journals)
            if len(routes) == len(journals) and all(
                r.primary >= 0 and len(r.members) == replication and {(m.zone, m.suffix) for m in r.members} <= running
                for r in routes.values()
            ):
                return
            time.sleep(0.1)
        shown = {name: [(m.zone, m.suffix) for m in r.members] + [r.primary] for name, r in routes.items()}
        raise TimeoutError(f"journals not routed to {replication} running brokers after {timeout}s: {shown}")

    def stop_all(self, timeout: float = 20.0) -> dict[str, int]:
        """SIGTERM every running broker at once (SIGKILL after `timeout`); their exit statuses by ID."""
        running = [slot.proc for slot in self.slots if slot.proc.proc.poll() is None]
        for proc in running:
            proc.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        statuses: dict[str, int] = {}
        for proc in running:
            try:
                proc.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.proc.kill()
            statuses[proc.broker_id] = proc.stop()  # Exited: this only reaps it and closes its log.
        for proc in self.processes:
            if proc.proc.poll() is not None:
                proc.stop()
        return statuses

    def log_lines(self, pattern: str = r"^\S+ (warning|error|critical)\b") -> list[str]:
        """Lines matching `pattern` in every incarnation's log, each prefixed with its broker ID and port."""
        out = []
        for proc in self.processes:
            for line in proc.logs().splitlines():
                if re.search(pattern, line):
                    out.append(f"[{proc.broker_id}:{proc.port}] {line}")
        return out


def list_routes(
    stubs: Iterable[Callable[[], tuple[grpc.Channel, pb_grpc.JournalStub]]], journals: list[str], timeout: float,
) -> dict[str, pb.Route]:
    """The routes of `journals` as the first broker of `stubs` (each opening a channel to one) that
    answers a List of their common `prefix` lists them; {} if none answers."""
    prefix = _common_prefix(journals)
    labels = [pb.Label(name="prefix", value=prefix)] if prefix else []
    sel = pb.LabelSelector(include=pb.LabelSet(labels=labels))
    for open_stub in stubs:
        channel, stub = open_stub()
        try:
            found = {}
            for resp in stub.List(pb.ListRequest(selector=sel), timeout=timeout):
                for j in resp.journals:
                    found[j.spec.name] = j.route
            return {name: found[name] for name in journals if name in found}
        except grpc.RpcError:
            continue
        finally:
            channel.close()
    return {}


def _common_prefix(names: list[str]) -> str:
    """The deepest directory (ending in `/`) holding every journal of `names`: a `prefix` label value."""
    parts = [name.split("/")[:-1] for name in names]
    common: list[str] = []
    for column in zip(*parts, strict=False):
        if len(set(column)) != 1:
            break
        common.append(column[0])
    return "/".join(common) + "/" if common else ""
