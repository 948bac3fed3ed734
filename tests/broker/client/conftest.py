"""Client tests: a real broker per module (against the session's etcd, under a module-unique prefix),
and a JournalClient per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from broker.client import JournalClient
from tests.support.harness import BrokerProcess, serving_broker


@pytest.fixture(scope="module")
def file_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module broker's --broker.file-root."""
    root: Path = tmp_path_factory.mktemp("fragments")
    return root


@pytest.fixture(scope="module")
def broker(etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory, file_root: Path) -> Iterator[BrokerProcess]:
    with serving_broker(tmp_path_factory.mktemp("broker"), etcd_endpoint, "--broker.file-root", str(file_root)) as proc:
        yield proc


@pytest.fixture
async def client(broker: BrokerProcess, file_root: Path) -> AsyncIterator[JournalClient]:
    async with JournalClient(broker.url, file_root=str(file_root)) as c:
        yield c

