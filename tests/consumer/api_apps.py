"""Applications with APIs ("Building APIs") that `gazette consume` loads in tests.

`app` (`tests.consumer.api_apps:app`) is the counting app of `cli_apps` (its SQLite file from
$GAZETTE_TEST_COUNTS_DB) plus an `init_application` that registers, on the consumer's port:

- a gRPC method `/test.ShardInfo/Who` (raw bytes: the request is a shard ID, the response JSON
  `{"served_by": member, "shard": id, "proxied": bool, "read_through": {...}}`), answered by the
  shard's primary: a member that is not proxies it there with `AppContext.serve`, carrying the
  resolution's header in the `x-proxy-header` metadata (base64 of the protocol.Header);
- HTTP routes: `GET /api/who?shard=ID` (the same, through the gRPC method when proxied),
  `GET /api/who-http?shard=ID` (the same, proxied over HTTP with `AppContext.proxy_http`),
  `GET|POST /api/echo/*` (the request, as JSON), `GET /api/boom` (raises), `GET /api/bad-status`
  (returns status 99), `GET /api/bad-header` (returns a header name with a space).

`failing_init` is an app whose `init_application` raises; `sync_init` one whose
`init_application` is not a coroutine function.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import grpc

from broker.protocol import pb as bpb
from cluster.server.http.routes import HttpRequest, HttpResponse
from consumer.app_api import AppContext, ShardUnavailable, proxy_header_of
from consumer.resolver import Resolution
from tests.support.cli_apps import EnvCountingApp

WHO_METHOD = "/test.ShardInfo/Who"
PROXY_HEADER = "x-proxy-header"


def _identity(data: bytes) -> bytes:
    return data


class ApiApp(EnvCountingApp):
    def __init__(self) -> None:
        super().__init__()
        self.ctx: AppContext | None = None

    async def init_application(self, ctx: AppContext) -> None:
        self.ctx = ctx
        handler = grpc.unary_unary_rpc_method_handler(
            self._grpc_who, request_deserializer=_identity, response_serializer=_identity
        )
        ctx.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("test.ShardInfo", {"Who": handler}),)
        )
        ctx.add_route("GET", "/api/who", self._http_who)
        ctx.add_route("GET", "/api/who-http", self._http_who_http)
        ctx.add_route("GET", "/api/echo/*", self._echo)
        ctx.add_route("POST", "/api/echo/*", self._echo)
        ctx.add_route("GET", "/api/boom", self._boom)
        ctx.add_route("GET", "/api/bad-status", self._bad_status)
        ctx.add_route("GET", "/api/bad-header", self._bad_header)

    async def who(self, shard: str, header: bpb.Header | None) -> dict[str, Any]:
        ctx = self.ctx
        assert ctx is not None
        member = ctx.service.member_id[1]

        async def local(res: Resolution) -> dict[str, Any]:
            assert res.shard is not None and res.store is not None
            return {"served_by": member, "shard": shard, "proxied": header is not None,
                    "read_through": dict(res.shard.progress.read_through)}

        async def proxy(res: Resolution) -> dict[str, Any]:
            call = ctx.channel_to(res).unary_unary(WHO_METHOD, request_serializer=_identity,
                                                    response_deserializer=_identity)
            metadata = ((PROXY_HEADER, base64.b64encode(res.header.SerializeToString()).decode()),)
            reply: bytes = await call(shard.encode(), metadata=metadata, timeout=10.0)
            out: dict[str, Any] = json.loads(reply)
            return out

        return await ctx.serve(shard, local=local, proxy=proxy, proxy_header=header, timeout=10.0)

    async def _grpc_who(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        header = None
        for key, value in context.invocation_metadata() or ():
            if key == PROXY_HEADER:
                header = bpb.Header()
                header.ParseFromString(base64.b64decode(value))
        try:
            return json.dumps(await self.who(request.decode(), header)).encode()
        except ShardUnavailable as exc:
            await context.abort(exc.grpc_code, str(exc))
            raise AssertionError("unreachable") from None

    async def _http_who(self, request: HttpRequest) -> HttpResponse:
        try:
            return HttpResponse.json(await self.who(request.param("shard", "") or "", None))
        except ShardUnavailable as exc:
            return HttpResponse.text(f"{exc}\n", exc.http_status)

    async def _http_who_http(self, request: HttpRequest) -> HttpResponse:
        """As /api/who, proxied over HTTP (AppContext.proxy_http) rather than gRPC."""
        ctx = self.ctx
        assert ctx is not None
        shard = request.param("shard", "") or ""
        try:
            header = proxy_header_of(request)
        except ValueError as exc:
            return HttpResponse.text(f"{exc}\n", 400)

        async def local(res: Resolution) -> HttpResponse:
            return HttpResponse.json({"served_by": ctx.service.member_id[1], "shard": shard,
                                      "proxied": header is not None, "x-test": request.header("x-test")})

        async def proxy(res: Resolution) -> HttpResponse:
            return await ctx.proxy_http(res, request, timeout=10.0)

        try:
            return await ctx.serve(shard, local=local, proxy=proxy, proxy_header=header, timeout=10.0)
        except ShardUnavailable as exc:
            return HttpResponse.text(f"{exc}\n", exc.http_status)

    async def _echo(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse.json({
            "method": request.method, "path": request.path, "query": dict(request.query),
            "body": request.body.decode(), "x-test": request.header("X-Test"),
        }, headers=[("X-Echo", "yes")])

    async def _boom(self, request: HttpRequest) -> HttpResponse:
        raise RuntimeError("boom")

    async def _bad_status(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(status=99)

    async def _bad_header(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(headers=[("Bad Name", "x")])


app = ApiApp()


class FailingInit(EnvCountingApp):
    async def init_application(self, ctx: AppContext) -> None:
        raise RuntimeError("no configuration for this application")


failing_init = FailingInit()


class SyncInit(EnvCountingApp):
    def init_application(self, ctx: AppContext) -> None:
        pass


sync_init = SyncInit()
