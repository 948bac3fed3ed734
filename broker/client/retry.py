"""Backoff between retries, and what is never retried: shared by RetryReader, AppendService and
the journal watcher."""

from __future__ import annotations

import random

import grpc

BASE_BACKOFF = 0.05
DEFAULT_MAX_BACKOFF = 2.0


def backoff(attempt: int, cap: float = DEFAULT_MAX_BACKOFF) -> float:
    """Seconds to wait before retry number `attempt` (0-based): 50 ms doubling up to `cap`, +-10% jitter.

    The short first steps suit the common case, a cluster converging on new assignments within a
    few etcd watch delays; the cap bounds how late a restarted broker is noticed.
    """
    delay = min(cap, BASE_BACKOFF * (2 ** min(attempt, 16)))
    return delay * random.uniform(0.9, 1.1)


FATAL_CODES = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
})
"""gRPC codes a retry cannot fix (a token refused, a request the broker rejects): the call fails.
Every other transport failure is retried."""
