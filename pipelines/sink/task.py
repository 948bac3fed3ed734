"""One Spark task of a write: route and frame every row, buffer, then append (see `pipelines.sink.writer`).

The task reads its whole input before it appends anything: rows go to a `Spool` per journal
(memory up to `TASK_MEMORY_BYTES` for the whole task, then temporary files), already cut into
appends of at most `batch_bytes` and never splitting a record. Only once the input iterator is
exhausted without error do the appends start (PySpark also ends it without error when the JVM
side of the task failed: see the known gap in `pipelines.sink.writer`), through one AppendService: journals in parallel,
each journal's appends in order, one RPC each.

Rows to transactional journals are stamped with the task's producer and clocks (`TaskTxn`,
`pipelines.sink.txn`) as they are routed; a rollback ACK, when the task must append one to a
journal, is the first record of that journal's first append.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from broker.client.append_service import DEFAULT_MEMORY_LIMIT, AppendService, AsyncAppend
from broker.client.dial import JournalClient
from broker.client.errors import AppendOutcomeUnknown, ClientError, TransportError
from consumer.message.clock import clock_at
from consumer.message.mapping import MappingFunc, modulo_mapping, random_mapping, rendezvous_mapping
from pipelines.auth import auth_error, is_auth_error, presented
from pipelines.errors import SparkPipelineError
from pipelines.sink.framing import FRAMERS, Framer
from pipelines.sink.options import (
    SinkConfig,
    SinkError,
    content_type,
    framing_of,
    is_transactional,
    list_named,
    list_selected,
)
from pipelines.sink.txn import ROLLBACK_CLOCK, Stamper, ack_record, producer_for, stamp

log = logging.getLogger(__name__)

TASK_MEMORY_BYTES = 64 << 20
"""Framed rows a task holds in memory before it spills the rest to temporary files."""


class SinkAppendError(SparkPipelineError, RuntimeError):
    """Appending a task's buffered rows failed; the message says what the task had already appended."""


@dataclass
class JournalWrite:
    """What one task (or, summed, one write) appended to one journal."""

    records: int = 0
    bytes: int = 0
    appends: int = 0
    begin: int = -1
    """Journal offset of the first appended byte (-1: none); with `end`, spans other writers' appends too."""
    end: int = -1

    def add(self, other: JournalWrite) -> None:
        self.records += other.records
        self.bytes += other.bytes
        self.appends += other.appends
        if other.begin >= 0:
            self.begin = other.begin if self.begin < 0 else min(self.begin, other.begin)
            self.end = max(self.end, other.end)


@dataclass
class _Budget:
    limit: int
    used: int = 0


class Spool:
    """One journal's framed records in arrival order, cut into appends of at most `batch_bytes`.

    A record larger than `batch_bytes` is one append of its own: records are never split.
    """

    def __init__(self, budget: _Budget, batch_bytes: int, spool_dir: str | None) -> None:
        self._budget = budget
        self._batch_bytes = batch_bytes
        self._spool_dir = spool_dir
        self._memory = bytearray()
        self._file: IO[bytes] | None = None
        self.size = 0
        self.records = 0
        self._batch_begin = 0
        self._batches: list[tuple[int, int, int]] = []  # (begin, end, records) in the spool.
        self._batch_records = 0

    def add(self, record: bytes, rows: int = 1) -> None:
        """Add a record (`rows`=0: an ACK, which is no row of the DataFrame)."""
        n = len(record)
        if self.size > self._batch_begin and self.size - self._batch_begin + n > self._batch_bytes:
            self._cut()
        if self._file is None and self._budget.used + n > self._budget.limit:
            # Over the task's budget: this journal's rows go to disk from now on (memory first, in order).
            self._file = tempfile.TemporaryFile(prefix="gazette-sink-", dir=self._spool_dir)
            self._file.write(self._memory)
            self._budget.used -= len(self._memory)
            self._memory = bytearray()
        if self._file is None:
            self._memory += record
            self._budget.used += n
        else:
            self._file.write(record)
        self.size += n
        self.records += rows
        self._batch_records += rows

    def _cut(self) -> None:
        self._batches.append((self._batch_begin, self.size, self._batch_records))
        self._batch_begin, self._batch_records = self.size, 0

    def batches(self) -> list[tuple[int, int, int]]:
        """The appends to make, in order: (begin, end, records)."""
        if self.size > self._batch_begin:
            self._cut()
        return self._batches

    def read(self, begin: int, end: int) -> bytes:
        if self._file is None:
            return bytes(self._memory[begin:end])
        self._file.flush()
        return os.pread(self._file.fileno(), end - begin, begin)

    def close(self) -> None:
        self._budget.used -= len(self._memory)
        self._memory = bytearray()
        if self._file is not None:
            self._file.close()
            self._file = None


