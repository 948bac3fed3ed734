"""Building APIs: an application's own gRPC services and HTTP routes on the consumer's one port
(Gazette's `InitApplication` and "Building APIs"; `consumer/resolver.go`,
`mainboilerplate/runconsumer/run_consumer.go`).

An application may define::

    async def init_application(self, ctx: AppContext) -> None

`gazette consume` calls it once, after the Shard service is registered and before the gRPC server
starts and the member announces itself; an exception from it fails the start. `ctx` offers:

- `ctx.server`: the consumer's `grpc.aio.Server`: register servicers on it
  (`add_FooServicer_to_server(servicer, ctx.server)`); they are served on the consumer's port.
- `ctx.add_route(method, path, handler)`: an HTTP route on the same port, `handler` being
  `async def handler(request: HttpRequest) -> HttpResponse` (see `cluster.server.http.routes`:
  exact paths or `/prefix/*`; a handler error is answered 500 with its text).
- `ctx.service` (the `ConsumerService`), `ctx.resolver`, `ctx.journal_client`, `ctx.config`.
- `await ctx.resolve(shard_id, proxy_header=None, read_through=None)`: Gazette's Resolve, with
  `may_proxy` = "the request was not proxied here" (`proxy_header is None`). A local primary's
  resolution carries its `shard` and `store`, after waiting until the store is ready (and has read
  through `read_through`); call `res.done()` when finished with them. A remote primary's carries
  the header to forward: `res.header` names the primary and its route's endpoints.
- `await ctx.serve(shard_id, local=..., proxy=..., proxy_header=None)`: the whole pattern, with
  Gazette's proxy semantics (`consumer/shard_api.go`): resolve; run `local(res)` with the local store (releasing it
  after), or `proxy(res)` to forward the request, carrying `res.header`, to the primary
  (`ctx.channel_to(res)` is a gRPC channel to it). A request that arrived proxied (with a header)
  is never proxied again: if this process is not the shard's primary, it fails with
  `ShardUnavailable` (NOT_SHARD_PRIMARY). A request that this process routes and whose primary
  stopped serving the shard (hand-off, exiting member: SHARD_STOPPED or NOT_SHARD_PRIMARY here,
  or gRPC UNAVAILABLE from the peer), or that has no primary yet, is resolved again once the
  shard's route changes, until `timeout`; then `ShardUnavailable` (SHARD_STOPPED, with the
  peer's error, when proxying failed). Other errors of `local` and `proxy` propagate.
- `await ctx.proxy_http(res, request)`: forward an HTTP route's request to the primary's same
  route, carrying `res.header` in the `X-Gazette-Proxy-Header` request header (base64 of the
  protocol.Header), and return its response; `proxy_header_of(request)` reads that header back
  on the peer, for `serve`'s `proxy_header`. A peer that cannot be reached, or answers 503, is
  `PeerUnavailable`, which `serve` outlives as it does gRPC UNAVAILABLE.
- `ctx.shards_with_source(journal)`: the specs of shards that read `journal`, in ID order.
- `ctx.add_cleanup(fn)`: an `async def fn()` run when the consumer stops, after its port closed.

`ShardUnavailable.grpc_code` and `.http_status` say how to answer it (NOT_FOUND / 404 for a
shard that does not exist; UNAVAILABLE / 503 otherwise, which a client may retry).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import grpc
import h11

from broker.client.config import dial_target
from broker.protocol import pb as bpb
from broker.protocol.credentials import TLSFiles
from cluster.server.channels import CHANNEL_OPTIONS
from cluster.server.http.routes import HttpHandler, HttpRequest, HttpResponse, RouteError, RouteTable
from cluster.server.tls import client_context
from consumer.errors import ConsumerError
from consumer.protocol import pb as cpb
from consumer.resolver import Resolution, ResolverError, ResolverStopped

if TYPE_CHECKING:
    from broker.client import JournalClient
    from consumer.resolver import Resolver
    from consumer.service import ConsumerService

log = logging.getLogger(__name__)

T = TypeVar("T")

PROXY_HEADER = "X-Gazette-Proxy-Header"
"""The HTTP request header carrying a proxied request's protocol.Header (base64 of its bytes)."""

SERVE_TIMEOUT = 30.0
"""Seconds `AppContext.serve` waits for a shard's route to change before it gives up."""

RETRY_STATUSES = frozenset({cpb.SHARD_STOPPED, cpb.NOT_SHARD_PRIMARY, cpb.NO_SHARD_PRIMARY})
"""Statuses a request this process routes outlives by resolving again once the route changes."""


class ShardUnavailable(ConsumerError):
    """A shard that cannot be served here or proxied to: its `status` (a `consumer.Status`)."""

    def __init__(self, shard: str, status: int, detail: str = "") -> None:
        self.shard, self.status = shard, status
        name = cpb.Status.Name(status) if status in cpb.Status.values() else str(status)  # type: ignore[arg-type]
        super().__init__(f"shard {shard}: {name}" + (f" ({detail})" if detail else ""))

    @property
    def grpc_code(self) -> grpc.StatusCode:
        return grpc.StatusCode.NOT_FOUND if self.status == cpb.SHARD_NOT_FOUND else grpc.StatusCode.UNAVAILABLE

    @property
    def http_status(self) -> int:
        return 404 if self.status == cpb.SHARD_NOT_FOUND else 503


