"""Assembles and runs a broker: etcd, keyspace mirror, member announcement, allocator,
replicas, the gRPC service on an internal socket, and the public one-port listener."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from broker.gateway import HttpGateway
from broker.gateway.local import LocalJournalStub
from broker.peers import PeerDialer
from broker.persistence import FragmentPersistence
from broker.pipeline import peer_timeout, same_id
from broker.protocol import pb
from broker.protocol.auth import KeyedAuth
from broker.protocol.credentials import Credentials, TLSFiles
from broker.pulse import run_pulses
from broker.replica import Replica
from broker.resolver import Resolver
from broker.service import JournalService, add_journal_service
from broker.state import BrokerState
from broker.stores import StoreRegistry
from cluster.keyspace import (
    Announcement,
    KeySpace,
    member_key,
    open_etcd,
    run_allocator,
    write_suspend,
)
from cluster.server.channels import CHANNEL_OPTIONS
from cluster.server.http import DebugConfig
from cluster.server.listener import OnePortListener
from cluster.server.process import (
    STOP_GRACE,
    etcd_credentials,
    grpc_server_options,
    handle_stop_signals,
    start_unless_stopped,
)
from cluster.server.tls import ServerTLS

log = logging.getLogger(__name__)

HANDOFF_TIMEOUT = 60.0
"""Seconds an exiting broker waits for its journals to be assigned to other members."""
REPLICATION_DRAIN_TIMEOUT = 5.0
"""Seconds an exiting broker, its journals handed off, waits for primaries to end their Replicate streams."""


@dataclass
class BrokerConfig:
    """Settings of `gazette serve`; see broker.cli for the flags that set them."""

    zone: str = "local"
    id: str = ""
    host: str = "localhost"
    port: int = 8080
    bind: str = "0.0.0.0"
    limit: int = 1024
    file_root: str = ""
    max_append_rate: int = 0
    min_append_rate: int = 64 * 1024
    max_replication: int = 9
    max_grpc_recv_size: int = 4 << 20
    etcd_address: str | None = None
    etcd_prefix: str = "/gazette/cluster"
    etcd_port: int = 2379
    etcd_peer_port: int = 2380
    etcd_lease: float = 20.0
    watch_delay: float = 0.03
    auth_keys: str = ""
    """Base64 keys (whitespace or comma separated): with any, every RPC must carry a token they signed."""
    file_only: bool = False
    auto_suspend: bool = False
    """Suspend journals whose fragments are all persisted once their route held still (`--broker.auto-suspend`)."""
    """Every fragment store is the `file://` store under `file_root` (`--broker.file-only`)."""
    debug: DebugConfig = field(default_factory=lambda: DebugConfig())
    allow_origins: tuple[str, ...] = ()
    """Origins the HTTP gateway answers with CORS headers (`--broker.allow-origin`)."""
    state_dir: Path = field(default_factory=lambda: Path.home() / ".local" / "state" / "gazette")
    server_tls: ServerTLS = field(default_factory=ServerTLS)
    """The public port's certificate, key and client CA (`--broker.server-*`): TLS when set."""
    peer_tls: TLSFiles = field(default_factory=TLSFiles)
    """What the broker presents to and trusts of `https://` peers (`--broker.peer-*`)."""
    etcd_tls: TLSFiles = field(default_factory=TLSFiles)
    """TLS files of an `https://` etcd (`--etcd.cert-file`, `--etcd.cert-key-file`, `--etcd.trusted-ca-file`)."""

    @property
    def endpoint(self) -> str:
        scheme = "https" if self.server_tls.enabled else "http"
        return f"{scheme}://{self.host}:{self.port}"


