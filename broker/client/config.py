"""The broker a client dials: its address and the gRPC target of that address.

The address is the first of: the one given, the `BROKER_ADDRESS` environment variable, and
`http://localhost:8080`. (gazctl also reads its INI files between the variable and the default:
see `gazctl.config`.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from broker.errors import ConfigError

DEFAULT_BROKER_ADDRESS = "http://localhost:8080"
BROKER_ADDRESS_ENV = "BROKER_ADDRESS"


def resolve_broker_address(address: str | None, env: Mapping[str, str] | None = None) -> str:
    """Return `address`, else `$BROKER_ADDRESS`, else the default."""
    env = os.environ if env is None else env
    return address or env.get(BROKER_ADDRESS_ENV) or DEFAULT_BROKER_ADDRESS


@dataclass(frozen=True)
class DialTarget:
    """Where to dial a broker: its URL, gRPC target (`host:port` or `unix:///path`), and whether to use TLS."""

    address: str
    target: str
    tls: bool


def dial_target(address: str) -> DialTarget:
    """Map a broker URL to its gRPC target: `http://host:port` -> `host:port` (http defaults to port 80).

    `https://` dials with TLS (default port 443), and `unix://host/abs/path` dials the socket path.
    """
    try:
        url = urlsplit(address)
        port = url.port
    except ValueError as err:
        raise ConfigError(f"invalid broker address {address!r}: {err}") from None
    scheme = url.scheme.lower()
    if scheme == "unix":
        if not url.path.startswith("/"):
            raise ConfigError(f"invalid broker address {address!r}: expected unix://host/absolute/path")
        return DialTarget(address, f"unix://{url.path}", tls=False)
    if scheme not in ("http", "https") or not url.hostname:
        raise ConfigError(
            f"invalid broker address {address!r}: expected a URL such as http://host:port, "
            "https://host:port or unix://host/path"
        )
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    default_port = 443 if scheme == "https" else 80
    return DialTarget(address, f"{host}:{port or default_port}", tls=scheme == "https")
