"""What every command shares: options (`--broker.address`, `--log.level`, `--log.format`,
`--selector`), running the async client, error reporting, stdout tables and progress bars.

The shared options are accepted both before the command (`gazctl --log.level debug journals
list`) and after it, as Gazette's gazctl takes them (`gazctl journals list --log.level debug`);
the later one wins. Then `$LOG_LEVEL` / `$LOG_FORMAT`, then `[Log] Level` / `Format` of the
first gazctl.ini found, then the defaults (`warn`, `text`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from types import MappingProxyType
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from broker.client import Credentials, EtcdTransactionFailed, JournalClient, TransportError
from broker.errors import ConfigError, GazetteError
from cluster.server import logs
from cluster.server.logs import LogFormat
from gazctl.config import (
    ADDRESS_KEY,
    BROKER_ADDRESS_ENV,
    BROKER_SECTION,
    DEFAULT_BROKER_ADDRESS,
    DialTarget,
    Resolved,
    dial_target,
    resolve_consumer_address,
    resolve_credentials,
    resolve_option,
)

log = logging.getLogger("gazctl")

GLOBAL_PANEL = "Global options"


class LogLevel(StrEnum):
    """Values of `--log.level`."""

    trace = "trace"
    debug = "debug"
    info = "info"
    warn = "warn"
    error = "error"
    fatal = "fatal"


BrokerAddressOption = Annotated[
    str | None,
    typer.Option(
        "--broker.address",
        help="Broker URL [env: BROKER_ADDRESS; INI: \\[journals.Broker] Address; default: http://localhost:8080]",
        show_default=False,
        rich_help_panel=GLOBAL_PANEL,
    ),
]
LogLevelOption = Annotated[
    LogLevel | None,
    typer.Option(
        "--log.level",
        help="Logging level [env: LOG_LEVEL; default: warn]",
        case_sensitive=False,
        show_default=False,
        rich_help_panel=GLOBAL_PANEL,
    ),
]
LogFormatOption = Annotated[
    LogFormat | None,
    typer.Option(
        "--log.format",
        help="Logging output format [env: LOG_FORMAT; default: text]",
        case_sensitive=False,
        show_default=False,
        rich_help_panel=GLOBAL_PANEL,
    ),
]



def _credential_option(flag: str, env: str, section: str, key: str, help: str) -> Any:
    return typer.Option(
        flag, help=f"{help} [env: {env}; INI: \\[{section}] {key}]", show_default=False, rich_help_panel=GLOBAL_PANEL,
    )


BrokerAuthTokenOption = Annotated[
    str | None,
    _credential_option("--broker.auth-token", "BROKER_AUTH_TOKEN", BROKER_SECTION, "AuthToken",
                       "Bearer token presented to brokers (see `gazctl auth token`)"),
]
BrokerAuthKeysOption = Annotated[
    str | None,
    _credential_option("--broker.auth-keys", "BROKER_AUTH_KEYS", BROKER_SECTION, "AuthKeys",
                       "Base64 keys of the brokers' --broker.auth-keys, to sign tokens with (instead of a token)"),
]
MaxTxnSizeOption = Annotated[
    int,
    typer.Option(
        "--max-txn-size",
        min=0,
        help="Apply in transactions of at most this many changes (0: one transaction)",
    ),
]
ConsumerAddressOption = Annotated[
    str | None,
    typer.Option(
        "--consumer.address",
        help="URL of a `gazette consume` process (it listens on a random port unless given --consumer.port)"
        " [env: CONSUMER_ADDRESS; INI: \\[shards.Consumer] Address; default: http://localhost:8080]",
        show_default=False,
        rich_help_panel=GLOBAL_PANEL,
    ),
]
ConsumerAuthTokenOption = Annotated[
    str | None,
    _credential_option("--consumer.auth-token", "CONSUMER_AUTH_TOKEN", "shards.Consumer", "AuthToken",
                       "Bearer token presented to consumers (`gazctl shards`)"),
]
ConsumerAuthKeysOption = Annotated[
    str | None,
    _credential_option("--consumer.auth-keys", "CONSUMER_AUTH_KEYS", "shards.Consumer", "AuthKeys",
                       "Base64 keys of the consumers' --consumer.auth-keys, to sign tokens with"),
]
BrokerCertFileOption = Annotated[
    str | None,
    _credential_option("--broker.cert-file", "BROKER_CERT_FILE", BROKER_SECTION, "CertFile",
                       "PEM client certificate presented to https:// brokers"),
]
BrokerCertKeyFileOption = Annotated[
    str | None,
    _credential_option("--broker.cert-key-file", "BROKER_CERT_KEY_FILE", BROKER_SECTION, "CertKeyFile",
                       "PEM private key of --broker.cert-file"),
]
BrokerTrustedCAFileOption = Annotated[
    str | None,
    _credential_option("--broker.trusted-ca-file", "BROKER_TRUSTED_CA_FILE", BROKER_SECTION, "TrustedCAFile",
                       "PEM CA certificate(s) trusted for https:// brokers (default: the system's roots)"),
]
ConsumerCertFileOption = Annotated[
    str | None,
    _credential_option("--consumer.cert-file", "CONSUMER_CERT_FILE", "shards.Consumer", "CertFile",
                       "PEM client certificate presented to https:// consumers"),
]
ConsumerCertKeyFileOption = Annotated[
    str | None,
    _credential_option("--consumer.cert-key-file", "CONSUMER_CERT_KEY_FILE", "shards.Consumer", "CertKeyFile",
                       "PEM private key of --consumer.cert-file"),
]
ConsumerTrustedCAFileOption = Annotated[
    str | None,
    _credential_option("--consumer.trusted-ca-file", "CONSUMER_TRUSTED_CA_FILE", "shards.Consumer",
                       "TrustedCAFile", "PEM CA certificate(s) trusted for https:// consumers"),
]

@dataclass
class GlobalOptions:
    """Shared options as given before the command; None where not given."""

    broker_address: str | None = None
    log_level: LogLevel | None = None
    log_format: LogFormat | None = None


CONSUMER_ADDRESS_FLAG: ContextVar[str | None] = ContextVar("gazctl_consumer_address_flag", default=None)
"""`--consumer.address` as given before the command (`gazctl --consumer.address URL shards list`), set by the
root command; a `--consumer.address` after the command wins over it."""

CREDENTIAL_FLAGS: ContextVar[Mapping[str, str | None]] = ContextVar(
    "gazctl_credential_flags", default=MappingProxyType({})
)
"""The credential flags of the running command line (set by the root command, read wherever a
command dials: they are given before the command, and commands dial deep in their helpers)."""


def resolve_consumer(flag: str | None) -> Resolved:
    """The consumer address of `gazctl shards` (and of sync's default consumer group): `flag` (given after
    the command), else `--consumer.address` given before it, then $CONSUMER_ADDRESS, the INI file, the default."""
    return resolve_consumer_address(flag or CONSUMER_ADDRESS_FLAG.get())


def credentials(group: str) -> Credentials:
    """The credentials gazctl presents to brokers (`group` "broker") or consumers ("consumer"):
    flags given before the command, then environment variables, then the INI file."""
    return resolve_credentials(group, CREDENTIAL_FLAGS.get())


def credential_options(**flags: str | None) -> dict[str, str | None]:
    """The root command's credential flags (keyword `broker_auth_token` -> `broker.auth-token`)."""
    out: dict[str, str | None] = {}
    for name, value in flags.items():
        group, _, rest = name.partition("_")
        out[f"{group}.{rest.replace('_', '-')}"] = value
    return out


