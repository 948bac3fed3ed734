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
from collections.abc import Iterator
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
        self, tmp: Path, etcd: str | None, prefix: str, *extra: str, broker_id: str = "", port: int | None = None
    ) -> None:
        # `port` restarts a broker where a stopped one listened, so clients find it again.
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
        args = [
            sys.executable, "-m", "broker", "serve",
            "--broker.port", str(self.port), "--broker.host", "127.0.0.1", "--broker.bind", "127.0.0.1",
            "--broker.id", self.broker_id, "--broker.state-dir", str(self.state_dir),
            "--etcd.prefix", prefix, "--log.level", "debug", *extra,
        ]
        if etcd:
            args += ["--etcd.address", etcd]
        env = {k: v for k, v in os.environ.items() if k != "ETCD_ADDRESS"}
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env)

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


ROOT = Path(__file__).resolve().parents[1]


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


def one_line_error(done: subprocess.CompletedProcess[str], *expected: str) -> str:
    """The error line of a gazctl run that failed with status 1, checked to name each of `expected`."""
    assert done.returncode == 1, done.stdout
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("error: "), done.stderr
    for text in expected:
        assert text in error, error
    return error


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
