"""The `gazctl` command-line tool: its root command, shared options, and `main()`."""

from __future__ import annotations

import typer

from gazctl.commands import attach_uuids, gitops, journals, pipelines, print_config, shards
from gazctl.commands.common import BrokerAddressOption, GlobalOptions, LogFormatOption, LogLevelOption

app = typer.Typer(
    name="gazctl",
    help="gazctl is a command-line tool for interacting with Gazette brokers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(journals.app, name="journals")
app.add_typer(shards.app, name="shards")
attach_uuids.register(app)
print_config.register(app)
gitops.register(app)
pipelines.register(app)


@app.callback()
def root(
    ctx: typer.Context,
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """gazctl is a command-line tool for interacting with Gazette brokers."""
    ctx.obj = GlobalOptions(broker_address, log_level, log_format)


def main() -> None:
    """Run gazctl on the process's arguments."""
    app()
