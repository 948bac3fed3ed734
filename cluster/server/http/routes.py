"""Routes a process adds to its HTTP server: `RouteTable`, `HttpRequest`, `HttpResponse`.

The HTTP side of the one-port listener (`cluster.server.http.server.HttpServer`) serves
`/debug/ready` and `/debug/metrics`, and on a broker journal reads and appends. A process may serve
its own routes there (a consumer application's, see `consumer.app_api`):
`HttpServer(..., routes=table)` answers a request whose path is in `table` with the route's
handler, before any journal route.

A handler is `async def handler(request: HttpRequest) -> HttpResponse`. The request's body is
read whole before the handler runs (up to `max_body` bytes; a larger one is answered 413). A
handler that raises is answered 500 with the error's text (as Go's `http.Error`), and the
connection serves on; the error is logged. A path served with other methods answers 405 with an
`Allow` header; HEAD is served by the GET handler, with the body left out.

Paths are exact (`/api/query`), or prefixes ending in `/*` (`/api/*` matches `/api/x/y`, not
`/api`); an exact path wins over a prefix, and a longer prefix over a shorter one. `/debug/`
paths are the server's own and cannot be routed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from broker.errors import GatewayError

log = logging.getLogger(__name__)

MAX_BODY = 16 << 20
"""Largest request body a route handler is given (a larger one is answered 413)."""


class RouteError(GatewayError, ValueError):
    """A route that cannot be added (a bad method or path, or one already routed)."""


@dataclass(frozen=True)
class HttpRequest:
    """One request, as a route handler sees it."""

    method: str
    path: str
    """The percent-decoded path, e.g. `/api/query`."""
    query: Mapping[str, list[str]] = field(default_factory=dict)
    """Values by key of the query string (decoded)."""
    headers: Sequence[tuple[str, str]] = ()
    """Header names (lower case) and values, in the order received."""
    body: bytes = b""

    def header(self, name: str, default: str | None = None) -> str | None:
        """The first value of header `name` (any case), or `default`."""
        lower = name.lower()
        for key, value in self.headers:
            if key == lower:
                return value
        return default

    def param(self, name: str, default: str | None = None) -> str | None:
        """The first value of query parameter `name`, or `default`."""
        values = self.query.get(name)
        return values[0] if values else default

    def json(self) -> Any:
        """The body, decoded as JSON (raises ValueError if it is not)."""
        return json.loads(self.body or b"null")


@dataclass(frozen=True)
class HttpResponse:
    """A handler's answer."""

    status: int = 200
    headers: Sequence[tuple[str, str]] = ()
    body: bytes = b""

    @classmethod
    def text(cls, text: str, status: int = 200, headers: Sequence[tuple[str, str]] = ()) -> HttpResponse:
        return cls(status, [("Content-Type", "text/plain; charset=utf-8"), *headers], text.encode("utf-8"))

    @classmethod
    def json(cls, value: Any, status: int = 200, headers: Sequence[tuple[str, str]] = ()) -> HttpResponse:
        body = (json.dumps(value, separators=(",", ":")) + "\n").encode("utf-8")
        return cls(status, [("Content-Type", "application/json"), *headers], body)


HttpHandler = Callable[[HttpRequest], Awaitable[HttpResponse]]
"""Answers one routed request."""

_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


class RouteTable:
    """Handlers by method and path (see the module's doc)."""

    def __init__(self, *, max_body: int = MAX_BODY) -> None:
        self.max_body = max_body
        self._exact: dict[str, dict[str, HttpHandler]] = {}
        self._prefixes: dict[str, dict[str, HttpHandler]] = {}

    def add(self, method: str, path: str, handler: HttpHandler) -> None:
        """Serve `method` requests of `path` with `handler`."""
        method = method.upper()
        if not method or not set(method) <= _TOKEN:
            raise RouteError(f"invalid HTTP method {method!r}")
        if method == "CONNECT":
            raise RouteError("CONNECT cannot be routed")
        if not path.startswith("/"):
            raise RouteError(f"route path {path!r} must begin with '/'")
        if path == "/debug" or path.startswith("/debug/"):
            raise RouteError(f"route path {path!r}: /debug/ paths are the gateway's own")
        if not callable(handler):
            raise RouteError(f"the handler of {method} {path} is not callable")
        if path.endswith("/*"):
            table, key = self._prefixes, path[:-1]
        else:
            table, key = self._exact, path
        methods = table.setdefault(key, {})
        if method in methods:
            raise RouteError(f"{method} {path} is already routed")
        methods[method] = handler

    def __bool__(self) -> bool:
        return bool(self._exact or self._prefixes)

    def methods(self, path: str) -> dict[str, HttpHandler] | None:
        """The handlers by method of the route matching `path`, or None if none does."""
        found = self._exact.get(path)
        if found is not None:
            return found
        best = ""
        for prefix in self._prefixes:
            if path.startswith(prefix) and len(prefix) > len(best):
                best = prefix
        return self._prefixes[best] if best else None

    def __iter__(self) -> Any:
        for table, suffix in ((self._exact, ""), (self._prefixes, "*")):
            for path, methods in table.items():
                for method in methods:
                    yield method, path + suffix


def route_handler(methods: Mapping[str, HttpHandler], method: str) -> HttpHandler | None:
    """The handler of `method` among a route's `methods` (HEAD falls back to GET)."""
    handler = methods.get(method)
    if handler is None and method == "HEAD":
        handler = methods.get("GET")
    return handler


__all__ = ["MAX_BODY", "HttpHandler", "HttpRequest", "HttpResponse", "RouteError", "RouteTable", "route_handler"]