class BrokerCore:
    """What serves a broker's journals over a loaded KeySpace: fragment persistence, the resolver
    and its replicas, the BrokerState the RPC handlers share, and the Journal servicer.

    `Broker` assembles one for `gazette serve`; tests assemble them in-process the same way. The
    caller registers `service` with a gRPC server, and then `join`s the cluster.
    """

    def __init__(
        self,
        client: Any,
        root: str,
        keyspace: KeySpace,
        local_id: pb.ProcessSpec.ID,
        registry: StoreRegistry,
        spool_dir: str,
        *,
        max_append_rate: int = 0,
        min_append_rate: int = 0,
        max_replication: int = 9,
        auth_keys: str = "",
        peer_tls: TLSFiles | None = None,
    ) -> None:
        self.keyspace = keyspace
        self.local_id = local_id
        self.spool_dir = spool_dir
        self.persistence = FragmentPersistence(
            registry, keyspace, replica_of=lambda journal: self.resolver.replicas.get(journal),
        )
        self.resolver = Resolver(keyspace, local_id, self._new_replica)
        self.state = BrokerState(
            etcd=client,
            root=root,
            keyspace=keyspace,
            resolver=self.resolver,
            # Peers sign their own calls with the cluster's keys (Replicate, proxied Read and Append).
            # And present --broker.peer-* to peers whose endpoints are https://.
            dialer=PeerDialer(Credentials.of(keys=auth_keys, **_files(peer_tls or TLSFiles()))),
            stores=registry,
            max_append_rate=max_append_rate,
            min_append_rate=min_append_rate,
            max_replication=max_replication,
        )
        self.service = JournalService(
            self.state,
            open_remote=self.persistence.open_remote,
            sign_url=self.persistence.sign_url,
            store_health=self.persistence.store_health,
            auth=KeyedAuth(auth_keys) if auth_keys else None,
        )

    def broker_spec(self, endpoint: str, journal_limit: int) -> pb.BrokerSpec:
        """The member spec this broker announces."""
        return pb.BrokerSpec(
            process_spec=pb.ProcessSpec(id=self.local_id, endpoint=endpoint), journal_limit=journal_limit
        )

    def _new_replica(self, journal: str, spec: pb.JournalSpec) -> Replica:
        replica = Replica(journal, spec, self.spool_dir, persister=self.persistence.on_complete)
        replica.start(refresh=self.persistence.start_refresh)
        return replica

    async def join(self, announcement: Announcement) -> asyncio.Task[None]:
        """Announce the member, then keep the replicas in line with the assignments as the mirror
        follows etcd (from at least the announcement on). Returns the mirror's watch task."""
        await announcement.announce()
        self.keyspace.add_observer(self.resolver.update_replicas)
        task = self.keyspace.watch()
        await self.keyspace.wait_for_revision(announcement.revision)
        self.resolver.update_replicas()
        return task


def _files(tls: TLSFiles) -> dict[str, str]:
    return {"cert_file": tls.cert_file, "key_file": tls.key_file, "ca_file": tls.ca_file}


