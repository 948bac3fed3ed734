"""`HttpServer`: takes over the listener's HTTP/1.1 connections and routes their requests.

What Go's net/http and Gazette's boilerplate give the broker and the consumer alike: a request
target that does not parse is a 400, a path that is not clean a 307 to the clean one, `CONNECT` a
400; `/debug/ready` and `/debug/metrics` are answered here (Gazette's `mainboilerplate/diagnostics.go`),
CORS headers go to the requests of allowed origins (`CORSWrapper`, `mainboilerplate/service.go`),
and the routes of a `RouteTable` (`cluster.server.http.routes`) are served. Any other request goes
to `serve_unrouted`, a 404 here as Go's ServeMux answers: the broker's gateway
(`broker.gateway.HttpGateway`) serves journal reads and appends there.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cluster.server.http.codec import Request
from cluster.server.http.connection import TEXT_HEADERS, Connection
from cluster.server.http.request import BadRequest, BadTarget, clean_redirect, parse_query, redirect_body, split_target
from cluster.server.http.routes import HttpHandler, HttpRequest, HttpResponse, RouteTable, route_handler

log = logging.getLogger(__name__)

_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")

CORS_HEADERS = (
    ("Access-Control-Allow-Methods", "GET, POST, OPTIONS"),
    (
        "Access-Control-Allow-Headers",
        "Cache-Control, Content-Language, Content-Length, Content-Type, Expires, Last-Modified, Pragma, Authorization",
    ),
)
"""What Gazette's `CORSWrapper` (mainboilerplate/service.go) adds, with `Access-Control-Allow-Origin`,
to the responses of a request from an allowed origin."""


@dataclass(frozen=True)
class DebugConfig:
    """Where `/debug/ready` and `/debug/metrics` are served: Gazette's `--debug.port` and
    `--debug.private` (mainboilerplate/diagnostics.go, applied in cmd/gazette/main.go)."""

    port: int | None = None
    """A port of their own (all of the process's HTTP routes too, unless `private`)."""
    private: bool = False
    """Not on the public port: there, `/debug/...` are paths like any other."""

    async def serve(self, host: str, server: HttpServer, ready: Callable[[], bool]) -> asyncio.Server | None:
        """Serve the debug port, if there is one, beside the public port's `server`."""
        if self.port is None:
            if self.private:
                log.warning("diagnostics are not served over the public port, and a private port is not configured")
            return None
        served = HttpServer(ready) if self.private else server
        return await served.serve(host, self.port)


class HttpServer:
    """Serves HTTP/1.1 connections: the debug endpoints, CORS, the routes of `routes`, and a 404 for
    anything else (see the module's doc; a subclass serves more by overriding `serve_unrouted`).

    `ready` says whether `/debug/ready` answers 200. `routes`, if given, may be added to while the
    server serves. An instance is the `http_handler` of OnePortListener.
    """

    def __init__(
        self, ready: Callable[[], bool], routes: RouteTable | None = None, *, debug: bool = True,
        allow_origins: Sequence[str] = (),
    ) -> None:
        self._ready = ready
        self.routes = routes
        self.debug = debug
        """Whether `/debug/ready` and `/debug/metrics` are served (not with `--debug.private`)."""
        self.allow_origins = frozenset(allow_origins)
        """Origins answered with CORS headers (`--broker.allow-origin`); with any, OPTIONS is answered."""
        self._connections: set[Connection] = set()

    def __call__(self, transport: asyncio.Transport, initial: bytes) -> None:
        """Take over `transport`, whose first bytes `initial` were already read from it."""
        connection = Connection(self.handle, self._connections)
        transport.set_protocol(connection)
        connection.connection_made(transport)
        if initial:
            connection.data_received(initial)

    async def serve(self, host: str, port: int) -> asyncio.Server:
        """Serve HTTP/1.1 on a port of its own (`--debug.port`), beside the listener's connections."""
        loop = asyncio.get_running_loop()
        return await loop.create_server(lambda: Connection(self.handle, self._connections), host, port)

    async def shut_down(self, grace: float) -> None:
        """Answer no new request: close idle connections now, give requests in progress up to `grace`
        seconds to be answered (each connection closing after its answer), then abort the rest."""
        tasks = [t for t in (c.shut_down() for c in list(self._connections)) if t is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        await self.close()

    async def close(self) -> None:
        """Abort every connection and wait until their requests have ended."""
        tasks = [c.abort() for c in list(self._connections)]
        await asyncio.gather(*[t for t in tasks if t is not None], return_exceptions=True)

    async def serve_unrouted(self, conn: Connection, request: Request, method: str, path: str, query: str) -> None:
        """Answer a request no route matched: 404, as Go's ServeMux."""
        await conn.error(404, "404 page not found")

    async def handle(self, conn: Connection, request: Request) -> None:
        """Answer one request on `conn`."""
        method = request.method.decode("ascii")
        if method == "CONNECT":
            # Refused before routing: h11 (as any HTTP client) takes a 2xx to CONNECT as the start
            # of a tunnel. Gazette's gateway answers it as any method it does not serve.
            await conn.error(400, f"unknown method: {method}")
            return
        try:
            path, query = split_target(request.target.decode("ascii"))
        except BadTarget:
            conn.must_close = True  # As Go's net/http, which rejects the target before any handler runs.
            await conn.respond(400, TEXT_HEADERS, b"400 Bad Request")
            return

        location = clean_redirect(method, request.target.decode("ascii"))
        if location is not None:
            headers, body = redirect_body(method, location, "Temporary Redirect")
            await conn.respond(307, [("Location", location), *headers], body)
            return

        if self.debug and path == "/debug/ready":
            if self._ready():
                await conn.respond(200, TEXT_HEADERS, b"ok")
            else:
                await conn.respond(503, TEXT_HEADERS, b"not ready")
            return
        if self.debug and path == "/debug/metrics":
            await conn.respond(200, [("Content-Type", CONTENT_TYPE_LATEST)], generate_latest())
            return
        if self.allow_origins:
            origin = next((v for k, v in request.headers if k == b"origin"), b"").decode("latin-1")
            if origin in self.allow_origins:
                conn.extra_headers = [("Access-Control-Allow-Origin", origin), *CORS_HEADERS]
            if method == "OPTIONS":
                await conn.respond(200, [], b"")
                return
        if self.routes is not None:
            methods = self.routes.methods(path)
            if methods is not None:
                await self._serve_route(conn, request, method, path, query, methods)
                return
        await self.serve_unrouted(conn, request, method, path, query)

    async def _serve_route(
        self, conn: Connection, request: Request, method: str, path: str, query: str,
        methods: dict[str, HttpHandler],
    ) -> None:
        """Answer a request of an added route (see `cluster.server.http.routes`)."""
        handler = route_handler(methods, method)
        if handler is None:
            allow = ", ".join(sorted({*methods, *(["HEAD"] if "GET" in methods else [])}))
            await conn.error(405, f"method {method} not allowed for {path}", [("Allow", allow)])
            return
        try:
            params = parse_query(query)
        except BadRequest as err:
            await conn.error(400, str(err))
            return
        assert self.routes is not None
        limit = self.routes.max_body
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = await conn.read_body(min(1 << 20, limit + 1 - size))
            if chunk is None:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                conn.must_close = True
                await conn.error(413, f"request body too large (more than {limit} bytes)")
                return
        routed = HttpRequest(
            method=method, path=path, query=params,
            headers=[(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in request.headers],
            body=b"".join(chunks),
        )
        try:
            response = await handler(routed)
            if not isinstance(response, HttpResponse):
                raise TypeError(f"the handler returned {type(response).__name__}, not an HttpResponse")
            if response.status < 200 or response.status not in HTTPStatus._value2member_map_:
                raise ValueError(f"the handler returned HTTP status {response.status}")
            for name, value in response.headers:
                if not isinstance(name, str) or not name or not _HEADER_NAME.fullmatch(name):
                    raise ValueError(f"the handler returned an invalid header name {name!r}")
                if not isinstance(value, str):
                    raise ValueError(f"the handler returned a header {name} whose value is not a str")
            if not isinstance(response.body, bytes | bytearray | memoryview):
                raise ValueError(f"the handler returned a body of {type(response.body).__name__}, not bytes")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("HTTP route %s %s failed", method, path)
            await conn.error(500, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            return
        headers = [(k, v) for k, v in response.headers if k.lower() not in ("content-length", "transfer-encoding")]
        await conn.respond(response.status, headers, bytes(response.body))
