"""The broker's Prometheus metrics, registered in prometheus_client's default registry.

`/debug/metrics` of the HTTP gateway exposes them (with `gazette_http_requests_total`, which
`cluster.server.http.connection` counts for the broker and the consumer alike).
"""

from __future__ import annotations

import functools

from prometheus_client import Counter

APPEND_BYTES = Counter("gazette_append_bytes_total", "Bytes committed by Append RPCs, by journal.", ["journal"])
APPEND_REQUESTS = Counter("gazette_append_requests_total", "Append RPCs that committed, by journal.", ["journal"])
READ_BYTES = Counter("gazette_read_bytes_total", "Content bytes served by Read RPCs, by journal.", ["journal"])
READ_REQUESTS = Counter("gazette_read_requests_total", "Read RPCs started, by journal.", ["journal"])
FRAGMENTS_PERSISTED = Counter(
    "gazette_fragments_persisted_total", "Fragments persisted to a fragment store, by journal.", ["journal"]
)
FRAGMENT_PERSISTED_BYTES = Counter(
    "gazette_fragment_persisted_bytes_total",
    "Journal bytes of fragments persisted to a fragment store, by journal.",
    ["journal"],
)


@functools.lru_cache(maxsize=4096)
def append_counters(journal: str) -> tuple[Counter, Counter]:
    """APPEND_REQUESTS and APPEND_BYTES of `journal` (remembered: `labels()` costs a lock and a
    lookup, and every append counts)."""
    return APPEND_REQUESTS.labels(journal), APPEND_BYTES.labels(journal)
