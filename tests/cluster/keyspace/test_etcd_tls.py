"""The broker's etcd over TLS: an `https://` --etcd.address is dialed with the --etcd.* files,
against a real etcd that requires client certificates; a wrong CA or no certificate is a clear
EtcdUnavailableError."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest

from cluster.keyspace.errors import EtcdUnavailableError
from cluster.keyspace.etcd import open_etcd
from tests.support.tls_certs import PKI

log = logging.getLogger(__name__)


def _credentials(pki: PKI, *, ca: Path | None = None, client_cert: bool = True) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=(ca or pki.ca).read_bytes(),
        private_key=pki.client_key.read_bytes() if client_cert else None,
        certificate_chain=pki.client_cert.read_bytes() if client_cert else None,
    )


async def test_https_etcd_with_client_certificate(tls_etcd: str, pki: PKI, tmp_path: Path) -> None:
    conn = await open_etcd(tls_etcd, tmp_path, log, credentials=_credentials(pki), timeout=10)
    try:
        assert conn.endpoint.startswith("https://")
        await conn.client.put(b"/tls-test/key", b"value")
        got = await conn.client.get(b"/tls-test/key")
        assert got is not None and got.value == b"value"
    finally:
        await conn.close()


@pytest.mark.parametrize("case", ["wrong CA", "no client certificate", "plain text"])
async def test_https_etcd_refusals_are_clear(tls_etcd: str, pki: PKI, tmp_path: Path, case: str) -> None:
    address = tls_etcd
    if case == "wrong CA":
        creds = _credentials(pki, ca=pki.wrong_ca)
    elif case == "no client certificate":
        creds = _credentials(pki, client_cert=False)
    else:
        creds = None
        address = tls_etcd.replace("https://", "http://")
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(EtcdUnavailableError) as err:
        await open_etcd(address, tmp_path, log, credentials=creds, timeout=5 if creds is not None else 1.5)
    if creds is not None:
        assert loop.time() - started < 4, "a refused certificate is not retried"
    message = str(err.value)
    assert "did not answer" in message and "last error" in message, message
    if creds is not None:
        assert "--etcd.trusted-ca-file" in message, message
