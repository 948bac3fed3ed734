"""`gazette consume` processes as hosts of a `tests.support.netfaults.NetworkLab`: each consumer member runs
`python -m consumer consume APP` inside a network namespace of its own, bound to and advertising its
host's address, against the lab's etcd (root namespace) and a broker of the lab.

`NetConsumer` is the consumer's `NetBroker` (both are `NetProcess`es): it can be stopped, killed and
restarted as itself (same --consumer.id, zone, address and port), as a supervisor restarts a pod; `url`,
`logs()`, `log_lines()`,
`ready()`, `wait_ready()` (polling /debug/ready from the root namespace), `running()`, `exits` (the exit
statuses of earlier incarnations), `metrics()` (its /debug/metrics, parsed).
"""

from __future__ import annotations

import contextlib
import re
import signal
import sys
import urllib.request
from collections.abc import Iterable, Mapping

from tests.support.netfaults import NetHost, NetProcess, NetworkLab

_METRIC_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


class NetConsumer(NetProcess):
    """A `gazette consume APP` member on a lab host (`python -m consumer consume`, the `gazette consume`
    entry point), inside the host's namespace. `restart()` starts it again as itself."""

    env_prefixes = ("CONSUMER_", "ETCD_", "BROKER_", "LOG_")

    def __init__(
        self, lab: NetworkLab, host: NetHost, *, app: str, consumer_id: str, root: str, broker_url: str,
        zone: str = "local", lease: float = 5.0, port: int = 8080, log_level: str = "info",
        env: Mapping[str, str] | None = None, extra: Iterable[str] = (),
    ) -> None:
        super().__init__(lab, host, consumer_id, port=port, log_name="consumer.log", env=env)
        self.app, self.consumer_id, self.root = app, consumer_id, root
        self.broker_url, self.zone, self.lease, self.log_level = broker_url, zone, lease, log_level
        self.extra = tuple(extra)

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

    def log_lines(self, pattern: str = r"\b(WARNING|ERROR|CRITICAL|warning|error|critical)\b|^==== ") -> list[str]:
        return super().log_lines(pattern)

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
