"""Network faults between real `gazette serve` brokers: each broker is a host of its own Linux network
namespace, etcd and the test process stay in the root namespace, and faults are injected and healed
with link state and nftables.

What it offers:

- `netfaults_unavailable()` says why these tests cannot run here (not root, no `ip`, no `nft`, or a
  namespace that cannot be made), or None; `require_netfaults()` skips the calling test with that reason.
- `NetworkLab(tmp)`, a context manager: a Linux bridge `gzb<id>` in the root namespace holding a /24
  `10.A.B.0/24` that collides with no address or route of the machine, the root side at `.1`
  (`lab.gateway`). On exit it kills every process it started, deletes its namespaces, veths and
  bridge (whether or not the test failed), and on entry it sweeps away what labs of crashed runs left
  (their owner, recorded under /run/gazette-netfaults, is dead).
  - `add_host(name)`: a namespace `gz<id>-<name>` whose `eth0` (one end of a veth pair whose other
    end is a bridge port) has `.N/24`, `lo` up and a default route via `.1`; a `NetHost`.
  - `start_etcd()`: etcd in the root namespace listening on `.1` (`--unsafe-no-fsync`), its client
    port checked reachable from inside every host (`lab.etcd_endpoint`).
  - `add_broker(name, zone=..., lease=5.0)`: a host and a `NetBroker` on it (started, not yet ready),
    all under the lab's etcd prefix and sharing one `file://` fragment root (`lab.file_root`).
  - Faults, each a `Fault` with `heal()`: `isolate(host)` takes the host's bridge port down (full
    isolation); `cut_etcd(host)` drops the host's traffic with etcd's address and port only;
    `cut_peers(host)` drops its traffic with every other host only (etcd and the test process, both
    at `.1`, stay reachable). The cuts are nftables tables in the host's namespace hooked on input and
    output, so packets vanish silently both ways (no RST, no ICMP). `heal(host)` removes every fault
    of a host, `heal_all()` those of every host.
  - `delay(host, seconds)`: latency on the host's egress (the kernel has no netem here): its routes
    are moved from `eth0` onto a delay wire (`DelayWire`, tests/support/delay_wire.py: a forwarder process
    in the host's namespace moving Ethernet frames between a TAP device there and a TAP port of the
    bridge, holding the host's frames `seconds`); healed, the routes go back to `eth0` (the wire
    stays, idle, until the lab closes). Do not `isolate` a host while its delay is active (the
    wire's bridge port stays up); the nftables cuts do apply.
  - `routes(journals)`, `wait_routed(journals, replication)`, `broker_of(member)`: journal routes
    as the first broker that answers lists them, and the broker a route member names.
  - `can_connect(host, addr, port)`: whether a TCP connect from inside `host` succeeds.
- `NetBroker`: a `gazette serve` process (`ip netns exec NS python -m broker serve ...`) bound to
  and advertising its host's address, with its own --broker.id, zone, state dir and log file. It can
  be stopped, killed and restarted as itself (same ID, state dir, address and port), as a supervisor
  restarts a pod; `url`, `target`, `logs()`, `wait_ready()` (polling /debug/ready from the root
  namespace), `running()`, `exits` (the exit statuses of earlier incarnations).
- `connect_seconds(addr, port)`: how long a TCP connect from the test process takes (a round trip).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import random
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

import grpc
import pytest

from broker.protocol import pb, pb_grpc
from cluster.keyspace.etcd import EtcdProcess
from tests.support.harness import list_routes

ROOT = Path(__file__).resolve().parents[2]
STATE_DIR = Path("/run/gazette-netfaults")
NETNS_ETC = Path("/etc/netns")
"""`ip netns exec NS` bind-mounts the files of /etc/netns/NS/ over /etc: each host gets a resolv.conf naming no
reachable server (a name lookup fails at once instead of sending a query out of the lab) and a hosts file."""
"""Where each lab records its owner (`<id>` holding `pid starttime`), so a later run can tell leftovers."""
SKIP_REASON = "network-fault tests need root, iproute2 and nftables (apt-get install nftables)"
_ID_RE = re.compile(r"^gz[bv]?([0-9a-f]{4})(?:-|$|\d)")
"""Names this harness makes: bridges `gzb<id>`, root-side veths `gzv<id><n>`, namespaces `gz<id>-<name>`."""


class NetfaultsError(RuntimeError):
    pass


def _run(*args: str, input: str | None = None, check: bool = True, timeout: float = 30.0) -> str:
    done = subprocess.run(list(args), input=input, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise NetfaultsError(f"`{' '.join(args)}` exited with {done.returncode}: {done.stderr.strip()}")
    return done.stdout


_unavailable: list[str | None] = []


def netfaults_unavailable() -> str | None:
    """Why the network-fault tests cannot run here, or None (probed once per process)."""
    if not _unavailable:
        _unavailable.append(_probe())
    return _unavailable[0]


def _probe() -> str | None:
    if not sys.platform.startswith("linux"):
        return f"{SKIP_REASON}: not Linux"
    if os.geteuid() != 0:
        return f"{SKIP_REASON}: not running as root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"{SKIP_REASON}: no `{tool}` on PATH"
    ns = f"gzprobe-{os.getpid()}"
    try:
        _run("ip", "netns", "add", ns)
        try:
            _run("ip", "netns", "exec", ns, "nft", "add", "table", "inet", "gzprobe")
        finally:
            _run("ip", "netns", "del", ns, check=False)
    except (NetfaultsError, OSError, subprocess.TimeoutExpired) as exc:
        return f"{SKIP_REASON}: {exc}"
    return None


def require_netfaults() -> None:
    """Skip the calling test unless network namespaces and nftables work here."""
    reason = netfaults_unavailable()
    if reason is not None:
        pytest.skip(reason)


def _start_time(pid: int) -> str:
    """The kernel's start time of `pid` (tells a live owner from a reused PID), or '' if it is gone (or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[1].split()
    return "" if fields[0] in ("Z", "X") else fields[19]


