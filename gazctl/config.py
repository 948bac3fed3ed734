"""Broker address resolution for gazctl: `broker.client.config`, raising gazctl's ConfigError.

The rules live in the client library (see `broker.client.config`); this module re-exports
them so that a bad address or INI file is reported as a one-line gazctl error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

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


P = ParamSpec("P")
T = TypeVar("T")


def _raising_gazctl_errors(rule: Callable[P, T]) -> Callable[P, T]:
    """`rule`, raising gazctl's ConfigError where the client library raises its own."""

    @functools.wraps(rule)
    def translated(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return rule(*args, **kwargs)
        except ClientConfigError as err:
            raise ConfigError(str(err)) from None

    return translated


read_ini_option = _raising_gazctl_errors(_config.read_ini_option)
resolve_broker_address = _raising_gazctl_errors(_config.resolve_broker_address)
resolve_option = _raising_gazctl_errors(_config.resolve_option)
dial_target = _raising_gazctl_errors(_config.dial_target)
