"""`HttpGateway`: the broker's HTTP server, whose requests besides its routes are journal requests.

GET and HEAD of a journal go to `read`, PUT to `append`; any other method is a 400, as in Gazette.
The `Authorization` header, passed on as gRPC metadata, must be something the broker's gRPC server
takes (see `authorization_metadata`). What any HTTP server of the project answers first (bad
targets, redirects, `/debug/ready`, `/debug/metrics`, CORS, the routes of an optional `RouteTable`)
is `cluster.server.http.server.HttpServer`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc

from broker.gateway.append import serve_append
from broker.gateway.read import serve_read
from broker.gateway.request import Metadata
from broker.gateway.responses import EndpointOf
from broker.protocol import pb_grpc
from cluster.server.http.codec import Request
from cluster.server.http.connection import Connection
from cluster.server.http.request import BadRequest
from cluster.server.http.routes import RouteTable
from cluster.server.http.server import HttpServer

MAX_AUTHORIZATION_BYTES = 7 << 10
"""Longest `Authorization` value passed on; a longer one is a 431. The broker's gRPC server
refuses a call whose metadata exceeds 8 KiB at random, and beyond 16 KiB always (grpc's
`grpc.max_metadata_size` defaults), and the call's own headers take about 600 bytes of that.
(Gazette's gRPC server takes up to 16 MiB, so its gateway passes on any header net/http reads.)"""


class _HeaderTooLarge(Exception):
    """A request header the gateway cannot pass on: answered 431 with this text."""


class HttpGateway(HttpServer):
    """Serves HTTP/1.1 connections on behalf of the Journal service reached through `channel`
    (or through `stub`, once set: a broker sets a `LocalJournalStub` of its own service).

    `ready` says whether `/debug/ready` answers 200. `endpoint_of` gives the endpoint of a route
    member, for the `Location` header of routes that carry no endpoints.
    `routes`, if given, are served before the journal routes (see `cluster.server.http.routes`);
    routes may be added to it while the gateway serves.
    An instance is the `http_handler` of OnePortListener.
    """

    def __init__(
        self, channel: grpc.aio.Channel | None, ready: Callable[[], bool], endpoint_of: EndpointOf | None = None,
        routes: RouteTable | None = None, *, debug: bool = True, allow_origins: Sequence[str] = (),
    ) -> None:
        super().__init__(ready, routes, debug=debug, allow_origins=allow_origins)
        self.stub: Any = pb_grpc.JournalStub(channel) if channel is not None else None
        """What GET, HEAD and PUT call `Read` and `Append` of; None answers them 404, as Go's ServeMux
        does a path it does not serve."""
        self._endpoint_of = endpoint_of

    async def serve_unrouted(self, conn: Connection, request: Request, method: str, path: str, query: str) -> None:
        """Answer a journal request: GET and HEAD read the journal the path names, PUT appends to it."""
        if self.stub is None:
            await super().serve_unrouted(conn, request, method, path, query)
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
