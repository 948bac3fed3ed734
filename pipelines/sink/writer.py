"""Writing DataFrames to journals: `df.write.format("gazette")` and `df.writeStream.format("gazette")`.

Columns: `value` (binary or string; strings are appended as UTF-8) is the record. A row goes to
- its `journal` column (string) when that is set: the journal must exist, and match option
  `selector` if one is given;
- else, with a `key` column (string or binary) that is set, to the journal `mapping`
  (`rendezvous`, the default, or `modulo`) picks for the key among the journals `selector`
  matches, in name order, exactly as Gazette's mapping functions do (32-bit FNV-1a), so a Go
  publisher puts the same key in the same journal;
- else (no key, or a null one, as Kafka) to a random journal of the selector, kept for a whole
  append's worth of rows before the next is drawn, so unkeyed rows make large appends.
Options: `broker`, `selector`, `mapping`, `framing` (`lines` appends value + "\\n" unless it
ends with one, `none` appends the bytes as they are, `fixed` is Gazette's protobuf-fixed frame;
default from each journal's `content-type`: JSON lines, CSV, text/plain or none -> `lines`,
protobuf-fixed -> `fixed`), `batchBytes` (largest append, default 4 MiB), `transactional`
(`true`/`false`; default: true for JSON lines journals written without option `framing`).

Options, columns and the selector's journals are checked on the driver when Spark makes the
writer, before any task runs. A batch write maps keys over the journals listed then; a
streaming task lists them anew, so journals created while the query runs take keys too (and a
key may move, as it does in Gazette when the set of journals changes).

Transactional writes (JSON lines journals, `application/x-ndjson`: the default there), the
Gazette way (`pipelines.sink.txn`):
- Each task is one Gazette producer. Its ProducerID is derived from the write id and its
  partition, so every attempt of a partition is the same producer. The write id is drawn at
  random on the driver for a batch write; a streaming micro-batch's is its query id (which the
  checkpoint keeps across restarts) and batch id, from the task's Spark local properties.
- Every row is stamped with a UUID of that producer, flag CONTINUE_TXN, in its top-level `uuid`
  field (`UUID` or `_meta.uuid` where the value has one instead); clocks tick per journal, from
  a base clock the driver draws (batch) or the task's wall-clock time (streaming). A value that
  is not a JSON object fails the task, naming the row.
- A task appends no ACK: its commit message carries its producer and, per journal, its last
  clock. The driver's `commit` appends one ACK_TXN per (journal, producer) at that clock, one
  append per journal. Only then are the rows visible to read-committed readers (Gazette's
  Sequencer, `consumer.message.read_committed`, and the `gazette` reader by default). ACKs are
  records `{"uuid": ...}` of their own, which read-uncommitted readers see.
- A rollback ACK (its clock at or below every clock the producer wrote: the batch's base clock,
  or 1 in streaming) discards the producer's pending rows. A retried task (attempt > 0) puts
  one first in its first append to every journal it writes, and, with a selector, to every
  selected journal (the failed attempt may have routed rows elsewhere). A streaming task always
  does, so a micro-batch replayed after a crash first discards what the crashed run left
  uncommitted. The driver's `abort` appends one for every partition's producer to every
  selected journal and every journal a finished task wrote.
So a failed job or micro-batch leaves nothing visible to read-committed readers, and a retried
task's rows are visible once. This closes, for these journals, the gap below: a task whose JVM
side failed appended rows, but nobody commits them.

What is atomic, and what is not:
- A record is never split: it is entirely within one append, and one Append RPC is atomic (its
  bytes are contiguous and become visible all at once, or never).
- A task reads all its input before it appends anything (spilling beyond 64 MiB to temporary
  files), so a bad row (null value, a journal that does not exist or does not match the
  selector, a newline inside a `lines` value) fails the task before it appends anything, and
  so does any error raised while iterating its input in this Python worker.
- Known gap (non-transactional journals): when the computation of the rows fails in the JVM (a
  failing expression, or a Python UDF, which runs in another worker), PySpark 4.0 does not raise
  in the writer's input iterator: it ends it as if the input were complete. The task then
  appends the rows it got (measured: it may go on appending after Spark failed it and the
  driver aborted). Transactional journals keep those rows uncommitted; for the others, make
  transforms that can fail write to a staging location first.
- The commit is one append per journal, not one for the whole write: should the driver fail
  between them, or an ACK append fail, some journals are committed and others not (the error
  says which). Re-appending an ACK is harmless (its second copy rolls back nothing).
- Read-uncommitted readers (and readers of the raw bytes) see every appended row, rolled back or
  not, and the ACK records.
- Non-transactional writes (`lines`, `none`, `fixed` framings, or `transactional=false`): a
  task's appends are not one transaction; each journal gets one append per `batchBytes` of rows,
  journals in parallel; if one fails, those that committed stay and the task fails (the error
  says what it had committed). Spark retries the task, which appends all its rows again;
  speculative execution may also run a task twice. So delivery is at-least-once: each record
  arrives whole, in order per journal within a task, at least once. A write's tasks run
  concurrently, so records of different tasks interleave (whole appends at a time).
- Limits of the transactions: a failed task's rows are rolled back only where the retry or the
  driver knows to look: with a `journal` column and no selector, the journals the retry's own
  rows name (the driver's abort, which does not see failed tasks' rows, cannot roll them back;
  they stay uncommitted, invisible to read-committed readers, since no ACK of that producer ever
  comes). Speculative execution (`spark.speculation`, off by default) must stay off: two live
  attempts of one producer interleave, and the commit could cover only part of the winner's
  rows. The same holds for an attempt still appending after Spark gave up on it (as measured
  above) while its retry runs: the Sequencer drops repeated clocks, so this is harmless only
  when the attempts produce the same rows in the same order per journal.
- Streaming: a micro-batch replayed after a crash before its commit ACKs is exactly once (its
  first append rolls back the crashed run's rows). One replayed after its commit ACKs but before
  Spark's checkpoint recorded the commit is appended and committed again (at-least-once, as
  Kafka's sink): its rollback ACK is below the producer's last ACK, which Gazette's Sequencer
  accepts, logging "loss of exactly-once semantics". Exactly-once there would need the replay
  to reuse the crashed run's clocks and know the commit happened.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import Row, StructType

from pipelines.sink.options import SinkConfig, is_transactional, resolve, run_sync
from pipelines.sink.task import JournalWrite, SinkAppendError, TaskTxn, log_totals, write_rows
from pipelines.sink.txn import ROLLBACK_CLOCK, ack_record, append_acks, producer_for

log = logging.getLogger(__name__)

QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""Spark's local property holding a streaming query's id, which its checkpoint keeps across restarts."""
BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""Spark's local property holding the micro-batch id of a streaming task."""


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What one task appended, per journal, and what its commit ACKs must carry."""

    journals: dict[str, JournalWrite] = field(default_factory=dict)
    partition: int = -1
    """The Spark partition the task wrote (-1: unknown)."""
    write_id: str = ""
    producer: bytes = b""
    """The task's ProducerID (derived from `write_id` and `partition`)."""
    last_clocks: dict[str, int] = field(default_factory=dict)
    """Per transactional journal the task wrote rows to: the clock of its last row there."""


