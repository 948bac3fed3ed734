"""What the read and append responses share: Gazette's header names, the headers that describe
a journal's route (`X-Route-Token`, `Location`), and gRPC errors in grpc-go's words."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from urllib.parse import quote

import grpc

from broker.fragment.names import go_join
from broker.protocol import pb
from broker.protocol.paths import URLError, parse_url
from broker.protocol.rpc_errors import rpc_error_text as go_error_text
from broker.protocol.textformat import quote_bytes

ROUTE_TOKEN_HEADER = "X-Route-Token"
FRAGMENT_NAME_HEADER = "X-Fragment-Name"
FRAGMENT_LAST_MODIFIED_HEADER = "X-Fragment-Last-Modified"
FRAGMENT_LOCATION_HEADER = "X-Fragment-Location"
WRITE_HEAD_HEADER = "X-Write-Head"
CLOSE_ERROR_HEADER = "X-Close-Error"
COMMIT_BEGIN_HEADER = "X-Commit-Begin"
COMMIT_END_HEADER = "X-Commit-End"
COMMIT_SUM_HEADER = "X-Commit-Sha1-Sum"  # Go's canonical spelling of X-Commit-SHA1-Sum.
REGISTERS_HEADER = "X-Registers"
"""The journal's registers after a PUT's commit, in compact text form; absent when it has none.
This project's own (Gazette's gateway does not report registers); the client library reads it."""

Headers = list[tuple[str, str]]
EndpointOf = Callable[[pb.ProcessSpec.ID], str | None]
"""The endpoint of a route member, for routes that carry no endpoints."""


def route_headers(route: pb.Route, path: str, endpoint_of: EndpointOf | None) -> Headers:
    """X-Route-Token, and Location (the primary's endpoint joined with `path`)."""
    if not route.members:
        return []
    endpoint: str | None = None
    if 0 <= route.primary < len(route.members):
        if route.primary < len(route.endpoints):
            endpoint = route.endpoints[route.primary]
        elif endpoint_of is not None:
            endpoint = endpoint_of(route.members[route.primary])
    return list(_route_headers(route.SerializeToString(), endpoint, path))


@functools.lru_cache(maxsize=1024)
def _route_headers(route: bytes, endpoint: str | None, path: str) -> tuple[tuple[str, str], ...]:
    """`route_headers` of a serialized route and its primary's endpoint (remembered: every PUT and
    read of a journal answers the same ones while its route holds)."""
    headers = [(ROUTE_TOKEN_HEADER, route_token(pb.Route.FromString(route)))]
    location = _location(endpoint, path) if endpoint else None
    if location is not None:
        headers.append(("Location", location))
    return tuple(headers)


def route_token(route: pb.Route) -> str:
    """The Route in protobuf compact text form, as Go's `proto.CompactTextString`."""
    parts: list[str] = []
    for member in route.members:
        fields = ""
        if member.zone:
            fields += f"zone:{_text_string(member.zone)} "
        if member.suffix:
            fields += f"suffix:{_text_string(member.suffix)} "
        parts.append(f"members:<{fields}> ")
    if route.primary:
        parts.append(f"primary:{route.primary} ")
    for endpoint in route.endpoints:
        parts.append(f"endpoints:{_text_string(endpoint)} ")
    return "".join(parts)


def registers_token(registers: pb.LabelSet) -> str:
    """A LabelSet in protobuf compact text form, as `route_token` writes a Route."""
    return "".join(
        f"labels:<name:{_text_string(label.name)} value:{_text_string(label.value)} > " for label in registers.labels
    )


def _text_string(s: str) -> str:
    # Byte-wise, as Go's text marshaler (broker/protocol/textformat.py).
    return quote_bytes(s.encode("utf-8", "surrogateescape"))


def _location(endpoint: str, path: str) -> str | None:
    """The endpoint URL with `path` joined onto its path, as Go's `path.Join` and `URL.String`."""
    try:
        url = parse_url(endpoint)
    except URLError:
        return None
    _, sep, rest = endpoint.partition("://")
    if not sep or not url.scheme:
        return None
    authority = re.match(r"[^/?#]*", rest)
    assert authority is not None
    suffix = re.search(r"[?#].*", rest[authority.end() :])
    joined = go_join(url.path, path)
    escaped = quote(joined.encode("utf-8", "surrogateescape"), safe="/$&+,:;=@")
    return f"{url.scheme}://{authority.group(0)}{escaped}{suffix.group(0) if suffix else ''}"


def rpc_error_status(err: grpc.aio.AioRpcError) -> int:
    """The HTTP status of a failed call: 401 for a token that is missing, does not verify or does
    not grant the call (UNAUTHENTICATED), 503 where a retry can succeed (a peer gone, a deadline),
    else 500 as Gazette's gateway answers every RPC error."""
    code = err.code()
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return 401
    return 503 if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) else 500


def rpc_error_text(err: grpc.aio.AioRpcError) -> str:
    """The text of a gRPC error as Go's grpc-go formats it (broker.protocol.rpc_errors)."""
    return go_error_text(err.code(), err.details() or "")
