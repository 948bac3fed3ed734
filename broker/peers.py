"""gRPC connections from this broker to its peers, cached by endpoint (their options: `cluster.server.channels`)."""

from __future__ import annotations

import asyncio

import grpc

from broker.protocol import pb_grpc
from broker.protocol.credentials import Credentials
from cluster.server.channels import CHANNEL_OPTIONS, grpc_target

FORGET_GRACE = 30.0
"""Seconds a forgotten channel's calls have to end before it is closed under them."""


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
