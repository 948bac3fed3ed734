"""Pipeline definitions as decoded from YAML: source, transform, sink and run mode."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from broker.specs.strict import At


class Mode(StrEnum):
    """How a pipeline runs: one Spark batch job, or a structured streaming query."""

    batch = "batch"
    stream = "stream"


class TriggerKind(StrEnum):
    """Streaming triggers: process what is available then stop, or one micro-batch per interval."""

    available_now = "availableNow"
    processing_time = "processingTime"


@dataclass(frozen=True)
class Trigger:
    """A streaming trigger; `interval` (e.g. `10 seconds`) is set for processingTime only."""

    kind: TriggerKind
    interval: str = ""

    def describe(self) -> str:
        """The trigger as written in YAML."""
        return self.kind.value if self.kind is TriggerKind.available_now else f"processingTime {self.interval}"


@dataclass(frozen=True)
class Source:
    """Journals selected by label, read with format `gazette` and registered as temporary view `view`."""

    selector: str
    options: dict[str, str] = field(default_factory=dict)
    view: str = "source"


@dataclass(frozen=True)
class Transform:
    """Exactly one of `sql` (over the source view) or `python` (`module:function`); neither is identity."""

    sql: str = ""
    python: str = ""
    at: At | None = None
    """Position of the `sql` or `python` field, for errors Spark raises later."""

    def describe(self) -> str:
        """`sql`, `python module:function` or `identity`."""
        if self.sql:
            return "sql"
        if self.python:
            return f"python {self.python}"
        return "identity"


@dataclass(frozen=True)
class JournalsSink:
    """Append rows to journals: a fixed `journal`, or journals matching `selector` partitioned by `key`."""

    selector: str = ""
    mapping: str = ""
    key: str = ""
    journal: str = ""
    options: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """A one-line summary for `gazctl pipelines list`."""
        if self.journal:
            return f"journal {self.journal}"
        text = f"journals {self.selector}"
        if self.key:
            text += f" by {self.key}"
        if self.mapping:
            text += f" ({self.mapping})"
        return text


@dataclass(frozen=True)
class PathSink:
    """Write files of a format Spark ships (parquet, json, csv, orc, text) under `path`."""

    path: str
    format: str
    mode: str = "append"
    options: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """A one-line summary for `gazctl pipelines list`."""
        return f"{self.format} {self.path} ({self.mode})"


@dataclass(frozen=True)
class ConsoleSink:
    """Print rows on stdout (Spark's console sink for streams)."""

    def describe(self) -> str:
        """A one-line summary for `gazctl pipelines list`."""
        return "console"


Sink = JournalsSink | PathSink | ConsoleSink


@dataclass(frozen=True)
class Pipeline:
    """One pipeline file: where it is, what it reads, how it transforms, where it writes, and how it runs."""

    name: str
    file: Path
    source: Source
    sink: Sink
    transform: Transform = field(default_factory=Transform)
    description: str = ""
    mode: Mode = Mode.batch
    trigger: Trigger | None = None
    """Streams only; None runs micro-batches back to back until stopped (Spark's default)."""
    checkpoint: str = ""
    """Streams only (required there): the Spark checkpoint location."""
