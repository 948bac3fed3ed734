"""`gazctl print-config`: the merged configuration, as a `gazctl.ini` that reproduces it."""

from __future__ import annotations

import sys

import typer

from gazctl.commands.common import (
    LOG_SECTION,
    BrokerAddressOption,
    ConsumerAddressOption,
    LogFormatOption,
    LogLevelOption,
    Settings,
    reported,
    resolve_consumer,
    setup,
)
from gazctl.config import (
    ADDRESS_KEY,
    BROKER_ADDRESS_ENV,
    BROKER_SECTION,
    CONSUMER_ADDRESS_ENV,
    CONSUMER_SECTION,
    Resolved,
)


def render(settings: Settings, consumer_address: Resolved) -> str:
    """The settings as INI text: each option with a comment saying where its value came from.
    `consumer_address` is that of `gazctl shards` (`[shards.Consumer] Address`)."""

    def option(key: str, resolved: Resolved, flag: str, env: str, help_text: str) -> str:
        source = {"flag": f"flag {flag}", "env": f"${env}", "default": "default"}.get(resolved.source, resolved.source)
        return f"; {help_text} ({flag}, ${env}). From: {source}.\n{key} = {resolved.value}\n"

    return (
        "; gazctl configuration: each option is the first of its flag, its environment variable,\n"
        "; the first gazctl.ini found (./, then ~/.config/gazette/), and its default.\n"
        f"\n[{BROKER_SECTION}]\n"
        + option(ADDRESS_KEY, settings.broker_address, "--broker.address", BROKER_ADDRESS_ENV, "Broker URL")
        + f"\n[{CONSUMER_SECTION}]\n"
        + option(
            ADDRESS_KEY, consumer_address, "--consumer.address", CONSUMER_ADDRESS_ENV,
            "Consumer URL, of `gazctl shards`",
        )
        + f"\n[{LOG_SECTION}]\n"
        + option(
            "Level", settings.log_level, "--log.level", "LOG_LEVEL", "Logging level: trace|debug|info|warn|error|fatal"
        )
        + option("Format", settings.log_format, "--log.format", "LOG_FORMAT", "Logging format: text|json|color")
    )


def register(app: typer.Typer) -> None:
    """Add `print-config` to the root app."""

    @app.command("print-config")
    def print_config(
        ctx: typer.Context,
        broker_address: BrokerAddressOption = None,
        consumer_address: ConsumerAddressOption = None,
        log_level: LogLevelOption = None,
        log_format: LogFormatOption = None,
    ) -> None:
        """Print the merged configuration (flags, environment, gazctl.ini, defaults) as INI.

        The output is a valid gazctl.ini: save it as ./gazctl.ini or ~/.config/gazette/gazctl.ini
        to make the current settings the defaults.
        """
        with reported():
            settings = setup(ctx, broker_address, log_level, log_format)
            sys.stdout.write(render(settings, resolve_consumer(consumer_address)))