class Broker:
    """A running broker. `await start()`, then `await stop()` (what SIGTERM does)."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.local_id = pb.ProcessSpec.ID(zone=config.zone, suffix=config.id)
        self._stop = asyncio.Event()  # Asked to stop: not ready, hand journals off.
        self._handed_off = asyncio.Event()  # Then the allocator and pulses stop too.
        self._force_exit = asyncio.Event()  # A second signal: exit without waiting on persists.
        self._tasks: list[asyncio.Task[None]] = []
        self._runtime_dir = tempfile.mkdtemp(prefix="gazette-broker-")
        self.grpc_path = os.path.join(self._runtime_dir, "grpc.sock")
        self.spool_dir = config.state_dir / "spools"
        self.debug_server: asyncio.Server | None = None

    async def start(self) -> None:
        cfg = self.config
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self.etcd = await open_etcd(
            cfg.etcd_address, cfg.state_dir, log, client_port=cfg.etcd_port, peer_port=cfg.etcd_peer_port,
            credentials=etcd_credentials(cfg.etcd_address, cfg.etcd_tls),
        )
        client = self.etcd.client

        self.keyspace = KeySpace(client, cfg.etcd_prefix, watch_delay=cfg.watch_delay)
        await self.keyspace.load()

        # The public port is bound before announcing, so the advertised endpoint is real, but it
        # accepts connections only once the mirror has caught up with the announcement: a broker
        # restarted under its old --broker.id must not serve the assignments of its dead self.
        self.grpc_server = grpc.aio.server(options=grpc_server_options(cfg.max_grpc_recv_size))
        self.grpc_server.add_insecure_port(f"unix:{self.grpc_path}")
        self.gateway_channel = grpc.aio.insecure_channel(f"unix:{self.grpc_path}", options=CHANNEL_OPTIONS)
        self.gateway = HttpGateway(
            self.gateway_channel, ready=lambda: not self._stop.is_set(), debug=not cfg.debug.private,
            allow_origins=cfg.allow_origins,
        )
        ssl_context = cfg.server_tls.context() if cfg.server_tls.enabled else None
        self.listener = OnePortListener(cfg.bind, cfg.port, self.grpc_path, self.gateway, ssl_context=ssl_context)
        await self.listener.start(serve=False)
        cfg.port = self.listener.port

        core = BrokerCore(
            client, cfg.etcd_prefix, self.keyspace, self.local_id, StoreRegistry(cfg.file_root, cfg.file_only),
            str(self.spool_dir),
            max_append_rate=cfg.max_append_rate,
            min_append_rate=cfg.min_append_rate,
            max_replication=cfg.max_replication,
            auth_keys=cfg.auth_keys,
            peer_tls=cfg.peer_tls,
        )
        self.persistence, self.resolver, self.state = core.persistence, core.resolver, core.state
        self.state.peer_timeout = peer_timeout(cfg.etcd_lease)
        add_journal_service(core.service, self.grpc_server)
        # The gateway calls the service in-process rather than through a gRPC round trip.
        self.gateway.stub = LocalJournalStub(core.service)
        await self.grpc_server.start()

        self.announcement = Announcement(
            client, cfg.etcd_prefix, core.broker_spec(cfg.endpoint, cfg.limit), ttl=cfg.etcd_lease,
            on_lost=self._on_lease_lost,
        )
        self._tasks.append(await core.join(self.announcement))
        self._tasks.append(
            asyncio.create_task(
                run_allocator(
                    client, self.keyspace, member_key(cfg.etcd_prefix, cfg.zone, cfg.id),
                    cfg.max_replication, self._handed_off,
                )
            )
        )
        self._tasks.append(asyncio.create_task(run_pulses(self.state, self._handed_off, auto_suspend=cfg.auto_suspend)))
        await self.listener.serve()
        # The debug port opens once the public port serves: its /debug/ready then says so too.
        self.debug_server = await cfg.debug.serve(cfg.bind, self.gateway, ready=lambda: not self._stop.is_set())
        log.info(
            "broker serving",
            extra={"endpoint": cfg.endpoint, "zone": cfg.zone, "id": cfg.id, "etcd": self.etcd.endpoint},
        )

    def _on_lease_lost(self) -> None:
        log.error("etcd lease lost: this broker's assignments are void; exiting")
        # Nothing more is acknowledged, and pipelines and Replicate streams end now: other brokers
        # already hold (or are about to take) these journals.
        self.state.lease_lost = True
        self.state.stopping.set()
        for replica in list(self.resolver.replicas.values()):
            replica.void()
        self._stop.set()

    async def start_unless_signalled(self) -> bool:
        """`start()` with the signals handled from its first moment: False if SIGTERM or SIGINT came
        first (the start is cancelled; `abort()` undoes it)."""
        handle_stop_signals(self._on_signal)
        return await start_unless_stopped(self.start(), self._stop)

    async def run_until_signalled(self) -> None:
        """Serve until SIGTERM or SIGINT (a second one stops waiting for persists), then shut down
        in order."""
        handle_stop_signals(self._on_signal)
        await self._stop.wait()
        await self.stop()

    def _on_signal(self) -> None:
        if self._stop.is_set():
            log.warning("second signal: exiting without waiting for fragments to persist")
            self._force_exit.set()
        self._stop.set()

    async def stop(self) -> None:
        """Hand journals off to other members, stop taking requests, roll and persist every spool,
        release the member key, stop etcd."""
        self._stop.set()
        log.info("broker stopping")
        await self._hand_off()
        self._handed_off.set()
        # The journals' primaries close their pipelines to this broker as soon as they see it left
        # their routes: its replicas then retire. Stopping the server first would cut replication
        # streams an append may be using.
        lost = self.state.lease_lost
        if not lost:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REPLICATION_DRAIN_TIMEOUT):
                    await self.resolver.settle()
        self.state.stopping.set()
        # HTTP requests in flight are answered (over gRPC, so first), then RPCs in flight (appends
        # proxied through this broker among them) get a grace period: none once the lease is lost,
        # as no answer this broker could give would still be its to give.
        grace = 0.0 if lost else STOP_GRACE
        await self.listener.stop_accepting()
        if self.debug_server is not None:
            self.debug_server.close()
        await self.gateway.shut_down(grace=grace)
        await asyncio.gather(self.listener.close(grace=grace), self.grpc_server.stop(grace=grace))
        for replica in list(self.resolver.replicas.values()):
            await replica.flush()
        await self.resolver.settle()  # Replicas unassigned during the hand-off flush theirs.
        # Write heads are recorded only under a live lease: a lost one's routes may be stale.
        if await self._persist_spools() and not lost:
            await self._record_write_heads()
        await self.resolver.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await self.announcement.release()
        except Exception as exc:
            # etcd cannot be reached (a partition): the lease expires by itself within its TTL.
            log.warning("releasing the member key failed", extra={"error": str(exc) or type(exc).__name__})
        await self.gateway_channel.close()
        await self.state.dialer.close()
        await self.keyspace.close()
        await self.persistence.close()
        await self.etcd.close()
        log.info("broker stopped")

    async def _hand_off(self) -> None:
        """In a cluster, announce that this broker is exiting and keep serving until the allocator
        has assigned its journals to other members, so that clients see no error (Gazette does the
        same). Alone, or once forced to exit or past HANDOFF_TIMEOUT, it goes on to stop."""
        if getattr(self, "announcement", None) is None or self.announcement.lost:
            return
        keyspace, me = self.keyspace, (self.local_id.zone, self.local_id.suffix)
        others = [m for mid, m in keyspace.members.items()
                  if mid != me and not m.spec.exiting and m.spec.journal_limit > 0]
        if not others:
            return
        try:
            await self.announcement.set_exiting()
        except Exception as exc:  # etcd unreachable, or the key is gone: nothing to hand off.
            log.warning("announcing exit failed", extra={"error": str(exc)})
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + HANDOFF_TIMEOUT

        def mine() -> list[str]:
            return sorted({a.journal for a in keyspace.all_assignments() if (a.zone, a.suffix) == me})

        log.info("handing journals off before exiting", extra={"journals": len(mine())})
        while (held := mine()) and not self._force_exit.is_set():
            remaining = deadline - loop.time()
            if remaining <= 0:
                log.warning("journals not handed off in time; exiting anyway", extra={"journals": held[:10]})
                return
            await keyspace.wait_for_change_within(min(remaining, 1.0))
        log.info("journals handed off")

    async def _persist_spools(self) -> bool:
        """Wait until every rolled spool is persisted, reporting progress, unless forced to exit.

        Returns whether everything was persisted.
        """
        drain = asyncio.ensure_future(self.persistence.drain())
        force = asyncio.ensure_future(self._force_exit.wait())
        try:
            while not drain.done():
                await asyncio.wait({drain, force}, timeout=10.0, return_when=asyncio.FIRST_COMPLETED)
                pending = self.persistence.persister.pending
                if force.done():
                    for job in pending:
                        log.error("fragment NOT persisted before exit", extra={"fragment": repr(job.fragment)})
                    return False
                if pending and not drain.done():
                    log.warning(
                        "still persisting before exit (signal again to exit without them)",
                        extra={"fragments": len(pending), "error": pending[0].last_error},
                    )
        finally:
            drain.cancel()
            force.cancel()
        return True

    async def _record_write_heads(self) -> None:
        """Record in each journal we are primary of that all content up to its head is persisted.

        The journal's `suspend.offset` tells the next primary where to resume appending: Gazette's
        append FSM rolls a spool that is behind it forward. Without this mark a restarted broker
        would find the stores ahead of its empty spool and, like Gazette after an unclean exit,
        refuse appends with INDEX_HAS_GREATER_OFFSET until `gazctl journals reset-head`.
        """
        for name, replica in list(self.resolver.replicas.items()):
            item = self.keyspace.journals.get(name)
            route = self.keyspace.route(name)
            if item is None or route.primary < 0 or not same_id(route.members[route.primary], self.local_id):
                continue
            head = replica.spool.fragment.end
            if head <= item.spec.suspend.offset:
                continue
            try:
                ok, _ = await write_suspend(
                    self.etcd.client, self.config.etcd_prefix, item.spec, item.mod_revision,
                    item.spec.suspend.level, head,
                )
            except Exception as exc:  # etcd unreachable: the journal then needs reset-head.
                ok = False
                log.warning("recording write head failed", extra={"journal": name, "error": str(exc)})
            log.info("recorded write head", extra={"journal": name, "offset": head, "ok": ok})

    async def abort(self) -> None:
        """Undo a partial start: close whatever was opened, and stop an embedded etcd."""
        self._stop.set()
        self._handed_off.set()
        if self.debug_server is not None:
            self.debug_server.close()
        for closer in ("listener", "grpc_server"):
            obj = getattr(self, closer, None)
            if obj is not None:
                await (obj.close() if closer == "listener" else obj.stop(None))
        announcement = getattr(self, "announcement", None)
        if announcement is not None:
            # A start cut short while announcing: revoke the lease it took (with any member key).
            with contextlib.suppress(Exception):
                await announcement.release()
        if hasattr(self, "etcd"):
            await self.etcd.close()
