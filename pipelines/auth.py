"""The bearer token the `gazette` source and sink present to brokers (option `authToken`).

A token given as option `authToken` is sent as `authorization: Bearer <token>` on every broker
call of the driver and the executors (with the TLS files of the `BROKER_*` environment, if any).
Without it, each process presents what its own environment holds (`$BROKER_AUTH_TOKEN`, or
`$BROKER_AUTH_KEYS` to sign tokens with: see `broker.protocol.credentials`).

The token is a secret: option objects keep it out of their `repr`, and no message quotes it.
"""

from __future__ import annotations

import os

import grpc

from broker.client.errors import TransportError
from broker.protocol.credentials import Credentials
from pipelines.errors import SparkPipelineError

OPTION = "authToken"
TOKEN_ENV = "BROKER_AUTH_TOKEN"
KEYS_ENV = "BROKER_AUTH_KEYS"

_AUTH_CODES = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


class PipelineAuthError(SparkPipelineError, PermissionError):
    """A broker refused the token the source or sink presented (or the lack of one)."""


def parse_token(text: str | None) -> str:
    """The token of option `authToken` ("" when absent or empty: the environment's applies).

    A leading `Bearer ` is dropped. Raises ValueError, without quoting the token, if it holds
    characters no token can (gRPC metadata is printable ASCII).
    """
    token = (text or "").strip()
    if token[:7].lower() == "bearer ":
        token = token[7:].strip()
    if any(not "\x21" <= ch <= "\x7e" for ch in token):
        raise ValueError(
            f"{OPTION}: not a bearer token (it holds spaces or characters outside printable ASCII); "
            "expected a JWT such as `gazctl auth token` prints"
        )
    return token


def credentials(token: str) -> Credentials | None:
    """Credentials presenting `token` with the environment's TLS files; None without a token
    (so each client reads `$BROKER_AUTH_TOKEN` / `$BROKER_AUTH_KEYS` of its own process)."""
    if not token:
        return None
    env = os.environ
    return Credentials.of(
        token=token, cert_file=env.get("BROKER_CERT_FILE", ""), key_file=env.get("BROKER_CERT_KEY_FILE", ""),
        ca_file=env.get("BROKER_TRUSTED_CA_FILE", ""),
    )


def presented(token: str) -> str:
    """What a refused call presented, for messages (never the token itself)."""
    if token:
        return f"presented the token of option {OPTION}"
    if os.environ.get(TOKEN_ENV, "").strip():
        return f"presented the token of ${TOKEN_ENV}"
    if os.environ.get(KEYS_ENV, "").strip():
        return f"presented a token signed with ${KEYS_ENV}"
    return f"no token presented: set option {OPTION} (or ${TOKEN_ENV} where Spark's driver and executors run)"


def is_auth_error(err: BaseException) -> bool:
    """Whether `err` is a broker call refused for its authorization."""
    return isinstance(err, TransportError) and err.code in _AUTH_CODES


def auth_error(err: TransportError, token: str, doing: str) -> PipelineAuthError:
    """A one-line error for a refused call: what was being done, the broker's reason, and which token was sent."""
    return PipelineAuthError(f"{doing}: {err}; {presented(token)}")
