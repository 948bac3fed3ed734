"""`gazette consume MODULE:ATTR`: the consumer's command line (`python -m consumer consume` runs it
alone; the `gazette` command, `gazette.cli`, carries it beside the broker's `serve`). The flags and
checks it shares with `gazette serve` are `cluster.server.command`'s.

Errors are one line on stderr, `error: <what is wrong>`, with exit status 2 for bad arguments and
1 for a failure to start (`StartError`); never a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Annotated, Any

import typer

from broker.errors import GazetteError
from broker.protocol.credentials import TLSFiles
from cluster.server import command, logs
from cluster.server.logs import LogFormat
from cluster.server.tls import ServerTLS
from consumer.errors import ConsumerError
from consumer.process import (
    ApplicationLoadError,
    ConsumerConfig,
    ConsumerProcess,
    default_prefix,
    load_application,
)
from consumer.protocol import pb as cpb
from consumer.protocol.validation import ValidationError, validate_consumer_spec
from consumer.replica import HINTS_INTERVAL
from consumer.service import WATCH_DELAY

log = logging.getLogger(__name__)

app = typer.Typer(
    name="gazette",
    help="Gazette consumer: `consume MODULE:ATTR` runs a consumer application's shards.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def main_callback() -> None:
    """Gazette consumer."""


@app.command()
def consume(
    application: Annotated[
        str,
        typer.Argument(
            metavar="MODULE:ATTR",
            help="The application object, as uvicorn takes `main:app`: ATTR of the importable MODULE "
            "(the current directory is searched first).",
            show_default=False,
        ),
    ],
    zone: Annotated[
        str, typer.Option("--consumer.zone", envvar="CONSUMER_ZONE", help="Availability zone of the consumer.")
    ] = "local",
    consumer_id: Annotated[
        str,
        typer.Option(
            "--consumer.id", envvar="CONSUMER_ID",
            help="Unique ID suffix of the consumer within its zone (default: random).",
        ),
    ] = "",
    host: Annotated[
        str,
        typer.Option(
            "--consumer.host", envvar="CONSUMER_HOST",
            help="Host name to advertise to peers and clients (default: hostname).",
        ),
    ] = "",
    port: Annotated[
        int,
        typer.Option(
            "--consumer.port", envvar="CONSUMER_PORT",
            help="Port serving the Shard gRPC API and HTTP (0 picks a free one, logged at start).",
        ),
    ] = 0,
    bind: Annotated[
        str, typer.Option("--consumer.bind", envvar="CONSUMER_BIND", help="Address to listen on.")
    ] = "0.0.0.0",
    limit: Annotated[
        int,
        typer.Option(
            "--consumer.limit", envvar="CONSUMER_LIMIT", help="Maximum number of shards assigned to this consumer."
        ),
    ] = 32,
    max_hot_standbys: Annotated[
        int,
        typer.Option(
            "--consumer.max-hot-standbys", envvar="CONSUMER_MAX_HOT_STANDBYS",
            help="Cap on the hot standbys of every shard, whatever its spec asks.",
        ),
    ] = 3,
    max_grpc_recv_size: Annotated[
        int,
        typer.Option(
            "--consumer.max-grpc-recv-size", envvar="CONSUMER_MAX_GRPC_RECV_SIZE",
            help="Largest gRPC message the consumer accepts, in bytes.",
        ),
    ] = 4 << 20,
    watch_delay: Annotated[
        float,
        typer.Option(
            "--consumer.watch-delay", envvar="CONSUMER_WATCH_DELAY", show_default="5ms",
            parser=command.duration_seconds, metavar="DURATION",
            help="Least time between two applied batches of etcd watch events (a Go duration, or seconds): events"
            " arriving sooner are gathered, and one after a quiet spell applies at once.",
        ),
    ] = WATCH_DELAY,
    hints_interval: Annotated[
        float,
        typer.Option(
            "--consumer.hints-interval", envvar="CONSUMER_HINTS_INTERVAL", show_default="5m",
            parser=command.duration_seconds, metavar="DURATION",
            help="Time between a primary's stores of its recovery log's hints in etcd, at least 100ms (which bound"
            " what a recovering replica replays, and what `gazctl shards prune` may delete).",
        ),
    ] = HINTS_INTERVAL,
    broker_address: Annotated[
        str,
        typer.Option("--broker.address", envvar="BROKER_ADDRESS", help="Broker to read and publish through."),
    ] = "http://localhost:8080",
    auth_keys: Annotated[
        str,
        typer.Option(
            "--consumer.auth-keys", envvar="CONSUMER_AUTH_KEYS", show_default=False,
            help="Base64 keys (whitespace or comma separated): with any, Shard API calls need a token signed by "
            "one of them (`gazctl auth token --keys ...`); the first signs calls proxied to peers.",
        ),
    ] = "",
    server_cert_file: Annotated[
        str,
        typer.Option(
            "--consumer.server-cert-file", envvar="CONSUMER_SERVER_CERT_FILE", show_default=False,
            help="PEM certificate (chain) of the port: with it the Shard API and application routes speak TLS "
            "only, and the advertised endpoint is https://.",
        ),
    ] = "",
    server_cert_key_file: Annotated[
        str,
        typer.Option(
            "--consumer.server-cert-key-file", envvar="CONSUMER_SERVER_CERT_KEY_FILE", show_default=False,
            help="PEM private key of --consumer.server-cert-file.",
        ),
    ] = "",
    server_ca_file: Annotated[
        str,
        typer.Option(
            "--consumer.server-ca-file", envvar="CONSUMER_SERVER_CA_FILE", show_default=False,
            help="PEM CA certificate(s): with it, every client (peers too) must present a certificate it signed.",
        ),
    ] = "",
    peer_cert_file: Annotated[
        str,
        typer.Option(
            "--consumer.peer-cert-file", envvar="CONSUMER_PEER_CERT_FILE", show_default=False,
            help="PEM certificate presented to https:// peer consumers (when they have a server CA).",
        ),
    ] = "",
    peer_cert_key_file: Annotated[
        str,
        typer.Option(
            "--consumer.peer-cert-key-file", envvar="CONSUMER_PEER_CERT_KEY_FILE", show_default=False,
            help="PEM private key of --consumer.peer-cert-file.",
        ),
    ] = "",
    peer_ca_file: Annotated[
        str,
        typer.Option(
            "--consumer.peer-ca-file", envvar="CONSUMER_PEER_CA_FILE", show_default=False,
            help="PEM CA certificate(s) trusted for https:// peer consumers (default: the system's roots).",
        ),
    ] = "",
    broker_cert_file: Annotated[
        str,
        typer.Option(
            "--broker.cert-file", envvar="BROKER_CERT_FILE", show_default=False,
            help="PEM client certificate presented to https:// brokers.",
        ),
    ] = "",
    broker_cert_key_file: Annotated[
        str,
        typer.Option(
            "--broker.cert-key-file", envvar="BROKER_CERT_KEY_FILE", show_default=False,
            help="PEM private key of --broker.cert-file.",
        ),
    ] = "",
    broker_trusted_ca_file: Annotated[
        str,
        typer.Option(
            "--broker.trusted-ca-file", envvar="BROKER_TRUSTED_CA_FILE", show_default=False,
            help="PEM CA certificate(s) trusted for https:// brokers (default: the system's roots).",
        ),
    ] = "",
    broker_auth_token: Annotated[
        str,
        typer.Option(
            "--broker.auth-token", envvar="BROKER_AUTH_TOKEN", show_default=False,
            help="Bearer token presented to brokers started with --broker.auth-keys.",
        ),
    ] = "",
    broker_auth_keys: Annotated[
        str,
        typer.Option(
            "--broker.auth-keys", envvar="BROKER_AUTH_KEYS", show_default=False,
            help="The brokers' --broker.auth-keys, to sign the consumer's tokens with (not with --broker.auth-token).",
        ),
    ] = "",
    etcd_address: Annotated[
        str,
        typer.Option(
            "--etcd.address", envvar="ETCD_ADDRESS",
            help="etcd of the consumer's keyspace (`gazette serve`'s embedded etcd answers at the default).",
        ),
    ] = "http://localhost:2379",
    etcd_cert_file: command.EtcdCertFileOption = "",
    etcd_cert_key_file: command.EtcdCertKeyFileOption = "",
    etcd_trusted_ca_file: command.EtcdTrustedCAFileOption = "",
    etcd_prefix: Annotated[
        str,
        typer.Option(
            "--etcd.prefix", envvar="ETCD_PREFIX",
            help="Root of the application's keyspace in etcd (default: /gazette/consumers/<the application's type>).",
            show_default=False,
        ),
    ] = "",
    etcd_lease: Annotated[
        float,
        typer.Option(
            "--etcd.lease", envvar="ETCD_LEASE_TTL", show_default="20s",
            parser=command.duration_seconds, metavar="DURATION",
            help="TTL of the consumer's etcd lease (a Go duration, e.g. 20s, or seconds).",
        ),
    ] = 20.0,
    allow_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--consumer.allow-origin", envvar="CONSUMER_ALLOW_ORIGIN", show_default=False,
            help="Origin whose browser requests the consumer's HTTP routes allow (CORS); repeat for more.",
        ),
    ] = None,
    debug_port: command.DebugPortOption = None,
    debug_private: command.DebugPrivateOption = False,
    log_level: Annotated[
        str,
        typer.Option("--log.level", envvar="LOG_LEVEL", help="Logging level: debug, info, warn, error."),
    ] = "info",
    log_format: Annotated[
        LogFormat,
        typer.Option("--log.format", envvar="LOG_FORMAT", help="Logging format."),
    ] = LogFormat.text,
) -> None:
    """Run a consumer application's shards: `gazette consume myapp:app`."""
    if log_level.lower() not in logs.LEVELS:
        raise typer.BadParameter(f"unknown level {log_level!r}; use one of {', '.join(logs.LEVELS)}",
                                 param_hint="--log.level")
    debug = command.debug_config(debug_port, debug_private)
    consumer_id = consumer_id or command.two_words()
    host = host or socket.gethostname()
    _check_identity(zone, consumer_id, f"http://{host}:{port}", limit)
    if max_hot_standbys < 0:
        raise typer.BadParameter(f"must be >= 0, not {max_hot_standbys}", param_hint="--consumer.max-hot-standbys")
    if etcd_lease <= 0:
        raise typer.BadParameter(f"must be > 0, not {etcd_lease:g}", param_hint="--etcd.lease")
    if hints_interval < 0.1:
        raise typer.BadParameter(
            f"must be at least 100ms, not {hints_interval:g}s", param_hint="--consumer.hints-interval"
        )
    if etcd_prefix and (not etcd_prefix.startswith("/") or etcd_prefix.endswith("/")):
        raise typer.BadParameter(
            f"{etcd_prefix!r} must start with '/' and not end with one", param_hint="--etcd.prefix"
        )
    command.check_auth_keys(auth_keys, "--consumer.auth-keys")
    command.check_auth_keys(broker_auth_keys, "--broker.auth-keys")
    server_tls = ServerTLS(server_cert_file, server_cert_key_file, server_ca_file, flag="--consumer.server")
    command.check_tls(
        server_tls, (peer_cert_file, peer_cert_key_file, peer_ca_file, PEER_TLS_FLAGS),
        (broker_cert_file, broker_cert_key_file, broker_trusted_ca_file, BROKER_TLS_FLAGS),
        (etcd_cert_file, etcd_cert_key_file, etcd_trusted_ca_file, command.ETCD_TLS_FLAGS),
    )
    broker_tls = None
    if broker_cert_file or broker_trusted_ca_file:
        broker_tls = TLSFiles(broker_cert_file, broker_cert_key_file, broker_trusted_ca_file)
    try:
        application_object = load_application(application)
    except ApplicationLoadError as err:
        raise typer.BadParameter(str(err), param_hint="MODULE:ATTR") from None

    logs.configure(log_level, log_format.value)
    config = ConsumerConfig(
        zone=zone, id=consumer_id, host=host, port=port, bind=bind, limit=limit,
        max_hot_standbys=max_hot_standbys, max_grpc_recv_size=max_grpc_recv_size,
        broker_address=broker_address, etcd_address=etcd_address,
        etcd_prefix=etcd_prefix or default_prefix(application_object), etcd_lease=etcd_lease,
        watch_delay=watch_delay, hints_interval=hints_interval, auth_keys=auth_keys,
        broker_auth_token=broker_auth_token, broker_auth_keys=broker_auth_keys,
        server_tls=server_tls, peer_tls=TLSFiles(peer_cert_file, peer_cert_key_file, peer_ca_file),
        broker_tls=broker_tls, etcd_tls=TLSFiles(etcd_cert_file, etcd_cert_key_file, etcd_trusted_ca_file),
        debug=debug, allow_origins=tuple(allow_origin or ()),
    )
    code = asyncio.run(_consume(config, application_object))
    raise typer.Exit(code)