class PeerUnavailable(ConsumerError):
    """A peer a request was proxied to could not answer it (unreachable, or 503): `serve` resolves
    the shard again once its route changes (and raises ShardUnavailable when it gives up)."""


def proxy_header_of(request: HttpRequest) -> bpb.Header | None:
    """The protocol.Header of a request proxied by `AppContext.proxy_http`, or None if it was not
    proxied. Raises ValueError for a header that does not decode."""
    raw = request.header(PROXY_HEADER)
    if raw is None:
        return None
    try:
        header = bpb.Header()
        header.ParseFromString(base64.b64decode(raw, validate=True))
    except Exception as exc:
        raise ValueError(f"invalid {PROXY_HEADER} header: {exc}") from None
    return header


class AppContext:
    """What `init_application(ctx)` gets (see the module's doc)."""

    def __init__(
        self, *, server: grpc.aio.Server, routes: RouteTable, service: ConsumerService,
        journal_client: JournalClient, config: Any = None,
    ) -> None:
        self.server = server
        """The consumer's grpc.aio server (not started yet): register servicers on it."""
        self.routes = routes
        self.service = service
        self.journal_client = journal_client
        """The consumer's JournalClient (reads, appends, `list_journals`)."""
        self.config = config
        """The process's `ConsumerConfig` (None in tests that build a context themselves)."""
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._cleanups: list[Callable[[], Awaitable[None]]] = []

    @property
    def resolver(self) -> Resolver:
        return self.service.resolver

    # -- registration ---------------------------------------------------------------------------

    def add_route(self, method: str, path: str, handler: HttpHandler) -> None:
        """Serve HTTP `method` requests of `path` (exact, or a `/prefix/*`) with `handler`."""
        self.routes.add(method, path, handler)

    def add_cleanup(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Run `await fn()` when the consumer stops (in reverse order of adding)."""
        self._cleanups.append(fn)

    # -- resolution and proxying ----------------------------------------------------------------

    async def resolve(
        self, shard_id: str, *, proxy_header: bpb.Header | None = None,
        read_through: Mapping[str, int] | None = None,
    ) -> Resolution:
        """Resolve `shard_id`, proxying allowed unless the request was proxied (`proxy_header`)."""
        return await self.resolver.resolve(
            shard_id, may_proxy=proxy_header is None, proxy_header=proxy_header, read_through=read_through
        )

    def shards_with_source(self, journal: str) -> list[cpb.ShardSpec]:
        return self.resolver.shards_with_source(journal)

    @property
    def peer_tls(self) -> TLSFiles:
        """What this process presents to and trusts of `https://` peers (`--consumer.peer-*`)."""
        tls = getattr(self.config, "peer_tls", None)
        return tls if isinstance(tls, TLSFiles) else TLSFiles()

    def channel(self, endpoint: str) -> grpc.aio.Channel:
        """A gRPC channel to a member's `endpoint` (cached; closed when the consumer stops)."""
        channel = self._channels.get(endpoint)
        if channel is None:
            target = dial_target(endpoint)
            channel = self.peer_tls.channel(target.target, tls=target.tls, options=CHANNEL_OPTIONS)
            self._channels[endpoint] = channel
        return channel

    def channel_to(self, res: Resolution) -> grpc.aio.Channel:
        """A gRPC channel to the primary a resolution names."""
        return self.channel(primary_endpoint(res))

    async def serve(
        self,
        shard_id: str,
        *,
        local: Callable[[Resolution], Awaitable[T]],
        proxy: Callable[[Resolution], Awaitable[T]],
        proxy_header: bpb.Header | None = None,
        read_through: Mapping[str, int] | None = None,
        timeout: float = SERVE_TIMEOUT,
    ) -> T:
        """Serve a request of `shard_id` locally or by proxy (see the module's doc)."""
        proxied = proxy_header is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                res = await self.resolve(shard_id, proxy_header=proxy_header, read_through=read_through)
            except ResolverStopped as exc:
                raise ShardUnavailable(shard_id, cpb.SHARD_STOPPED, f"{exc}: the consumer is stopping") from None
            except ResolverError as exc:
                raise ShardUnavailable(shard_id, cpb.NOT_SHARD_PRIMARY, str(exc)) from None
            error: Exception
            if res.status == cpb.OK and res.shard is not None:
                try:
                    return await local(res)
                finally:
                    res.done()
            if res.status == cpb.OK:
                try:
                    return await proxy(res)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAVAILABLE:
                        raise
                    detail = f"proxying to {primary_endpoint(res)}: {exc.details()}"
                    log.info("%s: %s; resolving again", shard_id, detail)
                    error = ShardUnavailable(shard_id, cpb.SHARD_STOPPED, detail)
                except PeerUnavailable as exc:
                    log.info("%s: %s; resolving again", shard_id, exc)
                    error = ShardUnavailable(shard_id, cpb.SHARD_STOPPED, str(exc))
            else:
                error = ShardUnavailable(shard_id, res.status)
            if proxied or (res.status not in RETRY_STATUSES and res.status != cpb.OK):
                raise error
            if not await self._route_changes(shard_id, res.header.route, deadline):
                raise error

    async def proxy_http(
        self, res: Resolution, request: HttpRequest, *, timeout: float = SERVE_TIMEOUT
    ) -> HttpResponse:
        """Forward `request` to the same route of the primary `res` names (see the module's doc)."""
        endpoint = primary_endpoint(res)
        if not endpoint:
            raise PeerUnavailable(f"the primary of the shard has no endpoint ({res.header.process_id})")
        target = dial_target(endpoint)
        tls = self.peer_tls
        context = client_context(tls.cert_file, tls.key_file, tls.ca_file) if target.tls else None
        headers = [(k, v) for k, v in request.headers
                   if k not in _HOP_HEADERS and k != PROXY_HEADER.lower()]
        headers.append((PROXY_HEADER, base64.b64encode(res.header.SerializeToString()).decode("ascii")))
        try:
            async with asyncio.timeout(timeout):
                response = await http_call(target.target, request.method, request.path, request.query, headers,
                                           request.body, ssl_context=context)
        except (OSError, TimeoutError, h11.ProtocolError, ValueError) as exc:
            raise PeerUnavailable(f"proxying HTTP to {endpoint}: {type(exc).__name__}: {exc}") from None
        if response.status == 503:
            raise PeerUnavailable(f"{endpoint} answered 503: {response.body.decode('utf-8', 'replace').strip()}")
        return response

    async def _route_changes(self, shard: str, route: bpb.Route, deadline: float) -> bool:
        """Wait until the shard's route differs from `route` (True), or the deadline passes (False)."""
        keyspace = self.service.keyspace
        loop = asyncio.get_running_loop()
        while keyspace.route(shard) == route:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            await keyspace.wait_for_change_within(remaining)
        return True

    async def close(self) -> None:
        """Run the cleanups, then close the channels opened to peers."""
        cleanups, self._cleanups = self._cleanups[::-1], []
        for fn in cleanups:
            try:
                await fn()
            except Exception:
                log.exception("an application cleanup failed")
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()


_HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
                          "proxy-connection", "content-length", "host", "expect"})


