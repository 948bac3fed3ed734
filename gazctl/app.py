"""The `gazctl` command-line tool: its root command, shared options, and `main()`.

Each command's module is imported when the command runs (or when the root's help lists them):
gazctl starts once per command a user or script types, and most commands need few of the
others' libraries (jinja2 and the GitOps planner, the recovery log player, the Spark pipeline
definitions): importing them all took a third of its start-up.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import Any

import typer
import typer.core
import typer.main

from gazctl.commands.common import (
    CONSUMER_ADDRESS_FLAG,
    CREDENTIAL_FLAGS,
    BrokerAddressOption,
    BrokerAuthKeysOption,
    BrokerAuthTokenOption,
    BrokerCertFileOption,
    BrokerCertKeyFileOption,
    BrokerTrustedCAFileOption,
    ConsumerAddressOption,
    ConsumerAuthKeysOption,
    ConsumerAuthTokenOption,
    ConsumerCertFileOption,
    ConsumerCertKeyFileOption,
    ConsumerTrustedCAFileOption,
    GlobalOptions,
    LogFormatOption,
    LogLevelOption,
    credential_options,
)

COMMANDS = {
    "attach-uuids": "gazctl.commands.attach_uuids",
    "print-config": "gazctl.commands.print_config",
    "plan": "gazctl.commands.gitops",
    "sync": "gazctl.commands.gitops",
    "journals": "gazctl.commands.journals",
    "shards": "gazctl.commands.shards",
    "auth": "gazctl.commands.auth",
    "pipelines": "gazctl.commands.pipelines",
}
"""The root's commands, in the order its help lists them, and the module of each: a module adds
its commands to a Typer with `register(app)`, or is a group whose Typer is its `app`."""


def _load_command(name: str) -> Any:
    """The click command `name` of the root, built from its module (see COMMANDS)."""
    module = importlib.import_module(COMMANDS[name])
    holder = typer.Typer(add_completion=False)
    holder.callback()(lambda: None)  # A group even when the module adds one command.
    register = getattr(module, "register", None)
    if register is not None:
        register(holder)
    else:
        holder.add_typer(module.app, name=name)
    group: Any = typer.main.get_command(holder)
    return group.commands[name]


class _LazyCommands(MutableMapping[str, Any]):
    """The root group's commands, each loaded at its first lookup."""

    def __init__(self) -> None:
        self._loaded: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._loaded:
            if name not in COMMANDS:
                raise KeyError(name)
            self._loaded[name] = _load_command(name)
        return self._loaded[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        raise TypeError("the root's commands are fixed")

    def __iter__(self) -> Iterator[str]:
        yield from COMMANDS
        yield from (name for name in self._loaded if name not in COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS) + sum(1 for name in self._loaded if name not in COMMANDS)


class _RootGroup(typer.core.TyperGroup):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        lazy = _LazyCommands()
        lazy.update(self.commands)  # Any command registered on `app` itself.
        self.commands = lazy


app = typer.Typer(
    name="gazctl",
    help="gazctl is a command-line tool for interacting with Gazette brokers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=_RootGroup,
)


@app.callback()
def root(
    ctx: typer.Context,
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
    broker_auth_token: BrokerAuthTokenOption = None,
    broker_auth_keys: BrokerAuthKeysOption = None,
    consumer_address: ConsumerAddressOption = None,
    consumer_auth_token: ConsumerAuthTokenOption = None,
    consumer_auth_keys: ConsumerAuthKeysOption = None,
    broker_cert_file: BrokerCertFileOption = None,
    broker_cert_key_file: BrokerCertKeyFileOption = None,
    broker_trusted_ca_file: BrokerTrustedCAFileOption = None,
    consumer_cert_file: ConsumerCertFileOption = None,
    consumer_cert_key_file: ConsumerCertKeyFileOption = None,
    consumer_trusted_ca_file: ConsumerTrustedCAFileOption = None,
) -> None:
    """gazctl is a command-line tool for interacting with Gazette brokers."""
    ctx.obj = GlobalOptions(broker_address, log_level, log_format)
    CONSUMER_ADDRESS_FLAG.set(consumer_address)
    CREDENTIAL_FLAGS.set(credential_options(
        broker_auth_token=broker_auth_token, broker_auth_keys=broker_auth_keys,
        consumer_auth_token=consumer_auth_token, consumer_auth_keys=consumer_auth_keys,
        broker_cert_file=broker_cert_file, broker_cert_key_file=broker_cert_key_file,
        broker_trusted_ca_file=broker_trusted_ca_file, consumer_cert_file=consumer_cert_file,
        consumer_cert_key_file=consumer_cert_key_file, consumer_trusted_ca_file=consumer_trusted_ca_file,
    ))


def main() -> None:
    """Run gazctl on the process's arguments."""
    app()