def _links() -> list[str]:
    names = []
    for line in _run("ip", "-o", "link", "show").splitlines():
        parts = line.split(": ", 2)
        if len(parts) >= 2:
            names.append(parts[1].split("@", 1)[0])
    return names


def _netns() -> list[str]:
    return [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line.strip()]


def _kill_netns_processes(ns: str) -> None:
    pids = [int(p) for p in _run("ip", "netns", "pids", ns, check=False).split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _start_time(p)]
        time.sleep(0.02)


def _teardown(lab_id: str) -> list[str]:
    """Delete every namespace, veth and bridge of lab `lab_id` (killing the processes in its namespaces
    first); what could not be deleted."""
    problems = []
    namespaces = [ns for ns in _netns() if ns.startswith(f"gz{lab_id}-")]
    for ns in namespaces:
        _kill_netns_processes(ns)
    for link in _links():
        if link.startswith((f"gzv{lab_id}", f"gzb{lab_id}")):
            try:
                _run("ip", "link", "del", link)
            except NetfaultsError as exc:
                if link in _links():  # A veth goes with its peer: gone already is fine.
                    problems.append(str(exc))
    for ns in namespaces:
        try:
            _run("ip", "netns", "del", ns)
        except (NetfaultsError, subprocess.TimeoutExpired) as exc:
            problems.append(str(exc))
    if NETNS_ETC.is_dir():
        for etc in NETNS_ETC.glob(f"gz{lab_id}-*"):
            shutil.rmtree(etc, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        (STATE_DIR / lab_id).unlink()
    return problems


def _owner_alive(lab_id: str) -> bool:
    try:
        pid, start = (STATE_DIR / lab_id).read_text().split()
    except (OSError, ValueError):
        return False
    return _start_time(int(pid)) == start


def sweep_leftovers() -> list[str]:
    """Tear down the labs of earlier runs whose owner process is dead; their IDs."""
    ids: set[str] = set()
    if STATE_DIR.is_dir():
        ids.update(p.name for p in STATE_DIR.iterdir() if re.fullmatch(r"[0-9a-f]{4}", p.name))
    etc = [p.name for p in NETNS_ETC.iterdir()] if NETNS_ETC.is_dir() else []
    for name in [*_links(), *_netns(), *etc]:
        m = _ID_RE.match(name)
        if m:
            ids.add(m.group(1))
    for ns in _netns():  # A probe (netfaults_unavailable) of a process that died before deleting it.
        m = re.fullmatch(r"gzprobe-(\d+)", ns)
        if m and not _start_time(int(m.group(1))):
            _run("ip", "netns", "del", ns, check=False)
    swept = []
    for lab_id in sorted(ids):
        if not _owner_alive(lab_id):
            _teardown(lab_id)
            swept.append(lab_id)
    return swept


def _taken_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network of an address or a route (any table) of the root namespace, but the default route."""
    nets = []
    for line in _run("ip", "-4", "-o", "addr", "show").splitlines():
        m = re.search(r"\binet (\S+)", line)
        if m:
            nets.append(ipaddress.IPv4Interface(m.group(1)).network)
    kinds = {"unicast", "local", "broadcast", "multicast", "unreachable", "blackhole", "prohibit", "throw", "nat"}
    for line in _run("ip", "-4", "route", "show", "table", "all").splitlines():
        words = line.split()
        if words and words[0] in kinds:
            words = words[1:]
        if words and words[0] != "default":
            with contextlib.suppress(ValueError):
                nets.append(ipaddress.IPv4Network(words[0], strict=False))
    return nets


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class NetHost:
    """One network namespace of a lab: its name, address and the root-side end of its veth."""

    def __init__(self, lab: NetworkLab, name: str, index: int) -> None:
        self.lab = lab
        self.name = name
        self.netns = f"gz{lab.id}-{name}"
        self.veth = f"gzv{lab.id}{index}"
        self.addr = str(lab.network.network_address + index)

    def exec_args(self, *cmd: str) -> list[str]:
        """`cmd` run inside the namespace."""
        return ["ip", "netns", "exec", self.netns, *cmd]

    def run(self, *cmd: str, input: str | None = None, check: bool = True) -> str:
        return _run(*self.exec_args(*cmd), input=input, check=check)

    def __repr__(self) -> str:
        return f"NetHost({self.name} {self.addr} in {self.netns})"


class Fault:
    """One injected fault of a host; `heal()` undoes it (again: a no-op)."""

    def __init__(self, lab: NetworkLab, host: NetHost, kind: str, undo: list[str]) -> None:
        self.lab, self.host, self.kind, self._undo = lab, host, kind, undo
        self.started = time.monotonic()
        self.healed: float | None = None

    @property
    def active(self) -> bool:
        return self.healed is None

    def heal(self) -> None:
        if self.healed is not None:
            return
        _run(*self._undo)
        self.healed = time.monotonic()
        self.lab._faults.remove(self)

    def __repr__(self) -> str:
        return f"Fault({self.kind} of {self.host.name})"


class DelayWire:
    """A host's delay wire (tests/support/delay_wire.py): a forwarder process in the host's namespace moving Ethernet
    frames between a TAP device there (`wire0`, eth0's MAC address) and a TAP port of the lab's bridge
    (`gzv<id>t<n>`), holding the frames the host sends for `delay` seconds. The host's traffic takes it
    while its routes name `wire0` (`route_via_wire`), else `eth0` (`route_via_eth0`); frames to the host
    may arrive either way (the bridge learns its MAC address on whichever port sent last). Both TAPs are
    gone with the forwarder (`stop`, or the lab's teardown killing what runs in the namespace)."""

    HOST_TAP = "wire0"
    TUNSETIFF = 0x400454CA
    IFF_TAP, IFF_NO_PI = 0x0002, 0x1000

    def __init__(self, lab: NetworkLab, host: NetHost) -> None:
        self.lab, self.host = lab, host
        self.bridge_tap = f"{host.veth[:7]}t{host.veth[7:]}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = lab.tmp / f"delay-wire-{host.name}.log"
        self.via_wire = False

    def start(self, timeout: float = 10.0) -> DelayWire:
        fd = os.open("/dev/net/tun", os.O_RDWR)
        try:
            fcntl.ioctl(fd, self.TUNSETIFF, struct.pack("16sH22x", self.bridge_tap.encode(),
                                                        self.IFF_TAP | self.IFF_NO_PI))
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    self.host.exec_args(sys.executable, "-S", str(Path(__file__).with_name("delay_wire.py")), str(fd),
                                        self.HOST_TAP),
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, pass_fds=(fd,), cwd=ROOT,
                    start_new_session=True,
                )
        finally:
            os.close(fd)  # The forwarder holds it now: the bridge's TAP lives as long as the forwarder.
        ready = self._line(timeout)
        if ready != "ready":
            self.stop()
            raise NetfaultsError(f"the delay wire of {self.host} did not start ({ready!r}): {self._log()}")
        mac = self.host.run("cat", "/sys/class/net/eth0/address").strip()
        _run("ip", "link", "set", self.bridge_tap, "master", self.lab.bridge, "up")
        self.host.run("ip", "link", "set", self.HOST_TAP, "address", mac, "up")
        # Packets to the host may come in on eth0 while its routes name wire0: no reverse-path filter.
        self.host.run("sysctl", "-q", "-w", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.eth0.rp_filter=0",
                      f"net.ipv4.conf.{self.HOST_TAP}.rp_filter=0", f"net.ipv6.conf.{self.HOST_TAP}.disable_ipv6=1")
        return self

    def _log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except FileNotFoundError:
            return ""

    def _line(self, timeout: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        readable, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline().decode().strip() if readable else "(no answer)"

    def command(self, line: str, timeout: float = 5.0) -> str:
        """Send the forwarder a command (`delay SECONDS`, `stats`); its answer."""
        if self.proc is None or self.proc.poll() is not None or self.proc.stdin is None:
            raise NetfaultsError(f"the delay wire of {self.host} is not running: {self._log()}")
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        return self._line(timeout)

    def set_delay(self, seconds: float) -> None:
        answer = self.command(f"delay {seconds:.6f}")
        if answer != "ok":
            raise NetfaultsError(f"the delay wire of {self.host} answered {answer!r}")

    def stats(self) -> dict[str, float]:
        """The forwarder's counts: egress and ingress frames, held, late_max (seconds), dropped."""
        words = self.command("stats").split()
        if words[:1] != ["stats"]:
            raise NetfaultsError(f"the delay wire of {self.host} answered {' '.join(words)!r}")
        return {k: float(v) for k, v in (w.split("=", 1) for w in words[1:])}

    def _routes(self, dev: str) -> None:
        net = self.lab.network
        self.host.run("ip", "route", "replace", str(net), "dev", dev, "proto", "kernel", "scope", "link",
                      "src", self.host.addr)
        self.host.run("ip", "route", "replace", "default", "via", self.lab.gateway, "dev", dev)

    def route_via_wire(self) -> None:
        self._routes(self.HOST_TAP)
        self.via_wire = True

    def route_via_eth0(self) -> None:
        self._routes("eth0")
        self.via_wire = False

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        """End the forwarder (it sends what it holds first); its TAPs go with it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if proc.stdin is not None:
                proc.stdin.close()
        _wait_or_kill_group(proc, timeout)
        if proc.stdout is not None:
            proc.stdout.close()

    def __repr__(self) -> str:
        return f"DelayWire({self.host.name}: {self.bridge_tap} <-> {self.HOST_TAP})"


class DelayFault(Fault):
    """Latency on a host's egress: its routes take its delay wire; healing puts them back on eth0."""

    def __init__(self, lab: NetworkLab, host: NetHost, wire: DelayWire, seconds: float) -> None:
        super().__init__(lab, host, "delay", [])
        self.wire, self.seconds = wire, seconds

    def heal(self) -> None:
        if self.healed is not None:
            return
        self.wire.route_via_eth0()
        self.wire.set_delay(0.0)  # What it holds still goes out in its time.
        self.healed = time.monotonic()
        self.lab._faults.remove(self)


def _wait_or_kill_group(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait for `proc` to exit; after `timeout`, SIGKILL its process group and reap it."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def connect_seconds(addr: str, port: int, timeout: float = 5.0) -> float:
    """How long a TCP connect from the test process to `addr:port` takes: one round trip (SYN, SYN-ACK)."""
    start = time.monotonic()
    with socket.create_connection((addr, port), timeout):
        return time.monotonic() - start


class NetProcess(ABC):
    """A process of the project's on a lab host (`python -m MODULE ...` inside the host's namespace),
    its log appended to by every incarnation: `start()`, and `restart()` it again as itself, `stop()`,
    `kill()`, `ready()` (its /debug/ready, from the root namespace). Subclasses give its `command()`."""

    name: str
    """Its ID (--broker.id, --consumer.id)."""
    env_prefixes: tuple[str, ...] = ("ETCD_", "BROKER_", "LOG_")
    """Environment variables it must not inherit (its flags' own)."""

    def __init__(self, lab: NetworkLab, host: NetHost, name: str, *, port: int, log_name: str,
                 env: Mapping[str, str] | None = None) -> None:
        self.lab, self.host, self.name, self.port = lab, host, name, port
        self.env = dict(env or {})
        self.log_path = lab.tmp / name / log_name
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

    @abstractmethod
    def command(self) -> list[str]:
        """Its command line, inside the host's namespace."""

    def start(self) -> Self:
        if self.running():
            raise NetfaultsError(f"{self.name} is running")
        self._reap()
        env = {k: v for k, v in os.environ.items() if not k.startswith(self.env_prefixes)}
        env.update(self.env)
        env["PYTHONPATH"] = str(ROOT)
        self.incarnation += 1
        with open(self.log_path, "ab") as log:
            log.write(f"==== netfaults: incarnation {self.incarnation} of {self.name} ====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                cwd=ROOT, start_new_session=True,
            )
        self.started_at = time.monotonic()
        return self

    def restart(self) -> Self:
        """Start it again as itself (same ID, state, address and port); it must have exited."""
        return self.start()

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
        """Signal it and wait for it to exit (SIGKILL after `timeout`); its exit status."""
        if self.proc is None:
            return None
        proc = self.proc
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            _wait_or_kill_group(proc, timeout)
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

    def log_lines(self, pattern: str = r"^\S+ (warning|error|critical)\b|^==== netfaults") -> list[str]:
        return [line for line in self.logs().splitlines() if re.search(pattern, line)]

    def ready(self, timeout: float = 1.0) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/debug/ready", timeout=timeout) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def wait_ready(self, timeout: float = 30.0) -> Self:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise NetfaultsError(f"{self.name} exited with {self.returncode}:\n{self.logs()[-6000:]}")
            if self.ready():
                return self
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready after {timeout}s:\n{self.logs()[-6000:]}")


class NetBroker(NetProcess):
    """A `gazette serve` broker on a lab host: `python -m broker serve` inside the host's namespace,
    bound to and advertising the host's address. `restart()` starts it again as itself."""

    def __init__(
        self, lab: NetworkLab, host: NetHost, *, broker_id: str, zone: str, lease: float = 5.0, port: int = 8080,
        log_level: str = "debug", extra: Iterable[str] = (),
    ) -> None:
        super().__init__(lab, host, broker_id, port=port, log_name="broker.log")
        self.broker_id, self.zone, self.lease = broker_id, zone, lease
        self.log_level = log_level
        self.extra = tuple(extra)
        self.state_dir = lab.tmp / broker_id / "state"
        self.state_dir.mkdir(parents=True, exist_ok=True)

    @property
    def target(self) -> str:
        return f"{self.addr}:{self.port}"

    @property
    def member(self) -> tuple[str, str]:
        """(zone, suffix), as route members name it."""
        return self.zone, self.broker_id

    def command(self) -> list[str]:
        assert self.lab.etcd is not None, "start the lab's etcd first"
        return self.host.exec_args(
            sys.executable, "-m", "broker", "serve",
            "--broker.host", self.addr, "--broker.bind", self.addr, "--broker.port", str(self.port),
            "--broker.id", self.broker_id, "--broker.zone", self.zone,
            "--broker.state-dir", str(self.state_dir), "--broker.file-root", str(self.lab.file_root),
            "--etcd.address", self.lab.etcd_endpoint, "--etcd.prefix", self.lab.prefix,
            "--etcd.lease", str(self.lease), "--log.level", self.log_level, "--broker.processes", "1",
            *self.extra,
        )

    def stub(self) -> tuple[grpc.Channel, pb_grpc.JournalStub]:
        channel = grpc.insecure_channel(self.target)
        return channel, pb_grpc.JournalStub(channel)

    def __repr__(self) -> str:
        return f"NetBroker({self.zone}/{self.broker_id} at {self.url})"


class NetworkLab:
    """A bridge, hosts in network namespaces, etcd, brokers and faults; all torn down on exit."""

    def __init__(self, tmp: Path, *, prefix: str | None = None) -> None:
        self.tmp = tmp
        self.id = ""
        self.network = ipaddress.IPv4Network("10.0.0.0/24")
        self.hosts: dict[str, NetHost] = {}
        self.brokers: list[NetBroker] = []
        self.etcd: EtcdProcess | None = None
        self.file_root = tmp / "fragments"
        self._prefix = prefix
        self._faults: list[Fault] = []
        self._tables = 0
        self.wires: dict[str, DelayWire] = {}
        """Delay wires by host name, made by the first `delay` of a host."""
        self._entered = False

    @property
    def bridge(self) -> str:
        return f"gzb{self.id}"

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge: etcd's and the test process's."""
        return str(self.network.network_address + 1)

    @property
    def prefix(self) -> str:
        return self._prefix or f"/netfaults/{self.id}"

    @property
    def etcd_endpoint(self) -> str:
        assert self.etcd is not None, "start the lab's etcd first"
        return self.etcd.endpoint

    # Setting up and tearing down.

    def __enter__(self) -> NetworkLab:
        reason = netfaults_unavailable()
        if reason is not None:
            raise NetfaultsError(reason)
        sweep_leftovers()
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        rng = random.SystemRandom()
        for _ in range(100):
            lab_id = f"{rng.randrange(1 << 16):04x}"
            try:
                with open(STATE_DIR / lab_id, "x") as f:
                    f.write(f"{os.getpid()} {_start_time(os.getpid())}\n")
            except FileExistsError:
                continue
            if any(n.startswith((f"gzb{lab_id}", f"gzv{lab_id}", f"gz{lab_id}-")) for n in [*_links(), *_netns()]):
                (STATE_DIR / lab_id).unlink()
                continue
            self.id = lab_id
            break
        else:
            raise NetfaultsError("no free lab ID")
        self._entered = True
        try:
            self.network = self._pick_network(rng)
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
            self.file_root.mkdir(parents=True, exist_ok=True)
        except BaseException:
            self.close()
            raise
        return self

    def _pick_network(self, rng: random.SystemRandom) -> ipaddress.IPv4Network:
        taken = _taken_networks()
        for _ in range(1000):
            net = ipaddress.IPv4Network(f"10.{rng.randrange(100, 250)}.{rng.randrange(256)}.0/24")
            if not any(net.overlaps(t) for t in taken if t.prefixlen > 0):
                return net
        raise NetfaultsError("no free 10.x.y.0/24")

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Kill every process the lab started, stop etcd and delete the namespaces, veths and bridge."""
        if not self._entered:
            return
        self._entered = False
        for broker in self.brokers:
            with contextlib.suppress(Exception):
                broker.stop(signal.SIGKILL, timeout=5.0)
        if self.etcd is not None:
            with contextlib.suppress(Exception):
                self.etcd.stop()
        for wire in self.wires.values():
            with contextlib.suppress(Exception):
                wire.stop(timeout=2.0)
        problems = _teardown(self.id)
        if problems:
            raise NetfaultsError("could not tear the lab down: " + "; ".join(problems))

    # Hosts, etcd and brokers.

    def add_host(self, name: str) -> NetHost:
        if name in self.hosts or not re.fullmatch(r"[a-z0-9-]{1,40}", name):
            raise NetfaultsError(f"bad or duplicate host name {name!r}")
        index = len(self.hosts) + 2
        if index > 250:
            raise NetfaultsError("too many hosts")
        host = NetHost(self, name, index)
        self.hosts[name] = host
        etc = NETNS_ETC / host.netns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "resolv.conf").write_text("# gazette netfaults: no name server\nnameserver 127.0.0.1\n")
        (etc / "hosts").write_text(
            f"127.0.0.1 localhost {socket.gethostname()}\n::1 localhost\n"
            + "".join(f"{h.addr} {h.name}\n" for h in self.hosts.values())
        )
        _run("ip", "netns", "add", host.netns)
        _run("ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        _run("ip", "link", "set", host.veth, "master", self.bridge, "up")
        host.run("ip", "addr", "add", f"{host.addr}/24", "dev", "eth0")
        host.run("ip", "link", "set", "eth0", "up")
        host.run("ip", "link", "set", "lo", "up")
        host.run("ip", "route", "add", "default", "via", self.gateway)
        if self.etcd is not None:
            self._check_etcd_reachable(host)
        return host

    def start_etcd(self, timeout: float = 30.0) -> str:
        """etcd in the root namespace on the bridge address; its client URL."""
        data = self.tmp / "etcd"
        self.etcd = EtcdProcess(
            data / "data", host=self.gateway, client_port=_free_port(self.gateway),
            peer_port=_free_port(self.gateway), log_path=data / "etcd.log", extra_args=["--unsafe-no-fsync"],
        )
        self.etcd.start()
        self.etcd.wait_ready(timeout)
        for host in self.hosts.values():
            self._check_etcd_reachable(host)
        return self.etcd.endpoint

    def _check_etcd_reachable(self, host: NetHost) -> None:
        assert self.etcd is not None
        deadline = time.monotonic() + 5.0
        while not self.can_connect(host, self.gateway, self.etcd.client_port):
            if time.monotonic() > deadline:
                raise NetfaultsError(f"etcd at {self.etcd.endpoint} is not reachable from inside {host}")
            time.sleep(0.2)

    def can_connect(self, host: NetHost, addr: str, port: int, timeout: float = 2.0) -> bool:
        """Whether a TCP connection from inside `host` to `addr:port` is accepted within `timeout`."""
        code = "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), float(sys.argv[3]))"
        done = subprocess.run(
            host.exec_args(sys.executable, "-S", "-c", code, addr, str(port), str(timeout)),
            capture_output=True, timeout=timeout + 10,
        )
        return done.returncode == 0

    def add_broker(
        self, name: str, *, zone: str, lease: float = 5.0, broker_id: str | None = None, port: int = 8080,
        extra: Iterable[str] = (),
    ) -> NetBroker:
        """A new host `name` and a broker on it (started; call `wait_ready`)."""
        host = self.add_host(name)
        broker = NetBroker(self, host, broker_id=broker_id or name, zone=zone, lease=lease, port=port, extra=extra)
        self.brokers.append(broker)
        return broker.start()

    def broker(self, name: str) -> NetBroker:
        return next(b for b in self.brokers if b.broker_id == name or b.host.name == name)

    def broker_of(self, member: pb.ProcessSpec.ID | tuple[str, str]) -> NetBroker | None:
        """The broker a route member (or (zone, suffix)) names."""
        key = member if isinstance(member, tuple) else (member.zone, member.suffix)
        return next((b for b in self.brokers if b.member == key), None)

    # Faults.

    def _host(self, host: NetHost | NetBroker | str) -> NetHost:
        if isinstance(host, NetBroker):
            return host.host
        if isinstance(host, str):
            return self.hosts[host]
        return host

    def faults(self, host: NetHost | NetBroker | str | None = None) -> list[Fault]:
        """The active faults (of `host`)."""
        return [f for f in self._faults if host is None or f.host is self._host(host)]

    def isolate(self, host: NetHost | NetBroker | str) -> Fault:
        """Take the host's bridge port down: nothing reaches it or leaves it."""
        h = self._host(host)
        if any(f.kind == "isolate" for f in self.faults(h)):
            raise NetfaultsError(f"{h} is isolated already")
        _run("ip", "link", "set", h.veth, "down")
        return self._add(Fault(self, h, "isolate", ["ip", "link", "set", h.veth, "up"]))

    def cut_etcd(self, host: NetHost | NetBroker | str) -> Fault:
        """Drop the host's traffic with etcd's client port only."""
        assert self.etcd is not None, "start the lab's etcd first"
        addr, port = self.gateway, self.etcd.client_port
        out_rule, in_rule = f"ip daddr {addr} tcp dport {port} drop", f"ip saddr {addr} tcp sport {port} drop"
        return self._drop(host, "etcd", out_rule, in_rule)

    def cut_peers(self, host: NetHost | NetBroker | str) -> Fault:
        """Drop the host's traffic with every other host of the lab (not with `.1`: etcd, the tests)."""
        h = self._host(host)
        others = ", ".join(o.addr for o in self.hosts.values() if o is not h)
        if not others:
            raise NetfaultsError("no other hosts")
        return self._drop(h, "peers", f"ip daddr {{ {others} }} drop", f"ip saddr {{ {others} }} drop")

    def cut(self, host: NetHost | NetBroker | str, *addrs: str) -> Fault:
        """Drop the host's traffic with `addrs` (hosts' or any other addresses)."""
        listed = ", ".join(addrs)
        return self._drop(host, "addrs", f"ip daddr {{ {listed} }} drop", f"ip saddr {{ {listed} }} drop")

    def delay(self, host: NetHost | NetBroker | str, seconds: float) -> DelayFault:
        """Hold every frame the host sends for `seconds` (its egress latency; what it receives is not delayed)
        until healed: its routes take its delay wire (made and started at the first delay of the host)."""
        h = self._host(host)
        if any(f.kind in ("delay", "isolate") for f in self.faults(h)):
            raise NetfaultsError(f"{h} is delayed or isolated already")
        wire = self.wires.get(h.name)
        if wire is None or not wire.running():
            wire = self.wires[h.name] = DelayWire(self, h).start()
        wire.set_delay(seconds)
        wire.route_via_wire()
        fault = DelayFault(self, h, wire, seconds)
        self._add(fault)
        return fault

    def _drop(self, host: NetHost | NetBroker | str, kind: str, out_rule: str, in_rule: str) -> Fault:
        h = self._host(host)
        self._tables += 1
        table = f"gzfault_{kind}_{self._tables}"
        ruleset = (
            f"table inet {table} {{\n"
            f"  chain out {{ type filter hook output priority 0; policy accept; {out_rule}; }}\n"
            f"  chain in {{ type filter hook input priority 0; policy accept; {in_rule}; }}\n"
            "}\n"
        )
        h.run("nft", "-f", "-", input=ruleset)
        return self._add(Fault(self, h, kind, h.exec_args("nft", "delete", "table", "inet", table)))

    def _add(self, fault: Fault) -> Fault:
        self._faults.append(fault)
        return fault

    def heal(self, host: NetHost | NetBroker | str) -> None:
        """Remove every fault of the host."""
        for fault in self.faults(host):
            fault.heal()

    def heal_all(self) -> None:
        for fault in list(self._faults):
            fault.heal()

    # Routes.

    def routes(self, journals: list[str], timeout: float = 2.0) -> dict[str, pb.Route]:
        """The routes of `journals` as the first running broker that answers List lists them (brokers
        of faulted hosts last)."""
        faulted = {f.host.name for f in self._faults}
        running = [b for b in sorted(self.brokers, key=lambda b: b.host.name in faulted) if b.running()]
        return list_routes([b.stub for b in running], journals, timeout)

    def primary_of(self, journal: str) -> NetBroker | None:
        route = self.routes([journal]).get(journal)
        if route is None or route.primary < 0:
            return None
        return self.broker_of(route.members[route.primary])

    def wait_routed(self, journals: list[str], replication: int | dict[str, int], timeout: float = 30.0) -> None:
        """Wait until every journal has a primary and its replication of members, all of them running brokers."""
        want = replication if isinstance(replication, dict) else dict.fromkeys(journals, replication)
        deadline = time.monotonic() + timeout
        routes: dict[str, pb.Route] = {}
        while time.monotonic() < deadline:
            running = {b.member for b in self.brokers if b.running()}
            routes = self.routes(journals)
            if len(routes) == len(journals) and all(
                r.primary >= 0 and len(r.members) == want[name] and {(m.zone, m.suffix) for m in r.members} <= running
                for name, r in routes.items()
            ):
                return
            time.sleep(0.1)
        shown = {name: [f"{m.zone}/{m.suffix}" for m in r.members] + [r.primary] for name, r in routes.items()}
        raise TimeoutError(f"journals not routed to running brokers after {timeout}s: {shown}")
