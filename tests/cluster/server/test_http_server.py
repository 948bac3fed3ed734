"""The HTTP server a consumer serves (`cluster.server.http.HttpServer`, as `ConsumerProcess` builds it),
on real loopback sockets: its routes, the debug endpoints, CORS, Go's redirects, and a 404 for any
other path: no journal routes (those are the broker's gateway's)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cluster.server.http import DebugConfig, HttpRequest, HttpResponse, HttpServer, RouteTable
from tests.broker.gateway.test_gateway_translation import assert_error, fetch
from tests.support.harness import free_port

ORIGIN = "https://app.example"


async def echo(request: HttpRequest) -> HttpResponse:
    return HttpResponse.text(f"{request.method} {request.path} {request.param('q')}")


@pytest.fixture
async def served() -> AsyncIterator[tuple[HttpServer, int, list[bool]]]:
    routes = RouteTable()
    routes.add("GET", "/api/echo", echo)
    ready = [True]
    server = HttpServer(lambda: ready[0], routes, allow_origins=[ORIGIN])
    listening = await server.serve("127.0.0.1", 0)
    try:
        yield server, listening.sockets[0].getsockname()[1], ready
    finally:
        listening.close()
        await server.close()


async def test_routes_debug_and_a_404_for_any_other_path(served: tuple[HttpServer, int, list[bool]]) -> None:
    _, port, ready = served
    routed = await fetch(port, "GET", "/api/echo?q=x")
    assert (routed.status, routed.body) == (200, b"GET /api/echo x")
    for method in ("GET", "HEAD", "PUT", "DELETE"):
        # A broker reads or appends a journal here; a consumer serves no journal.
        reply = await fetch(port, method, "/a/journal", body=b"data" if method == "PUT" else b"")
        if method == "HEAD":
            assert (reply.status, reply.body) == (404, b"")
        else:
            assert_error(reply, 404, "404 page not found")
    assert (await fetch(port, "GET", "/debug/ready")).body == b"ok"
    ready[0] = False
    assert (await fetch(port, "GET", "/debug/ready")).status == 503
    metrics = await fetch(port, "GET", "/debug/metrics")
    assert b'gazette_http_requests_total{code="404",method="PUT"}' in metrics.body
    moved = await fetch(port, "GET", "/api//echo?q=y")
    assert (moved.status, moved.headers["location"]) == (307, "/api/echo?q=y")


async def test_cors_is_answered_for_allowed_origins(served: tuple[HttpServer, int, list[bool]]) -> None:
    _, port, _ = served
    preflight = await fetch(port, "OPTIONS", "/api/echo", [("Origin", ORIGIN)])
    assert preflight.status == 200 and preflight.headers["access-control-allow-origin"] == ORIGIN
    routed = await fetch(port, "GET", "/api/echo", [("Origin", "https://elsewhere.example")])
    assert routed.status == 200 and "access-control-allow-origin" not in routed.headers


async def test_a_private_debug_port_serves_the_debug_routes_alone() -> None:
    routes = RouteTable()
    routes.add("GET", "/api/echo", echo)
    public = HttpServer(lambda: True, routes, debug=False)  # `--debug.private`: not on the public port.
    listening = await public.serve("127.0.0.1", 0)
    debug_port = free_port()
    debug = await DebugConfig(debug_port, private=True).serve("127.0.0.1", public, ready=lambda: True)
    assert debug is not None
    try:
        port = listening.sockets[0].getsockname()[1]
        assert_error(await fetch(port, "GET", "/debug/ready"), 404, "404 page not found")
        assert (await fetch(port, "GET", "/api/echo")).status == 200
        assert (await fetch(debug_port, "GET", "/debug/ready")).body == b"ok"
        assert_error(await fetch(debug_port, "GET", "/api/echo"), 404, "404 page not found")
    finally:
        debug.close()
        listening.close()
        await public.close()
