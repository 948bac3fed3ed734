"""Resolves a journal to its route and this broker's role in it, from the etcd mirror.

The resolver also owns this broker's replicas: one for every journal the keyspace
assigns to it, created and torn down as assignments change.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from broker.pipeline import routes_equivalent, same_id
from broker.protocol import pb
from broker.protocol.auth import Claims
from broker.protocol.labels import journal_label_set
from broker.protocol.paths import journal_of
from broker.replica import Replica
from cluster.keyspace import KeySpace

log = logging.getLogger(__name__)

ReplicaFactory = Callable[[str, pb.JournalSpec], Replica]


@dataclass
class Resolution:
    """A journal's resolution at an etcd revision."""

    status: int
    header: pb.Header
    spec: pb.JournalSpec | None = None
    replica: Replica | None = None
    mod_revision: int = 0

    @property
    def route(self) -> pb.Route:
        return self.header.route


class Resolver:
    """Maps journals to Resolutions and keeps the local replica set in line with assignments."""

    def __init__(self, keyspace: KeySpace, local_id: pb.ProcessSpec.ID, new_replica: ReplicaFactory) -> None:
        self.keyspace = keyspace
        self.local_id = local_id
        self._new_replica = new_replica
        self.replicas: dict[str, Replica] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._closing_pipelines: set[str] = set()  # Journals whose stale pipeline is being closed.
        self.stopped = False

    def header(self, route: pb.Route | None = None, process_id: pb.ProcessSpec.ID | None = None) -> pb.Header:
        header = pb.Header(process_id=process_id or self.local_id, etcd=self.keyspace.etcd_header())
        if route is None:
            header.route.primary = -1
        else:
            header.route.CopyFrom(route)
        return header

    def update_replicas(self) -> None:
        """Create replicas for newly assigned journals; close those no longer assigned."""
        if self.stopped:
            return
        assigned: set[str] = set()
        for name, item in self.keyspace.journals.items():
            route = self.keyspace.route(name)
            if any(same_id(m, self.local_id) for m in route.members):
                assigned.add(name)
                replica = self.replicas.get(name)
                if replica is None:
                    replica = self._new_replica(name, item.spec)
                    self.replicas[name] = replica
                    log.info("journal assigned", extra={"journal": name})
                else:
                    replica.update_spec(item.spec)
                    replica.preempt_stale_stream(route, self._is_member)
                    stale = replica.pipeline is not None and not routes_equivalent(replica.pipeline.route, route)
                    if stale:
                        self._break_pipeline_to_the_departed(replica)
                    if stale and name not in self._closing_pipelines:
                        self._closing_pipelines.add(name)
                        self._background(self._close_stale_pipeline(name, replica))
        for name in list(self.replicas):
            if name not in assigned:
                replica = self.replicas.pop(name)
                log.info("journal unassigned", extra={"journal": name})
                self._background(replica.retire())

    def _break_pipeline_to_the_departed(self, replica: Replica) -> None:
        """Break the replica's pipeline if a peer of it holds no member key (its lease expired, as
        when a partition cut it off): an append waiting on that peer would wait out the peer timeout."""
        pipeline = replica.pipeline
        assert pipeline is not None
        for member in pipeline.route.members:
            if not same_id(member, self.local_id) and not self._is_member(member):
                pipeline.break_off(f"peer {member.suffix} left the cluster (its etcd lease expired)")
                return

    def _is_member(self, process_id: pb.ProcessSpec.ID) -> bool:
        """Whether `process_id` holds a member key (its lease is live)."""
        return (process_id.zone, process_id.suffix) in self.keyspace.members

    async def _close_stale_pipeline(self, name: str, replica: Replica) -> None:
        try:
            await replica.close_stale_pipeline(self.keyspace.route(name))
        finally:
            self._closing_pipelines.discard(name)

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` (a replica's retirement or pipeline change) as a task `settle()` waits for."""
        task = asyncio.get_running_loop().create_task(work)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def resolve(
        self,
        journal: str,
        *,
        may_proxy: bool,
        require_primary: bool,
        min_etcd_revision: int = 0,
        proxy_header: pb.Header | None = None,
        claims: Claims | None = None,
    ) -> Resolution:
        """Resolve `journal` once the mirror has reached the requested revision. A journal the
        caller's `claims` do not cover is JOURNAL_NOT_FOUND, as one that does not exist."""
        wait_for = max(min_etcd_revision, proxy_header.etcd.revision if proxy_header else 0)
        if wait_for > self.keyspace.revision:
            await self.keyspace.wait_for_revision(wait_for)

        name = journal_of(journal)
        item = self.keyspace.journals.get(name)
        if item is None or not (claims is None or claims.authorizes(journal_label_set(item.spec))):
            return Resolution(pb.JOURNAL_NOT_FOUND, self.header())
        spec = item.spec
        route = self.keyspace.route(name)
        header = self.header(route)
        res = Resolution(pb.OK, header, spec, self.replicas.get(name), item.mod_revision)

        local_index = next((i for i, m in enumerate(route.members) if same_id(m, self.local_id)), -1)
        if spec.suspend.level == pb.JournalSpec.Suspend.FULL:
            res.status = pb.SUSPENDED
        elif require_primary and route.primary == -1:
            res.status = pb.NO_JOURNAL_PRIMARY_BROKER
        elif not route.members:
            res.status = pb.INSUFFICIENT_JOURNAL_BROKERS
        elif require_primary and route.primary != local_index:
            if may_proxy:
                header.process_id.CopyFrom(route.members[route.primary])
            else:
                res.status = pb.NOT_JOURNAL_PRIMARY_BROKER
        elif local_index == -1:
            if may_proxy:
                header.process_id.CopyFrom(self._pick_member(route))
            else:
                res.status = pb.NOT_JOURNAL_BROKER
        if res.status == pb.OK and same_id(header.process_id, self.local_id) and res.replica is None:
            # Assigned in etcd but the replica is not built yet: the mirror is ahead of us.
            self.update_replicas()
            res.replica = self.replicas.get(name)
        return res

    def _pick_member(self, route: pb.Route) -> pb.ProcessSpec.ID:
        """A member to proxy to, preferring this broker's zone."""
        for m in route.members:
            if m.zone == self.local_id.zone:
                return m
        return route.members[0]

    def endpoint_of(self, process_id: pb.ProcessSpec.ID, route: pb.Route) -> str:
        for i, m in enumerate(route.members):
            if same_id(m, process_id) and i < len(route.endpoints):
                return route.endpoints[i]
        member = self.keyspace.members.get((process_id.zone, process_id.suffix))
        return member.spec.process_spec.endpoint if member else ""

    async def settle(self) -> None:
        """Wait until replicas no longer assigned have handed their spools to the persister (so their
        Replicate streams have ended), and stale pipelines are closed."""
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    async def stop(self) -> None:
        """Close every replica (each rolls back its pipeline)."""
        self.stopped = True
        replicas, self.replicas = self.replicas, {}
        for replica in replicas.values():
            await replica.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
