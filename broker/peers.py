"""gRPC connections from this broker to its peers, cached by endpoint."""

from __future__ import annotations

from urllib.parse import urlparse

import grpc

from broker.protocol import pb_grpc

# Peers forward whole appends and stream content: allow messages well past gRPC's 4 MiB default.
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
]


def grpc_target(endpoint: str) -> str:
    """The gRPC dial target of a process endpoint URL (http://host:port or unix://host/path)."""
    url = urlparse(endpoint)
    if url.scheme == "unix":
        return f"unix:{url.path}"
    port = url.port or (443 if url.scheme == "https" else 80)
    return f"{url.hostname}:{port}"


class PeerDialer:
    """Hands out Journal stubs for peer endpoints, one channel per endpoint."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def stub(self, endpoint: str) -> pb_grpc.JournalStub:
        channel = self._channels.get(endpoint)
        if channel is None:
            channel = grpc.aio.insecure_channel(grpc_target(endpoint), options=CHANNEL_OPTIONS)
            self._channels[endpoint] = channel
        return pb_grpc.JournalStub(channel)

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()
