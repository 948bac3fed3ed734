"""`gazctl pipelines list|validate|run`: Spark pipelines defined as YAML files in a pipeline repository.

A pipeline repository is a directory of `*.yaml` / `*.yml` pipeline files (searched recursively),
`./pipelines` by default or `--dir DIR`. Every file is validated before Spark starts; `run` then
starts a SparkSession (`local[*]` unless `--master`), registers format `gazette` and runs one
pipeline, showing progress on stderr when it is a terminal and a one-line summary on stdout.

Spark Declarative Pipelines projects (`spark-pipeline.yml`) are `spark-pipelines run`'s to run: it
does all a wrapper here could, so given one, each command says so and names that command.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from broker.specs import SpecError
from gazctl.commands.common import (
    BrokerAddressOption,
    LogFormatOption,
    LogLevelOption,
    reported,
    setup,
    stdout_console,
)
from gazctl.errors import GazctlError
from pipelines.definitions.load import check_run_flags, find, load_dir
from pipelines.definitions.model import Pipeline

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipelines.definitions.run import BatchProgress

log = logging.getLogger("gazctl")

DEFAULT_DIR = Path("pipelines")
"""The pipeline repository when --dir is not given, relative to the current directory."""

app = typer.Typer(
    name="pipelines",
    help="List, validate and run Spark pipelines over journals selected by label."
    " (Spark Declarative Pipelines projects run with `spark-pipelines run`.)",
    no_args_is_help=True,
)

DirOption = Annotated[
    Path,
    typer.Option(
        "--dir",
        help="Pipeline repository: a directory of *.yaml pipeline files, searched recursively"
        " (this repository's examples: examples/pipelines)",
    ),
]
NameArgument = Annotated[
    str, typer.Argument(help="The pipeline's `name`, or the path of a pipeline file (*.yaml)", show_default=False)
]


def register(root: typer.Typer) -> None:
    """Add `pipelines` to the root app."""
    root.add_typer(app, name="pipelines")


@app.command("list")
def list_command(directory: DirOption = DEFAULT_DIR) -> None:
    """List the pipelines in the repository: name, mode, source selector and sink.

    Files that do not validate are reported on stderr (exit status 1) after the table.
    """
    with reported():
        loaded = load_dir(directory, check_imports=False)
        out = Table(box=box.ASCII, show_edge=True, highlight=False)
        for header in ("Name", "Mode", "Source", "Transform", "Sink"):
            out.add_column(header, overflow="fold")
        for p in loaded.pipelines:
            mode = p.mode.value + (f" ({p.trigger.describe()})" if p.trigger else "")
            cells = (p.name, mode, p.source.selector, p.transform.describe(), p.sink.describe())
            out.add_row(*(Text(cell) for cell in cells))
        stdout_console().print(out)
        _report(loaded.errors)


@app.command("validate")
def validate_command(
    name: Annotated[str | None, typer.Argument(help="Validate only this pipeline (default: all)")] = None,
    directory: DirOption = DEFAULT_DIR,
) -> None:
    """Validate every pipeline file (or NAME's) as `run` would before starting Spark.

    Each error names file:line:column and the field; Python transforms are imported. Exit status:
    0 all valid, 1 an invalid pipeline (or none found).
    """
    with reported():
        if name is not None:
            pipeline = find(directory, name)
            sys.stdout.write(f"{pipeline.file}: pipeline {pipeline.name!r} is valid\n")
            return
        loaded = load_dir(directory)
        for pipeline in loaded.pipelines:
            sys.stdout.write(f"{pipeline.file}: pipeline {pipeline.name!r} is valid\n")
        _report(loaded.errors)


@app.command("run")
def run_command(
    ctx: typer.Context,
    name: NameArgument,
    directory: DirOption = DEFAULT_DIR,
    master: Annotated[
        str, typer.Option("--master", help="Spark master URL: local[*], local[2], spark://host:7077, yarn, k8s://...")
    ] = "local[*]",
    once: Annotated[
        bool, typer.Option("--once", help="Streams: process what is available now, then stop (trigger availableNow)")
    ] = False,
    stream: Annotated[
        bool, typer.Option("--stream", help="Streams: run micro-batches until Ctrl-C, whatever the trigger")
    ] = False,
    broker_address: BrokerAddressOption = None,
    log_level: LogLevelOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Run pipeline NAME on Spark: a batch job, or a streaming query (its trigger, --once or --stream).

    The pipeline is validated before Spark starts. Its source and journals sink use --broker.address
    unless the pipeline's options set `broker`, and present gazctl's --broker.auth-token (or
    $BROKER_AUTH_TOKEN, or the INI's AuthToken) as their option `authToken`. Relative sink paths
    and checkpoints are under the current directory. Exit status: 0 done, 1 invalid pipeline or
    Spark error, 130 interrupted.
    """
    with reported():
        settings = setup(ctx, broker_address, log_level, log_format)
        # A static token travels to the executors as option authToken; keys stay in this process
        # (Spark's processes sign with the $BROKER_AUTH_KEYS of their own environment, if any).
        signer = settings.credentials.signer
        token = signer.token if signer is not None else ""
        pipeline = find(directory, name)
        check_run_flags(pipeline, once=once, stream=stream)
        try:
            from pipelines.definitions.run import run  # PySpark loads only once a valid pipeline is to run.
        except ImportError as missing:
            raise GazctlError(
                f"running pipelines needs PySpark and pyarrow ({missing}): pip install 'gazette-py[spark]'"
            ) from None

        err = Console(file=sys.stderr, highlight=False)
        spark = _spark(pipeline, master, settings.log_level.value)
        try:
            if pipeline.mode.value == "batch":
                with _stage_progress(spark, pipeline, err):
                    result = run(spark, pipeline, broker=settings.broker_address.value, auth_token=token)
            else:
                show = _batch_printer(err) if err.is_terminal else None
                status: AbstractContextManager[object] = (
                    err.status(f"{pipeline.name}: streaming (Ctrl-C to stop)") if err.is_terminal else nullcontext()
                )
                with status:
                    result = run(
                        spark, pipeline, broker=settings.broker_address.value, auth_token=token, once=once,
                        stream=stream, on_batch=show,
                    )
        finally:
            spark.stop()
        sys.stdout.write(result.summary(pipeline.sink.describe()) + "\n")
        if result.interrupted:
            raise typer.Exit(130)


def _report(errors: list[SpecError]) -> None:
    """Print each error on stderr; exit 1 if there were any."""
    for error in errors:
        sys.stderr.write(f"error: {error}\n")
    if errors:
        raise typer.Exit(1)


def _spark(pipeline: Pipeline, master: str, level: str) -> SparkSession:
    """A SparkSession for `pipeline` with format `gazette`; Spark logs only what --log.level asks for."""
    from pyspark.sql import SparkSession

    from pipelines.datasource import register

    # Local workers run this interpreter, and import Python transforms from beside the pipeline file.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if pipeline.transform.python:
        entry = str(pipeline.file.parent.resolve())
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (entry, os.environ.get("PYTHONPATH", "")) if p)
    spark_level = {"trace": "DEBUG", "debug": "INFO", "info": "WARN"}.get(level, "FATAL")
    config = _log4j_config(spark_level)
    builder = (
        SparkSession.builder.master(master)
        .appName(f"gazctl-pipeline-{pipeline.name}")
        .config("spark.ui.showConsoleProgress", "false")  # Its bar on stderr would fight ours.
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={config}")
    )
    log.debug("starting spark", extra={"master": master, "pipeline": pipeline.name})
    try:
        spark = builder.getOrCreate()
    finally:
        os.unlink(config)  # log4j read it as the JVM started.
    spark.sparkContext.setLogLevel(spark_level)
    register(spark)
    return spark


