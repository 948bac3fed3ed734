"""`HttpGateway`: takes over the listener's HTTP/1.1 connections and routes their requests.

`/debug/ready` and `/debug/metrics` are answered here; GET and HEAD of a journal go to
`read`, PUT to `append`; any other method is a 400, as in Gazette. The `Authorization` header,
passed on as gRPC metadata, must be something the broker's gRPC server takes (see
`authorization_metadata`). An optional `RouteTable` (`broker.gateway.app_routes`) adds routes of
the embedding process (a consumer application's), served before the journal routes.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import grpc
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from broker.gateway.app_routes import HttpHandler, HttpRequest, HttpResponse, RouteTable, route_handler
from broker.gateway.append import serve_append
from broker.gateway.codec import Request
from broker.gateway.connection import TEXT_HEADERS, Connection
from broker.gateway.read import serve_read
from broker.gateway.request import (
    BadRequest,
    BadTarget,
    Metadata,
    clean_redirect,
    parse_query,
    redirect_body,
    split_target,
)
from broker.gateway.responses import EndpointOf
from broker.protocol import pb_grpc

log = logging.getLogger(__name__)

_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")

MAX_AUTHORIZATION_BYTES = 7 << 10
"""Longest `Authorization` value passed on; a longer one is a 431. The broker's gRPC server
refuses a call whose metadata exceeds 8 KiB at random, and beyond 16 KiB always (grpc's
`grpc.max_metadata_size` defaults), and the call's own headers take about 600 bytes of that.
(Gazette's gRPC server takes up to 16 MiB, so its gateway passes on any header net/http reads.)"""


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
    """Not on the public port: there, `/debug/...` are journal paths like any other."""

    async def serve(self, host: str, gateway: HttpGateway, ready: Callable[[], bool]) -> asyncio.Server | None:
        """Serve the debug port, if there is one, beside the public port's `gateway`."""
        if self.port is None:
            if self.private:
                log.warning("diagnostics are not served over the public port, and a private port is not configured")
            return None
        served = HttpGateway(None, ready) if self.private else gateway
        return await served.serve(host, self.port)


class _HeaderTooLarge(Exception):
    """A request header the gateway cannot pass on: answered 431 with this text."""


class HttpGateway:
    """Serves HTTP/1.1 connections on behalf of the Journal service reached through `channel`
    (or through `stub`, once set: a broker sets a `LocalJournalStub` of its own service).

    `ready` says whether `/debug/ready` answers 200. `endpoint_of` gives the endpoint of a route
    member, for the `Location` header of routes that carry no endpoints.
    `routes`, if given, are served before the journal routes (see `broker.gateway.app_routes`);
    routes may be added to it while the gateway serves.
    An instance is the `http_handler` of OnePortListener.
    """

    def __init__(
        self, channel: grpc.aio.Channel | None, ready: Callable[[], bool], endpoint_of: EndpointOf | None = None,
        routes: RouteTable | None = None, *, debug: bool = True, allow_origins: Sequence[str] = (),
    ) -> None:
        self.stub: Any = pb_grpc.JournalStub(channel) if channel is not None else None
        """What GET, HEAD and PUT call `Read` and `Append` of; None serves `/debug/` routes only
        (`--debug.private`'s debug port), answering anything else 404 as Go's ServeMux does."""
        self._ready = ready
        self._endpoint_of = endpoint_of
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
        if self.stub is None:
            await conn.error(404, "404 page not found")
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

        if method not in ("GET", "HEAD", "PUT"):
            await conn.error(400, f"unknown method: {method}")
            return
        try:
            metadata = authorization_metadata(request.headers)
        except _HeaderTooLarge as err:
            await conn.error(431, str(err))
            return
        except BadRequest as err:
            await conn.error(400, str(err))
            return
        if method == "PUT":
            await serve_append(self.stub, conn, path, query, metadata, self._endpoint_of)
        else:
            await serve_read(self.stub, conn, method, path, query, metadata, self._endpoint_of)


    async def _serve_route(
        self, conn: Connection, request: Request, method: str, path: str, query: str,
        methods: dict[str, HttpHandler],
    ) -> None:
        """Answer a request of an added route (see `broker.gateway.app_routes`)."""
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


def authorization_metadata(headers: Sequence[tuple[bytes, bytes]]) -> Metadata:
    """The gRPC metadata carrying the request's (first) `Authorization` header, if it has one.

    Raises _HeaderTooLarge for a value longer than MAX_AUTHORIZATION_BYTES, and BadRequest for one
    gRPC cannot carry: metadata values are printable ASCII (h11 lets through tabs and bytes >= 0x80).
    """
    for name, value in headers:
        if name != b"authorization":
            continue
        if len(value) > MAX_AUTHORIZATION_BYTES:
            raise _HeaderTooLarge(
                f"Authorization header too large ({len(value)} bytes; expected at most {MAX_AUTHORIZATION_BYTES})"
            )
        if not all(0x20 <= b < 0x7F for b in value):
            raise BadRequest("invalid Authorization header (expected printable ASCII)")
        return (("authorization", value.decode("ascii")),)
    return None
