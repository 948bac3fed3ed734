"""`ConsumerService`: a consumer application's process in its keyspace (Gazette's `consumer/service.go`).

Given an etcd client, the application's keyspace root (`--etcd.prefix`), this process's
ConsumerSpec (zone, suffix, endpoint, shard_limit), a JournalClient for the brokers and the
Application, `start()`:

1. announces the member `<root>/members/<zone>#<suffix>` under a new lease (the broker's
   `Announcement`, with the consumer schema);
2. loads the keyspace (`KeySpace` with `CONSUMER_SCHEMA`) and watches it;
3. runs the shared allocator (`run_allocator`): whichever member leads assigns the shards;
4. keeps one `Replica` per assignment of this member (Gazette's Resolver.updateLocalShards):
   a new assignment starts one, a changed slot promotes or demotes it, an assignment deleted and
   re-created at the same slot (a new CreateRevision) replaces it, and a shard no longer assigned
   here is closed (its serving cancelled, its store destroyed).

`stop()` is the graceful exit: mark the member `exiting` (the allocator moves its shards to other
members, each through a standby that must report STANDBY before the primary is released: with
`hot_standbys: 0` it adds one beyond the replication first, which plays the shard's recovery log
until it tails it), wait until no shard is assigned here (at most `exit_timeout` seconds: a lone
member keeps its shards), all the while resolving local shards, then stop resolving them, stop the
allocator, close the replicas (a primary with a recovery log stores its last recorded hints) and
the mirror, and revoke the lease (which deletes the member key and any assignment left).

`abort()` is the crash: it stops serving at once as a SIGKILLed process would, releasing nothing
(no `exiting`, no hand-off, no status update); the lease expires after its TTL, or is revoked at
once on request. Tests use it to crash a service in-process.

A process that loses its lease (the keepalive fails for a TTL) stops serving at once: every
replica is closed, and `lost` is set; it does not come back by itself.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

from broker.client import JournalClient
from cluster.keyspace import Announcement, Assignment, KeySpace, run_allocator
from cluster.keyspace.allocator import MAX_REPLICATION
from cluster.keyspace.announce import LEASE_TTL
from consumer.application import Application
from consumer.keyspace import CONSUMER_SCHEMA
from consumer.protocol import pb as cpb
from consumer.protocol.validation import validate_consumer_spec
from consumer.replica import HANDOFF_TIMEOUT, HINTS_INTERVAL, Replica
from consumer.resolver import Resolver

log = logging.getLogger(__name__)

WATCH_DELAY: Final = 0.005
"""Seconds between two applied batches of the consumer's etcd watch events, at least (the broker's
is Gazette's 30 ms). A shard's assignment is a chain of etcd round trips (Apply, allocation,
PRIMARY status), each waiting for the watch when events come in a burst; the consumer's observer
of a batch costs little (its own assignments) and its allocator plans once for many batches."""

EXIT_TIMEOUT: Final = 60.0
"""Seconds `stop()` waits for the allocator to move this member's shards elsewhere."""


