"""Dialing brokers: one grpc.aio channel per endpoint, and the routed JournalClient.

`JournalClient` is what every other client module takes: it holds the default broker address,
the channel cache and the RouteCache, and says which endpoint a request for a journal should
go to. Channels belong to the event loop they were created on: use a client from one loop.
"""

from __future__ import annotations

import logging
from types import TracebackType

import grpc

from broker.client.config import dial_target, resolve_broker_address
from broker.client.http_append import HttpAppends
from broker.client.http_conn import HttpConnections
from broker.client.routes import RouteCache, primary_endpoint, read_endpoint
from broker.protocol import pb, pb_grpc
from broker.protocol.credentials import Credentials

log = logging.getLogger(__name__)

MAX_RECEIVE_BYTES = 16 << 20
"""Largest message the client accepts, as Gazette's client (16 MiB)."""

CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
    ("grpc.max_send_message_length", 64 << 20),
    # gRPC's default reconnect backoff grows to 120 s; a restarted broker should be found in seconds.
    # (Not min_reconnect_backoff: gRPC also takes it as the connect timeout, and 100 ms fails
    # handshakes on a loaded host: "connection attempt timed out before receiving SETTINGS frame".)
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


class Dialer:
    """Hands out Journal stubs by endpoint URL (`http://host:port`, `https://...`, `unix://host/path`),
    presenting `credentials` (default: `Credentials.from_env()`, the `BROKER_*` variables): TLS
    files to `https://` endpoints, and the token with every call."""

    def __init__(self, options: list[tuple[str, int]] | None = None, credentials: Credentials | None = None) -> None:
        self.options = list(CHANNEL_OPTIONS if options is None else options)
        self.credentials = Credentials.from_env() if credentials is None else credentials
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, pb_grpc.JournalStub] = {}

    def channel(self, endpoint: str) -> grpc.aio.Channel:
        """The channel to `endpoint`, created on first use. Raises ConfigError for a bad URL or
        TLS file."""
        channel = self._channels.get(endpoint)
        if channel is None:
            target = dial_target(endpoint)
            channel = self.credentials.tls.channel(target.target, tls=target.tls, options=self.options)
            self._channels[endpoint] = channel
        return channel

    def stub(self, endpoint: str) -> pb_grpc.JournalStub:
        """The Journal stub of the channel to `endpoint` (its calls carry the token, if any)."""
        stub = self._stubs.get(endpoint)
        if stub is None:
            stub = self.credentials.authorize(pb_grpc.JournalStub(self.channel(endpoint)))
            self._stubs[endpoint] = stub
        return stub

    async def close(self) -> None:
        """Close every channel; calls in flight fail with CANCELLED."""
        channels, self._channels = self._channels, {}
        self._stubs = {}
        for channel in channels.values():
            await channel.close()


class JournalClient:
    """Routes Journal RPCs: to a journal's cached route members, else to the default `address`.

    `address` defaults to the shared configuration (`$BROKER_ADDRESS`, `gazctl.ini`, then
    `http://localhost:8080`). `zone` picks read replicas; `file_root` is where `file://`
    fragment URLs are rooted (the brokers' `--broker.file-root`, when shared). `routes=None`
    disables the route cache, so every request goes to `address` and brokers proxy it.
    `credentials` (token, TLS files) default to the `BROKER_*` environment variables.
    `http_appends=False` makes `append()` use a gRPC Append always (see broker.client.http_append);
    `http_reads=False` makes every read a gRPC Read (see broker.client.http_read).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        zone: str = "local",
        file_root: str | None = None,
        routes: RouteCache | None = None,
        route_cache: bool = True,
        dialer: Dialer | None = None,
        credentials: Credentials | None = None,
        http_appends: bool = True,
        http_reads: bool = True,
    ) -> None:
        self.address = resolve_broker_address(address)
        dial_target(self.address)  # Fail now, with a clear error, on a malformed address.
        self.zone = zone
        self.file_root = file_root
        self.routes: RouteCache | None = None
        if route_cache:
            self.routes = routes if routes is not None else RouteCache()
        self.dialer = dialer or Dialer(credentials=credentials)
        self.http = HttpConnections()
        """Kept-alive HTTP connections to brokers' gateways, for PUTs and GETs."""
        self.http_appends = HttpAppends(self.http) if http_appends else None
        """`append()`'s PUTs (None: every append is a gRPC Append)."""
        self.http_reads = http_reads
        """Whether plain reads of `http://` brokers are GETs (else every read is a gRPC Read)."""

    def stub(self, endpoint: str | None = None) -> pb_grpc.JournalStub:
        """A stub of `endpoint`, or of the default address."""
        return self.dialer.stub(endpoint or self.address)

    def endpoint(self, journal: str, *, primary: bool) -> str:
        """Where to send a request for `journal`: the primary (appends) or a read member, else the default."""
        route = self.routes.get(journal) if self.routes is not None else None
        if route is not None:
            chosen = primary_endpoint(route) if primary else read_endpoint(route, self.zone)
            if chosen:
                return chosen
        return self.address

    def route_revision(self, journal: str) -> int:
        """The etcd revision of `journal`'s cached route, to send as `min_etcd_revision` (0: none)."""
        return self.routes.revision(journal) if self.routes is not None else 0

    def update_route(self, journal: str, header: pb.Header | None) -> None:
        """Learn `journal`'s route from a response header (a header without a route forgets it)."""
        if self.routes is not None and header is not None:
            self.routes.update(journal, header.route, header.etcd.revision)

    def failed(self, journal: str, endpoint: str) -> None:
        """Note that `endpoint` is unreachable: the next try for `journal` uses another member, or the default."""
        if self.routes is not None:
            self.routes.drop_endpoint(journal, endpoint)

    def authorization(self) -> str | None:
        """The `authorization` value the client presents (`Bearer <token>`), if it has credentials."""
        signer = self.dialer.credentials.signer
        return signer.authorization() if signer is not None else None

    async def close(self) -> None:
        """Close the client's channels and connections."""
        await self.http.close()
        await self.dialer.close()

    async def __aenter__(self) -> JournalClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
