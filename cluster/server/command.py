"""What the command lines of the serving processes (`gazette serve`, `gazette consume`) share, as
Gazette's `mainboilerplate/` serves both of its commands: flags that take Go durations, the
diagnostics flags (`--debug.port`, `--debug.private`), the etcd client's TLS files, checks that
refuse a bad value before anything starts (naming its flag), and `run`, which runs a command line
whose errors are one line on stderr.
"""

from __future__ import annotations

import math
import random
import sys
from typing import Annotated, NoReturn

import typer

from broker.errors import AuthError
from broker.protocol import pb
from broker.protocol.auth import parse_keys
from broker.protocol.validation import (
    MAX_SUFFIX_LEN,
    MAX_ZONE_LEN,
    MIN_SUFFIX_LEN,
    MIN_ZONE_LEN,
    TOKEN_SYMBOLS,
    ValidationError,
    validate_broker_spec,
    validate_endpoint,
    validate_token,
)
from broker.specs.durations import DurationError, parse_duration
from cluster.server.http import DebugConfig
from cluster.server.tls import ServerTLS, TLSFileError, check_client_files

_ADJECTIVES = ("amber", "brisk", "calm", "dusty", "eager", "fuzzy", "gentle", "hollow", "ivory", "jolly",
               "keen", "lucky", "misty", "noble", "olive", "proud", "quiet", "rapid", "silver", "tidy")
_NOUNS = ("otter", "falcon", "maple", "harbor", "comet", "badger", "cedar", "willow", "heron", "pebble",
          "lynx", "meadow", "raven", "spruce", "tundra", "walrus", "yarrow", "zephyr", "basil", "delta")


def two_words() -> str:
    """A random member ID suffix (`--broker.id`, `--consumer.id` unset): `calm-heron-4821`."""
    return f"{random.choice(_ADJECTIVES)}-{random.choice(_NOUNS)}-{random.randrange(1000, 9999)}"


def duration_seconds(value: str | float) -> float:
    """A duration flag's value in seconds: a Go duration (`20s`, `1m30s`, `250ms`), as Gazette's
    flags take, or a bare number of seconds (`20`, `0.03`), as this project's always did."""
    if isinstance(value, int | float):
        return float(value)
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = parse_duration(text) / 1e9
        except DurationError:
            raise typer.BadParameter(
                f"{value!r} is not a duration: give a Go duration such as 20s, 1m30s or 250ms, or seconds (20)"
            ) from None
    if not math.isfinite(seconds):
        raise typer.BadParameter(f"{value!r} is not a duration: give a finite one, such as 20s")
    return seconds


DebugPortOption = Annotated[
    int | None,
    typer.Option(
        "--debug.port", envvar="DEBUG_PORT", show_default=False,
        help="Port serving /debug/ready and /debug/metrics (and, unless --debug.private, every other route).",
    ),
]
DebugPrivateOption = Annotated[
    bool,
    typer.Option(
        "--debug.private", envvar="DEBUG_PRIVATE",
        help="Serve /debug/ready and /debug/metrics only on --debug.port, not on the public port.",
    ),
]


def debug_config(port: int | None, private: bool) -> DebugConfig:
    """The --debug.port and --debug.private flags, checked."""
    if port is not None and not 0 < port < 65536:
        raise typer.BadParameter(f"must be a port number (1 to 65535), not {port}", param_hint="--debug.port")
    return DebugConfig(port, private)


EtcdCertFileOption = Annotated[
    str,
    typer.Option(
        "--etcd.cert-file", envvar="ETCD_CERT_FILE", show_default=False,
        help="PEM client certificate presented to an https:// etcd.",
    ),
]
EtcdCertKeyFileOption = Annotated[
    str,
    typer.Option(
        "--etcd.cert-key-file", envvar="ETCD_CERT_KEY_FILE", show_default=False,
        help="PEM private key of --etcd.cert-file.",
    ),
]
EtcdTrustedCAFileOption = Annotated[
    str,
    typer.Option(
        "--etcd.trusted-ca-file", envvar="ETCD_TRUSTED_CA_FILE", show_default=False,
        help="PEM CA certificate(s) trusted for an https:// etcd (default: the system's roots).",
    ),
]
ETCD_TLS_FLAGS = ("--etcd.cert-file", "--etcd.cert-key-file", "--etcd.trusted-ca-file")


