"""The etcd + broker pair every broker benchmark runs against, started and stopped in one place."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from broker.keyspace.etcd import EtcdProcess
from tests.harness import BrokerProcess, free_port


def log(msg: str) -> None:
    """Progress of a benchmark, on stderr (the report goes to stdout)."""
    print(msg, file=sys.stderr, flush=True)


@contextmanager
def etcd_and_broker(
    tmp: Path,
    *broker_args: str,
    file_root: bool = True,
    etcd_factory: Callable[..., EtcdProcess] = EtcdProcess,
    start_broker: Callable[..., BrokerProcess] = BrokerProcess,
) -> Iterator[BrokerProcess]:
    """A ready broker (keyspace root `/bench`, a `file://` store at `tmp/fragments` if `file_root`) on a
    fresh etcd; on failure the broker's log tail is printed, and both are stopped on exit."""
    etcd = etcd_factory(tmp / "etcd", client_port=free_port(), peer_port=free_port(), log_path=tmp / "etcd.log")
    broker: BrokerProcess | None = None
    try:
        log("starting etcd and the broker")
        etcd.start()
        etcd.wait_ready(30.0)
        if file_root:
            (tmp / "fragments").mkdir(exist_ok=True)
            broker_args = ("--broker.file-root", str(tmp / "fragments"), *broker_args)
        broker = start_broker(tmp, etcd.endpoint, "/bench", *broker_args)
        broker.wait_ready()
        yield broker
    except Exception:
        if broker is not None and broker.proc.poll() is None:
            log(f"broker log tail:\n{broker.logs()[-4000:]}")
        raise
    finally:
        if broker is not None:
            running = broker.proc.poll() is None
            rc = broker.stop()
            if running and rc != 0:
                log(f"broker exited with {rc} when stopped:\n{broker.logs()[-4000:]}")
        etcd.stop()
