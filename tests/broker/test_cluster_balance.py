"""Three `gazette serve` brokers in zones a, b and c share twelve journals at replication 3: the
allocator spreads primaries evenly, reassigns a stopped broker's journals, and gives the broker
its share back when it returns under the same id. Appends go on across the moves: each continues
at the offset the last acknowledged append ended at, and every broker serves the new content."""

from __future__ import annotations

import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from broker.protocol import pb, pb_grpc
from tests.support.harness import BrokerProcess, append, apply_specs, journal_spec

JOURNALS = [f"balance/j{i:02}" for i in range(12)]
ZONES = ("a", "b", "c")
EXPECTED = len(JOURNALS) // len(ZONES)
DEADLINE = 20.0
"""Seconds each phase may take before the test fails."""

T = TypeVar("T")


class Cluster:
    """The brokers under one keyspace root, by zone (each zone's broker is `broker-<zone>`)."""

    def __init__(self, tmp: Path, etcd: str) -> None:
        self.tmp = tmp
        self.etcd = etcd
        self.prefix = f"/test/{uuid.uuid4().hex}"
        self.brokers: dict[str, BrokerProcess] = {}

    def start(self, zone: str, port: int | None = None) -> BrokerProcess:
        broker = BrokerProcess(
            self.tmp, self.etcd, self.prefix, "--broker.zone", zone, broker_id=f"broker-{zone}", port=port
        ).wait_ready()
        self.brokers[zone] = broker
        return broker

    def stop_all(self) -> None:
        """SIGTERM every broker at once (so that none waits to hand journals to another), then
        wait for each to exit."""
        running = [b for b in self.brokers.values() if b.proc.poll() is None]
        for broker in running:
            broker.proc.send_signal(signal.SIGTERM)
        for broker in running:
            broker.proc.wait(60)
        for broker in running:
            assert broker.stop() == 0, broker.logs()


def routes(stub: pb_grpc.JournalStub) -> dict[str, pb.Route]:
    """Every journal's route, from the List RPC."""
    return {j.spec.name: j.route for resp in stub.List(pb.ListRequest()) for j in resp.journals}


def primaries(found: dict[str, pb.Route]) -> Counter[str]:
    """Journals per primary's zone."""
    return Counter(r.members[r.primary].zone for r in found.values() if r.primary >= 0)


def until(what: str, check: Callable[[], T | None], timeout: float = DEADLINE) -> T:
    """Poll `check` until it returns something, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def balanced(stub: pb_grpc.JournalStub, zones: tuple[str, ...]) -> dict[str, pb.Route] | None:
    """The routes once every journal has a primary and one member in each of `zones` (no other),
    and each of their brokers is primary of exactly its share of the journals (the allocator's
    settled answer; a poll can catch a round that moved only some of the primaries yet)."""
    found = routes(stub)
    if sorted(found) != JOURNALS:
        return None
    for route in found.values():
        if route.primary < 0 or sorted(m.zone for m in route.members) != sorted(zones):
            return None
    counts = primaries(found)
    if any(counts[zone] != len(JOURNALS) // len(zones) for zone in zones):
        return None
    return found


def append_all(cluster: Cluster, found: dict[str, pb.Route], tag: str) -> dict[str, pb.AppendResponse]:
    """One append to each journal, sent to its primary as clients do."""
    out = {}
    for name in JOURNALS:
        route = found[name]
        channel, stub = cluster.brokers[route.members[route.primary].zone].stub()
        with channel:
            out[name] = append(stub, name, f"{tag} {name}\n".encode())
    return out


def read(stub: pb_grpc.JournalStub, journal: str, offset: int) -> bytes:
    """What this broker itself holds of the journal from `offset` (never proxied)."""
    req = pb.ReadRequest(journal=journal, offset=offset, do_not_proxy=True)
    return b"".join(resp.content for resp in stub.Read(req))


@pytest.fixture
def cluster(tmp_path: Path, etcd_endpoint: str) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, etcd_endpoint)
    try:
        yield cluster
    finally:
        cluster.stop_all()


def test_primaries_spread_and_rebalance_after_a_broker_returns(cluster: Cluster) -> None:
    timings: dict[str, float] = {}
    began = time.monotonic()
    for zone in ZONES:
        cluster.start(zone)
    channel, stub = cluster.brokers["a"].stub()
    with channel:
        # A canary journal is assigned to all three brokers only once the leader sees all three.
        assert apply_specs(stub, journal_spec("balance/canary", replication=3)).status == pb.OK
        until("the canary on three brokers", lambda: len(routes(stub).get("balance/canary", pb.Route()).members) == 3
              or None)
        delete = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(delete="balance/canary", expect_mod_revision=-1)])
        assert stub.Apply(delete).status == pb.OK
        timings["start"] = time.monotonic() - began

        # From scratch: one primary in three per broker.
        t = time.monotonic()
        assert apply_specs(stub, *(journal_spec(name, replication=3) for name in JOURNALS)).status == pb.OK
        found = until("balanced primaries", lambda: balanced(stub, ZONES))
        timings["assign"] = time.monotonic() - t
        first = primaries(found)
        assert first == {zone: EXPECTED for zone in ZONES}, first
        heads = {}
        before = append_all(cluster, found, "before")
        for name, resp in before.items():
            assert resp.status == pb.OK, (name, resp)
            heads[name] = resp.commit.end

        # SIGTERM broker c: its journals go to a and b, their primaries split evenly.
        t = time.monotonic()
        port = cluster.brokers["c"].port
        assert cluster.brokers["c"].stop(signal.SIGTERM) == 0, cluster.brokers["c"].logs()
        timings["stop"] = time.monotonic() - t
        found = until("c's journals reassigned", lambda: balanced(stub, ("a", "b")))
        timings["reassign"] = time.monotonic() - t
        assert primaries(found) == {"a": 6, "b": 6}

        # c returns under the same id (no client wrote meanwhile): it joins every journal, as
        # primary of its share.
        t = time.monotonic()
        cluster.start("c", port=port)
        found = until("balance restored", lambda: balanced(stub, ZONES))
        timings["rebalance"] = time.monotonic() - t
        restored = primaries(found)

        # Appends continue where the acknowledged ones ended, on every broker.
        t = time.monotonic()
        after = append_all(cluster, found, "after")
        timings["append"] = time.monotonic() - t
        for name, resp in after.items():
            assert resp.status == pb.OK, (name, resp)
            assert resp.commit.begin == heads[name], (name, resp.commit, heads[name])
    for zone, broker in cluster.brokers.items():
        channel, stub = broker.stub()
        with channel:
            for name, resp in after.items():
                assert read(stub, name, resp.commit.begin) == f"after {name}\n".encode(), (zone, name)
    timings["total"] = time.monotonic() - began
    print(f"primaries: first {dict(first)}, restored {dict(restored)}; seconds: "
          + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    assert restored == {zone: EXPECTED for zone in ZONES}, restored