def _log4j_config(level: str) -> str:
    """A log4j2 configuration file logging Spark at `level` to stderr, replacing Spark's chatty default."""
    text = (
        f"rootLogger.level = {level.lower()}\n"
        "rootLogger.appenderRef.stderr.ref = console\n"
        "appender.console.type = Console\n"
        "appender.console.name = console\n"
        "appender.console.target = SYSTEM_ERR\n"
        "appender.console.layout.type = PatternLayout\n"
        "appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex\n"
    )
    handle, path = tempfile.mkstemp(prefix="gazctl-log4j2-", suffix=".properties")
    with os.fdopen(handle, "w") as out:
        out.write(text)
    return path


def _batch_printer(err: Console) -> Callable[[BatchProgress], None]:
    """A callback printing one line per micro-batch on the terminal."""

    def show(progress: BatchProgress) -> None:
        err.print(
            f"batch {progress.batch_id}: {progress.input_rows} input rows"
            f" ({progress.rows_per_second:,.1f} rows/s)"
        )

    return show


class _stage_progress:
    """While a batch job runs, show its active stages' completed/total tasks on a terminal's stderr."""

    def __init__(self, spark: SparkSession, pipeline: Pipeline, err: Console) -> None:
        self._spark = spark
        self._pipeline = pipeline
        self._err = err
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> None:
        if self._err.is_terminal:
            self._thread = threading.Thread(target=self._watch, name="gazctl-stage-progress", daemon=True)
            self._thread.start()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        tracker = self._spark.sparkContext.statusTracker()
        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=self._err, transient=True,
        ) as bar:
            task = bar.add_task(f"{self._pipeline.name}: starting", total=None)
            while not self._stop.wait(0.25):
                done = total = 0
                stages = tracker.getActiveStageIds()
                for stage in stages:
                    info = tracker.getStageInfo(stage)
                    if info is not None:
                        done += info.numCompletedTasks
                        total += info.numTasks
                label = f"stages {', '.join(map(str, sorted(stages)))}" if stages else "planning"
                bar.update(task, description=f"{self._pipeline.name}: {label} (tasks)", completed=done,
                           total=total or None)
