"""Flags of Gazette's broker (cmd/gazette/main.go, mainboilerplate/service.go and diagnostics.go)
applied by a real `gazette serve`: Go durations (`--etcd.lease 1m30s`, also from the environment),
`--broker.allow-origin` (CORS, with a real preflight), `--debug.port` with `--debug.private`,
`--broker.file-only` and `--broker.max-grpc-recv-size`. One broker takes them all, to stay fast.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.protocol import pb, pb_grpc
from cluster.server.http.server import CORS_HEADERS
from tests.fuzz.fuzz_http import NORMAL, Exchange, Item, Wire, exchange
from tests.support.harness import (
    BrokerProcess,
    append,
    apply_specs,
    free_port,
    journal_spec,
    one_line_error,
    wait_for_primary,
)

ORIGIN = "https://reader.example"
JOURNAL = "flags/j"


class Served:
    def __init__(self, broker: BrokerProcess, debug_port: int, file_root: Path) -> None:
        self.broker, self.debug_port, self.file_root = broker, debug_port, file_root


@pytest.fixture(scope="module")
def served(etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("flags")
    root = tmp / "fragments"
    root.mkdir()
    debug_port = free_port()
    env = {"BROKER_WATCH_DELAY": "50ms", "BROKER_ALLOW_ORIGIN": ORIGIN}
    broker = BrokerProcess(
        tmp, etcd_endpoint, f"/test/{uuid.uuid4().hex}",
        "--etcd.lease", "1m30s", "--debug.port", str(debug_port), "--debug.private",
        "--broker.file-only", "--broker.file-root", str(root), "--broker.max-grpc-recv-size", "4096",
        env=env,
    )
    try:
        deadline = time.monotonic() + 30
        while not _ready(debug_port):
            assert broker.proc.poll() is None, broker.logs()
            assert time.monotonic() < deadline, broker.logs()
            time.sleep(0.1)
        yield Served(broker, debug_port, root)
    finally:
        assert broker.stop() == 0, broker.logs()


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/ready", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def journal_stub(served: Served) -> Iterator[pb_grpc.JournalStub]:
    channel, stub = served.broker.stub()
    with channel:
        spec = journal_spec(JOURNAL)
        spec.fragment.stores.append("s3://a-bucket/a/prefix/")
        assert apply_specs(stub, spec).status == pb.OK
        wait_for_primary(stub, JOURNAL)
        yield stub


def ask(port: int, method: str, target: str, *headers: str) -> Exchange:
    head = "".join(f"{h}\r\n" for h in ("Host: broker", *headers))
    ex = exchange(port, Wire([Item(f"{method} {target} HTTP/1.1\r\n{head}\r\n".encode(), NORMAL, method)]), 10.0)
    assert ex.malformed is None and len(ex.responses) == 1, ex
    return ex


async def test_durations_take_go_syntax_from_flags_and_environment(served: Served, etcd_client: Any) -> None:
    logs = served.broker.logs()
    lease = re.search(r"under lease ([0-9a-f]+)", logs)
    assert lease is not None, logs
    info = await etcd_client.get_lease_info(int(lease.group(1), 16))
    assert info.grantedTTL == 90, info
    # BROKER_WATCH_DELAY=50ms (a Go duration from the environment) was taken: the broker started.


def test_debug_routes_are_only_on_the_private_port(served: Served) -> None:
    [public] = ask(served.broker.port, "GET", "/debug/ready").responses
    assert (public.status, public.body) == (404, b"JOURNAL_NOT_FOUND\n"), "a journal path like any other"
    [ready] = ask(served.debug_port, "GET", "/debug/ready").responses
    assert (ready.status, ready.body) == (200, b"ok")
    [metrics] = ask(served.debug_port, "GET", "/debug/metrics").responses
    assert metrics.status == 200 and b"gazette_" in metrics.body
    [other] = ask(served.debug_port, "GET", f"/{JOURNAL}").responses
    assert (other.status, other.body) == (404, b"404 page not found\n")


def test_cors_preflight_and_get(served: Served, journal_stub: pb_grpc.JournalStub) -> None:
    assert append(journal_stub, JOURNAL, b"hello\n").status == pb.OK
    port = served.broker.port
    [preflight] = ask(port, "OPTIONS", f"/{JOURNAL}", f"Origin: {ORIGIN}", "Access-Control-Request-Method: GET",
                      "Access-Control-Request-Headers: authorization").responses
    assert (preflight.status, preflight.body, preflight.header(b"content-length")) == (200, b"", b"0")
    assert preflight.headers[b"access-control-allow-origin"] == [ORIGIN.encode()]
    for name, value in CORS_HEADERS:
        assert preflight.headers[name.lower().encode()] == [value.encode()]
    assert b"Authorization" in preflight.header(b"access-control-allow-headers")

    [got] = ask(port, "GET", f"/{JOURNAL}", f"Origin: {ORIGIN}").responses
    assert got.status == 206 and got.body.endswith(b"hello\n")
    assert got.headers[b"access-control-allow-origin"] == [ORIGIN.encode()]

    # Another origin: answered, without the headers that would let its page read the answer.
    [other] = ask(port, "OPTIONS", f"/{JOURNAL}", "Origin: https://elsewhere.example").responses
    assert other.status == 200 and b"access-control-allow-origin" not in other.headers
    [other_get] = ask(port, "GET", f"/{JOURNAL}", "Origin: https://elsewhere.example").responses
    assert other_get.status == 206 and b"access-control-allow-origin" not in other_get.headers


def test_file_only_keeps_fragments_under_the_file_root(served: Served, journal_stub: pb_grpc.JournalStub) -> None:
    assert append(journal_stub, JOURNAL, b"persist me\n").status == pb.OK
    deadline = time.monotonic() + 20
    while not list((served.file_root / JOURNAL).glob("*")):
        assert time.monotonic() < deadline, "no fragment persisted under the file root"
        time.sleep(0.2)
    assert not (served.file_root / "a-bucket").exists()


def test_max_grpc_recv_size_is_applied(served: Served, journal_stub: pb_grpc.JournalStub) -> None:
    assert append(journal_stub, JOURNAL, b"x" * 1024).status == pb.OK
    with pytest.raises(grpc.RpcError) as caught:
        append(journal_stub, JOURNAL, b"x" * 8192)
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--etcd.lease", "5x"], "--etcd.lease"),
        (["--broker.watch-delay", "1h2"], "--broker.watch-delay"),
        (["--broker.file-only"], "--broker.file-only"),
        (["--debug.port", "0"], "--debug.port"),
    ],
)
def test_bad_values_are_one_line_errors(args: list[str], flag: str) -> None:
    done = subprocess.run([sys.executable, "-m", "gazette", "serve", *args], capture_output=True, text=True,
                          timeout=60)
    error = one_line_error(done, flag, code=2)
    if flag in ("--etcd.lease", "--broker.watch-delay"):
        assert "give a Go duration such as 20s, 1m30s or 250ms, or seconds (20)" in error, error