LOG_SECTION = "Log"
"""The INI section of the log options (keys `Level` and `Format`), as `print-config` writes it."""


@dataclass(frozen=True)
class Settings:
    """Resolved shared options of one command, and where each came from."""

    target: DialTarget
    broker_address: Resolved
    log_level: Resolved
    log_format: Resolved
    credentials: Credentials = field(default_factory=Credentials)

    @property
    def address(self) -> str:
        return self.target.address

    def client(self, *, file_root: str | None = None, route_cache: bool = False) -> JournalClient:
        """A JournalClient of the resolved broker. As Gazette's gazctl, without a route cache the broker proxies."""
        return JournalClient(self.address, file_root=file_root, route_cache=route_cache, credentials=self.credentials)

    def run(self, work: Callable[[JournalClient], Awaitable[T]], *, file_root: str | None = None) -> T:
        """Run `work` with a client in a fresh event loop, closing the client after; return its result."""

        async def main() -> T:
            async with self.client(file_root=file_root) as client:
                return await work(client)

        return asyncio.run(main())


def setup(
    ctx: typer.Context,
    broker_address: str | None,
    log_level: LogLevel | None,
    log_format: LogFormat | None,
) -> Settings:
    """Merge the shared options of `ctx` and of the command, configure logging, and resolve the broker.

    Each option is the first of: the flag (after the command, else before it), its environment
    variable, the first gazctl.ini found (`./`, then `~/.config/gazette/`), the default.
    """
    given = ctx.find_object(GlobalOptions) or GlobalOptions()
    level = _choice(log_level or given.log_level, "--log.level", "LOG_LEVEL", "Level", LogLevel, LogLevel.warn)
    fmt = _choice(log_format or given.log_format, "--log.format", "LOG_FORMAT", "Format", LogFormat, LogFormat.text)
    logs.configure("debug" if level.value == LogLevel.trace else level.value, fmt.value)
    address = resolve_option(
        broker_address or given.broker_address, BROKER_ADDRESS_ENV, BROKER_SECTION, ADDRESS_KEY, DEFAULT_BROKER_ADDRESS
    )
    log.debug("resolved broker address", extra={"address": address.value, "source": address.source})
    return Settings(dial_target(address.value), address, level, fmt, credentials("broker"))


