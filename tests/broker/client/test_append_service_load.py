"""AppendService under 50 concurrent producers writing small records to 5 journals: every record lands
exactly once, each producer's records stay in order, and a broker stopped for 10 seconds mid-run loses
nothing.

One real broker (the only one: journals have replication 1 and a file:// store, so the broker persists
its spools when it exits on SIGTERM and the broker restarted on the same port, with the same etcd prefix
and --broker.file-root, serves them and resumes at the persisted write head). 50 producer tasks share one
AppendService; producer `p` writes `p-XX SEQ\n` records to journal `p % 5`, each awaited before the next
(so co-occurring records of the ten producers of a journal share Append RPCs). Partway through, the broker
is stopped; appends then fail before committing and are retried (with backoff) until the broker is back.

An append whose commit was already asked for when the broker went away fails with AppendOutcomeUnknown
(the service never retries those, as a retry could write the bytes twice; `retry_unknown_outcome=True`
would, and so could duplicate records). The producer then does what that error asks of callers that must
know: once the broker is back (so no stale attempt can still commit), it reads its journal for the record,
and writes it again only if it is absent. Its later records wait for that, so its order holds too.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path

from broker.client import AppendOutcomeUnknown, AppendService, JournalClient
from broker.client.sync import read_all
from tests.support.harness import BrokerProcess, journal_spec
from tests.support.journals import create_journal, unique

PRODUCERS = 50
JOURNALS = 5
RECORDS = 200
OUTAGE = 10.0
RESUME_WITHIN = 10.0
"""Seconds from the restarted broker's readiness until the first retried append commits (with backoff
capped at 0.5 s, a moment): the test bounds the recovery from the outage, not the run's throughput,
which depends on the host."""
RECORD = re.compile(rb"p-(\d+) (\d+)")

StartBroker = Callable[..., Awaitable[BrokerProcess]]


def record(producer: int, seq: int) -> bytes:
    return f"p-{producer:02d} {seq:04d}\n".encode()


async def test_append_service_load_survives_a_broker_outage(start_broker: StartBroker, tmp_path: Path) -> None:
    broker = await start_broker()
    journals = []
    async with JournalClient(broker.url) as client:
        for _ in range(JOURNALS):
            spec = journal_spec(unique("client/load"))
            spec.fragment.stores.append("file:///")
            spec.fragment.refresh_interval.seconds = 1
            await create_journal(client, spec)
            journals.append(spec.name)

        service = AppendService(client, spool_dir=str(tmp_path), max_backoff=0.5)
        progress = [0] * PRODUCERS
        unknown: list[tuple[int, int, bool]] = []  # (producer, seq, whether it had committed after all)
        back = asyncio.Event()  # Set once the restarted broker is ready.

        async def committed(journal: str, rec: bytes) -> bool:
            await back.wait()
            data = await asyncio.to_thread(read_all, broker.url, journal, timeout=30)
            return data.startswith(rec) or b"\n" + rec in data

        async def produce(p: int) -> None:
            journal = journals[p % JOURNALS]
            for seq in range(RECORDS):
                rec = record(p, seq)
                while True:
                    try:
                        await service.append(journal, rec)
                        break
                    except AppendOutcomeUnknown:
                        landed = await committed(journal, rec)
                        unknown.append((p, seq, landed))
                        if landed:
                            break
                progress[p] = seq + 1
                await asyncio.sleep(0.01)

        producers = [asyncio.create_task(produce(p)) for p in range(PRODUCERS)]
        # Partway through: every producer has committed some records and has more to write.
        async with asyncio.timeout(30):
            while min(progress) < RECORDS // 4:
                await asyncio.sleep(0.01)
        before_stop = sum(progress)
        assert await asyncio.to_thread(broker.stop) == 0, broker.logs()  # SIGTERM: it persists its spools.
        rpcs_at_stop = service.stats.rpcs
        await asyncio.sleep(OUTAGE)
        # Nothing commits while the broker is away: producers wait on appends that are being retried.
        assert service.stats.rpcs == rpcs_at_stop
        assert service.stats.retries > 0
        assert sum(progress) < PRODUCERS * RECORDS
        restarted = await start_broker(port=broker.port)
        back.set()
        # The retried appends reach the restarted broker within moments (they back off 0.5 s at most).
        ready_at = time.monotonic()
        while service.stats.rpcs == rpcs_at_stop:
            assert time.monotonic() - ready_at < RESUME_WITHIN, f"nothing committed {RESUME_WITHIN}s after the restart"
            await asyncio.sleep(0.01)
        resumed = time.monotonic() - ready_at

        async with asyncio.timeout(60):
            results = await asyncio.gather(*producers, return_exceptions=True)
        await service.close()
        # Only appends in flight at the stop can be of unknown outcome: at most one per producer.
        assert len({p for p, _, _ in unknown}) == len(unknown), unknown
        if unknown:
            print(f"appends of unknown outcome at the stop (producer, seq, had committed): {unknown}")
        assert [r for r in results if r is not None] == []
        assert progress == [RECORDS] * PRODUCERS
        assert before_stop < PRODUCERS * RECORDS
        # Records shared RPCs: without batching each record takes one RPC of its own. How many share one
        # depends on the host's speed; test_client_append pins the batching rules themselves.
        assert service.stats.rpcs < PRODUCERS * RECORDS, service.stats
        print(f"appends resumed {resumed:.2f}s after the restarted broker was ready; {service.stats}")

    seen: dict[int, list[int]] = defaultdict(list)
    for i, journal in enumerate(journals):
        data = await asyncio.to_thread(read_all, restarted.url, journal, timeout=30)
        assert data.endswith(b"\n")
        for line in data[:-1].split(b"\n"):
            match = RECORD.fullmatch(line)
            assert match is not None, line
            producer, seq = int(match.group(1)), int(match.group(2))
            assert producer % JOURNALS == i, (journal, line)
            seen[producer].append(seq)
    # Exactly once, and in each producer's order.
    assert sorted(seen) == list(range(PRODUCERS))
    for producer, seqs in seen.items():
        assert seqs == list(range(RECORDS)), (producer, seqs[:20])
