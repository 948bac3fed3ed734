"""Journals, appends and transactional publishing for the `gazette` source tests."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import Any
from uuid import UUID

import pytest

from broker.client import AppendService, JournalClient, sync
from broker.protocol import pb
from consumer.message import ZERO_UUID, Flags, Publisher, get_flags, read_committed
from consumer.message.mapping import MappingFunc
from tests.support.harness import BrokerProcess, apply_specs, journal_spec, wait_for_primary

NDJSON = "application/x-ndjson"

Row = tuple[str, int, bytes]
"""(journal, offset, value) of one message."""


def unique() -> str:
    return uuid.uuid4().hex[:10]


def make_journal(
    broker: BrokerProcess,
    name: str,
    labels: dict[str, str],
    *,
    store: str | None = "file:///",
    length: int = 1024,
    codec: int = pb.NONE,
) -> str:
    """Create `name` with `labels`, small fragments and a fast refresh; wait for its primary."""
    spec = journal_spec(name)
    for key, value in sorted(labels.items()):
        spec.labels.labels.add(name=key, value=value)
    spec.fragment.length = length
    spec.fragment.compression_codec = codec  # type: ignore[assignment]
    spec.fragment.refresh_interval.seconds = 1
    if store:
        spec.fragment.stores.append(store)
    channel, stub = broker.stub()
    try:
        resp = apply_specs(stub, spec)
        assert resp.status == pb.OK, resp
        wait_for_primary(stub, name)
    finally:
        channel.close()
    return name


def append_lines(broker: BrokerProcess, journal: str, lines: list[bytes]) -> list[Row]:
    """Append `lines` (each newline-terminated on write) in one append; the rows they become."""
    data = b"".join(line + b"\n" for line in lines)
    resp = sync.append(broker.url, journal, data, timeout=30)
    at = resp.commit.begin
    out = []
    for line in lines:
        out.append((journal, at, line))
        at += len(line) + 1
    return out


def fragments(broker: BrokerProcess, journal: str) -> list[pb.Fragment]:
    resp = sync.list_all_fragments(broker.url, journal, timeout=30)
    return [f.spec for f in resp.fragments]


def wait_persisted(broker: BrokerProcess, journal: str, count: int, timeout: float = 30.0) -> list[pb.Fragment]:
    """Wait until at least `count` fragments of `journal` are listed with a backing store."""
    deadline = time.monotonic() + timeout
    while True:
        frags = fragments(broker, journal)
        if sum(1 for f in frags if f.backing_store) >= count:
            return frags
        if time.monotonic() > deadline:
            raise TimeoutError(f"{journal}: fewer than {count} persisted fragments: {frags}")
        time.sleep(0.2)


@dataclasses.dataclass
class Msg:
    """A JSON message keeping its Gazette UUID in `UUID`, as the Publisher writes them."""

    UUID: uuid.UUID = ZERO_UUID
    Str: str = ""

    def get_uuid(self) -> uuid.UUID:
        return self.UUID

    def set_uuid(self, value: uuid.UUID) -> None:
        self.UUID = value

    def new_acknowledgement(self, journal: str) -> Msg:
        return Msg()


def to(journal: str) -> MappingFunc:
    def mapping(msg: object) -> tuple[str, str]:
        return journal, NDJSON

    return mapping


def publish(broker: BrokerProcess, script: Callable[[AppendService], object]) -> None:
    """Run `script(append_service)` (which publishes) and wait for every append."""

    async def run() -> None:
        async with JournalClient(broker.url) as client, AppendService(client) as svc:
            script(svc)
            await svc.flush()

    asyncio.run(run())


def transactional_history(broker: BrokerProcess, journal: str) -> tuple[set[str], set[str]]:
    """Publish committed, rolled-back and still-open transactions; (committed, not committed) Strs."""
    committed: set[str] = set()
    uncommitted: set[str] = set()

    def script(svc: AppendService) -> None:
        m = to(journal)
        a = Publisher(svc)
        b = Publisher(svc)
        c = Publisher(svc)
        pad = "x" * 300  # Messages larger than a third of a fragment: transactions span fragments.
        for i in range(3):
            a.publish_uncommitted(m, Msg(Str=f"a1-{i}-{pad}"))
            b.publish_uncommitted(m, Msg(Str=f"b1-{i}-{pad}"))
            committed.update({f"a1-{i}-{pad}", f"b1-{i}-{pad}"})
        last_a, _ = a.commit()
        b.commit()
        c.publish_committed(m, Msg(Str="c1"))
        committed.add("c1")
        # A writes a transaction, crashes, and its restart re-appends the last committed ACKs: a rollback.
        for i in range(3):
            a.publish_uncommitted(m, Msg(Str=f"a2-rolled-back-{i}-{pad}"))
            uncommitted.add(f"a2-rolled-back-{i}-{pad}")
        b.publish_uncommitted(m, Msg(Str=f"b2-{pad}"))
        committed.add(f"b2-{pad}")
        a2 = Publisher(svc, producer_id=a.producer_id)
        a2.clock = a.clock
        a2.write_ack_intents(last_a)
        b.commit()
        for i in range(2):
            a2.publish_uncommitted(m, Msg(Str=f"a3-{i}"))
            committed.add(f"a3-{i}")
        a2.commit()
        c.publish_committed(m, Msg(Str="c2"))
        committed.add("c2")
        # Left open: never emitted by a batch read.
        b.publish_uncommitted(m, Msg(Str="b3-open"))
        uncommitted.add("b3-open")

    publish(broker, script)
    return committed, uncommitted


def in_process(options: dict[str, str], *, direct_only: bool = False) -> tuple[int, list[dict[str, object]]]:
    """Plan and read in this process (no Spark): the partition count and the rows."""
    from pipelines.source import read as read_mod
    from pipelines.source.options import parse_options
    from pipelines.source.planning import plan_batch, run
    from pipelines.source.schema import ARROW_BASE

    opts = parse_options(options)
    parts = [p for p in run(plan_batch(opts)) if p.direct or not direct_only]
    out: list[dict[str, object]] = []
    for p in parts:
        for batch in read_mod.read_partition(p, opts, ARROW_BASE, None):
            out += batch.to_pylist()
    return len(parts), out


def direct_only_rows(options: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, list[Row]]:
    """Plan in-process and read every persisted partition with the broker path disabled."""
    from pipelines.source import read as read_mod

    def no_broker(*args: object) -> object:
        raise AssertionError("a persisted fragment was read through the broker")

    monkeypatch.setattr(read_mod, "broker_chunks", no_broker)
    count, rows = in_process(options, direct_only=True)
    return count, [(r["journal"], r["offset"], r["value"]) for r in rows]  # type: ignore[misc]


class JsonMsg(dict[str, Any]):
    """A JSON message whose Gazette UUID is its top-level `uuid`, as the journals sink writes it."""

    def get_uuid(self) -> UUID:
        return UUID(self["uuid"])

    def set_uuid(self, value: UUID) -> None:
        self["uuid"] = str(value)

    def new_acknowledgement(self, journal: str) -> JsonMsg:
        return JsonMsg()


def committed_json(broker: BrokerProcess, journal: str) -> list[dict[str, Any]]:
    """The committed messages of `journal` (read through Gazette's Sequencer), without their `uuid`."""

    async def read() -> list[dict[str, Any]]:
        async with JournalClient(broker.url) as client:
            return [dict(e.message) async for e in read_committed(client, journal, 0, lambda _: JsonMsg(), block=False)]

    rows = [m for m in asyncio.run(read()) if get_flags(UUID(m["uuid"])) != Flags.ACK_TXN]
    return [{k: v for k, v in m.items() if k != "uuid"} for m in rows]
