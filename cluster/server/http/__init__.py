"""The HTTP/1.1 server of a serving process, broker or consumer: the connections OnePortListener
hands over (and a `--debug.port` of their own), answered as Go's net/http answers.

- `server`: `HttpServer`, the listener's HTTP handler: bad targets, redirects, `/debug/ready` and
  `/debug/metrics`, CORS, a `RouteTable`'s routes, then `serve_unrouted` (a 404; the broker's
  `broker.gateway.HttpGateway` serves journals there); `DebugConfig` (`--debug.port`, `--debug.private`).
- `routes`: `RouteTable`, `HttpRequest`, `HttpResponse`: the routes a process adds (a consumer
  application's).
- `connection`: one connection: its request loop, backpressure and response writing.
- `codec`: its HTTP/1.1 framing: plain requests on httptools and the codec's own framing, any
  other request (malformed, HTTP/1.0, chunked, ...) on h11 from its first byte.
- `request`: the request target's path and query, decoded as Go's net/http and net/url.
- `sniff`: the `Content-Type` Go's net/http sniffs for a response that sets none.
"""

from cluster.server.http.routes import HttpHandler, HttpRequest, HttpResponse, RouteError, RouteTable
from cluster.server.http.server import DebugConfig, HttpServer

__all__ = ["DebugConfig", "HttpHandler", "HttpRequest", "HttpResponse", "HttpServer", "RouteError", "RouteTable"]
