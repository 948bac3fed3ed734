"""Building APIs: an application's gRPC methods and HTTP routes on the consumer's one port, served
by real `gazette consume` processes (`tests.consumer.api_apps`), and a request for a shard that
another member serves proxied to it (AppContext.serve). The route table itself is unit-tested.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from broker.client import AppendService, JournalClient
from cluster.server.http.routes import HttpRequest, HttpResponse, RouteError, RouteTable, route_handler
from consumer.protocol import pb as cpb
from consumer.protocol import pb_grpc as cpb_grpc
from tests.consumer.api_apps import WHO_METHOD
from tests.consumer.test_consume_cli import child_env, publish, run_consume
from tests.support.apps import NDJSON, create_tables
from tests.support.cli_apps import COUNTS_DB_ENV
from tests.support.harness import ROOT, BrokerProcess, free_port, journal_spec, one_line_error, wait_http_ready
from tests.support.journals import create_journal, unique

WAIT = 30.0
Code = cpb.ReplicaStatus.Code


# -- the route table ------------------------------------------------------------------------------


async def _ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse.text(request.path)


def test_route_table_matches_exact_then_longest_prefix() -> None:
    table = RouteTable()
    assert not table
    table.add("get", "/api/x", _ok)
    table.add("GET", "/api/*", _ok)
    table.add("POST", "/api/long/*", _ok)
    assert table and sorted(table) == [("GET", "/api/*"), ("GET", "/api/x"), ("POST", "/api/long/*")]
    assert list(table.methods("/api/x") or {}) == ["GET"]
    assert list(table.methods("/api/y/z") or {}) == ["GET"]
    assert list(table.methods("/api/long/a") or {}) == ["POST"]
    assert table.methods("/api") is None and table.methods("/other") is None
    methods = table.methods("/api/x")
    assert methods is not None and route_handler(methods, "HEAD") is _ok and route_handler(methods, "PUT") is None


@pytest.mark.parametrize(
    ("method", "path", "error"),
    [
        ("GET", "api", "must begin with '/'"),
        ("GET", "/debug/ready", "/debug/ paths are the gateway's own"),
        ("GET", "/debug", "/debug/ paths are the gateway's own"),
        ("G ET", "/x", "invalid HTTP method"),
        ("", "/x", "invalid HTTP method"),
        ("CONNECT", "/x", "CONNECT cannot be routed"),
        ("GET", "/dup", "GET /dup is already routed"),
    ],
)
def test_route_table_refuses_bad_routes(method: str, path: str, error: str) -> None:
    table = RouteTable()
    table.add("GET", "/dup", _ok)
    with pytest.raises(RouteError, match=error):
        table.add(method, path, _ok)


def test_http_response_helpers() -> None:
    r = HttpResponse.json({"a": 1}, 201)
    assert (r.status, r.body, list(r.headers)) == (201, b'{"a":1}\n', [("Content-Type", "application/json")])
    req = HttpRequest("GET", "/p", {"k": ["v", "w"]}, [("x-a", "1")], b'{"b": 2}')
    assert (req.param("k"), req.param("z", "d"), req.header("X-A"), req.json()) == ("v", "d", "1", {"b": 2})


# -- real consumer processes ----------------------------------------------------------------------


class ApiConsumer:
    """`python -m consumer consume tests.consumer.api_apps:app`."""

    def __init__(self, tmp: Path, broker: BrokerProcess, etcd: str, prefix: str, db: Path, name: str) -> None:
        self.name = name
        self.port = free_port()
        self.log_path = tmp / f"api-{name}-{self.port}.log"
        args = [
            sys.executable, "-m", "consumer", "consume", "tests.consumer.api_apps:app",
            "--consumer.id", name, "--consumer.port", str(self.port), "--consumer.host", "127.0.0.1",
            "--consumer.bind", "127.0.0.1", "--broker.address", broker.url, "--etcd.address", etcd,
            "--etcd.prefix", prefix, "--etcd.lease", "5", "--log.level", "info",
        ]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=child_env(**{COUNTS_DB_ENV: str(db)}), cwd=ROOT)
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")
        self.shards = cpb_grpc.ShardStub(self.channel)
        self.who_call = self.channel.unary_unary(WHO_METHOD)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> None:
        wait_http_ready(self.name, f"http://127.0.0.1:{self.port}", self.proc, self.logs, WAIT)

    async def who(self, shard: str) -> dict[str, Any]:
        reply: bytes = await self.who_call(shard.encode(), timeout=WAIT)
        out: dict[str, Any] = json.loads(reply)
        return out

    def http(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT)

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        await self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return await asyncio.to_thread(self.proc.wait, 60.0)
        finally:
            self._log.close()


def request(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    return resp.status, dict(resp.getheaders()), resp.read()


async def test_app_grpc_and_http_routes_on_the_consumer_port_and_proxied(
    broker: BrokerProcess, etcd_endpoint: str, client: JournalClient, tmp_path: Path
) -> None:
    """Two consumer processes, two shards (one each): the application's gRPC method and HTTP route
    are answered by whichever member is asked, by the shard's primary (proxied from the other)."""
    sources = [journal_spec(unique("api/src"), content_type=NDJSON) for _ in range(2)]
    for source in sources:
        await create_journal(client, source)
    db = tmp_path / "counts.db"
    create_tables(db)
    prefix = f"/test/{uuid.uuid4().hex}"
    members = [ApiConsumer(tmp_path, broker, etcd_endpoint, prefix, db, n) for n in ("api-a", "api-b")]
    a, b = members
    try:
        await asyncio.gather(*(asyncio.to_thread(m.wait_ready) for m in members))
        shards = ["api-shard-0", "api-shard-1"]
        changes = []
        for shard, source in zip(shards, sources, strict=True):
            spec = cpb.ShardSpec(id=shard, max_txn_duration=Duration(nanos=50_000_000))
            spec.sources.add(journal=source.name)
            changes.append(cpb.ApplyRequest.Change(upsert=spec))
        assert (await a.shards.Apply(cpb.ApplyRequest(changes=changes), timeout=WAIT)).status == cpb.OK
        async with AppendService(client) as appender:
            heads = [await publish(appender, s.name, "k", "k") for s in sources]

        # Each shard PRIMARY on its own member.
        deadline = time.monotonic() + WAIT
        while True:
            listed = await a.shards.List(cpb.ListRequest(), timeout=WAIT)
            primary = {
                s.spec.id: s.route.members[s.route.primary].suffix for s in listed.shards
                if 0 <= s.route.primary < len(s.route.members) and s.status[s.route.primary].code == Code.PRIMARY
            }
            if sorted(primary) == shards and set(primary.values()) == {"api-a", "api-b"}:
                break
            assert time.monotonic() < deadline, (listed, a.logs(), b.logs())
            await asyncio.sleep(0.05)

        # gRPC: asked of either member, the primary answers (proxied when it is the other one).
        for member in members:
            for shard, source, head in zip(shards, sources, heads, strict=True):
                deadline = time.monotonic() + WAIT
                while True:
                    got = await member.who(shard)
                    if got["read_through"].get(source.name, 0) >= head or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.05)
                assert got["served_by"] == primary[shard] and got["shard"] == shard
                assert got["proxied"] == (primary[shard] != member.name)
                assert got["read_through"][source.name] >= head
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await a.who("no-such-shard")
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        assert missing.value.details() == "shard no-such-shard: SHARD_NOT_FOUND"

        # HTTP, on the same port.
        conn = b.http()
        try:
            for shard in shards:
                status, headers, body = await asyncio.to_thread(request, conn, "GET", f"/api/who?shard={shard}")
                assert status == 200 and headers["Content-Type"] == "application/json", body
                doc = json.loads(body)
                assert doc["served_by"] == primary[shard] and doc["proxied"] == (primary[shard] != "api-b")
            status, _, body = await asyncio.to_thread(request, conn, "GET", "/api/who?shard=nope")
            assert (status, body) == (404, b"shard nope: SHARD_NOT_FOUND\n")
            # Proxied over HTTP: the request (its query and headers) reaches the primary's route.
            for shard in shards:
                status, headers, body = await asyncio.to_thread(
                    request, conn, "GET", f"/api/who-http?shard={shard}", None, {"X-Test": "via b"})
                assert status == 200 and headers["Content-Type"] == "application/json", body
                assert json.loads(body) == {"served_by": primary[shard], "shard": shard,
                                            "proxied": primary[shard] != "api-b", "x-test": "via b"}
            status, _, body = await asyncio.to_thread(request, conn, "GET", "/api/who-http?shard=nope")
            assert (status, body) == (404, b"shard nope: SHARD_NOT_FOUND\n")
            status, _, body = await asyncio.to_thread(
                request, conn, "GET", f"/api/who-http?shard={shards[0]}", None, {"X-Gazette-Proxy-Header": "!!"})
            assert status == 400 and body.startswith(b"invalid X-Gazette-Proxy-Header header"), body

            status, headers, body = await asyncio.to_thread(
                request, conn, "POST", "/api/echo/x%20y/z?a=1&a=2&b=%C3%A9", b"hello", {"X-Test": "t"})
            assert status == 200 and headers["X-Echo"] == "yes"
            assert json.loads(body) == {"method": "POST", "path": "/api/echo/x y/z",
                                        "query": {"a": ["1", "2"], "b": ["é"]}, "body": "hello", "x-test": "t"}
            status, headers, body = await asyncio.to_thread(request, conn, "HEAD", "/api/echo/q")
            assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0
            status, headers, body = await asyncio.to_thread(request, conn, "PUT", "/api/echo/q", b"x")
            assert status == 405 and headers["Allow"] == "GET, HEAD, POST", body

            # A handler that raises is answered 500 with its error; the connection serves on.
            status, _, body = await asyncio.to_thread(request, conn, "GET", "/api/boom")
            assert (status, body) == (500, b"RuntimeError: boom\n")
            status, _, body = await asyncio.to_thread(request, conn, "GET", "/api/bad-status")
            assert (status, body) == (500, b"ValueError: the handler returned HTTP status 99\n")
            status, _, body = await asyncio.to_thread(request, conn, "GET", "/api/bad-header")
            assert (status, body) == (500, b"ValueError: the handler returned an invalid header name 'Bad Name'\n")
            status, _, body = await asyncio.to_thread(request, conn, "GET", "/debug/ready")
            assert (status, body) == (200, b"ok")
        finally:
            conn.close()
        assert "HTTP route GET /api/boom failed" in b.logs()
    finally:
        codes = [await m.stop() for m in members]
    assert codes == [0, 0], [m.logs() for m in members]


@pytest.mark.parametrize(
    ("app", "expected"),
    [
        ("tests.consumer.api_apps:failing_init",
         "init_application failed: RuntimeError: no configuration for this application"),
        ("tests.consumer.api_apps:sync_init", "SyncInit.init_application must be a coroutine function"),
    ],
)
def test_init_application_failure_is_one_line_error(
    etcd_endpoint: str, broker: BrokerProcess, app: str, expected: str
) -> None:
    done = run_consume("consume", app, "--etcd.address", etcd_endpoint, "--broker.address", broker.url,
                       "--consumer.bind", "127.0.0.1", "--etcd.prefix", f"/test/{uuid.uuid4().hex}",
                       "--log.level", "error")
    one_line_error(done, "starting the consumer failed", expected)