PEER_TLS_FLAGS = ("--consumer.peer-cert-file", "--consumer.peer-cert-key-file", "--consumer.peer-ca-file")
BROKER_TLS_FLAGS = ("--broker.cert-file", "--broker.cert-key-file", "--broker.trusted-ca-file")


class StartError(ConsumerError):
    """The consumer could not start (etcd unreachable, port taken, ...): one line, exit status 1."""


def _check_identity(zone: str, consumer_id: str, endpoint: str, limit: int) -> None:
    """The broker's identity check (`cluster.server.command.check_identity`), naming the consumer's
    flags, then the ConsumerSpec's own validation."""
    command.check_identity(zone, consumer_id, endpoint, limit, flags="--consumer")
    spec = cpb.ConsumerSpec(shard_limit=limit)
    spec.process_spec.id.zone, spec.process_spec.id.suffix = zone, consumer_id
    spec.process_spec.endpoint = endpoint
    try:
        validate_consumer_spec(spec)
    except ValidationError as err:
        raise typer.BadParameter(str(err), param_hint="--consumer.id") from None


async def _consume(config: ConsumerConfig, application: Any) -> int:
    process = ConsumerProcess(config, application)
    try:
        started = await process.start_unless_signalled()
    except (GazetteError, OSError, ValueError) as exc:
        log.debug("start failed", exc_info=True)
        await process.abort()
        raise StartError(f"starting the consumer failed: {exc}") from None
    except BaseException:
        await process.abort()
        raise
    if not started:
        await process.abort()
        return 0
    return await process.run_until_signalled()


def main() -> None:
    """Run `gazette consume` alone (`python -m consumer consume`); errors are one line on stderr."""
    command.run(app, (StartError,))


__all__ = ["StartError", "app", "consume", "main"]
