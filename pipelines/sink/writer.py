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
protobuf-fixed -> `fixed`), `batchBytes` (largest append, default 4 MiB).

Options, columns and the selector's journals are checked on the driver when Spark makes the
writer, before any task runs. A batch write maps keys over the journals listed then; a
streaming task lists them anew, so journals created while the query runs take keys too (and a
key may move, as it does in Gazette when the set of journals changes).

What is atomic, and what is not:
- A record is never split: it is entirely within one append, and one Append RPC is atomic (its
  bytes are contiguous and become visible all at once, or never).
- A task reads all its input before it appends anything (spilling beyond 64 MiB to temporary
  files), so a bad row (null value, a journal that does not exist or does not match the
  selector, a newline inside a `lines` value) fails the task before it appends anything, and
  so does any error raised while iterating its input in this Python worker.
- Known gap: when the computation of the rows fails in the JVM (a failing expression, or a
  Python UDF, which runs in another worker), PySpark 4.0 does not raise in the writer's input
  iterator: it ends it as if the input were complete. The task then appends the rows it got,
  and Spark fails it afterwards. `tests/pipelines/test_sink.py` holds this as a strict xfail.
  Until PySpark reports it, make transforms that can fail write to a staging location first.
- A task's appends are not one transaction: Gazette has no multi-append commit. Each journal
  gets one append per `batchBytes` of rows, journals in parallel; if one fails (e.g. a broker
  outage longer than the retries, or an append whose outcome is unknown), the appends that
  committed before it stay, the task fails, and the error says what it had committed.
- Spark then retries the task, which appends all its rows again; speculative execution may
  also run a task twice. So delivery is at-least-once: each record arrives whole, in order per
  journal within a task, at least once, and exactly once when no task fails after its first
  append. Readers that must drop repeats need a key or id in the value. A write's tasks run
  concurrently, so records of different tasks interleave (whole appends at a time).
- In streaming, a micro-batch is committed to Spark's checkpoint after its appends; one
  replayed after a crash between the two is appended again (at-least-once, as Kafka's sink).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import Row, StructType

from pipelines.sink.options import SinkConfig, resolve
from pipelines.sink.task import JournalWrite, log_totals, write_rows

log = logging.getLogger(__name__)


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What one task appended, per journal."""

    journals: dict[str, JournalWrite] = field(default_factory=dict)
    partition: int = -1
    """The Spark partition the task wrote (-1: unknown)."""


def _partition() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else -1


def _writes(messages: list[WriterCommitMessage | None]) -> list[dict[str, JournalWrite] | None]:
    return [m.journals if isinstance(m, SinkCommitMessage) else None for m in messages]


class GazetteBatchWriter(DataSourceWriter):
    """`df.write.format("gazette").mode("append")`: each task appends its partition's rows."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        self.config: SinkConfig = resolve(options, schema, overwrite)
        self.totals: dict[str, JournalWrite] = {}
        """What the write appended per journal, once committed (on the driver)."""

    def write(self, iterator: Iterator[Row]) -> SinkCommitMessage:
        return SinkCommitMessage(write_rows(self.config, iterator, refresh=False), _partition())

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.totals = log_totals(_writes(messages), "gazette write committed", log.info)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        failed = sum(1 for m in messages if m is None)
        log_totals(_writes(messages), f"gazette write aborted ({failed} tasks failed); appended by the others",
                   log.warning)


class GazetteStreamWriter(DataSourceStreamWriter):
    """`df.writeStream.format("gazette")` (append output mode): each micro-batch's tasks append their rows."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        self.config: SinkConfig = resolve(options, schema, overwrite)
        self.totals: dict[str, JournalWrite] = {}
        """What the last committed micro-batch appended per journal (on the driver)."""

    def write(self, iterator: Iterator[Row]) -> SinkCommitMessage:
        return SinkCommitMessage(write_rows(self.config, iterator, refresh=True), _partition())

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.totals = log_totals(_writes(messages), f"gazette micro-batch {batchId} committed", log.info)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        failed = sum(1 for m in messages if m is None)
        log_totals(_writes(messages), f"gazette micro-batch {batchId} aborted ({failed} tasks failed); appended by "
                   "the others", log.warning)
