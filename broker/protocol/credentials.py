"""What a client presents to brokers (or consumers): an authorization token and TLS files.

`Credentials.from_env("BROKER")` reads Gazette's variables: `BROKER_AUTH_TOKEN` (a static bearer
token), `BROKER_AUTH_KEYS` (base64 keys to self-sign tokens with; the token wins when both are
set), `BROKER_CERT_FILE`, `BROKER_CERT_KEY_FILE` and `BROKER_TRUSTED_CA_FILE` (TLS of `https://`
endpoints). `"CONSUMER"` reads the `CONSUMER_*` ones. A `Dialer` applies them to every channel
and stub it hands out: `secure_channel` with the TLS files for `https://` endpoints, and the
token added as `authorization` metadata to every call that does not carry its own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc

from broker.errors import AuthError, ConfigError
from broker.protocol.auth import Signer

StubT = TypeVar("StubT")


@dataclass(frozen=True)
class TLSFiles:
    """PEM files of a TLS client: its certificate and key (for servers that require one), and the
    CA it trusts (the system's roots when empty)."""

    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError("a TLS client certificate needs both its cert file and its key file")

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials of these files; ConfigError naming a file that cannot be read."""
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file) if self.ca_file else None,
            private_key=_read(self.key_file) if self.key_file else None,
            certificate_chain=_read(self.cert_file) if self.cert_file else None,
        )


    def channel(
        self, target: str, *, tls: bool, options: Sequence[tuple[str, Any]] | None = None
    ) -> grpc.aio.Channel:
        """A grpc.aio channel to `target` (`host:port`), over TLS with these files when `tls`."""
        if tls:
            return grpc.aio.secure_channel(target, self.channel_credentials(), options=options)
        return grpc.aio.insecure_channel(target, options=options)


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read TLS file {path}: {exc.strerror or exc}") from None


@dataclass(frozen=True)
class Credentials:
    """A client's token (through `signer`) and TLS files; the default presents nothing."""

    signer: Signer | None = None
    tls: TLSFiles = field(default_factory=TLSFiles)

    @classmethod
    def from_env(cls, prefix: str = "BROKER", env: Mapping[str, str] | None = None) -> Credentials:
        """Credentials from `<prefix>_AUTH_TOKEN`, `_AUTH_KEYS`, `_CERT_FILE`, `_CERT_KEY_FILE`, `_TRUSTED_CA_FILE`."""
        env = os.environ if env is None else env
        return cls.of(
            token=env.get(f"{prefix}_AUTH_TOKEN", ""), keys=env.get(f"{prefix}_AUTH_KEYS", ""),
            cert_file=env.get(f"{prefix}_CERT_FILE", ""), key_file=env.get(f"{prefix}_CERT_KEY_FILE", ""),
            ca_file=env.get(f"{prefix}_TRUSTED_CA_FILE", ""), what=prefix.lower(),
        )

    @classmethod
    def of(
        cls, *, token: str = "", keys: str = "", cert_file: str = "", key_file: str = "", ca_file: str = "",
        what: str = "broker",
    ) -> Credentials:
        """Credentials of these settings (empty: not set); ConfigError for keys that do not decode."""
        signer = None
        if token or keys:
            try:
                signer = Signer(token=token.strip(), keys=keys)
            except AuthError as exc:
                raise ConfigError(f"--{what}.auth-keys: {exc}") from None
        return cls(signer, TLSFiles(cert_file, key_file, ca_file))

    def authorize(self, stub: StubT) -> StubT:
        """`stub` with every method adding this token's `authorization` metadata (unless the call
        passes its own); `stub` itself when there is no token."""
        if self.signer is None:
            return stub
        for name, method in list(vars(stub).items()):
            if callable(method):
                setattr(stub, name, _Authorized(method, self.signer))
        return stub


class _Authorized:
    """A stub's multi-callable that adds the signer's `authorization` metadata to each call."""

    __slots__ = ("_method", "_signer")

    def __init__(self, method: Any, signer: Signer) -> None:
        self._method = method
        self._signer = signer

    def __call__(self, *args: Any, metadata: Any = None, **kwargs: Any) -> Any:
        if metadata is None:
            metadata = self._signer.metadata()
        elif not any(key == "authorization" for key, _ in metadata):
            metadata = (*metadata, *self._signer.metadata())
        return self._method(*args, metadata=metadata, **kwargs)


__all__ = ["Credentials", "TLSFiles"]
