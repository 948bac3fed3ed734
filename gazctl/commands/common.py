"""Options shared by every command (`--broker.address`, `--log.level`, `--log.format`) and error reporting.

The shared options are accepted both before the command (`gazctl --log.level debug journals
list`) and after it, as Gazette's gazctl takes them (`gazctl journals list --log.level debug`);
the later one wins. Then `$LOG_LEVEL` / `$LOG_FORMAT`, then the defaults (`warn`, `text`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Annotated, TypeVar

import typer

from broker import logs
from gazctl.config import DialTarget, dial_target, resolve_broker_address
from gazctl.errors import ConfigError, GazctlError

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


class LogFormat(StrEnum):
    """Values of `--log.format`; `color` is accepted and prints as `text`."""

    text = "text"
    json = "json"
    color = "color"


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


@dataclass
class GlobalOptions:
    """Shared options as given before the command; None where not given."""

    broker_address: str | None = None
    log_level: LogLevel | None = None
    log_format: LogFormat | None = None


@dataclass(frozen=True)
class Settings:
    """Resolved shared options of one command."""

    target: DialTarget


def setup(
    ctx: typer.Context,
    broker_address: str | None,
    log_level: LogLevel | None,
    log_format: LogFormat | None,
) -> Settings:
    """Merge the shared options of `ctx` and of the command, configure logging, and resolve the broker."""
    given = ctx.find_object(GlobalOptions) or GlobalOptions()
    level = _choice(log_level or given.log_level, "LOG_LEVEL", LogLevel, LogLevel.warn)
    fmt = _choice(log_format or given.log_format, "LOG_FORMAT", LogFormat, LogFormat.text)
    logs.configure("debug" if level is LogLevel.trace else level.value, fmt.value)
    address = resolve_broker_address(broker_address or given.broker_address)
    log.debug("resolved broker address", extra={"address": address})
    return Settings(dial_target(address))


@contextmanager
def reported() -> Iterator[None]:
    """Report a GazctlError raised within the block as one line on stderr, and exit with status 1."""
    try:
        yield
    except GazctlError as err:
        sys.stderr.write(f"error: {err}\n")
        raise typer.Exit(1) from None


E = TypeVar("E", bound=Enum)


def _choice(given: E | None, env_name: str, enum: type[E], default: E) -> E:
    if given is not None:
        return given
    raw = os.environ.get(env_name, "")
    if not raw:
        return default
    try:
        return enum(raw.lower())
    except ValueError:
        options = ", ".join(str(e.value) for e in enum)
        raise ConfigError(f"invalid ${env_name} {raw!r} (expected one of {options})") from None