class Router:
    """Chooses each row's journal and framing; checks every journal before the task appends anything.

    `refresh` lists the selector's journals in the task (streaming: journals created while the
    query runs are used); otherwise the task uses the driver's listing, so every task of a write
    maps keys over the same journals.
    """

    def __init__(self, config: SinkConfig, client: JournalClient, runner: asyncio.Runner, refresh: bool) -> None:
        self._config = config
        self._client = client
        self._runner = runner
        self._selected: dict[str, str] | None = None if refresh or not config.journals else dict(config.journals)
        self._framers: dict[str, Framer] = {}
        self._mapping: MappingFunc | None = None
        self._random: MappingFunc | None = None
        self._sticky = ""
        self._sticky_bytes = 0
        self.transactional: set[str] = set()
        """Journals (of those framed so far) whose rows are stamped with UUIDs and committed by ACKs."""

    def selected(self) -> dict[str, str]:
        """The selector's journals (name -> content type), listed at most once per task."""
        if self._selected is None:
            self._selected = list_selected(self._config)
        return self._selected

    def framer(self, journal: str) -> Framer:
        """The framer of `journal`, checking first that it exists and matches the selector."""
        framer = self._framers.get(journal)
        if framer is not None:
            return framer
        config = self._config
        if config.selector and journal in self.selected():
            ct = self.selected()[journal]
        else:
            specs = self._runner.run(list_named(self._client, [journal]))
            if journal not in specs:
                raise SinkError(f"journal {journal!r} (column 'journal') does not exist")
            if config.selector:
                raise SinkError(f"journal {journal!r} (column 'journal') does not match option selector "
                                f"{config.selector!r}")
            ct = content_type(specs[journal])
        framer = FRAMERS[framing_of(config, journal, ct)]
        if is_transactional(config, journal, ct):
            self.transactional.add(journal)
        self._framers[journal] = framer
        return framer

    def by_key(self, key: bytes | bytearray | str) -> str:
        if self._mapping is None:
            names = sorted(self.selected())  # Gazette maps over the ListResponse, which is in name order.
            make = modulo_mapping if self._config.mapping == "modulo" else rendezvous_mapping
            self._mapping = make(_identity, names)
        return self._mapping(bytes(key) if isinstance(key, bytearray) else key)[0]

    def unkeyed(self, size: int) -> str:
        """A random journal, kept until an append's worth of rows went to it (as Kafka's sticky partitioner)."""
        if not self._sticky or self._sticky_bytes >= self._config.batch_bytes:
            if self._random is None:
                self._random = random_mapping(sorted(self.selected()))
            self._sticky, self._sticky_bytes = self._random(None)[0], 0
        self._sticky_bytes += size
        return self._sticky


def _identity(key: Any) -> Any:
    return key


def spool_dir() -> str | None:
    """Where a task spills: Spark's local directory when it has one (sized for shuffle files), else the temp dir."""
    dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
    return dirs.split(",")[0] or None


@dataclass(frozen=True)
class TaskTxn:
    """Who a task is as a producer (see `pipelines.sink.txn`), decided by the writer in the task."""

    partition: int
    write_id: str
    base_clock: int
    """Clocks start after it; 0: from the task's wall-clock time."""
    rollback_clock: int
    rollback_written: bool
    """Roll back, first, the producer's earlier messages in every journal the task writes."""
    rollback_all: bool
    """Also in every journal of the selector (a retry: the failed attempt may have routed rows elsewhere)."""


@dataclass
class TaskResult:
    writes: dict[str, JournalWrite]
    producer: bytes = b""
    last_clocks: dict[str, int] = field(default_factory=dict)
    """Per transactional journal with rows: the last clock the task stamped (what its commit ACK carries)."""


def write_rows(
    config: SinkConfig, rows: Iterable[Sequence[Any]], *, refresh: bool, txn: TaskTxn | None = None
) -> TaskResult:
    """Append `rows` as one task does, returning what went to each journal; raise on any failure."""
    budget = _Budget(TASK_MEMORY_BYTES)
    spools: dict[str, Spool] = {}
    directory = spool_dir()
    client = JournalClient(config.broker, credentials=config.credentials())
    txn = txn or TaskTxn(-1, secrets.token_hex(16), 0, ROLLBACK_CLOCK, False, False)
    stamper = Stamper(producer_for(txn.write_id, txn.partition), txn.base_clock or clock_at(time.time_ns()))
    rollback = ack_record(stamper.producer, txn.rollback_clock)
    with asyncio.Runner() as runner:
        try:
            router = Router(config, client, runner, refresh)
            for index, row in enumerate(rows):
                journal, record = _route(config, router, row, stamper, index)
                spool = spools.get(journal)
                if spool is None:
                    spool = spools[journal] = Spool(budget, config.batch_bytes, directory)
                    if txn.rollback_written and journal in router.transactional:
                        spool.add(rollback, rows=0)  # In the journal's first append, before the rows.
                spool.add(record)
            if txn.rollback_all and config.selector:
                for journal in router.selected():
                    if journal not in spools:
                        router.framer(journal)
                        if journal in router.transactional:
                            spools[journal] = Spool(budget, config.batch_bytes, directory)
                            spools[journal].add(rollback, rows=0)
            # The whole input was read and checked: only now does any of it reach a journal.
            if not spools:
                return TaskResult({}, stamper.producer)
            writes = runner.run(_append_all(client, config, spools))
            return TaskResult(writes, stamper.producer, dict(stamper.last))
        except TransportError as err:  # Listing journals, before any append.
            if is_auth_error(err):
                raise auth_error(err, config.auth_token, "gazette sink task: checking its journals") from None
            raise
        finally:
            for spool in spools.values():
                spool.close()
            runner.run(client.close())


