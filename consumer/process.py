"""A consumer process (`gazette consume MODULE:ATTR`): the application, its ConsumerService, and
one port serving the Shard gRPC API and HTTP (Gazette's `mainboilerplate/runconsumer/run_consumer.go`).

- `load_application("module:attr")` imports the application object as uvicorn loads `main:app`.
- `ConsumerProcess` wires the broker's parts, reused rather than copied: etcd (`open_etcd`, here
  always an existing etcd: a consumer never embeds one), a grpc.aio server on an internal unix
  socket with the Shard service, the `HttpServer` (`/debug/ready`, `/debug/metrics`, the
  application's routes; `cluster.server.http`) and the `OnePortListener` in front of both; then
  the `ConsumerService` (announce, keyspace, allocator, replicas). An application's optional
  `init_application(ctx)` (`consumer.app_api.AppContext`) is awaited before the gRPC server
  starts and the member announces: it registers the application's gRPC servicers and HTTP routes
  on the same port (Gazette's InitApplication).
  `run_until_signalled()` serves until SIGTERM or SIGINT, then `stop()`s: the
  service's graceful exit (the member is marked exiting, its shards move to other members,
  replicas drain), then the port closes.

`/debug/metrics` carries, besides the transaction metrics of `consumer.transaction`,
`gazette_shard_up{shard,status}` (1 per shard assigned here, by its replica's status) and
`gazette_consumer_shards{status}` (how many shards assigned here have each status).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import weakref
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from broker.client import Credentials, JournalClient, TLSFiles
from broker.protocol.auth import KeyedAuth
from cluster.keyspace import open_etcd
from cluster.keyspace.etcd import EtcdConnection
from cluster.server.http import DebugConfig, HttpServer, RouteTable
from cluster.server.listener import OnePortListener
from cluster.server.process import (
    STOP_GRACE,
    etcd_credentials,
    grpc_server_options,
    handle_stop_signals,
    start_unless_stopped,
)
from cluster.server.tls import ServerTLS
from consumer import txn_metrics as _txn_metrics  # noqa: F401  (registers the transaction metrics)
from consumer.api import ShardAPI, add_shard_service
from consumer.app_api import AppContext
from consumer.application import Application
from consumer.errors import ConsumerError
from consumer.keyspace import default_root
from consumer.protocol import pb as cpb
from consumer.replica import HINTS_INTERVAL
from consumer.service import EXIT_TIMEOUT, WATCH_DELAY, ConsumerService

log = logging.getLogger(__name__)

REQUIRED_METHODS = ("new_store", "new_message", "consume_message", "finalize_txn")
"""What an application object must have (consumer.application.Application)."""


class ApplicationLoadError(ConsumerError):
    """`MODULE:ATTR` does not name an application; the message says what is wrong."""


class ApplicationInitError(ConsumerError, ValueError):
    """The application's `init_application` failed (or is not a coroutine function)."""


def load_application(spec: str) -> Any:
    """The object named by `spec` (`module:attr`, attr may be dotted), checked to be an Application.

    The current directory is searched first for the module, as uvicorn does.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ApplicationLoadError(f"{spec!r} is not MODULE:ATTR (e.g. `myapp:app`, as uvicorn takes `main:app`)")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ApplicationLoadError(
                f"could not import module {module_name!r}: no module named {exc.name!r}"
            ) from None
        raise ApplicationLoadError(f"importing module {module_name!r} failed: {exc}") from None
    except Exception as exc:
        raise ApplicationLoadError(f"importing module {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ApplicationLoadError(f"module {module_name!r} has no attribute {attr!r}") from None
    if inspect.isclass(obj) or inspect.ismodule(obj):
        kind = "a class" if inspect.isclass(obj) else "a module"
        raise ApplicationLoadError(
            f"{spec} is {kind}, not an application object; name an instance (e.g. `app = {attr}()`)"
        )
    missing = [m for m in REQUIRED_METHODS if not callable(getattr(obj, m, None))]
    if missing:
        raise ApplicationLoadError(
            f"{spec} ({type(obj).__name__}) is not a consumer Application: it lacks "
            f"{', '.join(missing)} (see consumer.application.Application)"
        )
    assert isinstance(obj, Application)
    return obj


def application_name(app: Any) -> str:
    """The name of an application in its default etcd prefix: its type, as Gazette's `%T`."""
    cls = type(app)
    return f"{cls.__module__}.{cls.__qualname__}"


