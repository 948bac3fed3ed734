"""`gazette consume` over TLS: its port (Shard API, `/debug/ready`) with `--consumer.server-*` and a
client CA, reading from and writing to a TLS broker with `--broker.cert-file`,
`--broker.cert-key-file` and `--broker.trusted-ca-file`; `gazctl shards` with `--consumer.*` TLS
options; a consumer TLS file that cannot be used is a one-line error."""

from __future__ import annotations

import asyncio
import signal
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from broker.client import AppendService, Credentials, JournalClient
from consumer.protocol import pb as cpb
from consumer.protocol import pb_grpc as cpb_grpc
from tests.consumer.test_consume_cli import ConsumerProcess, publish, run_consume, stat_through
from tests.support.apps import NDJSON, create_tables, read_counts
from tests.support.harness import journal_spec, one_line_error, run_gazctl
from tests.support.journals import create_journal, unique
from tests.support.tls_certs import PKI, TLSBroker


@pytest.fixture(scope="module")
def tls_broker(etcd_endpoint: str, pki: PKI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSBroker]:
    proc = TLSBroker(tmp_path_factory.mktemp("tls-broker"), etcd_endpoint, f"/test/{uuid.uuid4().hex}", pki)
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.logs()


def client_credentials(pki: PKI) -> Credentials:
    return Credentials.of(cert_file=str(pki.client_cert), key_file=str(pki.client_key), ca_file=str(pki.ca))


@pytest.fixture
async def client(tls_broker: TLSBroker, pki: PKI) -> AsyncIterator[JournalClient]:
    async with JournalClient(tls_broker.url, credentials=client_credentials(pki)) as c:
        yield c


class TLSConsumer(ConsumerProcess):
    def __init__(
        self, tmp: Path, broker: TLSBroker, etcd: str, prefix: str, db: Path, pki: PKI, consumer_id: str = "cons-tls"
    ) -> None:
        super().__init__(
            tmp, broker, etcd, prefix, db, consumer_id,
            "--consumer.server-cert-file", str(pki.server_cert), "--consumer.server-cert-key-file",
            str(pki.server_key), "--consumer.server-ca-file", str(pki.ca),
            "--consumer.peer-cert-file", str(pki.server_cert), "--consumer.peer-cert-key-file", str(pki.server_key),
            "--consumer.peer-ca-file", str(pki.ca),
            "--broker.cert-file", str(pki.client_cert), "--broker.cert-key-file", str(pki.client_key),
            "--broker.trusted-ca-file", str(pki.ca),
        )
        self.pki = pki

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 30.0) -> None:
        context = TLSBroker.context(self)  # type: ignore[arg-type]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"consumer exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                with urllib.request.urlopen(f"{self.url}/debug/ready", timeout=1, context=context) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"consumer not ready after {timeout}s:\n{self.logs()}")


async def test_consumer_serves_tls_and_reads_a_tls_broker(
    tls_broker: TLSBroker, etcd_endpoint: str, client: JournalClient, pki: PKI, tmp_path: Path
) -> None:
    source = journal_spec(unique("tls/src"), content_type=NDJSON)
    await create_journal(client, source)
    db = tmp_path / "counts.db"
    create_tables(db)
    prefix = f"/test/{uuid.uuid4().hex}"
    consumer = TLSConsumer(tmp_path, tls_broker, etcd_endpoint, prefix, db, pki)
    peer: TLSConsumer | None = None
    try:
        await asyncio.to_thread(consumer.wait_ready)
        creds = grpc.ssl_channel_credentials(
            root_certificates=pki.ca.read_bytes(), private_key=pki.client_key.read_bytes(),
            certificate_chain=pki.client_cert.read_bytes(),
        )
        async with grpc.aio.secure_channel(f"127.0.0.1:{consumer.port}", creds) as channel:
            stub = cpb_grpc.ShardStub(channel)
            spec = cpb.ShardSpec(id="tls-shard", max_txn_duration=Duration(nanos=100_000_000))
            spec.sources.add(journal=source.name)
            applied = await stub.Apply(cpb.ApplyRequest(changes=[cpb.ApplyRequest.Change(upsert=spec)]))
            assert applied.status == cpb.OK
            async with AppendService(client) as appender:
                head = await publish(appender, source.name, "a", "b", "a")
            await stat_through(stub, "tls-shard", source.name, head)
            assert read_counts(db) == {"a": 2, "b": 1}
            [shard] = (await stub.List(cpb.ListRequest())).shards
            assert list(shard.route.endpoints) == [consumer.url]

        # A second member proxies Stat to the primary over TLS, presenting --consumer.peer-cert-file.
        peer = TLSConsumer(tmp_path, tls_broker, etcd_endpoint, prefix, db, pki, "cons-tls-peer")
        await asyncio.to_thread(peer.wait_ready)
        async with grpc.aio.secure_channel(f"127.0.0.1:{peer.port}", creds) as channel:
            proxied = await stat_through(cpb_grpc.ShardStub(channel), "tls-shard", source.name, head)
            assert proxied.header.process_id.suffix == "cons-tls", "answered by the primary, through the peer"

        # gazctl shards over TLS, its options before the command as Gazette's.
        tls = ["--consumer.trusted-ca-file", str(pki.ca), "--consumer.cert-file", str(pki.client_cert),
               "--consumer.cert-key-file", str(pki.client_key)]
        done = await asyncio.to_thread(
            run_gazctl, None, *tls, "shards", "list", "--primary", env={"CONSUMER_ADDRESS": consumer.url}
        )
        assert done.returncode == 0, done.stderr
        assert "tls-shard" in done.stdout and "cons-tls" in done.stdout, done.stdout
        done = await asyncio.to_thread(
            run_gazctl, None, "--consumer.trusted-ca-file", str(pki.wrong_ca), "shards", "list",
            env={"CONSUMER_ADDRESS": consumer.url},
        )
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith("error: ") and "CERTIFICATE_VERIFY_FAILED" in done.stderr, done.stderr
    finally:
        if peer is not None:
            assert await asyncio.to_thread(peer.stop, signal.SIGTERM) == 0, peer.logs()
        rc = await asyncio.to_thread(consumer.stop, signal.SIGTERM)
    assert rc == 0, consumer.logs()
    assert "Traceback" not in consumer.logs()
    assert peer is not None and "Traceback" not in peer.logs()


def test_unusable_consumer_tls_files_are_one_line_errors(pki: PKI, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pem")
    cases = [
        (["--consumer.server-cert-file", missing, "--consumer.server-cert-key-file", str(pki.server_key)],
         "--consumer.server-cert-file"),
        (["--consumer.server-cert-file", str(pki.server_cert), "--consumer.server-cert-key-file",
          str(pki.client_key)], "--consumer.server-cert-key-file"),
        (["--broker.trusted-ca-file", missing], "--broker.trusted-ca-file"),
        (["--consumer.peer-cert-file", str(pki.client_cert)], "--consumer.peer-cert-key-file"),
    ]
    for args, flag in cases:
        done = run_consume("consume", "tests.support.cli_apps:app", "--etcd.address", "http://127.0.0.1:1", *args)
        one_line_error(done, flag, code=2)
