"""`HttpGateway`: takes over the listener's HTTP/1.1 connections and routes their requests.

`/debug/ready` and `/debug/metrics` are answered here; GET and HEAD of a journal go to
`read`, PUT to `append`; any other method is a 400, as in Gazette.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import h11
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from broker.gateway.append import serve_append
from broker.gateway.connection import TEXT_HEADERS, Connection
from broker.gateway.read import serve_read
from broker.gateway.request import BadTarget, split_target
from broker.gateway.responses import EndpointOf
from broker.protocol import pb_grpc


class HttpGateway:
    """Serves HTTP/1.1 connections on behalf of the Journal service reached through `channel`.

    `ready` says whether `/debug/ready` answers 200. `endpoint_of` gives the endpoint of a route
    member, for the `Location` header of routes that carry no endpoints.
    An instance is the `http_handler` of OnePortListener.
    """

    def __init__(
        self, channel: grpc.aio.Channel, ready: Callable[[], bool], endpoint_of: EndpointOf | None = None
    ) -> None:
        self._stub = pb_grpc.JournalStub(channel)
        self._ready = ready
        self._endpoint_of = endpoint_of
        self._connections: set[Connection] = set()

    def __call__(self, transport: asyncio.Transport, initial: bytes) -> None:
        """Take over `transport`, whose first bytes `initial` were already read from it."""
        connection = Connection(self.handle, self._connections)
        transport.set_protocol(connection)
        connection.connection_made(transport)
        if initial:
            connection.data_received(initial)

    async def close(self) -> None:
        """Abort every connection and wait until their requests have ended."""
        tasks = [c.abort() for c in list(self._connections)]
        await asyncio.gather(*[t for t in tasks if t is not None], return_exceptions=True)

    async def handle(self, conn: Connection, request: h11.Request) -> None:
        """Answer one request on `conn`."""
        method = request.method.decode("ascii")
        try:
            path, query = split_target(request.target.decode("ascii"))
        except BadTarget:
            conn.must_close = True
            await conn.respond(400, [*TEXT_HEADERS, ("Connection", "close")], b"400 Bad Request")
            return

        if path == "/debug/ready":
            if self._ready():
                await conn.respond(200, TEXT_HEADERS, b"ok")
            else:
                await conn.respond(503, TEXT_HEADERS, b"not ready")
            return
        if path == "/debug/metrics":
            await conn.respond(200, [("Content-Type", CONTENT_TYPE_LATEST)], generate_latest())
            return

        metadata = None
        for name, value in request.headers:
            if name == b"authorization":
                metadata = (("authorization", value.decode("latin-1")),)
                break
        if method in ("GET", "HEAD"):
            await serve_read(self._stub, conn, method, path, query, metadata, self._endpoint_of)
        elif method == "PUT":
            await serve_append(self._stub, conn, path, query, metadata, self._endpoint_of)
        else:
            await conn.error(400, f"unknown method: {method}")
