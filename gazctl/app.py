"""The `gazctl` command-line tool: its root command, shared options, and `main()`."""

from __future__ import annotations

import typer

from gazctl.commands import attach_uuids, auth, gitops, journals, pipelines, print_config, shards
from gazctl.commands.common import (
    CONSUMER_ADDRESS_FLAG,
    CREDENTIAL_FLAGS,
    BrokerAddressOption,
    BrokerAuthKeysOption,
    BrokerAuthTokenOption,
    BrokerCertFileOption,
    BrokerCertKeyFileOption,
    BrokerTrustedCAFileOption,
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
from gazctl.commands.shards._client import ConsumerAddressOption

app = typer.Typer(
    name="gazctl",
    help="gazctl is a command-line tool for interacting with Gazette brokers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(journals.app, name="journals")
app.add_typer(shards.app, name="shards")
app.add_typer(auth.app, name="auth")
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
