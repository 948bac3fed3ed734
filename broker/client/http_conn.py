"""Kept-alive HTTP/1.1 connections to brokers' gateways, by endpoint: what the client's PUTs
(broker.client.http_append) and GETs (broker.client.http_read) share.

A connection goes back to its endpoint's idle list only once its response was read to the end;
one left amid a response (cancelled, failed, a read stopped early) is closed. An endpoint found to
answer in something other than HTTP/1.1 (a gRPC-only server) is remembered: the client talks gRPC
to it from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

import grpc
from google.protobuf import text_format

from broker.client.errors import ClientError, TransportError
from broker.protocol import pb

IDLE_CONNECTIONS = 8
"""Kept-alive connections kept per endpoint."""
CONNECT_TIMEOUT = 10.0
"""Seconds a new connection has to be made: a broker host that drops packets is given up on in
that time (the OS would keep trying for minutes), and a RetryReader tries another member."""


class NotHttp(ClientError):
    """The endpoint answered with something other than HTTP/1.1 (a gRPC-only server): it cannot
    have done anything with the request, and the client uses gRPC there from then on."""


@dataclass
class HttpConnection:
    """One connection to a gateway; `reused` if it served a request before this one."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    reused: bool = False

    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()


class HttpConnections:
    """Kept-alive HTTP connections, by endpoint (`http://host:port`)."""

    def __init__(self, connect_timeout: float = CONNECT_TIMEOUT) -> None:
        self.connect_timeout = connect_timeout
        self._idle: dict[str, list[HttpConnection]] = {}
        self._targets: dict[str, tuple[str, int, bytes]] = {}
        self._paths: dict[str, bytes] = {}
        self._routes: dict[str, tuple[bytes, pb.Route]] = {}
        self.not_http: set[str] = set()
        """Endpoints that answered in something other than HTTP/1.1."""

    def takes(self, endpoint: str) -> bool:
        """Whether requests to `endpoint` may go over HTTP."""
        return endpoint.startswith("http://") and endpoint not in self.not_http

    def host_header(self, endpoint: str) -> bytes:
        """The `Host` header value of `endpoint`."""
        return self._target(endpoint)[2]

    def path(self, journal: str) -> bytes:
        """The request path of `journal` (quoted; the journal name is validated by the caller)."""
        path = self._paths.get(journal)
        if path is None:
            path = self._paths[journal] = quote(journal, safe="/").encode()
        return path

    def route(self, journal: str, token: bytes) -> pb.Route:
        """The Route of an `X-Route-Token` answered for `journal` (empty if it does not parse);
        the last one is remembered: every request of a journal answers the same while its route
        holds. Callers copy it."""
        known = self._routes.get(journal)
        if known is not None and known[0] == token:
            return known[1]
        route = pb.Route()
        with contextlib.suppress(text_format.ParseError, UnicodeDecodeError):
            text_format.Parse(token.decode("utf-8"), route)
        self._routes[journal] = (token, route)
        return route

    def _target(self, endpoint: str) -> tuple[str, int, bytes]:
        target = self._targets.get(endpoint)
        if target is None:
            url = urlsplit(endpoint)
            host, port = url.hostname or "localhost", url.port or 80
            target = self._targets[endpoint] = (host, port, url.netloc.encode("idna"))
        return target

    async def connect(self, endpoint: str, journal: str, *, fresh: bool = False) -> HttpConnection:
        """An idle connection to `endpoint` (unless `fresh`), else a new one; TransportError
        (UNAVAILABLE) if it cannot be made."""
        idle = self._idle.get(endpoint)
        while idle and not fresh:
            conn = idle.pop()
            if conn.usable():
                conn.reused = True
                return conn
            conn.close()
        host, port, _ = self._target(endpoint)
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError) as exc:
            reason = f"no connection within {self.connect_timeout:g} s" if isinstance(exc, TimeoutError) else (
                exc.strerror or str(exc))
            raise TransportError(
                f"broker {endpoint}: UNAVAILABLE: {reason}", code=grpc.StatusCode.UNAVAILABLE, journal=journal,
            ) from None
        return HttpConnection(reader, writer)

    def release(self, endpoint: str, conn: HttpConnection) -> None:
        """Keep `conn`, whose response was read to its end, for the next request to `endpoint`."""
        idle = self._idle.setdefault(endpoint, [])
        if len(idle) < IDLE_CONNECTIONS and conn.usable():
            idle.append(conn)
        else:
            conn.close()

    async def close(self) -> None:
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()


__all__ = ["CONNECT_TIMEOUT", "IDLE_CONNECTIONS", "HttpConnection", "HttpConnections", "NotHttp"]