def _route(config: SinkConfig, router: Router, row: Sequence[Any], stamper: Stamper, index: int) -> tuple[str, bytes]:
    value = row[config.value_index]
    journal = row[config.journal_index] if config.journal_index >= 0 else None
    if value is None:
        where = f" (journal {journal!r})" if journal else ""
        raise SinkError(f"a row has a null 'value'{where}: every row must have one")
    data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if journal is None:
        key = row[config.key_index] if config.key_index >= 0 else None
        if key is not None:
            journal = router.by_key(key)
        elif config.selector:
            journal = router.unkeyed(len(data))
        else:
            raise SinkError("a row has a null 'journal' and option selector is not set, so it has nowhere to go")
    framer = router.framer(journal)
    if journal in router.transactional:
        return journal, stamp(stamper, data, index, journal)
    return journal, framer(data)


async def _append_all(client: JournalClient, config: SinkConfig, spools: dict[str, Spool]) -> dict[str, JournalWrite]:
    writes = {name: JournalWrite() for name in spools}
    service = AppendService(
        client,
        max_batch_bytes=config.batch_bytes,
        # Room for the append in flight and the next one queued behind it, so neither is spilled again.
        journal_memory_limit=2 * config.batch_bytes,
        memory_limit=max(DEFAULT_MEMORY_LIMIT, 2 * config.batch_bytes),
        spool_dir=spool_dir(),
    )
    try:
        async with service, asyncio.TaskGroup() as group:
            for name, spool in spools.items():
                group.create_task(_append_journal(service, name, spool, writes[name]))
    except BaseExceptionGroup as group_error:
        raise _task_error(group_error, writes, config.auth_token) from _first(group_error)
    return writes


async def _append_journal(service: AppendService, journal: str, spool: Spool, write: JournalWrite) -> None:
    """Append the spool's batches in order, the next queued while the previous is in flight."""
    pending: AsyncAppend | None = None
    pending_records = 0

    def done(aa: AsyncAppend, records: int) -> None:
        write.records += records
        write.bytes += aa.size
        write.appends += 1
        if write.begin < 0:
            write.begin = aa.begin
        write.end = aa.end

    for begin, end, records in spool.batches():
        aa = service.append(journal, spool.read(begin, end))
        if pending is not None:
            await pending
            done(pending, pending_records)
        pending, pending_records = aa, records
    if pending is not None:
        await pending
        done(pending, pending_records)


def _first(group: BaseExceptionGroup[Any]) -> BaseException:
    """The first error of a failed task group which is not the cancellation of a sibling."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        elif not isinstance(exc, asyncio.CancelledError):
            leaves.append(exc)

    walk(group)
    return leaves[0] if leaves else group


def _task_error(group: BaseExceptionGroup[Any], writes: dict[str, JournalWrite], token: str) -> SinkAppendError:
    cause = _first(group)
    journal = getattr(cause, "journal", "") if isinstance(cause, ClientError) else ""
    done = {name: w for name, w in writes.items() if w.appends}
    committed = ", ".join(f"{name}: {w.appends} appends, {w.bytes} bytes" for name, w in sorted(done.items()))
    outcome = " (its outcome is unknown: it may have committed)" if isinstance(cause, AppendOutcomeUnknown) else ""
    why = f"{cause}; {presented(token)}" if is_auth_error(cause) else str(cause)
    message = (
        f"appending to journal {journal or '?'} failed{outcome}: {why}. "
        f"Already committed by this task: {committed or 'nothing'}; a retry of the task appends them again "
        "(in transactional journals, rolling them back first)"
    )
    log.error("gazette sink task failed", extra={"journal": journal, "committed": committed, "error": str(cause)})
    return SinkAppendError(message)


def log_totals(writes: Iterable[dict[str, JournalWrite] | None], what: str, emit: Callable[..., None]) -> dict[
    str, JournalWrite
]:
    """Sum tasks' writes per journal and log them with `emit` (a logger method)."""
    totals: dict[str, JournalWrite] = {}
    for task in writes:
        for name, w in (task or {}).items():
            totals.setdefault(name, JournalWrite()).add(w)
    records = sum(w.records for w in totals.values())
    size = sum(w.bytes for w in totals.values())
    emit("%s: %d records, %d bytes in %d journals", what, records, size, len(totals),
         extra={"journals": {n: (w.records, w.bytes, w.appends) for n, w in sorted(totals.items())}})
    return totals