async def http_call(
    hostport: str, method: str, path: str, query: Mapping[str, list[str]], headers: list[tuple[str, str]],
    body: bytes, *, ssl_context: ssl.SSLContext | None = None,
) -> HttpResponse:
    """One HTTP/1.1 request to `hostport` on a connection of its own (over TLS with `ssl_context`);
    the whole response."""
    host, _, port = hostport.rpartition(":")
    host = host.strip("[]")
    if ssl_context is not None:
        reader, writer = await asyncio.open_connection(host, int(port), ssl=ssl_context, server_hostname=host)
    else:
        reader, writer = await asyncio.open_connection(host, int(port))
    try:
        conn = h11.Connection(h11.CLIENT)
        target = urllib.parse.quote(path, safe="/:@!$&'()*+,;=-._~")
        if query:
            target += "?" + urllib.parse.urlencode([(k, v) for k, vs in query.items() for v in vs])
        all_headers = [("Host", hostport), ("Connection", "close"), ("Content-Length", str(len(body))), *headers]
        writer.write(conn.send(h11.Request(method=method, target=target, headers=all_headers)))
        if body:
            writer.write(conn.send(h11.Data(data=body)))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()
        status, out_headers, chunks = 0, [], []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(1 << 16))
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                out_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers.raw_items()]
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                break
        keep = [(k, v) for k, v in out_headers if k.lower() not in _HOP_HEADERS and k.lower() != "date"]
        return HttpResponse(status, keep, b"".join(chunks))
    finally:
        writer.close()


def primary_endpoint(res: Resolution) -> str:
    """The endpoint of the primary a resolution names ('' if its route has none)."""
    route = res.header.route
    return route.endpoints[route.primary] if 0 <= route.primary < len(route.endpoints) else ""


@runtime_checkable
class InitApplication(Protocol):
    """The optional API hook of an Application (see the module's doc and `consumer.application`)."""

    async def init_application(self, ctx: AppContext) -> None: ...


__all__ = [
    "PROXY_HEADER",
    "RETRY_STATUSES",
    "SERVE_TIMEOUT",
    "AppContext",
    "HttpHandler",
    "HttpRequest",
    "HttpResponse",
    "InitApplication",
    "PeerUnavailable",
    "RouteError",
    "RouteTable",
    "ShardUnavailable",
    "http_call",
    "primary_endpoint",
    "proxy_header_of",
]