def default_prefix(app: Any) -> str:
    """Gazette's default `--etcd.prefix`: `/gazette/consumers/<the application's type>`."""
    return default_root(application_name(app))


# -- metrics --------------------------------------------------------------------------------------


class _ShardCollector(Collector):
    """Shards assigned to the consumer services of this process, by replica status."""

    def __init__(self) -> None:
        self.services: weakref.WeakSet[ConsumerService] = weakref.WeakSet()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "gazette_shard_up", "Shards assigned to this consumer, by status.", labels=["shard", "status"]
        )
        counts = GaugeMetricFamily(
            "gazette_consumer_shards", "Number of shards assigned to this consumer with each status.", labels=["status"]
        )
        by_status: Counter[str] = Counter({name: 0 for name in cpb.ReplicaStatus.Code.keys()})
        for service in list(self.services):
            for shard_id, a in sorted(service.local_assignments().items()):
                status = cpb.ReplicaStatus.Code.Name(a.value.code)
                up.add_metric([shard_id, status], 1)
                by_status[status] += 1
        for status, n in sorted(by_status.items()):
            counts.add_metric([status], n)
        yield up
        yield counts

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())


_collector = _ShardCollector()
_collector_lock = threading.Lock()
_registered = False


def _watch_metrics(service: ConsumerService) -> None:
    global _registered
    with _collector_lock:
        if not _registered:
            REGISTRY.register(_collector)
            _registered = True
    _collector.services.add(service)


# -- the process ----------------------------------------------------------------------------------


@dataclass
class ConsumerConfig:
    """Settings of `gazette consume`; see consumer.cli for the flags that set them."""

    zone: str = "local"
    id: str = ""
    host: str = "localhost"
    port: int = 0
    bind: str = "0.0.0.0"
    limit: int = 32
    max_hot_standbys: int = 3
    max_grpc_recv_size: int = 4 << 20
    broker_address: str = "http://localhost:8080"
    etcd_address: str = "http://localhost:2379"
    etcd_prefix: str = ""
    etcd_lease: float = 20.0
    watch_delay: float = WATCH_DELAY
    hints_interval: float = HINTS_INTERVAL
    exit_timeout: float = EXIT_TIMEOUT
    auth_keys: str = ""
    """`--consumer.auth-keys`: with any, Shard API calls need a token they signed (the first signs peer calls)."""
    broker_auth_token: str = ""
    broker_auth_keys: str = ""
    """What the consumer presents to brokers (`--broker.auth-token`, `--broker.auth-keys`; else `$BROKER_AUTH_*`)."""
    server_tls: ServerTLS = field(default_factory=lambda: ServerTLS(flag="--consumer.server"))
    """The port's certificate, key and client CA (`--consumer.server-*`): TLS when set."""
    peer_tls: TLSFiles = field(default_factory=TLSFiles)
    """What the consumer presents to and trusts of `https://` peer consumers (`--consumer.peer-*`)."""
    broker_tls: TLSFiles | None = None
    """What it presents to and trusts of `https://` brokers (`--broker.cert-file`...); None: `$BROKER_*`."""
    etcd_tls: TLSFiles = field(default_factory=TLSFiles)
    """TLS files of an `https://` etcd (`--etcd.cert-file`, `--etcd.cert-key-file`, `--etcd.trusted-ca-file`)."""
    debug: DebugConfig = field(default_factory=lambda: DebugConfig())
    """`--debug.port` and `--debug.private`."""
    allow_origins: tuple[str, ...] = ()
    """Origins the HTTP routes answer with CORS headers (`--consumer.allow-origin`)."""

    @property
    def endpoint(self) -> str:
        scheme = "https" if self.server_tls.enabled else "http"
        return f"{scheme}://{self.host}:{self.port}"


