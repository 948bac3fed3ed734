"""`gazette`: the command line of brokers (`gazette serve`) and consumers (`gazette consume MODULE:ATTR`).

The `gazette` console script runs `main()` here. Each runtime keeps its own command (`broker.cli`,
`consumer.cli`; `python -m broker serve` and `python -m consumer consume` run one alone); this
package, which may import both, puts them side by side.

Errors are one line on stderr, `error: <what is wrong>`, with exit status 2 for bad arguments and
1 for a failure to start; never a traceback.
"""

from __future__ import annotations

import typer

from broker import cli as broker_cli
from cluster.server.command import run
from consumer import cli as consumer_cli

app = typer.Typer(
    name="gazette",
    help="Gazette: `serve` runs a broker (journals over gRPC and HTTP on one port); "
    "`consume MODULE:ATTR` runs a consumer application's shards.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("serve")(broker_cli.serve)
app.command("consume")(consumer_cli.consume)


@app.callback()
def main_callback() -> None:
    """Gazette brokers and consumers."""


def main() -> None:
    """Run `gazette` on the process's arguments; errors are one line on stderr, never a traceback."""
    run(app, (consumer_cli.StartError,))


__all__ = ["app", "main"]
