"""A real broker per test module (as tests/broker), for gazctl's end-to-end tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import BrokerProcess


@pytest.fixture(scope="module")
def broker(etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with a `file://` store rooted at `<tmp>/fragments` (`broker.file_root`)."""
    tmp: Path = tmp_path_factory.mktemp("broker")
    (tmp / "fragments").mkdir()
    proc = BrokerProcess(tmp, etcd_endpoint, f"/test/{uuid.uuid4().hex}", "--broker.file-root", str(tmp / "fragments"))
    try:
        yield proc.wait_ready()
    finally:
        rc = proc.stop()
        assert rc == 0, proc.logs()
