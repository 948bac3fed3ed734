"""Test certificates made with `cryptography`: a CA, a server certificate it signs (for localhost
and 127.0.0.1, usable as a client certificate too, as a peer presents its own), a client
certificate, and a second, unrelated CA with its own server certificate (the "wrong" CA).
`TLSEtcd` is an etcd serving its clients over TLS with them, and requiring client certificates;
`TLSBroker` a `gazette serve` whose port speaks TLS and requires client certificates.

The equivalent with openssl is in the README's TLS section."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cluster.keyspace.etcd import EtcdProcess
from cluster.server.tls import client_context
from tests.support.harness import BrokerProcess

PrivateKey = ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class PKI:
    """Paths of the PEM files `make_pki` wrote."""

    ca: Path
    """The CA certificate that signs `server_cert` and `client_cert`."""
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    wrong_ca: Path
    """A CA that signed none of the above."""
    wrong_server_cert: Path
    """A certificate for localhost signed by `wrong_ca`."""
    wrong_server_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key() -> PrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: PrivateKey) -> Path:
    path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ))
    path.chmod(0o600)
    return path


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))


def _ca(common_name: str) -> tuple[x509.Certificate, PrivateKey]:
    key = _key()
    builder = _validity(
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
    )
    builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    builder = builder.add_extension(
        x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
        ),
        critical=True,
    )
    builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    return builder.sign(key, hashes.SHA256()), key


def _leaf(
    common_name: str, ca: x509.Certificate, ca_key: PrivateKey, *, server: bool
) -> tuple[x509.Certificate, PrivateKey]:
    key = _key()
    builder = _validity(
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
    )
    builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if server:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
        builder = builder.add_extension(
            x509.SubjectAlternativeName([
                x509.DNSName("localhost"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            ]),
            critical=False,
        )
    builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    builder = builder.add_extension(
        x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
    )
    return builder.sign(ca_key, hashes.SHA256()), key


def make_pki(directory: Path) -> PKI:
    """Write a CA, server and client certificates, and a wrong CA, into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _ca("gazette test CA")
    server, server_key = _leaf("localhost", ca, ca_key, server=True)
    client, client_key = _leaf("gazette test client", ca, ca_key, server=False)
    wrong, wrong_key = _ca("some other CA")
    wrong_server, wrong_server_key = _leaf("localhost", wrong, wrong_key, server=True)
    return PKI(
        ca=_write_cert(directory / "ca.pem", ca),
        server_cert=_write_cert(directory / "server.pem", server),
        server_key=_write_key(directory / "server-key.pem", server_key),
        client_cert=_write_cert(directory / "client.pem", client),
        client_key=_write_key(directory / "client-key.pem", client_key),
        wrong_ca=_write_cert(directory / "wrong-ca.pem", wrong),
        wrong_server_cert=_write_cert(directory / "wrong-server.pem", wrong_server),
        wrong_server_key=_write_key(directory / "wrong-server-key.pem", wrong_server_key),
    )


class TLSEtcd(EtcdProcess):
    """An etcd whose client URL is `https://`, with `pki`'s server certificate, requiring client
    certificates signed by `pki.ca` (etcd's --client-cert-auth)."""

    def __init__(self, data_dir: Path, pki: PKI, **kwargs: Any) -> None:
        super().__init__(data_dir, **kwargs)
        self.pki = pki

    @property
    def endpoint(self) -> str:
        return f"https://{self.host}:{self.client_port}"

    def command(self) -> list[str]:
        return [
            *super().command(),
            f"--cert-file={self.pki.server_cert}",
            f"--key-file={self.pki.server_key}",
            f"--trusted-ca-file={self.pki.ca}",
            "--client-cert-auth",
        ]

    def _healthy(self) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca))
        ctx.load_cert_chain(str(self.pki.client_cert), str(self.pki.client_key))
        try:
            with urllib.request.urlopen(f"{self.endpoint}/health", timeout=1.0, context=ctx) as resp:
                return b'"true"' in resp.read()
        except (urllib.error.URLError, OSError, ValueError):
            return False


def server_flags(pki: PKI) -> list[str]:
    return [
        "--broker.server-cert-file", str(pki.server_cert), "--broker.server-cert-key-file", str(pki.server_key),
        "--broker.server-ca-file", str(pki.ca),
        # Peers present the server's certificate (it is good for client auth too) and trust the CA.
        "--broker.peer-cert-file", str(pki.server_cert), "--broker.peer-cert-key-file", str(pki.server_key),
        "--broker.peer-ca-file", str(pki.ca),
    ]


class TLSBroker(BrokerProcess):
    """A broker process whose port speaks TLS only."""

    def __init__(self, tmp: Path, etcd: str, prefix: str, pki: PKI, *extra: str) -> None:
        super().__init__(tmp, etcd, prefix, *server_flags(pki), *extra)
        self.pki = pki

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def context(self) -> ssl.SSLContext:
        return client_context(str(self.pki.client_cert), str(self.pki.client_key), str(self.pki.ca))

    def wait_ready(self, timeout: float = 30.0) -> TLSBroker:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                with urllib.request.urlopen(f"{self.url}/debug/ready", timeout=1, context=self.context()) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"broker not ready after {timeout}s:\n{self.logs()}")
