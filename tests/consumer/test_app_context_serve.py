"""AppContext.serve's proxy semantics, against a scripted resolver and keyspace: local or proxied,
never proxied twice, and resolved again (once the shard's route changes) when the primary stops
serving it, is unreachable, or the shard has no primary yet; until the timeout."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from broker.protocol import pb as bpb
from cluster.server.http.routes import RouteTable
from consumer.app_api import AppContext, PeerUnavailable, ShardUnavailable
from consumer.protocol import pb as cpb
from consumer.resolver import Resolution, ResolverStopped


def route(*members: str, primary: int = 0) -> bpb.Route:
    r = bpb.Route(primary=primary)
    for m in members:
        r.members.add(zone="local", suffix=m)
        r.endpoints.append(f"http://{m}:8080")
    return r


class Keyspace:
    def __init__(self, current: bpb.Route) -> None:
        self.current = current
        self.changes: list[bpb.Route] = []
        """Routes the shard takes, one per wait for a change."""

    def route(self, shard: str) -> bpb.Route:
        return self.current

    async def wait_for_change_within(self, timeout: float) -> None:
        if self.changes:
            await asyncio.sleep(0)
            self.current = self.changes.pop(0)
        else:
            await asyncio.sleep(timeout)


class Resolver:
    def __init__(self, keyspace: Keyspace, script: list[Any]) -> None:
        self.keyspace, self.script = keyspace, script
        self.calls: list[dict[str, Any]] = []

    async def resolve(self, shard_id: str, **kwargs: Any) -> Resolution:
        self.calls.append(kwargs)
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        status, local = step
        header = bpb.Header(route=self.keyspace.current)
        res = Resolution(status, header)
        if local:
            res.shard = object()  # type: ignore[assignment]
            res.done = self.release
        return res

    released = 0

    def release(self) -> None:
        self.released += 1


class Service:
    def __init__(self, keyspace: Keyspace, resolver: Resolver) -> None:
        self.keyspace, self.resolver, self.member_id = keyspace, resolver, ("local", "me")


def context(script: list[Any], changes: int = 0) -> tuple[AppContext, Resolver, Keyspace]:
    keyspace = Keyspace(route("peer", "me"))
    keyspace.changes = [route("me", f"peer{i}") for i in range(changes)]
    resolver = Resolver(keyspace, script)
    ctx = AppContext(server=None, routes=RouteTable(), service=Service(keyspace, resolver),  # type: ignore[arg-type]
                     journal_client=None)  # type: ignore[arg-type]
    return ctx, resolver, keyspace


def unavailable() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                details="the peer is exiting")


def handlers(proxy_errors: list[BaseException]) -> tuple[Callable[..., Any], Callable[..., Any], list[str]]:
    seen: list[str] = []

    async def local(res: Resolution) -> str:
        seen.append("local")
        return "local"

    async def proxy(res: Resolution) -> str:
        seen.append("proxy")
        if proxy_errors:
            raise proxy_errors.pop(0)
        return "proxied"

    return local, proxy, seen


async def test_local_and_proxied() -> None:
    ctx, resolver, _ = context([(cpb.OK, True), (cpb.OK, False)])
    local, proxy, seen = handlers([])
    assert await ctx.serve("s", local=local, proxy=proxy) == "local"
    assert resolver.released == 1, "the local shard is released"
    assert await ctx.serve("s", local=local, proxy=proxy) == "proxied"
    assert seen == ["local", "proxy"]
    assert [c["may_proxy"] for c in resolver.calls] == [True, True]


async def test_an_unavailable_peer_is_resolved_again_once_the_route_changes() -> None:
    ctx, resolver, keyspace = context([(cpb.OK, False), (cpb.OK, True)], changes=1)
    local, proxy, seen = handlers([unavailable()])
    assert await ctx.serve("s", local=local, proxy=proxy) == "local"
    assert seen == ["proxy", "local"] and keyspace.current == route("me", "peer0")
    assert resolver.released == 1 and len(resolver.calls) == 2

    ctx, _resolver, keyspace = context([(cpb.OK, False), (cpb.OK, False)], changes=1)
    local, proxy, seen = handlers([PeerUnavailable("503")])
    assert await ctx.serve("s", local=local, proxy=proxy) == "proxied"


@pytest.mark.parametrize("status", [cpb.SHARD_STOPPED, cpb.NOT_SHARD_PRIMARY, cpb.NO_SHARD_PRIMARY])
async def test_a_stopped_or_missing_primary_is_resolved_again(status: int) -> None:
    ctx, resolver, _ = context([(status, False), (cpb.OK, False)], changes=1)
    local, proxy, _seen = handlers([])
    assert await ctx.serve("s", local=local, proxy=proxy) == "proxied"
    assert len(resolver.calls) == 2


async def test_a_proxied_request_is_never_proxied_again_nor_retried() -> None:
    header = bpb.Header()
    ctx, resolver, _ = context([(cpb.NOT_SHARD_PRIMARY, False)], changes=1)
    local, proxy, seen = handlers([])
    with pytest.raises(ShardUnavailable) as err:
        await ctx.serve("s", local=local, proxy=proxy, proxy_header=header)
    assert str(err.value) == "shard s: NOT_SHARD_PRIMARY" and err.value.grpc_code == grpc.StatusCode.UNAVAILABLE
    assert resolver.calls == [{"may_proxy": False, "proxy_header": header, "read_through": None}]
    assert seen == []


async def test_not_found_is_final() -> None:
    ctx, _, _ = context([(cpb.SHARD_NOT_FOUND, False)], changes=1)
    local, proxy, _ = handlers([])
    with pytest.raises(ShardUnavailable) as err:
        await ctx.serve("s", local=local, proxy=proxy)
    assert (err.value.http_status, err.value.grpc_code) == (404, grpc.StatusCode.NOT_FOUND)


async def test_gives_up_at_the_timeout() -> None:
    ctx, _resolver, _ = context([(cpb.OK, False)])
    local, proxy, _ = handlers([unavailable()])
    with pytest.raises(ShardUnavailable) as err:
        await ctx.serve("s", local=local, proxy=proxy, timeout=0.05)
    assert str(err.value) == "shard s: SHARD_STOPPED (proxying to http://peer:8080: the peer is exiting)"
    assert err.value.http_status == 503

    ctx, _, _ = context([(cpb.NO_SHARD_PRIMARY, False)])
    with pytest.raises(ShardUnavailable, match="NO_SHARD_PRIMARY"):
        await ctx.serve("s", local=local, proxy=proxy, timeout=0.05)


async def test_other_proxy_errors_propagate_and_a_stopped_resolver_is_unavailable() -> None:
    denied = grpc.aio.AioRpcError(grpc.StatusCode.PERMISSION_DENIED, grpc.aio.Metadata(), grpc.aio.Metadata())
    ctx, _, _ = context([(cpb.OK, False)], changes=1)
    local, proxy, _ = handlers([denied])
    with pytest.raises(grpc.aio.AioRpcError):
        await ctx.serve("s", local=local, proxy=proxy)

    ctx, _, _ = context([ResolverStopped()])
    with pytest.raises(ShardUnavailable, match=r"SHARD_STOPPED .*the consumer is stopping"):
        await ctx.serve("s", local=local, proxy=proxy)
