"""Brokers are cattle: three real `gazette serve` brokers (zones a, b, c) with journals at replication 3, writers
appending through every broker over HTTP PUT and gRPC, while brokers are SIGKILLed or SIGTERMed and restarted
as a scheduler does (the same --broker.id and state dir, or a new ID and a fresh one).

Afterwards every journal is read in full through every broker: each acknowledged record is there exactly once at
its acknowledged offsets, no record is torn, and the brokers agree byte for byte.

The workload (records, writers, reads and the checks) is shared with `tests/benchmarks/chaos.py`.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import logging
import random
import re
import signal
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from broker.client import (
    AppendOutcomeUnknown,
    AppendService,
    ClientError,
    JournalClient,
    OffsetJump,
    OffsetNotYetAvailable,
    RetryReader,
    StatusError,
    TransportError,
    append,
)
from broker.protocol import pb
from tests.support.harness import BrokerCluster, apply_specs, journal_spec

pytestmark = pytest.mark.timeout(300)

LEASE = 5.0
"""--etcd.lease of the brokers: a SIGKILLed broker's member key and assignments expire within it."""
REPLICATION = 3
JOURNALS = 4
READY_TIMEOUT = LEASE + 25.0
"""How long a restarted broker may take to answer /debug/ready (under its old ID, after its predecessor's lease)."""
ROUTED_TIMEOUT = 30.0
"""How long the journals may take to be routed to every running broker again."""
EXIT_TIMEOUT = 30.0
"""How long a SIGTERMed broker may take to hand its journals off, persist and exit."""
SETTLE_TIMEOUT = 45.0
"""How long, once the writers stop, until every broker serves every journal in full."""


# Records: one line each, `<writer> <seq> <padding> <crc32>\n`, unique and self-checking.


