"""Client tests: the root conftest's real broker per module (a `file://` store at `broker.file_root`),
a JournalClient per test reading that store's fragments directly, and brokers a test starts and stops."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from broker.client import JournalClient
from tests.support.harness import BrokerProcess


@pytest.fixture(scope="module")
def file_root(broker: BrokerProcess) -> Path:
    """The module broker's --broker.file-root."""
    assert broker.file_root is not None
    return broker.file_root


@pytest.fixture
async def client(broker: BrokerProcess, file_root: Path) -> AsyncIterator[JournalClient]:
    async with JournalClient(broker.url, file_root=str(file_root)) as c:
        yield c


@pytest.fixture
def start_broker(etcd_endpoint: str, tmp_path: Path) -> Iterator[Callable[..., Awaitable[BrokerProcess]]]:
    """Starts brokers of one cluster (one etcd prefix, one file root); `port=` restarts one where another listened."""
    prefix = f"/test/{uuid.uuid4().hex}"
    procs: list[BrokerProcess] = []
    (tmp_path / "fragments").mkdir()

    async def start(port: int | None = None, broker_id: str = "") -> BrokerProcess:
        proc = BrokerProcess(
            tmp_path, etcd_endpoint, prefix, "--broker.file-root", str(tmp_path / "fragments"),
            port=port, broker_id=broker_id,
        )
        procs.append(proc)
        return await asyncio.to_thread(proc.wait_ready)

    yield start
    for proc in procs:
        proc.stop()
