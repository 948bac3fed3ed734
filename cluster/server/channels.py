"""gRPC channels from a process to its peers (brokers, consumer members): their options and dial targets."""

from __future__ import annotations

from urllib.parse import urlparse

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


def grpc_target(endpoint: str) -> str:
    """The gRPC dial target of a process endpoint URL (http://host:port or unix://host/path)."""
    url = urlparse(endpoint)
    if url.scheme == "unix":
        return f"unix:{url.path}"
    port = url.port or (443 if url.scheme == "https" else 80)
    return f"{url.hostname}:{port}"
