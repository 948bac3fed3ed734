"""`gazctl auth token`: mint an authorization token for a selector and capabilities.

The token is what `--broker.auth-token` (`$BROKER_AUTH_TOKEN`), `--consumer.auth-token`, the
client library and HTTP clients (`Authorization: Bearer <token>`) present. It is signed with the
first of the keys brokers (or consumers) were started with (`--broker.auth-keys`), read from
`--keys`, else `--broker.auth-keys` given before the command, `$BROKER_AUTH_KEYS`, the INI file.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from broker.errors import AuthError, ConfigError
from broker.protocol.auth import Capability, Claims, KeyedAuth, capability_names, parse_capabilities, selector_json
from broker.specs.durations import DurationError, parse_duration
from gazctl.commands.common import CREDENTIAL_FLAGS, reported
from gazctl.config import BROKER_SECTION, resolve_option
from gazctl.errors import GazctlError
from gazctl.selectors import parse_list_selector

app = typer.Typer(help="Authorization tokens for brokers and consumers started with auth keys.",
                  no_args_is_help=True)


@app.command("token")
def token_command(
    selector: Annotated[
        str,
        typer.Option(
            "--selector", "-l",
            help="Journals (or shards) the token covers, e.g. 'prefix=examples/' or 'name=a/b' (default: all)",
        ),
    ] = "",
    capability: Annotated[
        list[str] | None,
        typer.Option(
            "--capability", "-c",
            help="Capabilities granted: LIST, APPLY, READ, APPEND, REPLICATE, ALL or a number; "
            "repeat or separate by commas",
            show_default=False,
        ),
    ] = None,
    ttl: Annotated[
        str, typer.Option("--ttl", help="How long the token is valid, as a Go duration (e.g. 1h, 30m, 720h)")
    ] = "1h",
    keys: Annotated[
        str | None,
        typer.Option(
            "--keys",
            help="Base64 signing keys, as the brokers' --broker.auth-keys (the first signs) "
            "[default: --broker.auth-keys, $BROKER_AUTH_KEYS, INI [journals.Broker] AuthKeys]",
            show_default=False,
        ),
    ] = None,
    claims_out: Annotated[
        bool, typer.Option("--claims", help="Print the token's claims as JSON on stderr")
    ] = False,
) -> None:
    """Mint a token granting capabilities over the journals (or shards) a selector matches.

    Examples:

      gazctl auth token -c READ,APPEND -l prefix=examples/ --ttl 24h

      BROKER_AUTH_TOKEN=$(gazctl auth token -c ALL) gazctl journals list
    """
    with reported():
        if not capability:
            raise GazctlError("--capability is required: which of LIST, APPLY, READ, APPEND, REPLICATE, ALL?")
        try:
            cap = parse_capabilities(",".join(capability))
            seconds = _parse_ttl(ttl)
            auth = KeyedAuth(_keys(keys))
        except AuthError as err:
            raise GazctlError(str(err)) from None
        if cap == Capability.NONE:
            raise GazctlError("--capability grants nothing: name at least one capability")
        claims = Claims(cap, parse_list_selector(selector)) if selector else Claims(cap)
        token = auth.sign(claims, seconds)
        sys.stdout.write(token + "\n")
        if claims_out:
            described = {"cap": capability_names(cap), "sel": selector_json(claims.selector), "ttl_seconds": seconds}
            sys.stderr.write(json.dumps(described) + "\n")


def _keys(flag: str | None) -> str:
    from_root = CREDENTIAL_FLAGS.get().get("broker.auth-keys")
    resolved = resolve_option(flag or from_root, "BROKER_AUTH_KEYS", BROKER_SECTION, "AuthKeys", "")
    if not resolved.value:
        raise ConfigError(
            "no signing keys: pass --keys (the brokers' --broker.auth-keys), or set $BROKER_AUTH_KEYS"
        )
    return resolved.value


def _parse_ttl(text: str) -> int:
    try:
        ns = parse_duration(text)
    except DurationError as err:
        raise GazctlError(f"invalid --ttl {text!r}: {err}") from None
    if ns < 1_000_000_000:
        raise GazctlError(f"invalid --ttl {text!r}: must be at least one second")
    return ns // 1_000_000_000
