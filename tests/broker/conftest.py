"""A real broker per test module, against the session's etcd, under a module-unique prefix."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from broker.protocol import pb_grpc
from tests.harness import BrokerProcess, serving_broker


@pytest.fixture(scope="module")
def broker(etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with serving_broker(tmp_path_factory.mktemp("broker"), etcd_endpoint, file_root=True) as proc:
        yield proc


@pytest.fixture(scope="module")
def stub(broker: BrokerProcess) -> Iterator[pb_grpc.JournalStub]:
    channel = grpc.insecure_channel(broker.target)
    yield pb_grpc.JournalStub(channel)
    channel.close()
