"""Broker address resolution for gazctl: `broker.client.config`, raising gazctl's ConfigError.

The rules live in the client library (see `broker.client.config`); this module re-exports
them so that a bad address or INI file is reported as a one-line gazctl error.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from broker.client import config as _config
from broker.client.config import (
    ADDRESS_KEY,
    BROKER_ADDRESS_ENV,
    BROKER_SECTION,
    DEFAULT_BROKER_ADDRESS,
    INI_NAME,
    DialTarget,
    Resolved,
    find_ini,
    ini_paths,
)
from broker.client.errors import ConfigError as ClientConfigError
from gazctl.errors import ConfigError

__all__ = [
    "ADDRESS_KEY",
    "BROKER_ADDRESS_ENV",
    "BROKER_SECTION",
    "DEFAULT_BROKER_ADDRESS",
    "INI_NAME",
    "DialTarget",
    "Resolved",
    "dial_target",
    "find_ini",
    "ini_paths",
    "read_ini_option",
    "resolve_broker_address",
    "resolve_option",
]


def read_ini_option(path: Path, section: str, key: str) -> str | None:
    """See `broker.client.config.read_ini_option`."""
    try:
        return _config.read_ini_option(path, section, key)
    except ClientConfigError as err:
        raise ConfigError(str(err)) from None


def resolve_broker_address(
    flag: str | None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    home: Path | None = None,
) -> str:
    """See `broker.client.config.resolve_broker_address`."""
    try:
        return _config.resolve_broker_address(flag, env, cwd, home)
    except ClientConfigError as err:
        raise ConfigError(str(err)) from None


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
    """See `broker.client.config.resolve_option`."""
    try:
        return _config.resolve_option(flag, env_name, section, key, default, env, cwd, home)
    except ClientConfigError as err:
        raise ConfigError(str(err)) from None


def dial_target(address: str) -> DialTarget:
    """See `broker.client.config.dial_target`."""
    try:
        return _config.dial_target(address)
    except ClientConfigError as err:
        raise ConfigError(str(err)) from None