def _task() -> tuple[int, int, str | None, str | None]:
    """(partition, attempt number, streaming query id, micro-batch id) of the running task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return -1, 0, None, None
    return (context.partitionId(), context.attemptNumber(), context.getLocalProperty(QUERY_ID_PROPERTY),
            context.getLocalProperty(BATCH_ID_PROPERTY))


def _writes(messages: list[WriterCommitMessage | None]) -> list[dict[str, JournalWrite] | None]:
    return [m.journals if isinstance(m, SinkCommitMessage) else None for m in messages]


def _message(config: SinkConfig, rows: Iterator[Row], refresh: bool, txn: TaskTxn) -> SinkCommitMessage:
    result = write_rows(config, rows, refresh=refresh, txn=txn)
    return SinkCommitMessage(result.writes, txn.partition, txn.write_id, result.producer, result.last_clocks)


def _commit_acks(messages: list[WriterCommitMessage | None]) -> dict[str, bytes]:
    """Per journal: the ACK_TXN of every task which wrote rows to it, at its last clock there."""
    acks: dict[str, list[bytes]] = {}
    for m in messages:
        if isinstance(m, SinkCommitMessage):
            for journal, clock in sorted(m.last_clocks.items()):
                acks.setdefault(journal, []).append(ack_record(m.producer, clock))
    return {journal: b"".join(records) for journal, records in acks.items()}


def _commit(config: SinkConfig, messages: list[WriterCommitMessage | None], what: str) -> None:
    acks = _commit_acks(messages)
    if not acks:
        return
    failed = run_sync(append_acks(config.broker, acks, config.credentials()))
    if failed:
        done = sorted(set(acks) - {journal for journal, _ in failed})
        journal, error = failed[0]
        raise SinkAppendError(
            f"{what}: appending the commit ACKs to journal {journal} failed: {error}. The rows are committed "
            f"(visible to read-committed readers) in {', '.join(done) or 'no journal'}, and not in "
            f"{', '.join(j for j, _ in failed)}"
        )


def _rollback(config: SinkConfig, messages: list[WriterCommitMessage | None], write_id: str, clock: int,
              what: str) -> None:
    """Roll back every partition's producer in every transactional journal the write may have written."""
    journals = {name for name, ct in config.journals.items() if is_transactional(config, name, ct)}
    for m in messages:
        if isinstance(m, SinkCommitMessage):
            journals.update(m.last_clocks)
    if not journals or not messages:
        return
    producers = [producer_for(write_id, partition) for partition in range(len(messages))]
    rollback = b"".join(ack_record(p, clock) for p in producers)
    try:
        failed = run_sync(append_acks(config.broker, dict.fromkeys(sorted(journals), rollback), config.credentials()))
    except Exception as err:  # Abort must not hide the job's own error.
        failed = [(name, err) for name in sorted(journals)]
    for journal, error in failed:
        log.warning("%s: rolling back journal %s failed (its rows stay uncommitted, invisible to read-committed "
                    "readers): %s", what, journal, error)


