"""A real broker per test module (as tests/broker), for gazctl's end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.protocol import pb_grpc
from tests.harness import BrokerProcess, serving_broker


@pytest.fixture(scope="module")
def broker(etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with a `file://` store rooted at `<tmp>/fragments` (`broker.file_root`)."""
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
