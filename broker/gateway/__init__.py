"""HTTP/1.1 gateway to the Journal service: GET and HEAD read a journal, PUT appends to it.

A port of Gazette's `http_gateway`, serving the connections that OnePortListener hands
over. Requests become Read and Append RPCs on the broker's own gRPC service (over its internal
unix socket), so the broker routes and proxies them as it would a client's; responses carry the
same statuses, headers, bodies and `X-Close-Error` trailer as Gazette's. `/debug/ready` and
`/debug/metrics` are served here too.

- `routes`: `HttpGateway`, the listener's HTTP handler: takes connections over and routes each
  request to the debug endpoints, `read` or `append`.
- `connection`: one connection: its request loop, backpressure and response writing.
- `codec`: its HTTP/1.1 framing: plain requests on httptools and the codec's own framing, any
  other request (malformed, HTTP/1.0, chunked, ...) on h11 from its first byte.
- `request`: the request target's path and query, decoded as Go's net/http and gorilla/schema.
- `read`: GET and HEAD, relayed from a Read RPC.
- `append`: PUT, relayed into an Append RPC.
- `responses`: Gazette's header names, the route headers (`route_token`, `Location`) and
  grpc-go's error text, shared by `read` and `append`.
"""

from broker.gateway.responses import (
    CLOSE_ERROR_HEADER,
    COMMIT_BEGIN_HEADER,
    COMMIT_END_HEADER,
    COMMIT_SUM_HEADER,
    FRAGMENT_LAST_MODIFIED_HEADER,
    FRAGMENT_LOCATION_HEADER,
    FRAGMENT_NAME_HEADER,
    ROUTE_TOKEN_HEADER,
    WRITE_HEAD_HEADER,
    EndpointOf,
    route_token,
)
from broker.gateway.routes import DebugConfig, HttpGateway

__all__ = [
    "CLOSE_ERROR_HEADER",
    "COMMIT_BEGIN_HEADER",
    "COMMIT_END_HEADER",
    "COMMIT_SUM_HEADER",
    "FRAGMENT_LAST_MODIFIED_HEADER",
    "FRAGMENT_LOCATION_HEADER",
    "FRAGMENT_NAME_HEADER",
    "ROUTE_TOKEN_HEADER",
    "WRITE_HEAD_HEADER",
    "DebugConfig",
    "EndpointOf",
    "HttpGateway",
    "route_token",
]