def record(writer: str, seq: int, size: int = 0) -> bytes:
    """A record of `writer` numbered `seq`, about `size` bytes long (at least its header)."""
    head = f"{writer} {seq:09d} "
    pad_len = max(1, size - len(head) - 10)
    pad = (hashlib.sha256(head.encode()).hexdigest() * (pad_len // 64 + 1))[:pad_len]
    body = head + pad
    return f"{body} {zlib.crc32(body.encode()):08x}\n".encode()


def record_id(rec: bytes) -> str:
    """`<writer> <seq>` of a record."""
    writer, seq = rec.split(b" ", 2)[:2]
    return f"{writer.decode()} {seq.decode()}"


def parse_records(content: bytes) -> tuple[dict[str, list[tuple[int, int]]], list[str]]:
    """Every record of a journal's content with its (begin, end) offsets by ID, and a description of each
    torn or corrupt stretch."""
    found: dict[str, list[tuple[int, int]]] = {}
    torn: list[str] = []
    offset = 0
    for line in content.splitlines(keepends=True):
        begin, offset = offset, offset + len(line)
        ok = line.endswith(b"\n")
        if ok:
            body, _, crc = line[:-1].rpartition(b" ")
            ok = len(body.split(b" ")) == 3 and crc == f"{zlib.crc32(body):08x}".encode()
        if not ok:
            torn.append(f"[{begin}, {offset}) {line[:80]!r}{'...' if len(line) > 80 else ''}")
            continue
        found.setdefault(record_id(line), []).append((begin, offset))
    return found, torn


# What the writers saw.


@dataclass
class Acked:
    journal: str
    begin: int
    end: int
    rec: bytes
    writer: str
    at: float
    via: str = ""
    """Where the append went and, when the reply says, which broker committed it."""


@dataclass
class Failed:
    journal: str
    rec: bytes
    writer: str
    at: float
    error: str
    definite: bool
    """Whether the append certainly did not commit (a status reply, or a connection that was never made)."""


@dataclass
class Ledger:
    """Every append's outcome, by writer kind."""

    acked: list[Acked] = field(default_factory=list)
    failed: list[Failed] = field(default_factory=list)

    def ack(self, writer: str, journal: str, begin: int, end: int, rec: bytes, via: str = "") -> None:
        if end - begin != len(rec):
            self.failed.append(Failed(journal, rec, writer, time.monotonic(),
                                      f"acknowledged [{begin}, {end}) for {len(rec)} bytes", definite=False))
        self.acked.append(Acked(journal, begin, end, rec, writer, time.monotonic(), via))

    def fail(self, writer: str, journal: str, rec: bytes, error: str, definite: bool) -> None:
        self.failed.append(Failed(journal, rec, writer, time.monotonic(), error, definite))

    def error_summary(self, limit: int = 12) -> str:
        """The commonest errors, by writer kind (the writer's name up to its last `-`)."""
        kinds = Counter(f"{f.writer.rsplit('-', 1)[0]}: {_squash(f.error)}" for f in self.failed)
        return "\n".join(f"  {n:5d} x {kind}" for kind, n in kinds.most_common(limit))


def _squash(error: str) -> str:
    """An error message without its addresses, journal names and offsets, to count errors by kind."""
    text = " ".join(error.split(" (journal ")[0].split())
    text = re.sub(r"(https?://)?127\.0\.0\.1:\d+", "<broker>", text)
    text = re.sub(r"chaos/[0-9a-f]+/j\d+", "<journal>", text)
    text = re.sub(r"broker-([a-z])-\d+", r"broker-\1-N", text)
    return text if len(text) <= 200 else text[:197] + "..."


def committed_by(url: str, resp: pb.AppendResponse) -> str:
    """`url`, and the broker whose reply header says it committed the append (the primary)."""
    pid = resp.header.process_id
    return f"{url} (committed by {pid.zone}#{pid.suffix} at etcd revision {resp.header.etcd.revision})"


class HttpAppendError(Exception):
    def __init__(self, message: str, definite: bool) -> None:
        super().__init__(message)
        self.definite = definite


STATUS_NAMES = frozenset(pb.Status.keys())


def http_put(url: str, journal: str, body: bytes, timeout: float = 10.0) -> tuple[int, int]:
    """PUT `body` to `journal` through the broker at `url`; the commit's (begin, end)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    try:
        try:
            conn.connect()
        except OSError as exc:
            raise HttpAppendError(f"connect: {exc}", definite=True) from None
        try:
            conn.request("PUT", f"/{journal}", body=body)
            resp = conn.getresponse()
            text = resp.read()
        except OSError as exc:
            raise HttpAppendError(f"{type(exc).__name__}: {exc}", definite=False) from None
        if resp.status != 204:
            message = text.decode(errors="replace").strip()
            # A status reply is sent instead of a commit; a failed RPC (the broker proxying it, say) may have committed.
            raise HttpAppendError(f"HTTP {resp.status}: {message}", definite=message in STATUS_NAMES)
        begin, end = resp.getheader("X-Commit-Begin"), resp.getheader("X-Commit-End")
        if begin is None or end is None:
            raise HttpAppendError(f"HTTP 204 without X-Commit-Begin/End: {resp.getheaders()}", definite=False)
        return int(begin), int(end)
    finally:
        conn.close()


# Writers. Each appends records of its own, one at a time, to a random journal through a random broker.


class Workload:
    """Writers appending to `journals` through the brokers `urls()` names now, until `stop` is set."""

    def __init__(self, journals: list[str], urls: Callable[[], list[str]], *, interval: float = 0.02,
                 sizes: tuple[int, int] = (40, 400), append_timeout: float = 10.0) -> None:
        self.journals = journals
        self.urls = urls
        self.interval = interval
        self.sizes = sizes
        self.append_timeout = append_timeout
        self.ledger = Ledger()
        self.stop = asyncio.Event()
        self.rng = random.Random(1)

    def _next(self, writer: str, seq: int) -> tuple[str, bytes]:
        return self.rng.choice(self.journals), record(writer, seq, self.rng.randint(*self.sizes))

    async def _pause(self) -> None:
        if self.interval > 0:
            await asyncio.sleep(self.interval)

    async def http_writer(self, name: str) -> None:
        """One PUT per record, to a random broker; failures are not retried."""
        seq = 0
        while not self.stop.is_set():
            journal, rec = self._next(name, seq)
            seq += 1
            url = self.rng.choice(self.urls())
            try:
                begin, end = await asyncio.to_thread(http_put, url, journal, rec, self.append_timeout)
            except HttpAppendError as exc:
                self.ledger.fail(name, journal, rec, f"{url}: {exc}", exc.definite)
            else:
                self.ledger.ack(name, journal, begin, end, rec, via=url)
            await self._pause()

    async def grpc_writer(self, name: str) -> None:
        """One Append RPC per record (`broker.client.append`), to a random broker which proxies it to the
        primary; failures are not retried."""
        clients: dict[str, JournalClient] = {}
        seq = 0
        try:
            while not self.stop.is_set():
                journal, rec = self._next(name, seq)
                seq += 1
                url = self.rng.choice(self.urls())
                client = clients.get(url)
                if client is None:
                    client = clients[url] = JournalClient(url, route_cache=False)
                try:
                    async with asyncio.timeout(self.append_timeout):
                        resp = await append(client, journal, rec)
                except TimeoutError:
                    self.ledger.fail(name, journal, rec, f"{url}: no reply in {self.append_timeout}s", False)
                except ClientError as exc:
                    definite = isinstance(exc, StatusError) or (
                        isinstance(exc, TransportError) and not isinstance(exc, AppendOutcomeUnknown)
                    )
                    self.ledger.fail(name, journal, rec, f"{type(exc).__name__}: {exc}", definite)
                else:
                    self.ledger.ack(name, journal, resp.commit.begin, resp.commit.end, rec, via=committed_by(url, resp))
                await self._pause()
        finally:
            for client in clients.values():
                await client.close()

    async def service_writer(self, name: str, *, route_cache: bool, timeout: float = 60.0) -> None:
        """Records through the client library's retrying AppendService, over a client of a random broker
        for each record (with `route_cache`, straight to the journal's primary; without, proxied by that
        broker). An append not resolved within `timeout` seconds is a failure."""
        clients: dict[str, tuple[JournalClient, AppendService]] = {}
        seq = 0
        try:
            while not self.stop.is_set():
                journal, rec = self._next(name, seq)
                seq += 1
                url = self.rng.choice(self.urls())
                if url not in clients:
                    client = JournalClient(url, route_cache=route_cache)
                    clients[url] = (client, AppendService(client))
                pending = clients[url][1].append(journal, rec)
                done, _ = await asyncio.wait({pending.future}, timeout=timeout)
                if not done:
                    self.ledger.fail(name, journal, rec, f"{url}: not resolved in {timeout}s", False)
                    continue  # Still queued: closing the service below cancels it.
                exc = pending.exception()
                if exc is None:
                    self.ledger.ack(name, journal, pending.begin, pending.end, rec,
                                    via=committed_by(url, pending.result()))
                else:
                    definite = isinstance(exc, StatusError) or (
                        isinstance(exc, TransportError) and not isinstance(exc, AppendOutcomeUnknown)
                    )
                    self.ledger.fail(name, journal, rec, f"{url}: {type(exc).__name__}: {exc}", definite)
                await self._pause()
        finally:
            for client, service in clients.values():
                await service.close(cancel=True)
                await client.close()


# Reading everything back.


@dataclass
class BrokerRead:
    """A journal read through one broker from offset 0 to its write head."""

    url: str
    content: bytes = b""
    gaps: list[tuple[int, int]] = field(default_factory=list)
    """Offset jumps: content the broker did not have."""
    served_by: set[str] = field(default_factory=set)
    error: str = ""


async def read_through(url: str, journal: str, timeout: float = 20.0) -> BrokerRead:
    """All of `journal` as the broker at `url` serves it (it proxies if not a member)."""
    out = BrokerRead(url)
    chunks: list[bytes] = []
    async with JournalClient(url, route_cache=False) as client:
        reader = RetryReader(client, journal, offset=0, block=False)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    try:
                        data = await reader.read()
                    except OffsetJump as jump:
                        out.gaps.append((-1 if jump.offset is None else jump.offset, jump.to))
                        continue
                    except OffsetNotYetAvailable:
                        break  # At the write head.
                    header = reader.reader.header
                    if header is not None:
                        out.served_by.add(header.process_id.suffix)
                    if not data:
                        break
                    chunks.append(data)
        except (TimeoutError, ClientError) as exc:
            out.error = f"{type(exc).__name__}: {exc}"
        finally:
            await reader.close()
    out.content = b"".join(chunks)
    return out


@dataclass
class Verdict:
    """What reading every journal back through every broker found."""

    problems: list[str] = field(default_factory=list)
    acked: int = 0
    acked_bytes: int = 0
    lost: int = 0
    lost_bytes: int = 0
    duplicated: int = 0
    torn: int = 0
    unacked_present: int = 0
    """Failed appends of unknown outcome whose records are in the journal (they committed)."""
    journal_bytes: int = 0


def check_journals(reads: dict[str, list[BrokerRead]], ledger: Ledger, t0: float | None = None) -> Verdict:
    """Judge the reads of each journal through each broker against what the writers were told (times of
    acknowledgements are given in seconds since `t0`, if given)."""
    verdict = Verdict()
    acked_by_journal: dict[str, list[Acked]] = {}
    for a in ledger.acked:
        acked_by_journal.setdefault(a.journal, []).append(a)
    failed_ids = {record_id(f.rec): f for f in ledger.failed}
    for journal, per_broker in reads.items():
        for r in per_broker:
            if r.error:
                verdict.problems.append(f"{journal}: reading through {r.url} failed: {r.error}")
            if r.gaps:
                verdict.problems.append(f"{journal}: {r.url} skipped content (offset jumps {r.gaps})")
        contents = {r.url: r.content for r in per_broker}
        reference = max(contents.values(), key=len)
        verdict.journal_bytes += len(reference)
        for url, content in contents.items():
            if content != reference:
                first = next((i for i, (x, y) in enumerate(zip(content, reference, strict=False)) if x != y),
                             min(len(content), len(reference)))
                served = next(r.served_by for r in per_broker if r.url == url)
                verdict.problems.append(
                    f"{journal}: {url} (served by {sorted(served)}) serves {len(content)} bytes, another broker "
                    f"{len(reference)}; they differ from offset {first}"
                )
        found, torn = parse_records(reference)
        verdict.torn += len(torn)
        verdict.problems += [f"{journal}: torn or corrupt content at {t}" for t in torn[:5]]
        for rid, places in found.items():
            if len(places) > 1:
                verdict.duplicated += 1
                verdict.problems.append(f"{journal}: record {rid!r} appears {len(places)} times, at {places}")
            failure = failed_ids.get(rid)
            if failure is not None:
                if failure.definite:
                    verdict.problems.append(
                        f"{journal}: record {rid!r} is in the journal at {places} but its append failed "
                        f"with {failure.error!r}, which says it did not commit"
                    )
                else:
                    verdict.unacked_present += 1
        for a in acked_by_journal.get(journal, []):
            verdict.acked += 1
            verdict.acked_bytes += len(a.rec)
            rid = record_id(a.rec)
            if reference[a.begin : a.end] != a.rec:
                verdict.lost += 1
                verdict.lost_bytes += len(a.rec)
                where = found.get(rid)
                def when(o: Acked) -> str:
                    return f" at {o.at - t0:.2f}s" if t0 is not None else ""

                there = [f"{record_id(o.rec)!r} acknowledged{when(o)} at [{o.begin}, {o.end}) via {o.via}"
                         for o in acked_by_journal[journal] if o is not a and o.begin < a.end and a.begin < o.end]
                verdict.problems.append(
                    f"{journal}: record {rid!r} acknowledged{when(a)} via {a.via} is not at [{a.begin}, {a.end})"
                    + (f"; it is at {where}" if where else "; it is nowhere in the journal")
                    + f"; the journal has {reference[a.begin : a.begin + 40]!r}... there"
                    + (f"; also acknowledged there: {'; '.join(there)}" if there else "")
                )
    for journal in acked_by_journal.keys() - reads.keys():
        verdict.problems.append(f"{journal}: not read back")
    return verdict


async def read_back(
    urls: list[str], journals: list[str], ledger: Ledger, timeout: float = SETTLE_TIMEOUT, t0: float | None = None
) -> tuple[Verdict, dict[str, list[BrokerRead]]]:
    """Read every journal through every broker until they agree and hold every acknowledged record, or
    `timeout` passes (fragments persisted by one broker reach the others' indexes at their next store
    listing); the last verdict."""
    deadline = time.monotonic() + timeout
    while True:
        done = await asyncio.gather(*(read_through(url, j) for j in journals for url in urls))
        reads = {j: list(done[i * len(urls) : (i + 1) * len(urls)]) for i, j in enumerate(journals)}
        verdict = check_journals(reads, ledger, t0)
        if not verdict.problems or time.monotonic() >= deadline:
            return verdict, reads
        await asyncio.sleep(1.0)


async def barrier(
    urls: list[str], journals: list[str], ledger: Ledger, timeout: float = 30.0, name: str = "barrier"
) -> None:
    """Append one record to each journal through the retrying AppendService.

    A replica that rejoined a journal holds nothing past the persisted fragments until an append syncs the
    pipeline (rolling every member's spool to the head, so the fragment only the older members hold is
    persisted and listed by all); this is that append, made once the writers have stopped.
    """
    async with JournalClient(urls[0]) as client:
        async with AppendService(client) as service:
            records = [(j, record(name, i)) for i, j in enumerate(journals)]
            pending = [(j, rec, service.append(j, rec)) for j, rec in records]
            await asyncio.wait([p.future for _, _, p in pending], timeout=timeout)
            for journal, rec, p in pending:
                if not p.done():
                    ledger.fail(name, journal, rec, f"not resolved in {timeout}s", False)
                elif (exc := p.exception()) is not None:
                    ledger.fail(name, journal, rec, f"{type(exc).__name__}: {exc}", False)
                else:
                    ledger.ack(name, journal, p.begin, p.end, rec)
            if not all(p.done() for _, _, p in pending):
                await service.close(cancel=True)


# The cluster.


def create_journals(cluster: BrokerCluster, count: int = JOURNALS, replication: int = REPLICATION) -> list[str]:
    """`count` journals at `replication` with a `file:///` store, routed to running brokers."""
    base = f"chaos/{uuid.uuid4().hex[:8]}"
    specs = []
    for i in range(count):
        spec = journal_spec(f"{base}/j{i}", replication=replication)
        spec.fragment.length = 64 * 1024
        spec.fragment.stores.append("file:///")
        spec.fragment.refresh_interval.seconds = 1
        specs.append(spec)
    channel, stub = cluster.slots[0].proc.stub()
    try:
        apply_specs(stub, *specs)
    finally:
        channel.close()
    names = [s.name for s in specs]
    cluster.wait_routed(names, replication, ROUTED_TIMEOUT)
    return names


@pytest.fixture
def cluster(etcd_endpoint: str, tmp_path: Path) -> Iterator[BrokerCluster]:
    """Three brokers in zones a, b and c, each with a state dir of its own, sharing a file:// root."""
    brokers = BrokerCluster(tmp_path, etcd_endpoint, f"/test/{uuid.uuid4().hex}", ("a", "b", "c"), lease=LEASE)
    try:
        yield brokers.start()
    finally:
        brokers.stop_all()


class Timeline:
    """What the kill loop did, when (seconds since it began)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.events: list[str] = []

    def note(self, text: str) -> None:
        self.events.append(f"  {time.monotonic() - self.t0:7.2f}s {text}")

    def __str__(self) -> str:
        return "\n".join(self.events)


def failure_report(
    cluster: BrokerCluster, ledger: Ledger, verdict: Verdict | None = None, timeline: Timeline | None = None
) -> str:
    lines = [f"acknowledged {len(ledger.acked)} appends; {len(ledger.failed)} failed:", ledger.error_summary()]
    if timeline is not None:
        lines += ["events:", str(timeline)]
        lines += ["the first failures:"] + [
            f"  {f.at - timeline.t0:7.2f}s {f.writer} {f.journal}: {' '.join(f.error.split())}"
            for f in ledger.failed[:5]
        ]
    if verdict is not None:
        lines += [f"verdict: lost {verdict.lost} ({verdict.lost_bytes} B), duplicated {verdict.duplicated}, "
                  f"torn {verdict.torn}, unacknowledged records present {verdict.unacked_present}"]
        lines += verdict.problems[:30]
    logs = cluster.log_lines()
    lines += [f"broker warnings and errors ({len(logs)}, the last 40):", *logs[-40:]]
    return "\n".join(lines)


async def replace_broker(
    cluster: BrokerCluster, journals: list[str], index: int, sig: int, *, same_id: bool, timeline: Timeline,
) -> None:
    """Signal slot `index`'s broker, wait for it to exit, start its successor and wait until the journals are
    routed to it again (each step under a deadline)."""
    old = cluster.slots[index].proc
    kind = f"{signal.Signals(sig).name} {old.broker_id} ({'same' if same_id else 'new'} ID)"
    timeline.note(f"{kind}")
    try:
        rc = await asyncio.to_thread(cluster.kill, index, sig, EXIT_TIMEOUT)
    except Exception as exc:
        timeline.note(f"{old.broker_id} did not exit within {EXIT_TIMEOUT}s of {signal.Signals(sig).name}")
        raise AssertionError(f"{kind}: no exit within {EXIT_TIMEOUT}s\n{old.logs()[-6000:]}") from exc
    timeline.note(f"{old.broker_id} exited with {rc}")
    if sig == signal.SIGTERM:
        assert rc == 0, f"{kind}: exit status {rc}\n{old.logs()[-6000:]}"
    new = cluster.restart(index, same_id=same_id)
    try:
        await asyncio.to_thread(new.wait_ready, READY_TIMEOUT)
    except (TimeoutError, RuntimeError) as exc:
        timeline.note(f"{new.broker_id} not ready")
        raise AssertionError(f"{kind}: the restarted broker was not ready in {READY_TIMEOUT}s: {exc}") from None
    timeline.note(f"{new.broker_id} ready on port {new.port}")
    try:
        await asyncio.to_thread(cluster.wait_routed, journals, REPLICATION, ROUTED_TIMEOUT)
    except TimeoutError as exc:
        timeline.note("journals not routed")
        raise AssertionError(f"{kind}: {exc}") from None
    timeline.note(f"journals routed to {new.broker_id} again")


async def stop_writers(workload: Workload, tasks: list[asyncio.Task[None]], timeout: float = 90.0) -> None:
    workload.stop.set()
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        task.result()  # A writer that crashed fails the test.
    assert not pending, f"{len(pending)} writers did not stop within {timeout}s"


Plan = list[tuple[int, signal.Signals, bool]]
"""Brokers to replace, in order: (slot, signal, whether the successor keeps the ID)."""


async def chaos_run(
    cluster: BrokerCluster, journals: list[str], workload: Workload, writers: list[asyncio.Task[None]], plan: Plan,
    *, pause: float, appends_may_fail: bool,
) -> None:
    """Replace brokers by `plan` while `writers` run, pausing `pause` seconds after each; then stop the writers,
    make one more append to each journal and read everything back through every broker. Fails the test with a
    report of everything that went wrong (an append that failed, unless `appends_may_fail`)."""
    timeline = Timeline()
    error: AssertionError | None = None
    try:
        await asyncio.sleep(2.0)
        for index, sig, same_id in plan:
            await replace_broker(cluster, journals, index, sig, same_id=same_id, timeline=timeline)
            await asyncio.sleep(pause)
    except AssertionError as exc:
        error = exc
    finally:
        await stop_writers(workload, writers)
    ledger = workload.ledger
    failed = len(ledger.failed)
    await barrier(cluster.urls, journals, ledger)
    verdict, _reads = await read_back(cluster.urls, journals, ledger, t0=timeline.t0)

    complaints = []
    if error is not None:
        complaints.append(str(error).splitlines()[0])
    if not ledger.acked:
        complaints.append("no append was acknowledged")
    if not appends_may_fail and failed:
        complaints.append(f"{failed} of {failed + len(ledger.acked)} appends failed at the client library")
    if len(ledger.failed) > failed:
        complaints.append(f"{len(ledger.failed) - failed} of the appends made after the writers stopped failed")
    if verdict.problems:
        complaints.append(
            f"reading back: {verdict.lost} acknowledged records lost ({verdict.lost_bytes} B), {verdict.duplicated} "
            f"duplicated, {verdict.torn} torn, {len(verdict.problems)} problems in all"
        )
    if complaints:
        details = f"{error}\n" if error is not None else ""
        pytest.fail("; ".join(complaints) + "\n" + details + failure_report(cluster, ledger, verdict, timeline))
    assert verdict.acked == len(ledger.acked) and verdict.lost == 0 and verdict.torn == 0


async def test_kill_and_restart_loses_nothing(cluster: BrokerCluster) -> None:
    journals = create_journals(cluster)
    workload = Workload(journals, lambda: cluster.urls)
    writers = [
        asyncio.create_task(workload.http_writer("http-0")),
        asyncio.create_task(workload.http_writer("http-1")),
        asyncio.create_task(workload.grpc_writer("grpc-0")),
        asyncio.create_task(workload.grpc_writer("grpc-1")),
    ]
    # Each broker is killed at least once, alternately restarted as itself (same ID and state dir, at once, as a
    # container restarts) and rescheduled (a new ID, a fresh state dir and a new port). Appends fail meanwhile.
    plan = [(victim, signal.SIGKILL, n % 2 == 0) for n, victim in enumerate((0, 1, 2, 0, 1))]
    await chaos_run(cluster, journals, workload, writers, plan, pause=2.0, appends_may_fail=True)


async def test_rolling_restart_fails_no_append(cluster: BrokerCluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="broker.client")  # Retries are expected; the ledger counts failures.
    journals = create_journals(cluster)
    workload = Workload(journals, lambda: cluster.urls)
    writers = [
        asyncio.create_task(workload.service_writer("service-routed-0", route_cache=True)),
        asyncio.create_task(workload.service_writer("service-routed-1", route_cache=True)),
        asyncio.create_task(workload.service_writer("service-proxied-0", route_cache=False)),
        asyncio.create_task(workload.service_writer("service-proxied-1", route_cache=False)),
    ]
    # Twice over all three: SIGTERM, exit, restart as itself, ready and routed again.
    plan = [(victim, signal.SIGTERM, True) for _round in range(2) for victim in range(len(cluster.slots))]
    await chaos_run(cluster, journals, workload, writers, plan, pause=1.0, appends_may_fail=False)


def test_records_parse_back() -> None:
    """The record format itself: records parse back with their offsets, and damage is found."""
    recs = [record("w", i, size) for i, size in enumerate((10, 50, 300))]
    content = b"".join(recs)
    found, torn = parse_records(content)
    assert not torn
    assert found == {"w 000000000": [(0, len(recs[0]))], "w 000000001": [(len(recs[0]), len(recs[0]) + len(recs[1]))],
                     "w 000000002": [(len(recs[0]) + len(recs[1]), len(content))]}
    assert parse_records(content[:-5])[1] and parse_records(content.replace(b"a", b"b", 1))[1]
