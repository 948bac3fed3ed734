"""`gazette consume` processes as hosts of a `tests.netfaults.NetworkLab`: each consumer member runs
`python -m consumer consume APP` inside a network namespace of its own, bound to and advertising its
host's address, against the lab's etcd (root namespace) and a broker of the lab.

`NetConsumer` is the consumer's `NetBroker`: it can be stopped, killed and restarted as itself (same
--consumer.id, zone, address and port), as a supervisor restarts a pod; `url`, `logs()`, `log_lines()`,
`ready()`, `wait_ready()` (polling /debug/ready from the root namespace), `running()`, `exits` (the exit
statuses of earlier incarnations), `metrics()` (its /debug/metrics, parsed).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping

from tests.netfaults import ROOT, NetfaultsError, NetHost, NetworkLab

_METRIC_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


class NetConsumer:
    """A `gazette consume APP` member on a lab host (`python -m consumer consume`, the `gazette consume`
    entry point), inside the host's namespace. `restart()` starts it again as itself."""

    def __init__(
        self, lab: NetworkLab, host: NetHost, *, app: str, consumer_id: str, root: str, broker_url: str,
        zone: str = "local", lease: float = 5.0, port: int = 8080, log_level: str = "info",
        env: Mapping[str, str] | None = None, extra: Iterable[str] = (),
    ) -> None:
        self.lab, self.host, self.app, self.consumer_id, self.root = lab, host, app, consumer_id, root
        self.broker_url, self.zone, self.lease, self.port, self.log_level = broker_url, zone, lease, port, log_level
        self.env = dict(env or {})
        self.extra = tuple(extra)
        self.log_path = lab.tmp / consumer_id / "consumer.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.exits: list[int] = []
        """Exit statuses of the incarnations that ended."""
        self.started_at = 0.0
        self.incarnation = 0

    @property
    def addr(self) -> str:
        return self.host.addr

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}"

    @property
    def member(self) -> tuple[str, str]:
        """(zone, suffix), as assignments name it."""
        return self.zone, self.consumer_id

    def command(self) -> list[str]:
        return self.host.exec_args(
            sys.executable, "-m", "consumer", "consume", self.app,
            "--consumer.id", self.consumer_id, "--consumer.zone", self.zone,
            "--consumer.host", self.addr, "--consumer.bind", self.addr, "--consumer.port", str(self.port),
            "--broker.address", self.broker_url, "--etcd.address", self.lab.etcd_endpoint,
            "--etcd.prefix", self.root, "--etcd.lease", str(self.lease), "--log.level", self.log_level,
            *self.extra,
        )

    def start(self) -> NetConsumer:
        if self.running():
            raise NetfaultsError(f"{self.consumer_id} is running")
        self._reap()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CONSUMER_", "ETCD_", "BROKER_", "LOG_"))}
        env.update(self.env)
        env["PYTHONPATH"] = str(ROOT)
        self.incarnation += 1
        with open(self.log_path, "ab") as log:
            log.write(f"==== netfaults: incarnation {self.incarnation} of {self.consumer_id} ====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                cwd=ROOT, start_new_session=True,
            )
        self.started_at = time.monotonic()
        return self

    restart = start
    """Start the consumer again as itself (same ID, zone, address and port); it must have exited."""

    def _reap(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            self.exits.append(self.proc.returncode)
            self.proc = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        """Signal the consumer and wait for it to exit (SIGKILL after `timeout`); its exit status."""
        if self.proc is None:
            return None
        proc = self.proc
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        rc = proc.returncode
        self._reap()
        return rc

    def kill(self) -> int | None:
        return self.stop(signal.SIGKILL)

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_lines(self, pattern: str = r"\b(WARNING|ERROR|CRITICAL|warning|error|critical)\b|^==== ") -> list[str]:
        return [line for line in self.logs().splitlines() if re.search(pattern, line)]

    def ready(self, timeout: float = 1.0) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/debug/ready", timeout=timeout) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def wait_ready(self, timeout: float = 30.0) -> NetConsumer:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise NetfaultsError(f"{self.consumer_id} exited with {self.returncode}:\n{self.logs()[-6000:]}")
            if self.ready():
                return self
            time.sleep(0.1)
        raise TimeoutError(f"{self.consumer_id} not ready after {timeout}s:\n{self.logs()[-6000:]}")

    def metrics(self, timeout: float = 1.0) -> dict[str, float] | None:
        """Its /debug/metrics as {`name{labels}`: value}, or None if it does not answer."""
        try:
            with urllib.request.urlopen(f"{self.url}/debug/metrics", timeout=timeout) as resp:
                text = resp.read().decode(errors="replace")
        except OSError:
            return None
        out = {}
        for line in text.splitlines():
            m = _METRIC_RE.match(line)
            if m:
                with contextlib.suppress(ValueError):
                    out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        return out

    def __repr__(self) -> str:
        return f"NetConsumer({self.zone}/{self.consumer_id} at {self.url})"


def kill_all(consumers: Iterable[NetConsumer], timeout: float = 5.0) -> None:
    """SIGKILL every running consumer (the lab's teardown would too, by namespace)."""
    for consumer in consumers:
        with contextlib.suppress(Exception):
            consumer.stop(signal.SIGKILL, timeout=timeout)


__all__ = ["NetConsumer", "kill_all"]
