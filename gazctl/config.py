"""gazctl's settings: each the first of its flag, its environment variable, the first `gazctl.ini`
found (`./`, then `~/.config/gazette/`) and its default. Only the first INI file found is read,
as Gazette's go-flags does. The broker address is `Address` in section `[journals.Broker]`; the
consumer address of `gazctl shards` is `Address` in section `[shards.Consumer]`. Credentials
(`resolve_credentials`) are keys `AuthToken`, `AuthKeys`, `CertFile`, `CertKeyFile` and
`TrustedCAFile` of the same sections, after `$BROKER_AUTH_TOKEN` (`$CONSUMER_...`) and so on.
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from broker.client.config import BROKER_ADDRESS_ENV, DEFAULT_BROKER_ADDRESS, DialTarget, dial_target
from broker.errors import ConfigError
from broker.protocol.credentials import Credentials

__all__ = [
    "ADDRESS_KEY",
    "BROKER_ADDRESS_ENV",
    "BROKER_SECTION",
    "CONSUMER_ADDRESS_ENV",
    "CONSUMER_SECTION",
    "DEFAULT_BROKER_ADDRESS",
    "DEFAULT_CONSUMER_ADDRESS",
    "INI_NAME",
    "DialTarget",
    "Resolved",
    "dial_target",
    "find_ini",
    "ini_paths",
    "read_ini_option",
    "resolve_broker_address",
    "resolve_consumer_address",
    "resolve_credentials",
    "resolve_option",
]

INI_NAME = "gazctl.ini"
BROKER_SECTION = "journals.Broker"
ADDRESS_KEY = "Address"
CONSUMER_SECTION = "shards.Consumer"
CONSUMER_ADDRESS_ENV = "CONSUMER_ADDRESS"
DEFAULT_CONSUMER_ADDRESS = "http://localhost:8080"
"""Gazette's default. A `gazette consume` process listens on a random port unless given
`--consumer.port`, so the address must name the port of a running consumer process."""


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


def resolve_consumer_address(
    flag: str | None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    home: Path | None = None,
) -> Resolved:
    """The consumer address of `gazctl shards`: flag, then $CONSUMER_ADDRESS, then `Address` of
    `[shards.Consumer]` in the INI file, then the default; and where it came from."""
    return resolve_option(
        flag, CONSUMER_ADDRESS_ENV, CONSUMER_SECTION, ADDRESS_KEY, DEFAULT_CONSUMER_ADDRESS, env, cwd, home
    )


CREDENTIAL_SETTINGS = (
    # (flag suffix, INI key, environment variable suffix), as Gazette's AddressConfig names them.
    ("auth-token", "AuthToken", "AUTH_TOKEN"),
    ("auth-keys", "AuthKeys", "AUTH_KEYS"),
    ("cert-file", "CertFile", "CERT_FILE"),
    ("cert-key-file", "CertKeyFile", "CERT_KEY_FILE"),
    ("trusted-ca-file", "TrustedCAFile", "TRUSTED_CA_FILE"),
)


def resolve_credentials(
    group: str,
    flags: Mapping[str, str | None],
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    home: Path | None = None,
) -> Credentials:
    """What gazctl presents to brokers (`group` "broker") or consumers ("consumer"): each setting
    the first of its flag (`flags["broker.auth-token"]`...), `$BROKER_AUTH_TOKEN`..., its key in
    `[journals.Broker]` (`[shards.Consumer]`) of the INI file. ConfigError for unusable keys."""
    section = BROKER_SECTION if group == "broker" else CONSUMER_SECTION
    values = {
        flag: resolve_option(flags.get(f"{group}.{flag}"), f"{group.upper()}_{suffix}", section, key, "",
                             env, cwd, home).value
        for flag, key, suffix in CREDENTIAL_SETTINGS
    }
    return Credentials.of(
        token=values["auth-token"], keys=values["auth-keys"], cert_file=values["cert-file"],
        key_file=values["cert-key-file"], ca_file=values["trusted-ca-file"], what=group,
    )


def _unquote(value: str) -> str:
    """Strip one pair of surrounding double quotes, as go-flags' INI parser does."""
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value
