"""`gazette serve --broker.processes N`: N broker processes on one host, each a cluster member.

A broker serves from one asyncio event loop, so one process uses one core; N processes use N.
With N > 1 `gazette serve` is a supervisor (`cluster.server.supervisor`): it chooses etcd once for
the host (the one of `--etcd.address`, one answering at localhost, or one it embeds and stops last),
then runs N children, each `python -m broker serve --broker.processes 1`: member `<id>-<i>`, port
`<port>+i` (with port 0, a free port of its own), state directory `<state-dir>/broker-<i>`, debug
port `<debug.port>+i`, and that etcd; every other flag as given, passed in its environment
variable (so that no key or path shows in `ps` that was not there already). Each logs to the
supervisor's stderr with the field `member=<id>-<i>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import broker
from broker.server import BrokerConfig
from cluster.keyspace.etcd import EtcdConnection, open_etcd
from cluster.server.process import etcd_credentials, start_unless_stopped
from cluster.server.supervisor import Child, Supervisor

log = logging.getLogger(__name__)

AUTO = "auto"
"""`--broker.processes auto`: one process per usable core."""

OVERRIDDEN = frozenset({"processes", "broker_id", "host", "port", "state_dir", "debug_port", "etcd_address",
                        "log_member"})
"""Parameters of `serve` that each child is given on its command line rather than as the supervisor's."""


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, which a container's cpuset narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # Not Linux.
        return os.cpu_count() or 1


def parse_processes(value: str) -> int:
    """`--broker.processes`: `auto` (the usable cores) or a whole number, 1 or more; ValueError else."""
    text = value.strip().lower()
    if text == AUTO:
        return usable_cores()
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{value!r} is not a number of processes: give auto (one per core) or a whole number, "
                         "1 or more")
    return count


@dataclass(frozen=True)
class Member:
    """One child broker of a host: its index, ID suffix, ports and state directory."""

    index: int
    broker_id: str
    port: int
    debug_port: int | None
    state_dir: Path

    @property
    def name(self) -> str:
        port = f", port {self.port}" if self.port else ""
        return f"broker process {self.index} (member {self.broker_id}{port})"


def plan_members(count: int, broker_id: str, port: int, debug_port: int | None, state_dir: Path) -> list[Member]:
    """The `count` members of a host whose flags say `broker_id`, `port`, `debug_port` and `state_dir`."""
    return [
        Member(i, f"{broker_id}-{i}", port + i if port else 0, None if debug_port is None else debug_port + i,
               state_dir / f"broker-{i}")
        for i in range(count)
    ]


def env_value(value: object) -> str | None:
    """A flag's value as its environment variable gives it (None: leave the variable unset)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, list | tuple):
        return " ".join(str(v) for v in value) if value else None  # click splits a list's variable on spaces.
    return str(value)


def flag_environment(flags: Iterable[tuple[str, object]]) -> dict[str, str | None]:
    """Environment variables that give a child each (variable, value) of the supervisor's flags."""
    return {envvar: env_value(value) for envvar, value in flags}


def child(member: Member, host: str, etcd_address: str, flags_env: Mapping[str, str | None]) -> Child:
    """The child process of `member`: this interpreter running this `broker` package, not whatever
    a `broker` directory in the working directory holds (`-P`, and the package's root first on
    PYTHONPATH)."""
    argv = [
        sys.executable, "-P", "-m", "broker", "serve", "--broker.processes", "1",
        "--broker.id", member.broker_id, "--broker.host", host, "--broker.port", str(member.port),
        "--broker.state-dir", str(member.state_dir), "--etcd.address", etcd_address,
        "--log.member", member.broker_id,
    ]
    if member.debug_port is not None:
        argv += ["--debug.port", str(member.debug_port)]
    env = dict(os.environ)
    for key, value in flags_env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    root = str(Path(broker.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return Child(member.name, f"stderr lines with member={member.broker_id}", tuple(argv), env)


async def serve_processes(config: BrokerConfig, members: list[Member], flags_env: Mapping[str, str | None]) -> None:
    """Supervise `members` until SIGTERM or SIGINT (passed on once; a second is passed on again, so
    that they exit without waiting on persists), or until one exits (ChildExitedError)."""
    stop = asyncio.Event()
    running: list[Supervisor] = []  # Signals before the children start only set `stop`.

    def on_stop() -> None:
        if stop.is_set():
            log.warning("second signal: passing it on (the brokers exit without waiting for fragments to persist)")
            for supervisor in running:
                supervisor.signal(signal.SIGTERM)
        stop.set()

    def dump_tasks() -> None:
        for supervisor in running:
            supervisor.signal(signal.SIGUSR1)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_stop)
    loop.add_signal_handler(signal.SIGUSR1, dump_tasks)  # Each child logs its tasks.

    chosen: list[EtcdConnection] = []

    async def choose_etcd() -> None:
        chosen.append(await open_etcd(
            config.etcd_address, config.state_dir, log, client_port=config.etcd_port,
            peer_port=config.etcd_peer_port, credentials=etcd_credentials(config.etcd_address, config.etcd_tls),
        ))

    if not await start_unless_stopped(choose_etcd(), stop):
        if chosen:
            await chosen[0].close()
        return
    [etcd] = chosen
    with contextlib.suppress(Exception):  # The children dial etcd themselves.
        await etcd.client.close()
    supervisor = Supervisor([child(m, config.host, etcd.endpoint, flags_env) for m in members])
    running.append(supervisor)
    log.info("serving as %d broker processes", len(members),
             extra={"members": ",".join(m.broker_id for m in members), "etcd": etcd.endpoint})
    try:
        await supervisor.run(stop)
    finally:
        if etcd.embedded is not None:  # Last: the children release their member keys through it.
            await etcd.embedded.stop_async()
