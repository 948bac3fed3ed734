"""The broker's choice of etcd, and the etcd child process."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import aetcd
import pytest

from cluster.keyspace.errors import EtcdAddressError, EtcdUnavailableError
from cluster.keyspace.etcd import EtcdProcess, open_etcd, parse_address
from tests.support.harness import free_port

log = logging.getLogger("test")


def _dead(pid: int) -> bool:
    """Whether `pid` has exited (a zombie counts: nothing may reap it in a container)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_parse_address() -> None:
    assert parse_address("http://127.0.0.1:2379") == ("127.0.0.1", 2379)
    assert parse_address("localhost:1234") == ("localhost", 1234)
    assert parse_address("http://etcd") == ("etcd", 2379)
    assert parse_address("https://etcd:2379") == ("etcd", 2379)  # Dialed over TLS (--etcd.cert-file...).
    with pytest.raises(EtcdAddressError, match="only http:// and https://"):
        parse_address("unix:///etcd.sock")


async def test_process_start_stop(tmp_path: Path) -> None:
    proc = EtcdProcess(tmp_path / "data", client_port=free_port(), peer_port=free_port(), log_path=tmp_path / "log")
    proc.start()
    try:
        proc.wait_ready()
        client = aetcd.Client(host=proc.host, port=proc.client_port)
        await client.put(b"k", b"v")
        assert (await client.get(b"k")).value == b"v"
        await client.close()
    finally:
        status = proc.stop()
    # etcd re-raises SIGTERM after its graceful shutdown.
    assert status == -signal.SIGTERM
    assert not proc.running()
    assert (tmp_path / "log").stat().st_size > 0


async def test_embedded_then_existing(tmp_path: Path) -> None:
    client_port, peer_port = free_port(), free_port()
    first = await open_etcd(None, tmp_path / "a", log, client_port=client_port, peer_port=peer_port)
    try:
        assert first.choice == "embedded"
        assert first.embedded is not None and first.embedded.running()
        assert first.endpoint == f"http://127.0.0.1:{client_port}"
        assert (tmp_path / "a" / "etcd").is_dir()
        assert (tmp_path / "a" / "etcd.log").is_file()
        await first.client.put(b"shared", b"1")

        second = await open_etcd(None, tmp_path / "b", log, client_port=client_port, peer_port=peer_port)
        assert second.choice == "existing"
        assert second.embedded is None
        assert (await second.client.get(b"shared")).value == b"1"
        await second.close()
        assert first.embedded.running()
    finally:
        embedded = first.embedded
        await first.close()
    assert not embedded.running()


async def test_flag_address(etcd_endpoint: str, tmp_path: Path) -> None:
    conn = await open_etcd(etcd_endpoint, tmp_path, log)
    try:
        assert conn.choice == "flag"
        assert conn.endpoint == etcd_endpoint
        await conn.client.put(b"flag", b"1")
    finally:
        await conn.close()


async def test_flag_address_not_answering(tmp_path: Path) -> None:
    with pytest.raises(EtcdUnavailableError, match="did not answer"):
        await open_etcd(f"http://127.0.0.1:{free_port()}", tmp_path, log, timeout=0.5)


def test_embedded_dies_with_sigkilled_owner(tmp_path: Path) -> None:
    owner = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from cluster.keyspace.etcd import EtcdProcess
        proc = EtcdProcess(Path({str(tmp_path / "data")!r}), client_port={free_port()}, peer_port={free_port()})
        proc.start()
        proc.wait_ready()
        print(proc.pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", owner], stdout=subprocess.PIPE, cwd=Path(__file__).parents[3])
    try:
        assert parent.stdout is not None
        etcd_pid = int(parent.stdout.readline())
        assert not _dead(etcd_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while not _dead(etcd_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _dead(etcd_pid)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if "etcd_pid" in locals() and not _dead(etcd_pid):
            os.kill(etcd_pid, signal.SIGKILL)


async def test_port_taken_by_something_else_is_a_clear_error(tmp_path: Path) -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(EtcdUnavailableError, match=f"port {port} is in use but does not answer as etcd"):
            await open_etcd(None, tmp_path, log, client_port=port, peer_port=free_port(), timeout=1.0)
    finally:
        server.close()
        await server.wait_closed()