class ConsumerProcess:
    """A running consumer process. `await start()`, then `await stop()` (what SIGTERM does)."""

    def __init__(self, config: ConsumerConfig, app: Any) -> None:
        self.config = config
        self.app = app
        self._stop = asyncio.Event()
        self._serving = False
        self._runtime_dir = tempfile.mkdtemp(prefix="gazette-consumer-")
        self.grpc_path = os.path.join(self._runtime_dir, "grpc.sock")
        self.etcd: EtcdConnection | None = None
        self.grpc_server: grpc.aio.Server | None = None
        self.http_server: HttpServer | None = None
        self.listener: OnePortListener | None = None
        self.debug_server: asyncio.Server | None = None
        self.journal_client: JournalClient | None = None
        self.service: ConsumerService | None = None
        self.api: ShardAPI | None = None
        self.routes = RouteTable()
        """HTTP routes the application added (served on the port; any other path is a 404)."""
        self.app_context: AppContext | None = None
        self._stopped = False

    @property
    def ready(self) -> bool:
        """Whether `/debug/ready` answers 200: serving, and not asked to stop."""
        return self._serving and not self._stop.is_set()

    async def start(self) -> None:
        cfg = self.config
        if not cfg.etcd_prefix:
            cfg.etcd_prefix = default_prefix(self.app)
        # With an address, open_etcd only connects (a consumer never embeds an etcd).
        self.etcd = await open_etcd(
            cfg.etcd_address, Path(self._runtime_dir), log, credentials=etcd_credentials(cfg.etcd_address, cfg.etcd_tls)
        )
        broker_credentials = None
        if cfg.broker_auth_token or cfg.broker_auth_keys or cfg.broker_tls is not None:
            tls = cfg.broker_tls or TLSFiles()
            broker_credentials = Credentials.of(
                token=cfg.broker_auth_token, keys=cfg.broker_auth_keys,
                cert_file=tls.cert_file, key_file=tls.key_file, ca_file=tls.ca_file,
            )
        self.journal_client = JournalClient(cfg.broker_address, credentials=broker_credentials)

        # The port is bound before announcing (the advertised endpoint is real), and accepts
        # connections once the service has started.
        self.grpc_server = grpc.aio.server(options=grpc_server_options(cfg.max_grpc_recv_size))
        self.grpc_server.add_insecure_port(f"unix:{self.grpc_path}")
        self.http_server = HttpServer(
            ready=lambda: self.ready, routes=self.routes, debug=not cfg.debug.private, allow_origins=cfg.allow_origins,
        )
        ssl_context = cfg.server_tls.context() if cfg.server_tls.enabled else None
        self.listener = OnePortListener(cfg.bind, cfg.port, self.grpc_path, self.http_server, ssl_context=ssl_context)
        await self.listener.start(serve=False)
        cfg.port = self.listener.port

        spec = cpb.ConsumerSpec(shard_limit=cfg.limit)
        spec.process_spec.id.zone, spec.process_spec.id.suffix = cfg.zone, cfg.id
        spec.process_spec.endpoint = cfg.endpoint
        self.service = ConsumerService(
            self.etcd.client, cfg.etcd_prefix, spec, self.journal_client, self.app,
            lease_ttl=cfg.etcd_lease, max_replication=cfg.max_hot_standbys + 1, watch_delay=cfg.watch_delay,
            exit_timeout=cfg.exit_timeout, hints_interval=cfg.hints_interval,
        )
        self.api = ShardAPI(
            self.service, auth=KeyedAuth(cfg.auth_keys) if cfg.auth_keys else None,
            # Peers are dialed with the consumer's own token and --consumer.peer-* (https:// peers).
            peer_credentials=Credentials.of(
                keys=cfg.auth_keys, cert_file=cfg.peer_tls.cert_file, key_file=cfg.peer_tls.key_file,
                ca_file=cfg.peer_tls.ca_file, what="consumer",
            ),
        )
        add_shard_service(self.api, self.grpc_server)
        await self._init_application()
        await self.grpc_server.start()
        await self.service.start()
        _watch_metrics(self.service)
        await self.listener.serve()
        # The debug port opens once the public port serves: its /debug/ready then says so too.
        self.debug_server = await cfg.debug.serve(cfg.bind, self.http_server, ready=lambda: self.ready)
        self._serving = True
        log.info(
            "consumer serving",
            extra={"endpoint": cfg.endpoint, "zone": cfg.zone, "id": cfg.id, "etcd": self.etcd.endpoint,
                   "prefix": cfg.etcd_prefix, "broker": self.journal_client.address},
        )

    async def _init_application(self) -> None:
        """Await the application's optional `init_application(ctx)` (see consumer.app_api)."""
        assert self.grpc_server is not None and self.service is not None and self.journal_client is not None
        self.app_context = AppContext(
            server=self.grpc_server, routes=self.routes, service=self.service,
            journal_client=self.journal_client, config=self.config,
        )
        init = getattr(self.app, "init_application", None)
        if init is None:
            return
        if not inspect.iscoroutinefunction(init):
            raise ApplicationInitError(
                f"{type(self.app).__name__}.init_application must be a coroutine function (async def)"
            )
        try:
            await init(self.app_context)
        except Exception as exc:
            log.debug("init_application failed", exc_info=True)
            raise ApplicationInitError(f"init_application failed: {type(exc).__name__}: {exc}") from exc

    async def start_unless_signalled(self) -> bool:
        """`start()` with the signals handled from its first moment: False if SIGTERM or SIGINT came
        first (the start is cancelled; `abort()` undoes it). A consumer restarted under its old
        --consumer.id waits up to a lease TTL for the old member key: a signal ends that wait."""
        handle_stop_signals(self._on_signal)
        return await start_unless_stopped(self.start(), self._stop)

    async def run_until_signalled(self) -> int:
        """Serve until SIGTERM or SIGINT (then stop, and return 0), or until the member's lease is
        lost (then stop, and return 1)."""
        assert self.service is not None
        loop = asyncio.get_running_loop()
        handle_stop_signals(self._on_signal)
        lost = asyncio.ensure_future(self.service.lost.wait())
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({lost, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            stop.cancel()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        code = 1 if self.service.lost.is_set() else 0
        if code:
            log.error("the consumer's etcd lease was lost; exiting")
        await self.stop()
        return code

    def _on_signal(self) -> None:
        log.info("signalled to stop: handing shards off")
        self._stop.set()

    async def stop(self) -> None:
        """Hand the shards off and drain them (ConsumerService.stop), then stop serving the port."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        log.info("consumer stopping")
        if self.service is not None:
            await self.service.stop()
        await self._close(grace=STOP_GRACE)
        log.info("consumer stopped")

    async def abort(self) -> None:
        """Undo a partial start."""
        self._stopped = True
        self._stop.set()
        if self.service is not None:
            await self.service.stop()
        await self._close(grace=None)

    async def _close(self, grace: float | None) -> None:
        if self.debug_server is not None:
            self.debug_server.close()
        if self.listener is not None:
            await self.listener.stop_accepting()
        if self.http_server is not None:
            await self.http_server.shut_down(grace=grace or 0.0)
        # Together, as the broker does: a relayed connection ends only once the gRPC server behind
        # it has said GOAWAY, so closing the listener first waited out the whole grace.
        closing = [] if self.listener is None else [self.listener.close(grace=grace or 0.0)]
        if self.grpc_server is not None:
            closing.append(self.grpc_server.stop(grace))
        await asyncio.gather(*closing)
        if self.api is not None:
            await self.api.close()
        if self.app_context is not None:
            await self.app_context.close()
        if self.journal_client is not None:
            await self.journal_client.close()
        if self.etcd is not None:
            await self.etcd.close()
        shutil.rmtree(self._runtime_dir, ignore_errors=True)


__all__ = [
    "REQUIRED_METHODS",
    "ApplicationInitError",
    "ApplicationLoadError",
    "ConsumerConfig",
    "ConsumerProcess",
    "application_name",
    "default_prefix",
    "load_application",
]
