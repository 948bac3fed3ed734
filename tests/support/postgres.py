"""A real PostgreSQL server for tests: `initdb` and `postgres` in a temporary directory, on a
loopback port, run as an unprivileged user.

PostgreSQL refuses to run as root, and tests here run as root: the server then runs as the
`postgres` system user (Debian's package creates it), or else as `nobody`, through subprocess's
own `user=`/`group=` (no `runuser` or `sudo` needed). Its directory is a fresh `mkdtemp` under
the system temporary directory, owned by that user; pytest's own `tmp_path` is not used because
its parent (`/tmp/pytest-of-root`) is private to root.

The server is tuned for throwaway data (no fsync, no synchronous commit, no full-page writes),
listens on 127.0.0.1 only (no Unix socket) and trusts loopback connections. Binaries are looked
for on PATH, then in Debian's `/usr/lib/postgresql/<version>/bin` (newest first); `find_bindir()`
returns None when there are none, and the fixtures skip with that reason.

    server = PostgresServer.start()          # initdb + postgres, waits until it accepts
    dsn = server.create_database("t1")       # "host=127.0.0.1 port=… user=postgres dbname=t1"
    server.stop()                            # fast shutdown, then removes the directory
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

SUPERUSER = "postgres"
"""The cluster's superuser role, whatever OS user the server runs as."""

MISSING_REASON = (
    "PostgreSQL server binaries (initdb, postgres) are not on PATH nor in /usr/lib/postgresql/*/bin: "
    "install Debian's `postgresql` package (apt-get install -y postgresql) to run these tests"
)


def find_bindir() -> Path | None:
    """The directory holding `initdb` and `postgres`, or None when PostgreSQL is not installed."""
    initdb = shutil.which("initdb")
    if initdb is not None:
        bindir = Path(os.path.realpath(initdb)).parent
        if (bindir / "postgres").is_file():
            return bindir

    def version(path: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", Path(path).parent.name))

    for bindir_s in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        bindir = Path(bindir_s)
        if (bindir / "initdb").is_file() and (bindir / "postgres").is_file():
            return bindir
    return None


def _server_account() -> tuple[int, int] | None:
    """(uid, gid) to run the server as, or None to run it as ourselves (we are not root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return entry.pw_uid, entry.pw_gid
    raise RuntimeError("running as root, and neither a `postgres` nor a `nobody` user exists to run PostgreSQL as")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


_WATCHDOG = """
import os, shutil, signal, sys, time
pid, root = int(sys.argv[1]), sys.argv[2]
sys.stdin.buffer.read()  # EOF: the test process is gone (or stopped the server itself)
try:
    os.kill(pid, signal.SIGINT)
    for _ in range(600):
        os.kill(pid, 0)
        time.sleep(0.05)
except ProcessLookupError:
    pass
shutil.rmtree(root, ignore_errors=True)
"""
"""Stops the server and removes its directory when the test process dies without doing so."""


class PostgresServer:
    """One PostgreSQL server process and its temporary directory."""

    def __init__(self, bindir: Path, root: Path, port: int, account: tuple[int, int] | None) -> None:
        self.bindir = bindir
        self.root = root
        self.port = port
        self.account = account
        self.data = root / "data"
        self.log_path = root / "postgres.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.watchdog: subprocess.Popen[bytes] | None = None
        self.startup_seconds = 0.0

    @classmethod
    def start(cls, bindir: Path | None = None, timeout: float = 60.0) -> PostgresServer:
        """initdb a new cluster and start a server on a free loopback port; wait until it accepts."""
        began = time.monotonic()
        bindir = bindir or find_bindir()
        if bindir is None:
            raise RuntimeError(MISSING_REASON)
        account = _server_account()
        root = Path(tempfile.mkdtemp(prefix="gazette-pg-"))
        try:
            if account is not None:
                os.chown(root, *account)
            server = cls(bindir, root, 0, account)
            server._initdb()
            # A free port may be taken between the probe and the bind: try a few.
            for attempt in range(5):
                server.port = _free_port()
                try:
                    server._launch(deadline=began + timeout)
                    break
                except _PortTaken:
                    if attempt == 4:
                        raise
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        server.startup_seconds = time.monotonic() - began
        return server

    def _run_kwargs(self) -> dict[str, object]:
        kwargs: dict[str, object] = {"cwd": self.root, "env": {**os.environ, "LC_ALL": "C", "LANG": "C"}}
        if self.account is not None:
            kwargs.update(user=self.account[0], group=self.account[1], extra_groups=[])
        return kwargs

    def _initdb(self) -> None:
        cmd = [
            str(self.bindir / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "--auth=trust",
            "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions",
        ]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False,
                             **self._run_kwargs())
        if out.returncode != 0:
            raise RuntimeError(f"initdb failed ({out.returncode}):\n{out.stdout.decode(errors='replace')}")

    def _launch(self, deadline: float) -> None:
        cmd = [
            str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port),
            "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
            "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
            "-c", "max_connections=100", "-c", "shared_buffers=32MB",
        ]
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, **self._run_kwargs())
        finally:
            log.close()
        self.watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(self.proc.pid), str(self.root)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True,
        )
        while True:
            if self.proc.poll() is not None:
                text = self.log_path.read_bytes()[log_start:].decode(errors="replace")
                self.stop_watchdog()
                self.proc = None
                if "Address already in use" in text:
                    raise _PortTaken(self.port)
                raise RuntimeError(f"postgres exited at start; its log ({self.log_path}):\n{text[-4000:]}")
            try:
                with psycopg.connect(self.dsn("postgres"), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"postgres did not accept connections in time; log at {self.log_path}")
            time.sleep(0.05)

    def dsn(self, dbname: str) -> str:
        """A libpq connection string for a database of this server."""
        return f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname={dbname}"

    def create_database(self, name: str | None = None) -> str:
        """Create a database (a fresh name when none is given); return its DSN."""
        name = name or f"test_{uuid.uuid4().hex[:16]}"
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise ValueError(f"database name {name!r}: use lowercase letters, digits and underscores")
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.dsn(name)

    def stop_watchdog(self) -> None:
        watchdog, self.watchdog = self.watchdog, None
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait()
            if watchdog.stdin is not None:
                watchdog.stdin.close()

    def stop(self) -> None:
        """Fast shutdown (SIGINT: roll back, disconnect clients), then remove the directory."""
        proc, self.proc = self.proc, None
        self.stop_watchdog()
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


class _PortTaken(Exception):
    pass
