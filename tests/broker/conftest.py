"""A real broker per test module, against the session's etcd, under a module-unique prefix."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from broker.protocol import pb_grpc
from tests.harness import BrokerProcess


@pytest.fixture(scope="module")
def broker(etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    tmp: Path = tmp_path_factory.mktemp("broker")
    proc = BrokerProcess(tmp, etcd_endpoint, f"/test/{uuid.uuid4().hex}", "--broker.file-root", str(tmp / "fragments"))
    (tmp / "fragments").mkdir()
    try:
        yield proc.wait_ready()
    finally:
        rc = proc.stop()
        assert rc == 0, proc.logs()


@pytest.fixture(scope="module")
def stub(broker: BrokerProcess) -> Iterator[pb_grpc.JournalStub]:
    channel = grpc.insecure_channel(broker.target)
    yield pb_grpc.JournalStub(channel)
    channel.close()
