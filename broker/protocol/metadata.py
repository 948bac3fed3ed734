"""gRPC metadata of this implementation's Append RPC: the broker's word that it began an append.

A stopping grpcio server fails the calls it had accepted but not yet handed to a handler: their
clients see CANCELLED, or UNAVAILABLE once the server's GOAWAY closed the connection, with no
response headers, although the broker never looked at them (a grpc-go server, as Gazette's, runs
every call it accepted). A broker here therefore sends APPEND_BEGUN as its initial metadata
before it reads an Append's first request, when the call asks for it with WANT_APPEND_BEGUN (this
project's clients and proxying brokers do; Gazette's clients do not, and are spared the extra
send). Its frames reach the client before any later frame of the connection (the stream's
reset, the GOAWAY), so an Append that asked for it and failed that way without it was never
begun: nothing of it was committed, and retrying cannot write it twice.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc

APPEND_BEGUN_KEY = "gazette-append-begun"
APPEND_BEGUN: tuple[tuple[str, str], ...] = ((APPEND_BEGUN_KEY, "1"),)
WANT_APPEND_BEGUN_KEY = "gazette-want-append-begun"
WANT_APPEND_BEGUN: tuple[tuple[str, str], ...] = ((WANT_APPEND_BEGUN_KEY, "1"),)
"""Request metadata of an Append whose client tells a never-begun append by APPEND_BEGUN's absence."""


def wants_append_begun(invocation_metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
    """Whether an Append's caller asked for APPEND_BEGUN (see WANT_APPEND_BEGUN)."""
    return any(key == WANT_APPEND_BEGUN_KEY for key, _value in invocation_metadata or ())


def never_begun(
    code: grpc.StatusCode | None, details: str | None, initial_metadata: Iterable[tuple[str, str | bytes]] | None
) -> bool:
    """Whether an Append that failed with `code` and `details`, having received `initial_metadata`,
    was certainly never begun by its broker (so that nothing of it was committed)."""
    cut_by_stop = code == grpc.StatusCode.CANCELLED or (
        code == grpc.StatusCode.UNAVAILABLE and "GOAWAY received" in (details or "")
    )
    return cut_by_stop and not any(key == APPEND_BEGUN_KEY for key, _value in initial_metadata or ())