def check_auth_keys(keys: str, flag: str) -> None:
    """Refuse auth keys that do not decode, naming the flag."""
    if keys:
        try:
            parse_keys(keys)
        except AuthError as err:
            raise typer.BadParameter(str(err), param_hint=flag) from None


def check_tls(server: ServerTLS, *clients: tuple[str, str, str, tuple[str, str, str]]) -> None:
    """Refuse, before anything starts, TLS files that cannot be used, naming the flag: the server's,
    and each client's (cert, key, CA, and their three flags)."""
    try:
        if server.enabled:
            server.context()
        for cert_file, key_file, ca_file, flags in clients:
            check_client_files(cert_file, key_file, ca_file, flags)
    except TLSFileError as err:
        raise typer.BadParameter(err.problem, param_hint=err.flag) from None


def check_identity(zone: str, member_id: str, endpoint: str, limit: int, flags: str = "--broker") -> None:
    """Refuse, before anything starts, an identity peers would reject on every replicated append,
    naming the flag: `{flags}.zone`, `.id`, `.host` or `.limit`."""
    checks = [
        (f"{flags}.zone", lambda: validate_token(zone, TOKEN_SYMBOLS, MIN_ZONE_LEN, MAX_ZONE_LEN)),
        (f"{flags}.id", lambda: validate_token(member_id, TOKEN_SYMBOLS, MIN_SUFFIX_LEN, MAX_SUFFIX_LEN)),
        (f"{flags}.host", lambda: validate_endpoint(endpoint)),
        (f"{flags}.limit", lambda: validate_broker_spec(pb.BrokerSpec(
            process_spec=pb.ProcessSpec(id=pb.ProcessSpec.ID(zone=zone, suffix=member_id), endpoint=endpoint),
            journal_limit=max(limit, 0),
        ))),
    ]
    for flag, check in checks:
        try:
            check()
        except ValidationError as err:
            raise typer.BadParameter(str(err), param_hint=flag) from None
    if limit < 0:
        raise typer.BadParameter(f"must be >= 0, not {limit}", param_hint=f"{flags}.limit")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def run(app: typer.Typer, start_errors: tuple[type[Exception], ...] = ()) -> NoReturn:
    """Run `app` on the process's arguments and exit: an error is one line on stderr, never a
    traceback (exit status 2 for bad arguments, 1 for one of `start_errors` or an abort)."""
    try:
        code = app(standalone_mode=False)
    except start_errors as exc:
        typer.echo(f"error: {_one_line(str(exc))}", err=True)
        sys.exit(1)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("error: aborted", err=True)
        sys.exit(1)
    except Exception as exc:
        # Click's exceptions (typer vendors click from 0.20 on: match them by what they have).
        format_message, exit_code = getattr(exc, "format_message", None), getattr(exc, "exit_code", None)
        if format_message is None or not isinstance(exit_code, int):
            raise
        if type(exc).__name__ == "NoArgsIsHelpError":  # The command alone: its help.
            typer.echo(format_message(), err=True)
            sys.exit(exit_code)
        ctx = getattr(exc, "ctx", None)
        command = ctx.command_path if ctx is not None else app.info.name or "gazette"
        usage = any(c.__name__ == "UsageError" for c in type(exc).__mro__)
        hint = f" (see `{command} --help`)" if usage else ""
        typer.echo(f"error: {_one_line(format_message())}{hint}", err=True)
        sys.exit(exit_code)
    sys.exit(code if isinstance(code, int) else 0)
