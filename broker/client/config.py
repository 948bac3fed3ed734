"""Broker address resolution and its gRPC dial target, shared by the client library and gazctl.

The address is the first of: the `--broker.address` flag, the `BROKER_ADDRESS` environment
variable, `Address` in section `[journals.Broker]` of the first `gazctl.ini` found in `./` or
`~/.config/gazette/`, and `http://localhost:8080`. Only the first INI file found is read, as
Gazette's go-flags does.
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from broker.client.errors import ConfigError

DEFAULT_BROKER_ADDRESS = "http://localhost:8080"
BROKER_ADDRESS_ENV = "BROKER_ADDRESS"
INI_NAME = "gazctl.ini"
BROKER_SECTION = "journals.Broker"
ADDRESS_KEY = "Address"


def ini_paths(cwd: Path, home: Path) -> list[Path]:
    """The INI files looked for, in order: `./gazctl.ini`, then `~/.config/gazette/gazctl.ini`."""
    return [cwd / INI_NAME, home / ".config" / "gazette" / INI_NAME]


def find_ini(cwd: Path, home: Path) -> Path | None:
    """Return the first INI file which exists, or None."""
    return next((path for path in ini_paths(cwd, home) if path.is_file()), None)


def read_ini_option(path: Path, section: str, key: str) -> str | None:
    """Return option `key` of `section` in an INI file (names match case-insensitively), or None."""
    try:
        content = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read INI file: {err}") from None
    parser = configparser.ConfigParser(interpolation=None, strict=False, default_section="\0")
    try:
        # Options before any section belong to none we read; a leading header keeps them legal.
        parser.read_string("[\0top]\n" + content, source=str(path))
    except configparser.ParsingError as err:
        line = err.errors[0][0] - 1 if err.errors else 1
        lines = content.splitlines()
        bad = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        raise ConfigError(f"{path}:{line}: invalid INI file: cannot parse {bad!r}") from None
    except configparser.Error as err:
        raise ConfigError(f"{path}: invalid INI file: {err.message}") from None
    matched = next((s for s in parser.sections() if s.lower() == section.lower()), None)
    if matched is None or not parser.has_option(matched, key):
        return None
    return _unquote(parser.get(matched, key).strip())


@dataclass(frozen=True)
class Resolved:
    """A setting's value and where it came from: `flag`, `env`, the INI file's path, or `default`."""

    value: str
    source: str


def resolve_option(
    flag: str | None,
    env_name: str,
    section: str,
    key: str,
    default: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    home: Path | None = None,
) -> Resolved:
    """Resolve a setting: the flag, then `$env_name`, then `key` of `section` in the INI file, then `default`."""
    env = os.environ if env is None else env
    if flag:
        return Resolved(flag, "flag")
    if env.get(env_name):
        return Resolved(env[env_name], "env")
    ini = find_ini(cwd or Path.cwd(), home or Path.home())
    if ini is not None:
        value = read_ini_option(ini, section, key)
        if value:
            return Resolved(value, str(ini))
    return Resolved(default, "default")


def resolve_broker_address(
    flag: str | None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    home: Path | None = None,
) -> str:
    """Return the broker address: flag, then $BROKER_ADDRESS, then the INI file, then the default."""
    return resolve_option(
        flag, BROKER_ADDRESS_ENV, BROKER_SECTION, ADDRESS_KEY, DEFAULT_BROKER_ADDRESS, env, cwd, home
    ).value


@dataclass(frozen=True)
class DialTarget:
    """Where to dial a broker: its URL, gRPC target (`host:port` or `unix:///path`), and whether to use TLS."""

    address: str
    target: str
    tls: bool


def dial_target(address: str) -> DialTarget:
    """Map a broker URL to its gRPC target: `http://host:port` -> `host:port` (http defaults to port 80).

    `https://` dials with TLS (default port 443), and `unix://host/abs/path` dials the socket path.
    """
    try:
        url = urlsplit(address)
        port = url.port
    except ValueError as err:
        raise ConfigError(f"invalid broker address {address!r}: {err}") from None
    scheme = url.scheme.lower()
    if scheme == "unix":
        if not url.path.startswith("/"):
            raise ConfigError(f"invalid broker address {address!r}: expected unix://host/absolute/path")
        return DialTarget(address, f"unix://{url.path}", tls=False)
    if scheme not in ("http", "https") or not url.hostname:
        raise ConfigError(
            f"invalid broker address {address!r}: expected a URL such as http://host:port, "
            "https://host:port or unix://host/path"
        )
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    default_port = 443 if scheme == "https" else 80
    return DialTarget(address, f"{host}:{port or default_port}", tls=scheme == "https")


def _unquote(value: str) -> str:
    """Strip one pair of surrounding double quotes, as go-flags' INI parser does."""
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value
