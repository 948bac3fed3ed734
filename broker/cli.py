"""`gazette`: the broker's command line (`gazette serve`)."""

from __future__ import annotations

import asyncio
import os
import random
import socket
from enum import StrEnum
from pathlib import Path

import typer

from broker import logs
from broker.server import Broker, BrokerConfig
from broker.tuning import keep_freed_memory, raise_open_file_limit

app = typer.Typer(
    name="gazette",
    help="Gazette broker: serves journals over gRPC and HTTP on one port.",
    no_args_is_help=True,
    add_completion=False,
)

_ADJECTIVES = ("amber", "brisk", "calm", "dusty", "eager", "fuzzy", "gentle", "hollow", "ivory", "jolly",
               "keen", "lucky", "misty", "noble", "olive", "proud", "quiet", "rapid", "silver", "tidy")
_NOUNS = ("otter", "falcon", "maple", "harbor", "comet", "badger", "cedar", "willow", "heron", "pebble",
          "lynx", "meadow", "raven", "spruce", "tundra", "walrus", "yarrow", "zephyr", "basil", "delta")


def _two_words() -> str:
    return f"{random.choice(_ADJECTIVES)}-{random.choice(_NOUNS)}-{random.randrange(1000, 9999)}"


class LogFormat(StrEnum):
    text = "text"
    json = "json"


def _default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gazette"


DEFAULT_STATE_DIR = _default_state_dir()


@app.callback()
def main_callback() -> None:
    """Gazette broker."""


@app.command()
def serve(
    zone: str = typer.Option("local", "--broker.zone", envvar="BROKER_ZONE", help="Availability zone of the broker."),
    broker_id: str = typer.Option("", "--broker.id", envvar="BROKER_ID",
                                  help="Unique ID suffix of the broker within its zone [default: random]."),
    host: str = typer.Option("", "--broker.host", envvar="BROKER_HOST",
                             help="Host name to advertise to peers and clients [default: hostname]."),
    port: int = typer.Option(8080, "--broker.port", envvar="BROKER_PORT",
                             help="Port serving gRPC and HTTP (0 picks a free one)."),
    bind: str = typer.Option("0.0.0.0", "--broker.bind", envvar="BROKER_BIND", help="Address to listen on."),
    limit: int = typer.Option(1024, "--broker.limit", envvar="BROKER_LIMIT",
                              help="Maximum number of journal replicas assigned to this broker."),
    file_root: str = typer.Option("", "--broker.file-root", envvar="BROKER_FILE_ROOT",
                                  help="Local directory that file:// fragment stores are rooted at."),
    max_append_rate: int = typer.Option(0, "--broker.max-append-rate", envvar="BROKER_MAX_APPEND_RATE",
                                        help="Maximum bytes/second appended to any journal (0: unlimited)."),
    min_append_rate: int = typer.Option(64 * 1024, "--broker.min-append-rate", envvar="BROKER_MIN_APPEND_RATE",
                                        help="Bytes/second an append client must sustain after a second of "
                                             "grace, or be cut off (0: no minimum)."),
    max_replication: int = typer.Option(9, "--broker.max-replication", envvar="BROKER_MAX_REPLICATION",
                                        help="Cap on the effective replication of every journal."),
    max_grpc_recv_size: int = typer.Option(4 << 20, "--broker.max-grpc-recv-size",
                                           envvar="BROKER_MAX_GRPC_RECV_SIZE",
                                           help="Largest gRPC message the broker accepts, in bytes."),
    etcd_address: str = typer.Option("", "--etcd.address", envvar="ETCD_ADDRESS",
                                     help="etcd to use. Unset: an etcd at http://localhost:2379 (see "
                                          "--etcd.embedded-port) if one answers, else an embedded one started there."),
    etcd_port: int = typer.Option(2379, "--etcd.embedded-port", envvar="ETCD_EMBEDDED_PORT",
                                  help="Client port of the local etcd to use or embed, without --etcd.address."),
    etcd_peer_port: int = typer.Option(2380, "--etcd.embedded-peer-port", envvar="ETCD_EMBEDDED_PEER_PORT",
                                       help="Peer port of an embedded etcd."),
    etcd_prefix: str = typer.Option("/gazette/cluster", "--etcd.prefix", envvar="ETCD_PREFIX",
                                    help="Root of the broker keyspace in etcd."),
    etcd_lease: float = typer.Option(20.0, "--etcd.lease", envvar="ETCD_LEASE_TTL",
                                     help="TTL in seconds of the broker's etcd lease."),
    watch_delay: float = typer.Option(0.03, "--broker.watch-delay", envvar="BROKER_WATCH_DELAY",
                                      help="Seconds to batch etcd watch events before applying them."),
    state_dir: Path = typer.Option(DEFAULT_STATE_DIR, "--broker.state-dir", envvar="BROKER_STATE_DIR",
                                   help="Directory for spools and the embedded etcd's data."),
    log_level: str = typer.Option("info", "--log.level", envvar="LOG_LEVEL",
                                  help="Logging level: debug, info, warn, error."),
    log_format: LogFormat = typer.Option(LogFormat.text, "--log.format", envvar="LOG_FORMAT",
                                         help="Logging format."),
) -> None:
    """Serve as a Gazette broker."""
    if log_level.lower() not in logs.LEVELS:
        raise typer.BadParameter(f"unknown level {log_level!r}; use one of {', '.join(logs.LEVELS)}",
                                 param_hint="--log.level")
    logs.configure(log_level, log_format.value)
    keep_freed_memory()
    raise_open_file_limit()
    config = BrokerConfig(
        zone=zone, id=broker_id or _two_words(), host=host or socket.gethostname(), port=port, bind=bind,
        limit=limit, file_root=file_root, max_append_rate=max_append_rate, min_append_rate=min_append_rate,
        max_replication=max_replication,
        max_grpc_recv_size=max_grpc_recv_size, etcd_address=etcd_address or None, etcd_prefix=etcd_prefix,
        etcd_port=etcd_port, etcd_peer_port=etcd_peer_port,
        etcd_lease=etcd_lease, watch_delay=watch_delay, state_dir=state_dir,
    )
    asyncio.run(_serve(config))


async def _serve(config: BrokerConfig) -> None:
    broker = Broker(config)
    try:
        await broker.start()
    except BaseException:
        await broker.abort()
        raise
    await broker.run_until_signalled()


def main() -> None:
    app()
