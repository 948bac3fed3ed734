"""`gazette serve`: the broker's command line (`python -m broker serve` runs it alone; the `gazette`
command, `gazette.cli`, carries it beside `consume`). The flags and checks it shares with
`gazette consume` are `cluster.server.command`'s."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Annotated

import typer

from broker import processes as processes_mod
from broker.errors import GazetteError
from broker.protocol.credentials import TLSFiles
from broker.server import Broker, BrokerConfig
from cluster.server import logs
from cluster.server.command import (
    ETCD_TLS_FLAGS,
    DebugPortOption,
    DebugPrivateOption,
    EtcdCertFileOption,
    EtcdCertKeyFileOption,
    EtcdTrustedCAFileOption,
    check_auth_keys,
    check_identity,
    check_tls,
    debug_config,
    duration_seconds,
    two_words,
)
from cluster.server.logs import LogFormat
from cluster.server.supervisor import ChildExitedError
from cluster.server.tls import ServerTLS
from cluster.server.tuning import keep_freed_memory, raise_open_file_limit

app = typer.Typer(
    name="gazette",
    help="Gazette broker: serves journals over gRPC and HTTP on one port.",
    no_args_is_help=True,
    add_completion=False,
)


def _default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gazette"


DEFAULT_STATE_DIR = _default_state_dir()


@app.callback()
def main_callback() -> None:
    """Gazette broker."""


@app.command()
def serve(
    ctx: typer.Context,
    zone: Annotated[
        str,
        typer.Option("--broker.zone", envvar="BROKER_ZONE", help="Availability zone of the broker."),
    ] = "local",
    broker_id: Annotated[
        str,
        typer.Option(
            "--broker.id", envvar="BROKER_ID",
            help="Unique ID suffix of the broker within its zone (default: random).",
        ),
    ] = "",
    host: Annotated[
        str,
        typer.Option(
            "--broker.host", envvar="BROKER_HOST",
            help="Host name to advertise to peers and clients (default: hostname).",
        ),
    ] = "",
    port: Annotated[
        int,
        typer.Option("--broker.port", envvar="BROKER_PORT", help="Port serving gRPC and HTTP (0 picks a free one)."),
    ] = 8080,
    bind: Annotated[str, typer.Option("--broker.bind", envvar="BROKER_BIND", help="Address to listen on.")] = "0.0.0.0",
    limit: Annotated[
        int,
        typer.Option(
            "--broker.limit", envvar="BROKER_LIMIT",
            help="Maximum number of journal replicas assigned to this broker.",
        ),
    ] = 1024,
    file_root: Annotated[
        str,
        typer.Option(
            "--broker.file-root", envvar="BROKER_FILE_ROOT",
            help="Local directory that file:// fragment stores are rooted at.",
        ),
    ] = "",
    max_append_rate: Annotated[
        int,
        typer.Option(
            "--broker.max-append-rate", envvar="BROKER_MAX_APPEND_RATE",
            help="Maximum bytes/second appended to any journal (0: unlimited).",
        ),
    ] = 0,
    min_append_rate: Annotated[
        int,
        typer.Option(
            "--broker.min-append-rate", envvar="BROKER_MIN_APPEND_RATE",
            help="Bytes/second an append client must sustain after a second of grace, or be cut off (0: no minimum).",
        ),
    ] = 64 * 1024,
    max_replication: Annotated[
        int,
        typer.Option(
            "--broker.max-replication", envvar="BROKER_MAX_REPLICATION",
            help="Cap on the effective replication of every journal.",
        ),
    ] = 9,
    max_grpc_recv_size: Annotated[
        int,
        typer.Option(
            "--broker.max-grpc-recv-size", envvar="BROKER_MAX_GRPC_RECV_SIZE",
            help="Largest gRPC message the broker accepts, in bytes.",
        ),
    ] = 4 << 20,
    auth_keys: Annotated[
        str,
        typer.Option(
            "--broker.auth-keys", envvar="BROKER_AUTH_KEYS", show_default=False,
            help=(
                "Base64 keys, separated by whitespace or commas, that sign and verify authorization tokens: "
                "with any, every RPC and HTTP request needs a token signed by one of them (the first signs the "
                "broker's own calls to peers). The key AA== also admits requests without a token (for rolling "
                "auth out). Mint tokens with `gazctl auth token`."
            ),
        ),
    ] = "",
    server_cert_file: Annotated[
        str,
        typer.Option(
            "--broker.server-cert-file", envvar="BROKER_SERVER_CERT_FILE", show_default=False,
            help="PEM certificate (chain) of the port: with it the port speaks TLS only, and the advertised "
            "endpoint is https://.",
        ),
    ] = "",
    server_cert_key_file: Annotated[
        str,
        typer.Option(
            "--broker.server-cert-key-file", envvar="BROKER_SERVER_CERT_KEY_FILE", show_default=False,
            help="PEM private key of --broker.server-cert-file.",
        ),
    ] = "",
    server_ca_file: Annotated[
        str,
        typer.Option(
            "--broker.server-ca-file", envvar="BROKER_SERVER_CA_FILE", show_default=False,
            help="PEM CA certificate(s): with it, every client (peers too) must present a certificate it signed.",
        ),
    ] = "",
    peer_cert_file: Annotated[
        str,
        typer.Option(
            "--broker.peer-cert-file", envvar="BROKER_PEER_CERT_FILE", show_default=False,
            help="PEM certificate the broker presents to https:// peers (needed when they have a server CA).",
        ),
    ] = "",
    peer_cert_key_file: Annotated[
        str,
        typer.Option(
            "--broker.peer-cert-key-file", envvar="BROKER_PEER_CERT_KEY_FILE", show_default=False,
            help="PEM private key of --broker.peer-cert-file.",
        ),
    ] = "",
    peer_ca_file: Annotated[
        str,
        typer.Option(
            "--broker.peer-ca-file", envvar="BROKER_PEER_CA_FILE", show_default=False,
            help="PEM CA certificate(s) trusted for https:// peers (default: the system's roots).",
        ),
    ] = "",
    etcd_address: Annotated[
        str,
        typer.Option(
            "--etcd.address", envvar="ETCD_ADDRESS",
            help=(
                "etcd to use. Unset: an etcd at http://localhost:2379 (see --etcd.embedded-port) if one answers, "
                "else an embedded one started there."
            ),
        ),
    ] = "",
    etcd_port: Annotated[
        int,
        typer.Option(
            "--etcd.embedded-port", envvar="ETCD_EMBEDDED_PORT",
            help="Client port of the local etcd to use or embed, without --etcd.address.",
        ),
    ] = 2379,
    etcd_peer_port: Annotated[
        int,
        typer.Option(
            "--etcd.embedded-peer-port", envvar="ETCD_EMBEDDED_PEER_PORT",
            help="Peer port of an embedded etcd.",
        ),
    ] = 2380,
    etcd_cert_file: EtcdCertFileOption = "",
    etcd_cert_key_file: EtcdCertKeyFileOption = "",
    etcd_trusted_ca_file: EtcdTrustedCAFileOption = "",
    etcd_prefix: Annotated[
        str,
        typer.Option("--etcd.prefix", envvar="ETCD_PREFIX", help="Root of the broker keyspace in etcd."),
    ] = "/gazette/cluster",
    etcd_lease: Annotated[
        float,
        typer.Option(
            "--etcd.lease", envvar="ETCD_LEASE_TTL", show_default="20s", parser=duration_seconds, metavar="DURATION",
            help="TTL of the broker's etcd lease (a Go duration, e.g. 20s, or seconds).",
        ),
    ] = 20.0,
    watch_delay: Annotated[
        float,
        typer.Option(
            "--broker.watch-delay", envvar="BROKER_WATCH_DELAY", show_default="30ms",
            parser=duration_seconds, metavar="DURATION",
            help="Least time between two applied batches of etcd watch events (a Go duration, or seconds): events"
            " arriving sooner are gathered, and one after a quiet spell applies at once.",
        ),
    ] = 0.03,
    file_only: Annotated[
        bool,
        typer.Option(
            "--broker.file-only", envvar="BROKER_FILE_ONLY",
            help="Keep every journal's fragments in the file:// store under --broker.file-root, whatever stores "
            "its spec names (s3://, gs://, azure://: bucket and prefix ignored).",
        ),
    ] = False,
    auto_suspend: Annotated[
        bool,
        typer.Option(
            "--broker.auto-suspend", envvar="BROKER_AUTO_SUSPEND",
            help="Automatically suspend journals which have persisted all fragments (after 15 one-minute pulses"
            " without a route change); the next append resumes them.",
        ),
    ] = False,
    allow_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--broker.allow-origin", envvar="BROKER_ALLOW_ORIGIN", show_default=False,
            help="Origin whose browser requests the HTTP gateway allows (CORS); repeat for more.",
        ),
    ] = None,
    debug_port: DebugPortOption = None,
    debug_private: DebugPrivateOption = False,
    state_dir: Annotated[
        Path,
        typer.Option(
            "--broker.state-dir", envvar="BROKER_STATE_DIR",
            help="Directory for spools and the embedded etcd's data.",
        ),
    ] = DEFAULT_STATE_DIR,
    log_level: Annotated[
        str,
        typer.Option("--log.level", envvar="LOG_LEVEL", help="Logging level: debug, info, warn, error."),
    ] = "info",
    log_format: Annotated[
        LogFormat,
        typer.Option("--log.format", envvar="LOG_FORMAT", help="Logging format."),
    ] = LogFormat.text,
    processes: Annotated[
        str,
        typer.Option(
            "--broker.processes", envvar="BROKER_PROCESSES", metavar="N|auto",
            help="Broker processes to run on this host, each a cluster member of its own (--broker.id "
            "suffixed -0, -1, ...; ports --broker.port+0, +1, ...; state dirs <state-dir>/broker-0, ...), so "
            "that the host's cores all serve: a broker process uses one. auto: one per usable core. With more "
            "than one, this process supervises them (and the embedded etcd), and stops them all when one exits.",
        ),
    ] = processes_mod.AUTO,
    log_member: Annotated[
        str,
        typer.Option("--log.member", hidden=True, help="A member= field on every log line (set by a supervisor)."),
    ] = "",
) -> None:
    """Serve as a Gazette broker."""
    if log_level.lower() not in logs.LEVELS:
        raise typer.BadParameter(f"unknown level {log_level!r}; use one of {', '.join(logs.LEVELS)}",
                                 param_hint="--log.level")
    if file_only and not file_root:
        raise typer.BadParameter("needs --broker.file-root, the directory to keep fragments in",
                                 param_hint="--broker.file-only")
    debug = debug_config(debug_port, debug_private)
    try:
        count = processes_mod.parse_processes(processes)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--broker.processes") from None
    broker_id = broker_id or two_words()
    host = host or socket.gethostname()
    members = processes_mod.plan_members(count, broker_id, port, debug_port, state_dir) if count > 1 else []
    check_ports(port, debug_port, count)
    # The flags' own identity, whatever the count, then each member's (`<id>-<i>`, `<port>+i`).
    for member_id, member_port in [(broker_id, port), *((m.broker_id, m.port) for m in members)]:
        check_identity(zone, member_id, f"http://{host}:{member_port}", limit)
    check_auth_keys(auth_keys, "--broker.auth-keys")
    server_tls = ServerTLS(server_cert_file, server_cert_key_file, server_ca_file)
    check_tls(server_tls, (peer_cert_file, peer_cert_key_file, peer_ca_file, PEER_TLS_FLAGS),
              (etcd_cert_file, etcd_cert_key_file, etcd_trusted_ca_file, ETCD_TLS_FLAGS))
    peer_tls = TLSFiles(peer_cert_file, peer_cert_key_file, peer_ca_file)
    etcd_tls = TLSFiles(etcd_cert_file, etcd_cert_key_file, etcd_trusted_ca_file)
    logs.configure(log_level, log_format.value, {"member": log_member} if log_member else None)
    if members:
        _supervise(ctx, members, BrokerConfig(
            zone=zone, id=broker_id, host=host, etcd_address=etcd_address or None, etcd_port=etcd_port,
            etcd_peer_port=etcd_peer_port, state_dir=state_dir, etcd_tls=etcd_tls,
        ))
        return
    keep_freed_memory()
    raise_open_file_limit()
    config = BrokerConfig(
        zone=zone, id=broker_id, host=host, port=port, bind=bind,
        limit=limit, file_root=file_root, max_append_rate=max_append_rate, min_append_rate=min_append_rate,
        max_replication=max_replication,
        max_grpc_recv_size=max_grpc_recv_size, etcd_address=etcd_address or None, etcd_prefix=etcd_prefix,
        etcd_port=etcd_port, etcd_peer_port=etcd_peer_port,
        etcd_lease=etcd_lease, watch_delay=watch_delay, state_dir=state_dir, auth_keys=auth_keys,
        server_tls=server_tls, peer_tls=peer_tls, etcd_tls=etcd_tls,
        file_only=file_only, auto_suspend=auto_suspend, debug=debug, allow_origins=tuple(allow_origin or ()),
    )
    try:
        asyncio.run(_serve(config))
    except GazetteError as err:  # etcd unreachable (over TLS: why), a file the broker cannot use.
        typer.echo(f"error: starting the broker failed: {' '.join(str(err).split())}", err=True)
        raise typer.Exit(1) from None


def _supervise(ctx: typer.Context, members: list[processes_mod.Member], config: BrokerConfig) -> None:
    """`gazette serve --broker.processes N` with N > 1: run the members (broker.processes)."""
    flags = [(param.envvar, ctx.params[param.name]) for param in ctx.command.params
             if isinstance(param.envvar, str) and param.name is not None and param.name not in processes_mod.OVERRIDDEN]
    try:
        asyncio.run(processes_mod.serve_processes(config, members, processes_mod.flag_environment(flags)))
    except ChildExitedError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    except GazetteError as err:  # etcd unreachable, or not embedded.
        typer.echo(f"error: starting the broker failed: {' '.join(str(err).split())}", err=True)
        raise typer.Exit(1) from None


def check_ports(port: int, debug_port: int | None, count: int) -> None:
    """Refuse `count` processes whose ports would run past 65535."""
    for first, flag in ((port, "--broker.port"), (debug_port, "--debug.port")):
        if first and first + count - 1 > 65535:
            raise typer.BadParameter(
                f"{count} processes need {flag} {first} to {first + count - 1}, past 65535",
                param_hint="--broker.processes",
            )


PEER_TLS_FLAGS = ("--broker.peer-cert-file", "--broker.peer-cert-key-file", "--broker.peer-ca-file")


async def _serve(config: BrokerConfig) -> None:
    broker = Broker(config)
    try:
        started = await broker.start_unless_signalled()
    except BaseException:
        await broker.abort()
        raise
    if not started:
        await broker.abort()
        return
    await broker.run_until_signalled()


def main() -> None:
    """Run the broker's own command line (`python -m broker serve`)."""
    app()
