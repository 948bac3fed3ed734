"""OnePortListener over TLS: gRPC and HTTP/1.1 on one TLS port, client certificates required by a
CA, plain text and untrusted clients dropped without a traceback, and ServerTLS's file checks."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from pathlib import Path

import grpc
import pytest

from broker.errors import ConfigError
from cluster.server.listener import OnePortListener
from cluster.server.tls import ServerTLS, check_client_files, client_context
from tests.cluster.server.test_listener import grpc_server, hello_handler, sock_dir  # noqa: F401 (fixtures)
from tests.support.tls_certs import PKI

MIB = 1 << 20


def _channel_credentials(pki: PKI, *, client_cert: bool = True, ca: Path | None = None) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=(ca or pki.ca).read_bytes(),
        private_key=pki.client_key.read_bytes() if client_cert else None,
        certificate_chain=pki.client_cert.read_bytes() if client_cert else None,
    )


async def _https_get(port: int, path: str, context: ssl.SSLContext) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost")
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    body = await reader.readexactly(length)
    writer.close()
    return body


async def _tls_listener(pki: PKI, grpc_path: str, *, require_client_cert: bool) -> OnePortListener:
    tls = ServerTLS(str(pki.server_cert), str(pki.server_key), str(pki.ca) if require_client_cert else "")
    listener = OnePortListener("127.0.0.1", 0, grpc_path, hello_handler, ssl_context=tls.context())
    await listener.start()
    return listener


async def test_grpc_and_http_share_one_tls_port(grpc_server: str, pki: PKI) -> None:  # noqa: F811
    listener = await _tls_listener(pki, grpc_server, require_client_cert=False)
    options = [("grpc.max_send_message_length", 8 * MIB), ("grpc.max_receive_message_length", 8 * MIB)]
    try:
        creds = _channel_credentials(pki, client_cert=False)
        async with grpc.aio.secure_channel(f"127.0.0.1:{listener.port}", creds, options=options) as channel:
            echo = channel.unary_unary("/test.Test/Echo")
            assert await echo(b"ping") == b"ping"
            big = os.urandom(3 * MIB)
            assert await echo(big) == big
            total = channel.stream_unary("/test.Test/Total")
            call = total()
            for _ in range(8):
                await call.write(big)
            await call.done_writing()
            assert await call == str(24 * MIB).encode()
            # HTTP/1.1 on the same port and over TLS, as curl --cacert would.
            body = await _https_get(listener.port, "/x", client_context(ca_file=str(pki.ca)))
            assert body == b"hello GET /x HTTP/1.1"
    finally:
        await listener.close()


async def test_ca_requires_client_certificates(grpc_server: str, pki: PKI) -> None:  # noqa: F811
    listener = await _tls_listener(pki, grpc_server, require_client_cert=True)
    target = f"127.0.0.1:{listener.port}"
    try:
        async with grpc.aio.secure_channel(target, _channel_credentials(pki)) as channel:
            assert await channel.unary_unary("/test.Test/Echo")(b"ping") == b"ping"
        async with grpc.aio.secure_channel(target, _channel_credentials(pki, client_cert=False)) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await channel.unary_unary("/test.Test/Echo")(b"ping", timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        with_cert = client_context(str(pki.client_cert), str(pki.client_key), str(pki.ca))
        assert await _https_get(listener.port, "/y", with_cert) == b"hello GET /y HTTP/1.1"
        # Without a certificate the server ends the handshake (TLS 1.3: at the first read).
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            await _https_get(listener.port, "/y", client_context(ca_file=str(pki.ca)))
    finally:
        await listener.close()


async def test_plain_text_and_untrusted_clients_are_dropped_quietly(
    grpc_server: str, pki: PKI, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    caplog.set_level(logging.DEBUG)
    listener = await _tls_listener(pki, grpc_server, require_client_cert=False)
    try:
        # Plain HTTP/1.1 to the TLS port: the connection is closed.
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        # Plain gRPC: UNAVAILABLE.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{listener.port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await channel.unary_unary("/test.Test/Echo")(b"ping", timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        # A client trusting another CA refuses the server's certificate.
        with pytest.raises(ssl.SSLCertVerificationError):
            await _https_get(listener.port, "/x", client_context(ca_file=str(pki.wrong_ca)))
        creds = _channel_credentials(pki, client_cert=False, ca=pki.wrong_ca)
        async with grpc.aio.secure_channel(f"127.0.0.1:{listener.port}", creds) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await channel.unary_unary("/test.Test/Echo")(b"ping", timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        # The port still serves.
        body = await _https_get(listener.port, "/z", client_context(ca_file=str(pki.ca)))
        assert body == b"hello GET /z HTTP/1.1"
    finally:
        await listener.close()
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not noisy, [r.getMessage() for r in noisy]


def test_server_files_are_checked(pki: PKI, tmp_path: Path) -> None:
    good = ServerTLS(str(pki.server_cert), str(pki.server_key), str(pki.ca))
    ctx = good.context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ServerTLS(str(pki.server_cert), str(pki.server_key)).context().verify_mode == ssl.CERT_NONE

    missing = tmp_path / "missing.pem"
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    cases = [
        (ServerTLS(str(missing), str(pki.server_key)), "--broker.server-cert-file: cannot read"),
        (ServerTLS(str(pki.server_cert), str(missing)), "--broker.server-cert-key-file: cannot read"),
        (ServerTLS(str(pki.server_cert), str(pki.client_key)), "is not the key of the certificate"),
        (ServerTLS(str(not_pem), str(pki.server_key)), "holds no PEM certificate"),
        (ServerTLS(str(pki.server_cert), str(not_pem)), "holds no PEM private key"),
        (ServerTLS(str(pki.server_cert), str(pki.server_key), str(not_pem)), "--broker.server-ca-file"),
        (ServerTLS(str(pki.server_cert), "", flag="--consumer.server"), "--consumer.server-cert-key-file: required"),
        (ServerTLS("", "", str(pki.ca)), "--broker.server-cert-file: required"),
    ]
    for tls, expected in cases:
        with pytest.raises(ConfigError, match=expected.replace(".", r"\.")):
            tls.context()

    flags = ("--etcd.cert-file", "--etcd.cert-key-file", "--etcd.trusted-ca-file")
    check_client_files(str(pki.client_cert), str(pki.client_key), str(pki.ca), flags)
    check_client_files("", "", "", flags)
    with pytest.raises(ConfigError, match="go together"):
        check_client_files(str(pki.client_cert), "", "", flags)
    with pytest.raises(ConfigError, match=r"--etcd\.trusted-ca-file"):
        check_client_files("", "", str(missing), flags)
    with pytest.raises(ConfigError, match="is not the key"):
        check_client_files(str(pki.client_cert), str(pki.server_key), "", flags)


async def test_close_skips_a_transport_closed_twice(grpc_server: str, pki: PKI) -> None:  # noqa: F811
    """asyncio drops a TLS transport's SSL layer when it is closed a second time (`get_protocol()` then
    raises AttributeError): the listener's close() skips closed transports (it once raised there,
    and a TLS broker exited 1 on SIGTERM)."""
    listener = await _tls_listener(pki, grpc_server, require_client_cert=False)
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", listener.port, ssl=client_context(ca_file=str(pki.ca)))
        for _ in range(100):
            if listener._accepted:
                break
            await asyncio.sleep(0.01)
        (accepted,) = list(listener._accepted)
        accepted.close()
        accepted.close()  # As a connection's own shutdown and a stop can both close it.
        writer.transport.abort()
    finally:
        await listener.close()