@contextmanager
def reported() -> Iterator[None]:
    """Report an error raised within the block as one line on stderr, and exit with status 1.

    Every GazetteError (gazctl's own and those of the packages it drives) is one a user can act on;
    Ctrl-C exits 130 and a closed stdout (e.g. `| head`) exits quietly. This is the one place gazctl
    turns errors into messages and exit codes.
    """
    try:
        yield
    except GazetteError as err:
        sys.stderr.write(f"error: {err}{_hint(err)}\n")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except BrokenPipeError:
        # Python would complain again when flushing stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(1) from None


def _hint(err: Exception) -> str:
    if isinstance(err, EtcdTransactionFailed):
        return (
            " (a journal's current revision differs from the spec's `revision`: it was changed, created or"
            " deleted since it was listed; list the journals again, or use `revision: -1` to overwrite)"
        )
    if isinstance(err, TransportError) and err.code is not None and err.code.name == "UNAVAILABLE":
        message = str(err).lower()
        if "wrong_version_number" in message:
            return " (TLS: the broker does not speak TLS there; use its http:// address)"
        if "handshake failed" in message:
            return " (TLS: check --broker.trusted-ca-file, --broker.cert-file and --broker.cert-key-file)"
        if "https://" in message and ("socket closed" in message or "connection reset by peer" in message):
            # A plain listener closes a TLS handshake at once; a TLS one that requires client certificates
            # refuses a handshake without one, which arrives as either.
            return (" (TLS: the broker closed the handshake: if it does not serve TLS there, use its http://"
                    " address; one with --broker.server-ca-file drops clients without --broker.cert-file and"
                    " --broker.cert-key-file)")
        return " (is a broker listening there? set --broker.address or $BROKER_ADDRESS)"
    return ""


def stdout_console() -> Console:
    """A console for data on stdout; when not a terminal, wide enough never to fold a cell."""
    console = Console(file=sys.stdout, highlight=False)
    if not console.is_terminal:
        console = Console(file=sys.stdout, highlight=False, width=1 << 16)
    return console


def progress() -> Progress:
    """A progress bar on stderr, shown only when stderr is a terminal (none when piped or redirected)."""
    console = Console(file=sys.stderr)
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


E = TypeVar("E", bound=Enum)
T = TypeVar("T")


def _choice(given: E | None, flag: str, env_name: str, key: str, enum: type[E], default: E) -> Resolved:
    resolved = resolve_option(given.value if given is not None else None, env_name, LOG_SECTION, key, default.value)
    try:
        enum(resolved.value.lower())
    except ValueError:
        options = ", ".join(str(e.value) for e in enum)
        where = {"env": f"${env_name}", "default": "default", "flag": flag}.get(resolved.source, resolved.source)
        raise ConfigError(f"invalid {flag} {resolved.value!r} from {where} (expected one of {options})") from None
    return Resolved(resolved.value.lower(), resolved.source)
