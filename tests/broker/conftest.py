"""Fixtures of the broker tests: in-process brokers (see `tests/support/inprocess.py`) in the test's
event loop, against the session's etcd under the test's own keyspace root."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.inprocess import InProcessBroker, InProcessCluster


@pytest.fixture
async def inproc_cluster(etcd_client: Any, etcd_prefix: str, tmp_path: Path) -> AsyncIterator[InProcessCluster]:
    """An empty in-process cluster (add brokers with `add_broker`), closed after the test."""
    cluster = InProcessCluster(etcd_client, etcd_prefix, tmp_path)
    try:
        yield cluster
    finally:
        await cluster.close()


@pytest.fixture
async def inproc_pair(inproc_cluster: InProcessCluster) -> tuple[InProcessBroker, InProcessBroker]:
    """Two in-process brokers, `local/broker-a` and `local/broker-b`, of `inproc_cluster`."""
    return await inproc_cluster.add_broker("broker-a"), await inproc_cluster.add_broker("broker-b")
