"""Shared fixtures: one real etcd per test session (and a TLS one, with a test CA, per module that asks),
a unique keyspace root per test, the object stores' emulators, a real broker (with a Journal stub) per
test module, and a client and AppendService of it per test. The helpers they use are tests/support's."""

from __future__ import annotations

import os

# Before gRPC is imported: its fork handlers, run in a fork()ed child while the tests' gRPC threads
# are busy, crash about one child in a hundred with SIGSEGV before it execs (measured: 5 of 300
# `subprocess.run(..., user=...)`, which must fork, not vfork). PostgreSQL is started that way.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import importlib.metadata
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aetcd
import pytest
from grpc._cython import cygrpc

from broker.client import AppendService, JournalClient
from broker.protocol import pb_grpc
from cluster.keyspace.etcd import EtcdProcess, parse_address
from tests.support.harness import BrokerProcess, free_port, serving_broker
from tests.support.store_emulators import (
    EMULATORS,
    AzuriteServer,
    EmulatorMissing,
    EmulatorProcess,
    FakeGCSServer,
    MotoServer,
    running,
    use_test_credentials,
)
from tests.support.tls_certs import PKI, TLSEtcd, make_pki

# grpc.aio shuts its poller thread down when its last channel or server is freed, joining that
# thread; a call left pending in a loop that was closed (a test cut off by its timeout) keeps the
# thread from ending, and the garbage collector then hangs the whole run in that join, in whatever
# test happens to be running. One reference held for the session keeps grpc.aio up until exit.
cygrpc.init_grpc_aio()

# Named in the report's header, so that a run's log says what a fresh install resolved.
REPORTED_DISTRIBUTIONS = (
    "pyspark", "pyarrow", "numpy", "grpcio", "protobuf", "aetcd", "boto3", "moto", "google-cloud-storage",
    "azure-storage-blob", "typer",
)


def pytest_report_header() -> str:
    """The versions of the dependencies that have broken us before, or could."""
    versions = []
    for name in REPORTED_DISTRIBUTIONS:
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    return "dependencies: " + ", ".join(versions)


def running_etcd(proc: EtcdProcess) -> Iterator[str]:
    """Start `proc`, yield its URL once it is ready, and stop it after."""
    proc.start()
    try:
        proc.wait_ready(30.0)
        yield proc.endpoint
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def etcd_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL (`http://127.0.0.1:PORT`) of an etcd process that lives for the whole session."""
    tmp = tmp_path_factory.mktemp("etcd")
    # No fsync: on a loaded 2-core host etcd's WAL fsyncs stalled long enough for every broker's
    # lease to expire at once (the brokers then exit, as they must). Test data is throwaway.
    proc = EtcdProcess(
        tmp / "data", client_port=free_port(), peer_port=free_port(), log_path=tmp / "etcd.log",
        extra_args=["--unsafe-no-fsync"],
    )
    yield from running_etcd(proc)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    """A test CA with server and client certificates, and a wrong CA (tests/support/tls_certs.py)."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_etcd(pki: PKI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL (`https://127.0.0.1:PORT`) of an etcd of the module that serves TLS with `pki`'s certificates
    and requires client certificates."""
    tmp = tmp_path_factory.mktemp("tls-etcd")
    proc = TLSEtcd(
        tmp / "data", pki, client_port=free_port(), peer_port=free_port(), log_path=tmp / "etcd.log",
        extra_args=["--unsafe-no-fsync"],
    )
    yield from running_etcd(proc)


@pytest.fixture
def etcd_prefix() -> str:
    """A keyspace root no other test uses, e.g. `/test/3f2a…`."""
    return f"/test/{uuid.uuid4().hex}"


@pytest.fixture
async def etcd_client(etcd_endpoint: str) -> AsyncIterator[Any]:
    """A connected aetcd client of the session's etcd."""
    host, port = parse_address(etcd_endpoint)
    client = aetcd.Client(host=host, port=port)
    await client.connect()
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """moto's S3 server on loopback, with test credentials in the environment, set before any broker
    or Spark worker of the module starts so that they inherit them."""
    use_test_credentials()
    with running(MotoServer, tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture(scope="module")
def fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGCSServer]:
    """fake-gcs-server on loopback; STORAGE_EMULATOR_HOST and a service-account key (for signing) are
    in the environment before any broker of the module starts."""
    with running(FakeGCSServer, tmp_path_factory.mktemp("fake-gcs")) as server:
        yield server


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteServer]:
    """Azurite's blob service on loopback; its account, key and endpoint are in the environment before
    any broker of the module starts."""
    with running(AzuriteServer, tmp_path_factory.mktemp("azurite")) as server:
        yield server


@pytest.fixture(scope="module")
def emulators(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, EmulatorProcess | str]]:
    """Every object store's emulator (s3, gs, azure) that is installed, started before any broker of the
    module so that it inherits their endpoints and credentials; a missing one maps to the reason."""
    out: dict[str, EmulatorProcess | str] = {}
    try:
        for scheme, kind in EMULATORS.items():
            try:
                out[scheme] = kind(tmp_path_factory.mktemp(kind.name)).start()
            except EmulatorMissing as exc:
                out[scheme] = str(exc)
        yield out
    finally:
        for server in out.values():
            if isinstance(server, EmulatorProcess):
                server.stop()


@pytest.fixture(scope="module")
def store_broker(
    emulators: dict[str, EmulatorProcess | str], etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    """A broker per module started after the object stores' emulators (`emulators`) put their endpoints
    and credentials in the environment, so it reaches `s3://`, `gs://` and `azure://` stores."""
    with serving_broker(tmp_path_factory.mktemp("store-broker"), etcd_endpoint) as proc:
        yield proc


@pytest.fixture(scope="module")
def broker(etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A real broker per test module, with a `file://` store rooted at `<tmp>/fragments`
    (`broker.file_root`). Directories whose tests need another broker define their own."""
    with serving_broker(tmp_path_factory.mktemp("broker"), etcd_endpoint, file_root=True) as proc:
        yield proc


@pytest.fixture(scope="module")
def stub(broker: BrokerProcess) -> Iterator[pb_grpc.JournalStub]:
    """A Journal stub of the module's broker."""
    channel, journal_stub = broker.stub()
    try:
        yield journal_stub
    finally:
        channel.close()


@pytest.fixture
async def client(broker: BrokerProcess) -> AsyncIterator[JournalClient]:
    """A JournalClient of the module's broker."""
    async with JournalClient(broker.url) as c:
        yield c


@pytest.fixture
async def appender(client: JournalClient) -> AsyncIterator[AppendService]:
    """An AppendService of `client`."""
    async with AppendService(client) as svc:
        yield svc