class GazetteBatchWriter(DataSourceWriter):
    """`df.write.format("gazette").mode("append")`: each task appends its partition's rows; commit ACKs them."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        self.config: SinkConfig = resolve(options, schema, overwrite)
        self.totals: dict[str, JournalWrite] = {}
        """What the write appended per journal, once committed (on the driver)."""

    def write(self, iterator: Iterator[Row]) -> SinkCommitMessage:
        partition, attempt, _, _ = _task()
        config = self.config
        # Every attempt of a partition is the same producer, with the same clocks: a retry first rolls
        # back, at the clock just below them, whatever an earlier attempt appended.
        txn = TaskTxn(partition, config.write_id, config.base_clock, config.base_clock,
                      rollback_written=attempt > 0, rollback_all=attempt > 0)
        return _message(config, iterator, False, txn)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _commit(self.config, messages, "gazette write")
        self.totals = log_totals(_writes(messages), "gazette write committed", log.info)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        failed = sum(1 for m in messages if m is None)
        _rollback(self.config, messages, self.config.write_id, self.config.base_clock, "gazette write abort")
        log_totals(_writes(messages), f"gazette write aborted ({failed} tasks failed); appended by the others, "
                   "rolled back where transactional", log.warning)


class GazetteStreamWriter(DataSourceStreamWriter):
    """`df.writeStream.format("gazette")` (append output mode): each micro-batch is one write, committed by ACKs."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        # Tasks clock from their own wall-clock time: a query restarted from its checkpoint makes a new writer.
        self.config: SinkConfig = dataclasses.replace(resolve(options, schema, overwrite), base_clock=0)
        self.totals: dict[str, JournalWrite] = {}
        """What the last committed micro-batch appended per journal (on the driver)."""

    def write(self, iterator: Iterator[Row]) -> SinkCommitMessage:
        partition, attempt, query, batch = _task()
        # The same micro-batch, replayed after a restart, is the same producers: their first append
        # rolls back what a crashed run left uncommitted.
        write_id = f"{query}/{batch}" if query and batch else f"{self.config.write_id}/{batch}"
        txn = TaskTxn(partition, write_id, 0, ROLLBACK_CLOCK, rollback_written=True, rollback_all=attempt > 0)
        return _message(self.config, iterator, True, txn)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _commit(self.config, messages, f"gazette micro-batch {batchId}")
        self.totals = log_totals(_writes(messages), f"gazette micro-batch {batchId} committed", log.info)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        failed = sum(1 for m in messages if m is None)
        ids = {m.write_id for m in messages if isinstance(m, SinkCommitMessage)}
        if ids:
            _rollback(self.config, messages, ids.pop(), ROLLBACK_CLOCK, f"gazette micro-batch {batchId} abort")
        log_totals(_writes(messages), f"gazette micro-batch {batchId} aborted ({failed} tasks failed); appended by "
                   "the others, rolled back where transactional", log.warning)
