"""Client tests: a real broker per module (against the session's etcd, under a module-unique prefix),
and a JournalClient per test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from broker.client import JournalClient
from tests.harness import BrokerProcess


@pytest.fixture(scope="module")
def file_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module broker's --broker.file-root."""
    root: Path = tmp_path_factory.mktemp("fragments")
    return root


@pytest.fixture(scope="module")
def broker(etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory, file_root: Path) -> Iterator[BrokerProcess]:
    tmp: Path = tmp_path_factory.mktemp("broker")
    proc = BrokerProcess(tmp, etcd_endpoint, f"/test/{uuid.uuid4().hex}", "--broker.file-root", str(file_root))
    try:
        yield proc.wait_ready()
    finally:
        rc = proc.stop()
        assert rc == 0, proc.logs()


@pytest.fixture
async def client(broker: BrokerProcess, file_root: Path) -> AsyncIterator[JournalClient]:
    async with JournalClient(broker.url, file_root=str(file_root)) as c:
        yield c

