"""gRPC connections from this broker to its peers, cached by endpoint."""

from __future__ import annotations

import asyncio
from urllib.parse import urlparse

import grpc

from broker.protocol import pb_grpc
from broker.protocol.credentials import Credentials

# Peers forward whole appends and stream content: allow messages well past gRPC's 4 MiB default.
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    # gRPC's default reconnect backoff grows to 120 s, and calls fail at once while it lasts: a peer
    # restarted on the same endpoint must be dialed again within a second. (Not min_reconnect_backoff:
    # gRPC also takes it as the connect timeout, and 100 ms fails handshakes on a loaded host.)
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # A peer that vanishes without closing its connection (a partition, a frozen host) is noticed
    # by keepalive pings rather than by the kernel's retransmission timeout, minutes later.
    # The timeout is generous: a busy peer's event loop acks pings late, and a missed ack ends
    # every stream of the connection (GOAWAY ping_timeout).
    ("grpc.keepalive_time_ms", 15_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # A channel of its own connection: gRPC otherwise shares connections between channels to one
    # target, and the channel `forget` makes anew would take over the stalled connection it replaces.
    ("grpc.use_local_subchannel_pool", 1),
]


FORGET_GRACE = 30.0
"""Seconds a forgotten channel's calls have to end before it is closed under them."""


def grpc_target(endpoint: str) -> str:
    """The gRPC dial target of a process endpoint URL (http://host:port or unix://host/path)."""
    url = urlparse(endpoint)
    if url.scheme == "unix":
        return f"unix:{url.path}"
    port = url.port or (443 if url.scheme == "https" else 80)
    return f"{url.hostname}:{port}"


class PeerDialer:
    """Hands out Journal stubs for peer endpoints, one channel per endpoint; with `credentials`,
    every call carries the broker's own token (peers verify Replicate and proxied calls with it),
    and `https://` peers are dialed over TLS with its files (`--broker.peer-*`)."""

    def __init__(self, credentials: Credentials | None = None) -> None:
        self.credentials = credentials or Credentials()
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, pb_grpc.JournalStub] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def _channel(self, endpoint: str) -> grpc.aio.Channel:
        channel = self._channels.get(endpoint)
        if channel is None:
            # An https:// peer's port speaks TLS: dialed with --broker.peer-cert-file, -key-file, -ca-file.
            channel = self.credentials.tls.channel(
                grpc_target(endpoint), tls=endpoint.lower().startswith("https://"), options=CHANNEL_OPTIONS
            )
            self._channels[endpoint] = channel
        return channel

    def stub(self, endpoint: str) -> pb_grpc.JournalStub:
        stub = self._stubs.get(endpoint)
        if stub is None:
            stub = self.credentials.authorize(pb_grpc.JournalStub(self._channel(endpoint)))
            self._stubs[endpoint] = stub
        return stub

    async def connected(self, endpoint: str, timeout: float) -> bool:
        """Whether a connection to `endpoint` is (or within `timeout` seconds becomes) ready."""
        channel = self._channel(endpoint)
        if channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
            return True
        try:
            async with asyncio.timeout(timeout):
                await channel.channel_ready()
        except TimeoutError:
            return False
        return True

    def forget(self, endpoint: str) -> None:
        """Drop the connection to `endpoint` (closing it in the background): the peer stopped
        answering on it. A partition leaves a TCP connection that the kernel retransmits on with
        growing back-off, for minutes; calls on it would wait that out even after the heal, where a
        new connection is made at once."""
        channel = self._channels.pop(endpoint, None)
        self._stubs.pop(endpoint, None)
        if channel is not None:
            # Calls still on it (other journals' streams to the peer) end by their own deadlines first.
            task = asyncio.get_running_loop().create_task(channel.close(grace=FORGET_GRACE))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        self._stubs = {}
        for channel in channels.values():
            await channel.close()
