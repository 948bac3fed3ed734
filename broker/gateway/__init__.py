"""HTTP/1.1 gateway to the Journal service: GET and HEAD read a journal, PUT appends to it.

A port of Gazette's `http_gateway`, serving the connections that OnePortListener hands
over. Requests become Read and Append RPCs on the broker's own Journal service (in-process,
`local`), so the broker routes and proxies them as it would a client's; responses carry the
same statuses, headers, bodies and `X-Close-Error` trailer as Gazette's. The HTTP server it
builds on (connections, framing, target decoding, `/debug/ready` and `/debug/metrics`, CORS,
added routes) is `cluster.server.http`, which the consumer serves too.

- `routes`: `HttpGateway`, the broker's HTTP server: a request no route matched goes to `read`
  or `append`, with its `Authorization` passed on.
- `request`: the journal a path names, and gorilla/schema's text for bad parameters.
- `read`: GET and HEAD, relayed from a Read RPC.
- `append`: PUT, relayed into an Append RPC.
- `local`: the broker's service called in-process, in a stub's shape.
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
from broker.gateway.routes import HttpGateway

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
    "EndpointOf",
    "HttpGateway",
    "route_token",
]
