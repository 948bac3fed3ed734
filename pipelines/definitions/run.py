"""Running a pipeline on a SparkSession: read journals with format `gazette`, transform, write the sink.

A batch pipeline is one Spark job; a stream is a structured streaming query which runs until its
trigger says stop (`availableNow`) or until interrupted. Spark's own errors (SQL analysis, failed
jobs, failed queries) become PipelineRunError naming the pipeline's file and, where known, field.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.errors.exceptions.captured import StreamingQueryException
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from pipelines.datasource import FORMAT
from pipelines.definitions.errors import PipelineRunError
from pipelines.definitions.load import check_run_flags, resolve_python
from pipelines.definitions.model import (
    ConsoleSink,
    JournalsSink,
    Mode,
    Pipeline,
    Trigger,
    TriggerKind,
)

CONSOLE_ROWS = 20
"""Rows a batch pipeline with `console: true` prints (as `DataFrame.show`)."""

SPARK_ERRORS = (PySparkException, Py4JJavaError)
"""What Spark raises for a failed plan or job (py4j's error when PySpark has no class for the JVM's)."""

_TRACEBACK = "Traceback (most recent call last):"

_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:")


@dataclass(frozen=True)
class BatchProgress:
    """One micro-batch of a stream, from `StreamingQuery.recentProgress`."""

    batch_id: int
    input_rows: int
    rows_per_second: float
    """Processed rows per second (Spark's `processedRowsPerSecond`)."""


@dataclass
class RunResult:
    """What a run did: rows written (batch) or read (stream, summed over micro-batches), and for how long."""

    pipeline: str
    mode: Mode
    rows: int | None = None
    """None when Spark did not report a count (a console sink)."""
    batches: int = 0
    seconds: float = 0.0
    interrupted: bool = False

    def summary(self, sink: str) -> str:
        """One line for the end of `gazctl pipelines run`."""
        rows = "?" if self.rows is None else str(self.rows)
        if self.mode is Mode.batch:
            text = f"{self.pipeline}: wrote {rows} rows to {sink} in {self.seconds:.1f}s"
        else:
            text = (
                f"{self.pipeline}: {self.batches} micro-batches, {rows} input rows, to {sink}"
                f" in {self.seconds:.1f}s"
            )
        return text + (" (interrupted)" if self.interrupted else "")


def reader_options(pipeline: Pipeline, broker: str | None, auth_token: str = "") -> dict[str, str]:
    """Options of `spark.read.format("gazette")`: the pipeline's, its selector, and `broker` if it has
    none; `auth_token` (a secret) as option `authToken` when given."""
    options = {**pipeline.source.options, "selector": pipeline.source.selector}
    if broker and "broker" not in options:
        options["broker"] = broker
    if auth_token:
        options["authToken"] = auth_token
    return options


def writer_options(sink: JournalsSink, broker: str | None, auth_token: str = "") -> dict[str, str]:
    """Options of `df.write.format("gazette")` for a journals sink; the pipeline's `broker` wins;
    `auth_token` (a secret) as option `authToken` when given."""
    options = dict(sink.options)
    if sink.selector:
        options["selector"] = sink.selector
    if sink.mapping:
        options["mapping"] = sink.mapping
    if broker and "broker" not in options:
        options["broker"] = broker
    if auth_token:
        options["authToken"] = auth_token
    return options


def resolve_path(path: str, workdir: Path | None) -> str:
    """An absolute location for Spark: URIs (`s3a://`, `file:`) as given, relative paths under `workdir`.

    Spark's JVM resolves relative paths against its own start directory, not the caller's.
    """
    if _URI.match(path):
        return path
    return str(((workdir or Path.cwd()) / path).resolve())


def source_frame(spark: SparkSession, pipeline: Pipeline, broker: str | None, auth_token: str = "") -> DataFrame:
    """Read the pipeline's journals (a streaming DataFrame for streams) and register its view."""
    reader = spark.readStream if pipeline.mode is Mode.stream else spark.read
    try:
        frame = reader.format(FORMAT).options(**reader_options(pipeline, broker, auth_token)).load()
        frame.createOrReplaceTempView(pipeline.source.view)
    except SPARK_ERRORS as err:
        raise _run_error(pipeline, "source", err) from None
    return frame


def transform_frame(spark: SparkSession, pipeline: Pipeline, source: DataFrame) -> DataFrame:
    """Apply the pipeline's SQL or Python transform to `source` (identity when it has none)."""
    transform = pipeline.transform
    field = "transform.sql" if transform.sql else "transform.python"
    if transform.sql:
        try:
            return spark.sql(transform.sql)
        except SPARK_ERRORS as err:
            raise _run_error(pipeline, field, err) from None
    if not transform.python:
        return source
    try:
        function = resolve_python(transform.python, pipeline.file.parent)
    except ValueError as err:
        raise _run_error(pipeline, field, err) from None
    _ship_module(spark, function)
    try:
        out = function(source)
    except SPARK_ERRORS as err:
        raise _run_error(pipeline, field, err) from None
    if not isinstance(out, DataFrame):
        raise _run_error(pipeline, field, f"{transform.python} returned {type(out).__name__}, not a DataFrame")
    return out


def journal_rows(frame: DataFrame, sink: JournalsSink) -> DataFrame:
    """The columns the gazette writer takes: `value`, and `journal` (fixed) or `key` (partition key).

    Without a `value` column, each row is written as one JSON object. Without `journal` or `key`
    in the sink, the frame's own `journal` or `key` column routes rows, if it has one.
    """
    value: Column = F.col("value") if "value" in frame.columns else F.to_json(F.struct(*frame.columns))
    columns = [value.alias("value")]
    if sink.journal:
        columns.append(F.lit(sink.journal).alias("journal"))
    elif sink.key:
        columns.append(F.expr(sink.key).cast("string").alias("key"))  # The writer takes string keys.
    else:
        columns.extend(F.col(name) for name in ("journal", "key") if name in frame.columns)
    return frame.select(*columns)


def run(
    spark: SparkSession,
    pipeline: Pipeline,
    *,
    broker: str | None = None,
    auth_token: str = "",
    workdir: Path | None = None,
    once: bool = False,
    stream: bool = False,
    on_batch: Callable[[BatchProgress], None] | None = None,
    poll_seconds: int = 1,
) -> RunResult:
    """Run `pipeline` on `spark` (with format `gazette` registered) and return what it did.

    `broker` is the address for source and journals sink unless the pipeline sets its own;
    `auth_token` is the bearer token they present (option `authToken`; "": the `$BROKER_AUTH_TOKEN`
    of Spark's driver and executors). For a stream, `once` processes what is available then stops
    (trigger availableNow), `stream` runs until interrupted (Ctrl-C stops the query and returns with
    `interrupted`); neither keeps the pipeline's trigger. `on_batch` sees each micro-batch's progress.
    """
    check_run_flags(pipeline, once=once, stream=stream)
    started = time.monotonic()
    frame = transform_frame(spark, pipeline, source_frame(spark, pipeline, broker, auth_token))
    if isinstance(pipeline.sink, JournalsSink):
        frame = journal_rows(frame, pipeline.sink)
    if pipeline.mode is Mode.batch:
        rows = _write_batch(pipeline, frame, broker, auth_token, workdir)
        result = RunResult(pipeline.name, pipeline.mode, rows=rows)
    else:
        trigger = pipeline.trigger
        if once:
            trigger = Trigger(TriggerKind.available_now)
        elif stream and trigger is not None and trigger.kind is TriggerKind.available_now:
            trigger = None  # Run micro-batches back to back until interrupted.
        query = _start_stream(pipeline, frame, broker, auth_token, workdir, trigger)
        result = _await(pipeline, query, on_batch, poll_seconds)
    result.seconds = time.monotonic() - started
    return result


def _write_batch(
    pipeline: Pipeline, frame: DataFrame, broker: str | None, auth_token: str, workdir: Path | None
) -> int | None:
    sink = pipeline.sink
    observation = Observation(f"gazctl-{pipeline.name}")
    observed = frame.observe(observation, F.count(F.lit(1)).alias("rows"))
    try:
        if isinstance(sink, ConsoleSink):
            frame.show(CONSOLE_ROWS, truncate=False)
            return None
        if isinstance(sink, JournalsSink):
            observed.write.format(FORMAT).options(**writer_options(sink, broker, auth_token)).mode("append").save()
        else:
            writer = observed.write.format(sink.format).options(**sink.options).mode(sink.mode)
            writer.save(resolve_path(sink.path, workdir))
    except SPARK_ERRORS as err:
        raise _run_error(pipeline, "", err) from None  # The job runs source, transform and sink alike.
    rows = observation.get.get("rows")
    return int(rows) if rows is not None else None


def _start_stream(
    pipeline: Pipeline,
    frame: DataFrame,
    broker: str | None,
    auth_token: str,
    workdir: Path | None,
    trigger: Trigger | None,
) -> StreamingQuery:
    sink = pipeline.sink
    writer: DataStreamWriter = (
        frame.writeStream.queryName(pipeline.name.replace("-", "_").replace(".", "_"))
        .option("checkpointLocation", resolve_path(pipeline.checkpoint, workdir))
    )
    if isinstance(sink, ConsoleSink):
        writer = writer.format("console").option("truncate", "false")
    elif isinstance(sink, JournalsSink):
        writer = writer.format(FORMAT).options(**writer_options(sink, broker, auth_token))
    else:
        writer = writer.format(sink.format).options(**sink.options).option("path", resolve_path(sink.path, workdir))
    if trigger is not None and trigger.kind is TriggerKind.available_now:
        writer = writer.trigger(availableNow=True)
    elif trigger is not None:
        writer = writer.trigger(processingTime=trigger.interval)
    try:
        return writer.outputMode("append").start()
    except SPARK_ERRORS as err:
        raise _run_error(pipeline, "sink", err) from None


def _await(
    pipeline: Pipeline, query: StreamingQuery, on_batch: Callable[[BatchProgress], None] | None, poll: int
) -> RunResult:
    """Wait for `query` to end, reporting each micro-batch once; Ctrl-C stops it."""
    result = RunResult(pipeline.name, pipeline.mode, rows=0)
    seen: dict[int, BatchProgress] = {}

    def report() -> None:
        for entry in query.recentProgress:
            progress = _batch_progress(entry)
            # Idle queries repeat the last batch id in progress events without input: skip repeats.
            if progress is None or progress.batch_id in seen:
                continue
            seen[progress.batch_id] = progress
            if on_batch is not None:
                on_batch(progress)

    with _ctrl_c_noted() as interrupted:
        try:
            while True:
                try:
                    done = query.awaitTermination(poll)
                except StreamingQueryException as err:
                    raise _run_error(pipeline, "", err) from None
                report()
                if done:
                    break
                if interrupted.is_set():
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            result.interrupted = True
            query.stop()
            report()
    result.batches = len(seen)
    result.rows = sum(p.input_rows for p in seen.values())
    return result


@contextmanager
def _ctrl_c_noted() -> Iterator[threading.Event]:
    """An event set by the first Ctrl-C (SIGINT) while the block runs; a second one reaches the handler before.

    SparkContext's own SIGINT handler calls into the JVM over py4j; run while the main thread waits in a
    py4j call (awaitTermination), that call fails (PySpark 4.0: "reentrant call inside BufferedReader")
    and the run ended with a traceback instead of stopping its query. The wait polls, so noting the
    signal and stopping the query at the next poll is enough. Off the main thread nothing is installed.
    """
    noted = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return

    def note(_signum: int, _frame: Any) -> None:
        noted.set()
        signal.signal(signal.SIGINT, previous)

    # None: a handler not installed from Python; Python's own raises KeyboardInterrupt.
    previous = signal.signal(signal.SIGINT, note) or signal.default_int_handler
    try:
        yield noted
    finally:
        if signal.getsignal(signal.SIGINT) is note:
            signal.signal(signal.SIGINT, previous)


def _batch_progress(entry: Any) -> BatchProgress | None:
    """A progress entry (a dict, or StreamingQueryProgress in newer PySpark) as BatchProgress."""
    get = entry.get if isinstance(entry, dict) else lambda key, default=None: getattr(entry, key, default)
    batch_id = get("batchId")
    if batch_id is None:
        return None
    return BatchProgress(
        batch_id=int(batch_id),
        input_rows=int(get("numInputRows", 0) or 0),
        rows_per_second=float(get("processedRowsPerSecond", 0.0) or 0.0),
    )


def _ship_module(spark: SparkSession, function: Callable[..., Any]) -> None:
    """Send a transform's module file to executors, so UDFs it defines unpickle there (cluster masters)."""
    module = __import__(function.__module__)
    path = getattr(module, "__file__", None)
    if path and "." not in function.__module__ and Path(path).suffix == ".py":
        try:
            spark.sparkContext.addPyFile(path)
        except Exception:  # Already added in this session (tests reuse one): nothing more to ship.
            pass


def first_line(err: BaseException | str) -> str:
    """An error in one line: py4j's `An error occurred while calling oN.save.` is skipped, and a Python
    traceback (a data source's or UDF's, relayed by the JVM) gives way to its exception line."""
    lines = [line.rstrip() for line in str(err).splitlines()]
    for i, line in enumerate(lines):
        head = line.strip().removeprefix(": ").strip()
        if not head or head.startswith("An error occurred while calling"):
            continue
        # PySpark 4.0 puts the traceback on the header's line; 4.3 on the line after it.
        if head.endswith(_TRACEBACK) or (i + 1 < len(lines) and lines[i + 1].strip() == _TRACEBACK):
            raised = _raised(lines[i + 1 :])
            head = head.removesuffix(_TRACEBACK).rstrip() + (f" {raised}" if raised else "")
        return head
    return type(err).__name__ if isinstance(err, BaseException) else "failed"


def _raised(traceback: list[str]) -> str | None:
    """The first line of the exception a Python traceback ends with (its message may span lines)."""
    frames = [i for i, line in enumerate(traceback) if line.startswith("  File ")]
    after = traceback[frames[-1] + 1 :] if frames else traceback
    return next((t for t in after if t and not t[0].isspace() and t != _TRACEBACK), None)


def _run_error(pipeline: Pipeline, field: str, err: BaseException | str) -> PipelineRunError:
    """A one-line error: the pipeline's file (and field position, for its SQL or Python) and Spark's message."""
    message = first_line(err)
    at = pipeline.transform.at if field.startswith("transform") else None
    where = f"{at.file}:{at.line}:{at.column}" if at is not None else str(pipeline.file)
    return PipelineRunError(f"{where}: {field + ': ' if field else ''}pipeline {pipeline.name!r}: {message}")