class ConsumerService:
    """One consumer process of an application: membership, allocation, and its shard replicas."""

    def __init__(
        self,
        etcd: Any,
        root: str,
        spec: cpb.ConsumerSpec,
        journal_client: JournalClient,
        app: Application,
        *,
        lease_ttl: float = LEASE_TTL,
        max_replication: int = MAX_REPLICATION,
        watch_delay: float = WATCH_DELAY,
        exit_timeout: float = EXIT_TIMEOUT,
        handoff_timeout: float = HANDOFF_TIMEOUT,
        hints_interval: float = HINTS_INTERVAL,
    ) -> None:
        validate_consumer_spec(spec)
        self.etcd = etcd
        self.root = root.rstrip("/")
        self.spec = spec
        self.journal_client = journal_client
        self.app = app
        self.max_replication = max_replication
        self.exit_timeout = exit_timeout
        self.handoff_timeout = handoff_timeout
        self.hints_interval = hints_interval
        self.member_id = (spec.process_spec.id.zone, spec.process_spec.id.suffix)
        self.keyspace = KeySpace(etcd, self.root, schema=CONSUMER_SCHEMA, watch_delay=watch_delay)
        self.announcement = Announcement(
            etcd, self.root, spec, schema=CONSUMER_SCHEMA, ttl=lease_ttl, on_lost=self._on_lease_lost, log=log
        )
        self.replicas: dict[str, Replica] = {}
        """This member's shards by ID (the resolver reads it: updated in place)."""
        self.resolver = Resolver(self.keyspace, self.member_id, self.replicas)
        self.lost = asyncio.Event()
        """Set once the member's lease is lost: the process no longer serves anything."""
        self._stop_allocator = asyncio.Event()
        self._allocator: asyncio.Task[None] | None = None
        self._remove_observer: Any = None
        self._closing: set[asyncio.Task[None]] = set()
        self._started = False
        self._stopped = False

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Announce, load and watch the keyspace, run the allocator, serve local assignments."""
        if self._started:
            return
        self._started = True
        await self.announcement.announce()
        await self.keyspace.load()
        self.keyspace.watch()
        self._remove_observer = self.keyspace.add_observer(self._update_local_shards)
        self._update_local_shards()
        self._allocator = asyncio.create_task(
            run_allocator(self.etcd, self.keyspace, self.announcement.key, self.max_replication,
                          self._stop_allocator, log=log),
            name=f"allocator {self.announcement.key}",
        )
        log.info("consumer service started", extra={"member": self.announcement.key})

    async def stop(self) -> None:
        """Exit gracefully: announce exiting, wait (bounded) until the shards are assigned elsewhere,
        close the replicas, release the lease."""
        if self._stopped:
            return
        self._stopped = True
        # Local shards keep resolving while they are handed off (as Gazette stops serving local
        # shards only once Allocate returned): requests proxied here meanwhile are still answered.
        # (Nothing to hand off before the member key was announced: a start cut short by a signal.)
        if self._started and not self.lost.is_set() and self.announcement.revision:
            await asyncio.gather(*(r.store_hints_before_exit() for r in list(self.replicas.values())))
            try:
                await self.announcement.set_exiting()
                async with asyncio.timeout(self.exit_timeout):
                    await self._wait_unassigned()
            except TimeoutError:
                log.warning(
                    "shards are still assigned to this consumer after %gs; stopping anyway",
                    self.exit_timeout, extra={"shards": sorted(self.replicas)},
                )
            except Exception as exc:
                log.warning("graceful exit failed (%s); stopping anyway", exc)
        self.resolver.stop()
        await self._shutdown()
        try:
            await self.announcement.release()
        except Exception as exc:
            log.warning("releasing the member lease failed: %s", exc)
        log.info("consumer service stopped", extra={"member": self.announcement.key})

    async def abort(self, *, revoke_lease: bool = False) -> None:
        """Stop serving at once, as a crashed (SIGKILLed) process would.

        The replicas' serving tasks, the allocator and the keyspace watch are cancelled; nothing is
        handed off or released: the member is not marked `exiting`, no status is written, and the
        member key and this member's assignments stay in etcd. The lease's keepalive stops, so the
        lease expires after its TTL (as a killed process's does) and etcd then deletes the member
        key and the assignments under it; with `revoke_lease` the lease is revoked at once instead
        (as if the TTL had already passed). Local resources of the shards (their stores' connections)
        are closed, as the kernel closes a killed process's. `stop()` does nothing afterwards.
        """
        if self._stopped:
            return
        self._stopped = True
        self.resolver.stop()
        if self._remove_observer is not None:
            self._remove_observer()
            self._remove_observer = None
        # Everything stops at once (no await between these), then the cancellations are awaited.
        allocator, self._allocator = self._allocator, None
        keepalive, self.announcement._keepalive = self.announcement._keepalive, None
        tasks = [t for t in (allocator, keepalive) if t is not None]
        for task in tasks:
            task.cancel()
        replicas = list(self.replicas.values())
        self.replicas.clear()  # In place: the resolver reads this map.
        # Cancels each serving task; no last recorded hints are stored, as a crash stores none.
        closing = [asyncio.ensure_future(r.close(graceful=False)) for r in replicas]
        watch = asyncio.ensure_future(self.keyspace.close())
        await asyncio.gather(*tasks, *closing, watch, *self._closing, return_exceptions=True)
        if revoke_lease:
            try:
                await self.announcement.release()
            except Exception as exc:
                log.warning("revoking the member lease failed: %s", exc)
        log.warning("consumer service aborted", extra={"member": self.announcement.key, "revoked": revoke_lease})

    async def __aenter__(self) -> ConsumerService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _wait_unassigned(self) -> None:
        while any(a for a in self.keyspace.all_assignments() if (a.zone, a.suffix) == self.member_id):
            await self.keyspace.wait_for_change()

    async def _shutdown(self) -> None:
        """Stop the allocator and watch; close every replica."""
        if self._remove_observer is not None:
            self._remove_observer()
            self._remove_observer = None
        self._stop_allocator.set()
        task, self._allocator = self._allocator, None
        if task is not None:
            # It returns once it sees the event (between two plans); a stuck etcd call is cut off.
            if not (await asyncio.wait({task}, timeout=5.0))[0]:
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if not task.cancelled() and (exc := task.exception()) is not None:
                log.error("the allocator had failed: %s", exc, exc_info=exc)
        replicas = list(self.replicas.values())
        self.replicas.clear()  # In place: the resolver reads this map.
        await asyncio.gather(*(r.close() for r in replicas), return_exceptions=True)
        await asyncio.gather(*self._closing, return_exceptions=True)
        await self.keyspace.close()

    def _on_lease_lost(self) -> None:
        log.error("member lease lost: stopping every shard of this consumer")
        self.lost.set()
        self.resolver.stop()
        if self._remove_observer is not None:
            self._remove_observer()
            self._remove_observer = None
        self._stop_allocator.set()
        for shard_id in list(self.replicas):
            self._close_replica(shard_id)

    # -- local shards ---------------------------------------------------------------------------

    def local_assignments(self) -> dict[str, Assignment]:
        """This member's assignments by shard ID, for shards whose spec exists."""
        found: dict[str, Assignment] = {}
        for a in self.keyspace.all_assignments():
            if (a.zone, a.suffix) == self.member_id and a.item_id in self.keyspace.items:
                # Two slots of one shard (mid re-key) never happen in one applied batch; keep the lowest.
                if a.item_id not in found or a.slot < found[a.item_id].slot:
                    found[a.item_id] = a
        return found

    def _update_local_shards(self) -> None:
        """Reconcile the replicas with the keyspace's local assignments (after every applied batch)."""
        if self.lost.is_set() or (self._stopped and not self.replicas):
            return
        local = self.local_assignments()
        for shard_id in [s for s in self.replicas if s not in local]:
            self._close_replica(shard_id)
        for shard_id, a in local.items():
            spec = self.keyspace.items[shard_id].spec
            replica = self.replicas.get(shard_id)
            if replica is not None and replica.assignment.slot == a.slot and (
                replica.assignment.create_revision != a.create_revision
            ):
                # Deleted and re-created at the same slot: a new instance.
                self._close_replica(shard_id)
                replica = None
            if replica is None:
                if self._stopped:
                    continue
                replica = Replica(
                    keyspace=self.keyspace, etcd=self.etcd, journal_client=self.journal_client, app=self.app,
                    assignment=a, spec=spec, handoff_timeout=self.handoff_timeout,
                    hints_interval=self.hints_interval,
                )
                self.replicas[shard_id] = replica
                log.info("shard assigned", extra={"shard": shard_id, "slot": a.slot})
                replica.start()
            else:
                replica.update(a, spec)

    def _close_replica(self, shard_id: str) -> None:
        replica = self.replicas.pop(shard_id, None)
        if replica is None:
            return
        log.info("shard unassigned", extra={"shard": shard_id})
        task = asyncio.ensure_future(replica.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)


__all__ = ["EXIT_TIMEOUT", "ConsumerService"]
