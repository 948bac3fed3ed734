"""An Apply larger than etcd allows in one transaction is a clear error; batches of it apply."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.keyspace.etcd import EtcdProcess
from tests.support.harness import BrokerProcess, free_port, run_gazctl


class SmallTxnEtcd(EtcdProcess):
    """An etcd allowing 4 operations per transaction (the last flag given wins)."""

    def command(self) -> list[str]:
        return [*super().command(), "--max-txn-ops=4"]


@pytest.fixture(scope="module")
def small_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    tmp: Path = tmp_path_factory.mktemp("small-txn")
    etcd = SmallTxnEtcd(tmp / "etcd", client_port=free_port(), peer_port=free_port(), log_path=tmp / "etcd.log")
    etcd.start()
    try:
        etcd.wait_ready(30.0)
        broker = BrokerProcess(tmp, etcd.endpoint, f"/test/{uuid.uuid4().hex}")
        try:
            yield broker.wait_ready()
        finally:
            broker.stop()
    finally:
        etcd.stop()


def test_too_large_apply_is_one_clear_line_and_batches_apply(small_broker: BrokerProcess) -> None:
    children = "".join(f"- name: limits/j{i}\n" for i in range(10))
    tree = ("name: limits/\nreplication: 1\nfragment:\n  length: 1024\n  compression_codec: NONE\n"
            f"  refresh_interval: 30s\nchildren:\n{children}")
    refused = run_gazctl(small_broker, "journals", "apply", input=tree)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert "etcd rejected the Apply transaction of 10 changes" in refused.stderr
    assert "--max-txn-ops" in refused.stderr and "--max-txn-size" in refused.stderr

    batched = run_gazctl(small_broker, "journals", "apply", "--max-txn-size", "4", input=tree)
    assert batched.returncode == 0, batched.stderr
    listed = run_gazctl(small_broker, "journals", "list", "-l", "prefix=limits/")
    assert listed.stdout.count("limits/j") == 10
