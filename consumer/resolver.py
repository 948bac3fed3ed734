"""`Resolver`: a shard ID to its spec, route and local primary (Gazette's `consumer/resolver.go`).

Applications use it for their own APIs (and the Shard gRPC API will): `resolve(shard_id)` answers
from the service's keyspace mirror, after waiting for a minimum etcd revision when asked (a
request's ProxyHeader, or `min_revision`), with a status of Gazette's:

- `SHARD_NOT_FOUND`: no spec for the shard;
- `NO_SHARD_PRIMARY`: the shard has no slot-0 assignment;
- `NOT_SHARD_PRIMARY`: the primary is another process and the caller may not proxy;
- `OK`: otherwise. When this process is the primary, the resolution waits until its store is
  ready and it has read through `read_through` (offsets of its source journals; others are
  ignored), then carries the local `shard` and `store`, held in use until `done()` is called.
  A primary that stops (closed, demoted, FAILED) before that resolves as `SHARD_STOPPED`.

A non-OK status's header names this process (it authored the answer); an OK one names the primary.
After the service stops, local resolutions fail with `ResolverStopped`; remote routes still resolve.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker.protocol import pb as bpb
from consumer.errors import ConsumerError
from consumer.protocol import pb as cpb

if TYPE_CHECKING:
    from cluster.keyspace import KeySpace
    from consumer.replica import Replica
    from consumer.store import Store

Status = cpb.Status

MISSING_MEMBER = ("local ConsumerSpec", "missing from Etcd")
"""The process ID a header carries when this member's key is gone (Gazette's placeholder)."""


class ResolverError(ConsumerError):
    """A resolution that cannot be answered with a status."""


class ResolverStopped(ResolverError):
    """The service stopped serving local shards (Gazette's ErrResolverStopped)."""

    def __init__(self) -> None:
        super().__init__("resolver has stopped serving local shards")


def _noop() -> None:
    pass


@dataclass
class Resolution:
    """The answer of `Resolver.resolve`."""

    status: int
    header: bpb.Header
    spec: cpb.ShardSpec | None = None
    shard: Replica | None = None
    """The local primary replica, when `status` is OK and it is served here."""
    store: Store | None = None
    done: Callable[[], None] = field(default=_noop)
    """Release the local shard and store (call it once finished with them)."""

    @property
    def local(self) -> bool:
        return self.shard is not None


class Resolver:
    """Resolves shards against a consumer member's keyspace mirror and its replicas: `member_id` is
    the member's (zone, suffix), `replicas` its live map of shard ID to Replica (the service's own,
    updated in place)."""

    def __init__(self, keyspace: KeySpace, member_id: tuple[str, str], replicas: Mapping[str, Replica]) -> None:
        self._keyspace = keyspace
        self._member_id = member_id
        self._replicas = replicas
        self._stopped = False

    def stop(self) -> None:
        """Local resolutions fail from now on (ResolverStopped)."""
        self._stopped = True

    @property
    def stopped(self) -> bool:
        return self._stopped

    def _process_id(self) -> bpb.ProcessSpec.ID:
        keyspace = self._keyspace
        zone, suffix = self._member_id
        if (zone, suffix) not in keyspace.members:
            zone, suffix = MISSING_MEMBER
        return bpb.ProcessSpec.ID(zone=zone, suffix=suffix)

    async def resolve(
        self,
        shard_id: str,
        *,
        may_proxy: bool = False,
        proxy_header: bpb.Header | None = None,
        read_through: Mapping[str, int] | None = None,
        min_revision: int = 0,
    ) -> Resolution:
        """Resolve `shard_id` (see the module's doc)."""
        keyspace = self._keyspace
        if proxy_header is not None:
            ours = keyspace.etcd_header()
            if proxy_header.etcd.cluster_id != ours.cluster_id:
                raise ResolverError(
                    f"request Etcd ClusterId doesn't match our own ({proxy_header.etcd.cluster_id} vs "
                    f"{ours.cluster_id})"
                )
            pid = proxy_header.process_id
            if (pid.zone or pid.suffix) and (pid.zone, pid.suffix) != self._member_id:
                local = self._process_id()
                raise ResolverError(
                    f"request ProcessId doesn't match our own ({pid.zone}#{pid.suffix} vs "
                    f"{local.zone}#{local.suffix})"
                )
            min_revision = max(min_revision, proxy_header.etcd.revision)
        if min_revision > keyspace.revision:
            await keyspace.wait_for_revision(min_revision)

        local_id = self._process_id()
        item = keyspace.items.get(shard_id)
        route = keyspace.route(shard_id)
        header = bpb.Header(route=route, etcd=keyspace.etcd_header())
        primary: bpb.ProcessSpec.ID | None = None
        if 0 <= route.primary < len(route.members):
            primary = route.members[route.primary]
            header.process_id.CopyFrom(primary)

        spec = item.spec if item is not None else None
        if spec is None:
            status = Status.SHARD_NOT_FOUND
        elif primary is None:
            status = Status.NO_SHARD_PRIMARY
        elif not may_proxy and (primary.zone, primary.suffix) != self._member_id:
            status = Status.NOT_SHARD_PRIMARY
        else:
            status = Status.OK
        if status != Status.OK:
            header.process_id.CopyFrom(local_id)
            return Resolution(status, header, spec)

        assert primary is not None
        if (primary.zone, primary.suffix) != self._member_id:
            return Resolution(status, header, spec)  # A remote primary: the caller proxies.

        if self._stopped:
            raise ResolverStopped()
        replica = self._replicas.get(shard_id)
        if replica is None or not replica.is_primary:
            # The keyspace says so, but the replica has not caught up: it will momentarily.
            return Resolution(Status.SHARD_STOPPED, header, spec)
        if not await _ready(replica):
            return Resolution(Status.SHARD_STOPPED, header, spec)
        sources = {s.journal for s in replica.spec.sources}
        targets = {j: o for j, o in (read_through or {}).items() if j in sources and o}
        if not await _read_through(replica, targets):
            return Resolution(Status.SHARD_STOPPED, header, spec)
        if self._stopped:
            raise ResolverStopped()
        return Resolution(Status.OK, header, replica.spec, replica, replica.store, replica.acquire())

    def shards_with_source(self, journal: str) -> list[cpb.ShardSpec]:
        """Specs of the shards that read `journal`, in shard ID order."""
        items = self._keyspace.items
        return [
            items[shard_id].spec
            for shard_id in sorted(items)
            if any(s.journal == journal for s in items[shard_id].spec.sources)
        ]


async def _first(*aws: Any) -> set[asyncio.Future[Any]]:
    futures = [asyncio.ensure_future(a) for a in aws]
    try:
        done, _ = await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
        return done
    finally:
        for f in futures:
            f.cancel()


async def _ready(replica: Replica) -> bool:
    """Wait until the replica's store is ready (True), or it stops first (False)."""
    ready, stopped = replica.store_ready, replica.done
    if not ready.is_set() and not stopped.is_set():
        await _first(ready.wait(), stopped.wait())
    return ready.is_set() and not stopped.is_set()


async def _read_through(replica: Replica, targets: Mapping[str, int]) -> bool:
    """Wait until the replica read through `targets` (True), or it stops first (False)."""
    progress, stopped = replica.progress, replica.done
    while any(progress.read_through.get(j, 0) < o for j, o in targets.items()):
        if stopped.is_set():
            return False
        await _first(asyncio.shield(progress.signal), stopped.wait())
    return not stopped.is_set()


__all__ = ["MISSING_MEMBER", "Resolution", "Resolver", "ResolverError", "ResolverStopped"]
