"""TLS of the public port, as Gazette's `--broker.server-cert-file` and friends.

`ServerTLS(cert_file, key_file, ca_file)` is what `gazette serve` (and `gazette consume`, with its
`--consumer.server-*` flags) is given. `context()` builds the asyncio server context of the
one-port listener: TLS 1.2 or later, ALPN offering `h2` (gRPC clients require it) and
`http/1.1`; with a CA file, client certificates signed by that CA are required (CERT_REQUIRED),
as Gazette's `--broker.server-ca-file` does. Every file is checked when the context is built,
and a file that cannot be used is a ConfigError naming its flag, the file and what is wrong.

`check_client_files` does the same checks for the PEM files a process presents as a client
(`--broker.peer-*`, `--etcd.*`), so that a bad one stops it at startup rather than failing every
later connection. Both raise `TLSFileError`, a ConfigError carrying the flag apart from the
problem, so that a command line reports it as any other invalid flag value.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from broker.errors import ConfigError


class TLSFileError(ConfigError):
    """A TLS file that cannot be used: `flag` names its option, `problem` what is wrong."""

    def __init__(self, flag: str, problem: str) -> None:
        super().__init__(f"{flag}: {problem}")
        self.flag = flag
        self.problem = problem


ALPN_PROTOCOLS = ["h2", "http/1.1"]
"""What the public port offers in ALPN: gRPC needs `h2`; HTTP/1.1 clients pick `http/1.1`."""


@dataclass(frozen=True)
class ServerTLS:
    """The PEM files of a TLS server: its certificate chain, its key, and the CA its clients'
    certificates must be signed by (none: clients need no certificate). `flag` is the flags'
    prefix, for error messages (`--broker.server`, `--consumer.server`)."""

    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""
    flag: str = "--broker.server"

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file or self.key_file or self.ca_file)

    def context(self) -> ssl.SSLContext:
        """The server context of these files; ConfigError for a missing, unreadable or mismatched one."""
        if not self.cert_file or not self.key_file:
            missing = "-cert-file" if not self.cert_file else "-cert-key-file"
            given = ", ".join(f"{self.flag}{suffix}" for suffix, value in self._files() if value)
            raise TLSFileError(f"{self.flag}{missing}", f"required for TLS (given: {given})")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(ALPN_PROTOCOLS)
        load_cert_chain(ctx, self.cert_file, self.key_file, f"{self.flag}-cert-file", f"{self.flag}-cert-key-file")
        if self.ca_file:
            load_ca(ctx, self.ca_file, f"{self.flag}-ca-file")
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def _files(self) -> list[tuple[str, str]]:
        return [("-cert-file", self.cert_file), ("-cert-key-file", self.key_file), ("-ca-file", self.ca_file)]


def check_client_files(cert_file: str, key_file: str, ca_file: str, flags: tuple[str, str, str]) -> None:
    """Check the PEM files of a TLS client (any may be empty); ConfigError naming the flag of a bad one.

    `flags` name the three files' options, e.g. `("--etcd.cert-file", "--etcd.cert-key-file",
    "--etcd.trusted-ca-file")`.
    """
    if bool(cert_file) != bool(key_file):
        missing, given = (flags[1], flags[0]) if cert_file else (flags[0], flags[1])
        raise TLSFileError(missing, f"required with {given} (a client certificate and its key go together)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if cert_file:
        load_cert_chain(ctx, cert_file, key_file, flags[0], flags[1])
    if ca_file:
        load_ca(ctx, ca_file, flags[2])


def client_context(cert_file: str = "", key_file: str = "", ca_file: str = "") -> ssl.SSLContext:
    """An ssl client context presenting `cert_file`/`key_file` (if set) and trusting `ca_file`
    (the system's roots when empty), for HTTPS clients of a TLS port."""
    ctx = ssl.create_default_context(cafile=ca_file or None)
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file or None)
    return ctx


def load_cert_chain(ctx: ssl.SSLContext, cert_file: str, key_file: str, cert_flag: str, key_flag: str) -> None:
    """`ctx.load_cert_chain`, with a ConfigError naming the flag and file that cannot be used."""
    _readable(cert_file, cert_flag)
    _readable(key_file, key_flag)
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        reason = exc.reason or ""
        if reason == "KEY_VALUES_MISMATCH":
            raise TLSFileError(
                key_flag, f"{key_file} is not the key of the certificate in {cert_file} ({cert_flag})"
            ) from None
        if not _is_pem(cert_file, "CERTIFICATE"):
            raise TLSFileError(cert_flag, f"{cert_file} holds no PEM certificate") from None
        raise TLSFileError(
            key_flag, f"{key_file} holds no PEM private key usable with {cert_file} ({reason or exc})"
        ) from None


def load_ca(ctx: ssl.SSLContext, ca_file: str, flag: str) -> None:
    """`ctx.load_verify_locations(ca_file)`, with a ConfigError naming the flag and file."""
    _readable(ca_file, flag)
    try:
        ctx.load_verify_locations(cafile=ca_file)
    except ssl.SSLError as exc:
        raise TLSFileError(flag, f"{ca_file} holds no PEM CA certificate ({exc.reason or exc})") from None
    if not _is_pem(ca_file, "CERTIFICATE"):
        raise TLSFileError(flag, f"{ca_file} holds no PEM CA certificate")


def _readable(path: str, flag: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise TLSFileError(flag, f"cannot read {path}: {exc.strerror or exc}") from None


def _is_pem(path: str, kind: str) -> bool:
    try:
        return f"-----BEGIN {kind}-----".encode() in Path(path).read_bytes()
    except OSError:
        return False


__all__ = ["ALPN_PROTOCOLS", "ServerTLS", "TLSFileError", "check_client_files", "client_context"]
