"""Pipeline definitions: strict decoding and validation (no Spark), and `gazctl pipelines list|validate`."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from broker.specs import SpecError
from pipelines.definitions import (
    ConsoleSink,
    JournalsSink,
    Mode,
    PathSink,
    PipelineDirError,
    PipelineNotFound,
    PipelineRunError,
    TriggerKind,
    find,
    load_dir,
    load_file,
    load_text,
)
from pipelines.definitions.load import check_run_flags
from pipelines.definitions.run import first_line
from tests.support.harness import ROOT, run_gazctl

EXAMPLES = ROOT / "examples" / "pipelines"

VALID = """\
name: clicks
source:
  selector: app.gazette.dev/message-type=Click
sink:
  console: true
"""


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(tmp_path: Path, text: str) -> SpecError:
    path = tmp_path / "p.yaml"
    with pytest.raises(SpecError) as info:
        load_text(textwrap.dedent(text), path)
    return info.value


def test_minimal_pipeline_has_defaults(tmp_path: Path) -> None:
    p = load_text(VALID, tmp_path / "p.yaml")
    assert p.name == "clicks"
    assert p.mode is Mode.batch
    assert p.source.view == "source"
    assert p.source.options == {}
    assert p.transform.describe() == "identity"
    assert isinstance(p.sink, ConsoleSink)
    assert p.trigger is None and p.checkpoint == ""


def test_full_stream_pipeline(tmp_path: Path) -> None:
    p = load_text(
        textwrap.dedent("""\
        name: enrich.v2
        description: |
          Enriched clicks.
        mode: stream
        trigger: 10 seconds
        checkpoint: s3a://bucket/checkpoints/enrich
        source:
          selector: app.gazette.dev/message-type=Click, app.gazette.dev/region in (us, eu)
          view: clicks
          options:
            startingOffsets: {a/journal: 0, b/journal: 1024}
            failOnDataLoss: false
            maxBytesPerTrigger: 1048576
            isolation: read_uncommitted
            parse: json
        transform:
          sql: SELECT value, journal AS key FROM clicks
        sink:
          journals:
            selector: app.gazette.dev/message-type=Enriched
            mapping: rendezvous
            key: key
            options: {framing: json}
        """),
        tmp_path / "p.yaml",
    )
    assert p.mode is Mode.stream and p.description == "Enriched clicks."
    assert p.trigger is not None and p.trigger.kind is TriggerKind.processing_time
    assert p.trigger.interval == "10 seconds"
    assert p.source.view == "clicks"
    assert json.loads(p.source.options["startingOffsets"]) == {"a/journal": 0, "b/journal": 1024}
    assert p.source.options["failOnDataLoss"] == "false"
    assert p.source.options["maxBytesPerTrigger"] == "1048576"
    assert p.transform.sql.startswith("SELECT") and p.transform.at is not None
    assert (p.transform.at.line, p.transform.at.column) == (17, 8)
    assert p.sink == JournalsSink(
        selector="app.gazette.dev/message-type=Enriched", mapping="rendezvous", key="key", options={"framing": "json"}
    )


@pytest.mark.parametrize(
    ("trigger", "kind", "interval"),
    [
        ("availableNow", TriggerKind.available_now, ""),
        ("{availableNow: true}", TriggerKind.available_now, ""),
        ("{processingTime: 1 minute}", TriggerKind.processing_time, "1 minute"),
        ("500 milliseconds", TriggerKind.processing_time, "500 milliseconds"),
    ],
)
def test_triggers(tmp_path: Path, trigger: str, kind: TriggerKind, interval: str) -> None:
    p = load_text(VALID + f"mode: stream\ncheckpoint: cp\ntrigger: {trigger}\n", tmp_path / "p.yaml")
    assert p.trigger is not None and (p.trigger.kind, p.trigger.interval) == (kind, interval)


def test_path_sink_and_offsets_json(tmp_path: Path) -> None:
    p = load_text(
        VALID.replace("  console: true\n", "  path: out/x\n  format: csv\n  options: {header: true}\n")
        + "source:\n" * 0,
        tmp_path / "p.yaml",
    )
    assert p.sink == PathSink(path="out/x", format="csv", mode="append", options={"header": "true"})
    q = load_text(
        VALID.replace("  selector:", '  options: {endingOffsets: \'{"a/b": 10}\'}\n  selector:'), tmp_path / "q.yaml"
    )
    assert q.source.options == {"endingOffsets": '{"a/b": 10}'}


def test_python_transform_is_imported_from_beside_the_file(tmp_path: Path) -> None:
    (tmp_path / "my_transforms.py").write_text("def enrich(df):\n    return df\n")
    text = VALID + "transform:\n  python: my_transforms:enrich\n"
    assert load_text(text, tmp_path / "p.yaml").transform.python == "my_transforms:enrich"
    err = error_of(tmp_path, VALID + "transform:\n  python: my_transforms:missing\n")
    assert str(err).startswith(f"{tmp_path / 'p.yaml'}:7:11: transform.python: ")
    assert "has no function 'missing'" in str(err)
    err = error_of(tmp_path, VALID + "transform:\n  python: no_such_module_here:f\n")
    assert "cannot import module 'no_such_module_here'" in str(err)
    # Without imports (as `list` loads), only the form is checked.
    assert load_text(VALID + "transform:\n  python: nope:f\n", tmp_path / "p.yaml", check_imports=False)


# (YAML, line, column, field, words of the message)
ERRORS = [
    (VALID + "colour: red\n", 6, 1, "colour", "unknown field 'colour'"),
    (VALID.replace("sink:\n  console: true\n", "sink:\n  console: true\n  colour: red\n"), 6, 3, "sink.colour",
     "unknown field"),
    (VALID.replace("app.gazette.dev/message-type=Click", "a in (b"), 3, 13, "source.selector", "invalid selector"),
    (VALID.replace("app.gazette.dev/message-type=Click", "''"), 3, 13, "source.selector", "must not be empty"),
    ("name: x\nsource: {}\nsink: {console: true}\n", 2, 9, "source.selector", "missing required field 'selector'"),
    ("name: x\nsink: {console: true}\n", 1, 1, "source", "missing required field 'source'"),
    ("source: {selector: app=x}\nsink: {console: true}\n", 1, 1, "name", "missing required field 'name'"),
    (VALID.replace("name: clicks", "name: 'a b'"), 1, 7, "name", "invalid name"),
    ("name: x\nsource: {selector: app=x}\n", 1, 1, "sink", "missing required field 'sink'"),
    ("name: x\nsource: {selector: app=x}\nsink: {}\n", 3, 7, "sink", "exactly one of"),
    ("name: x\nsource: {selector: app=x}\nsink: {console: true, path: /x}\n", 3, 29, "sink.path", "exactly one of"),
    ("name: x\nsource: {selector: app=x}\nsink: {console: false}\n", 3, 17, "sink.console", "console: true"),
    ("name: x\nsource: {selector: app=x}\nsink: {console: true, format: csv}\n", 3, 31, "sink.format",
     "path sink only"),
    ("name: x\nsource: {selector: app=x}\nsink: {path: /x}\n", 3, 7, "sink.format", "missing required field"),
    ("name: x\nsource: {selector: app=x}\nsink: {path: /x, format: delta}\n", 3, 26, "sink.format",
     "invalid format 'delta'"),
    ("name: x\nsource: {selector: app=x}\nsink: {path: /x, format: csv, mode: upsert}\n", 3, 37, "sink.mode",
     "invalid mode 'upsert'"),
    ("name: x\nmode: stream\ncheckpoint: c\nsource: {selector: app=x}\n"
     "sink: {path: /x, format: csv, mode: overwrite}\n", 5, 37, "sink.mode", "must be append"),
    ("name: x\nsource: {selector: app=x}\nsink: {journals: {}}\n", 3, 18, "sink.journals", "journal"),
    ("name: x\nsource: {selector: app=x}\nsink: {journals: {selector: 'x in (y'}}\n", 3, 29,
     "sink.journals.selector", "invalid selector"),
    ("name: x\nsource: {selector: app=x}\nsink: {journals: {journal: a/b, key: k}}\n", 3, 38, "sink.journals.key",
     "not both"),
    ("name: x\nsource: {selector: app=x}\nsink: {journals: {selector: app=y, mapping: hash}}\n", 3, 45,
     "sink.journals.mapping", "invalid mapping 'hash'"),
    ("name: x\nsource: {selector: app=x}\nsink: {journals: {journal: a/b, options: {selector: app=y}}}\n", 3, 53,
     "sink.journals.options.selector", "sink.journals.selector"),
    ("name: x\nsource: {selector: app=x, options: {selector: app=y}}\nsink: {console: true}\n", 2, 47,
     "source.options.selector", "source.selector, not as an option"),
    ("name: x\nsource: {selector: app=x, options: {colour: red}}\nsink: {console: true}\n", 2, 37,
     "source.options.colour", "unknown field 'colour'"),
    ("name: x\nsource: {selector: app=x, options: {startingOffsets: soon}}\nsink: {console: true}\n", 2, 54,
     "source.options.startingOffsets", "expected earliest, latest"),
    ("name: x\nsource: {selector: app=x, options: {endingOffsets: {a/b: x}}}\nsink: {console: true}\n", 2, 52,
     "source.options.endingOffsets", "must be an integer"),
    ("name: x\nsource: {selector: app=x, options: {failOnDataLoss: maybe}}\nsink: {console: true}\n", 2, 53,
     "source.options.failOnDataLoss", "true or false"),
    ("name: x\nsource: {selector: app=x, options: {maxBytesPerTrigger: -1}}\nsink: {console: true}\n", 2, 57,
     "source.options.maxBytesPerTrigger", "positive integer"),
    ("name: x\nsource: {selector: app=x, view: 'my view'}\nsink: {console: true}\n", 2, 33, "source.view",
     "invalid view name"),
    (VALID + "transform: {sql: SELECT 1, python: m:f}\n", 6, 36, "transform.python", "not both"),
    (VALID + "transform: {}\n", 6, 12, "transform", "one of transform.sql or transform.python"),
    (VALID + "transform: {sql: ''}\n", 6, 18, "transform.sql", "must not be empty"),
    (VALID + "transform: {python: not-a-ref}\n", 6, 21, "transform.python", "module:function"),
    (VALID + "transform: {sql: x, scala: y}\n", 6, 21, "transform.scala", "unknown field"),
    (VALID + "mode: streaming\n", 6, 7, "mode", "invalid mode 'streaming' (expected batch or stream)"),
    (VALID + "mode: stream\n", 1, 1, "checkpoint", "missing required field 'checkpoint'"),
    (VALID + "mode: stream\ncheckpoint: ''\n", 7, 13, "checkpoint", "must not be empty"),
    (VALID + "checkpoint: cp\n", 6, 13, "checkpoint", "mode: stream only"),
    (VALID + "trigger: availableNow\n", 6, 10, "trigger", "mode: stream only"),
    (VALID + "mode: stream\ncheckpoint: c\ntrigger: sometimes\n", 8, 10, "trigger", "invalid trigger 'sometimes'"),
    (VALID + "mode: stream\ncheckpoint: c\ntrigger: {processingTime: 1 minute, availableNow: true}\n", 8, 10,
     "trigger", "one of trigger.processingTime"),
    ("- a\n- b\n", 1, 1, "", "expected a mapping"),
    ("name: [x\n", 2, 1, "", "invalid YAML"),
    ("", 1, 1, "", "empty pipeline file"),
]


@pytest.mark.parametrize(("text", "line", "column", "field", "words"), ERRORS)
def test_errors_name_file_line_and_field(
    tmp_path: Path, text: str, line: int, column: int, field: str, words: str
) -> None:
    err = error_of(tmp_path, text)
    prefix = f"{tmp_path / 'p.yaml'}:{line}:{column}: " + (f"{field}: " if field else "")
    assert str(err).startswith(prefix), str(err)
    assert words in str(err)
    assert err.field == field


def test_examples_are_valid() -> None:
    loaded = load_dir(EXAMPLES)
    assert loaded.errors == []
    by_name = {p.name: p for p in loaded.pipelines}
    assert set(by_name) == {"clicks-by-region", "clicks-enriched"}
    batch, stream = by_name["clicks-by-region"], by_name["clicks-enriched"]
    assert batch.mode is Mode.batch and isinstance(batch.sink, PathSink) and batch.sink.format == "parquet"
    assert "labels['app.gazette.dev/region'][0]" in batch.transform.sql
    assert stream.mode is Mode.stream and stream.checkpoint
    assert stream.trigger is not None and stream.trigger.kind is TriggerKind.available_now
    assert isinstance(stream.sink, JournalsSink) and stream.sink.journal == "examples/clicks-enriched"


def test_load_dir_collects_errors_and_duplicates(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", VALID)
    (tmp_path / "nested").mkdir()
    write(tmp_path / "nested", "b.yml", VALID)
    write(tmp_path, "c.yaml", VALID.replace("clicks", "other").replace("console: true", "console: 1"))
    write(tmp_path, "notes.txt", "not a pipeline")
    loaded = load_dir(tmp_path)
    assert [p.name for p in loaded.pipelines] == ["clicks"]
    messages = sorted(str(e) for e in loaded.errors)
    assert messages[0].startswith(f"{tmp_path / 'c.yaml'}:5:12: sink.console: ")
    assert messages[1].startswith(f"{tmp_path / 'nested' / 'b.yml'}:1:1: name: duplicate pipeline name 'clicks'")


def test_find(tmp_path: Path) -> None:
    good = write(tmp_path, "good.yaml", VALID)
    write(tmp_path, "bad.yaml", "name: broken\nsource: {selector: app=x}\n")
    assert find(tmp_path, "clicks").file == good
    assert find(tmp_path, str(good)).name == "clicks"
    with pytest.raises(SpecError, match=r"bad.yaml:1:1: sink: missing required field"):
        find(tmp_path, "broken")  # The invalid file that declares it: its own error, not "not found".
    with pytest.raises(PipelineNotFound, match=r"no pipeline named 'nope' .*\(there: clicks\)"):
        find(tmp_path, "nope")
    with pytest.raises(PipelineDirError, match="does not exist"):
        load_dir(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PipelineDirError, match="no pipeline files"):
        load_dir(tmp_path / "empty")


def test_run_flags_checked_before_spark(tmp_path: Path) -> None:
    batch = load_text(VALID, tmp_path / "p.yaml")
    stream = load_text(VALID + "mode: stream\ncheckpoint: c\n", tmp_path / "s.yaml")
    check_run_flags(batch, once=True, stream=False)  # A batch job runs once anyway.
    check_run_flags(stream, once=False, stream=True)
    with pytest.raises(PipelineRunError, match="not both"):
        check_run_flags(stream, once=True, stream=True)
    with pytest.raises(PipelineRunError, match="is mode: batch; --stream needs mode: stream"):
        check_run_flags(batch, once=False, stream=True)


def test_load_file_unreadable(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_file(tmp_path / "missing.yaml")


# gazctl pipelines list|validate|run, as a user runs them.


def test_gazctl_list_examples() -> None:
    out = run_gazctl(None, "pipelines", "list", "--dir", str(EXAMPLES))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [c.strip() for c in lines[1].strip("|").split("|")] == ["Name", "Mode", "Source", "Transform", "Sink"]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")] for line in lines[3:-1]}
    assert rows["clicks-by-region"] == [
        "clicks-by-region", "batch", "app.gazette.dev/message-type=Click", "sql",
        "parquet out/clicks-by-region (overwrite)",
    ]
    assert rows["clicks-enriched"] == [
        "clicks-enriched", "stream (availableNow)", "app.gazette.dev/message-type=Click", "sql",
        "journal examples/clicks-enriched",
    ]


def test_gazctl_validate_exit_codes(tmp_path: Path) -> None:
    ok = run_gazctl(None, "pipelines", "validate", "--dir", str(EXAMPLES))
    assert ok.returncode == 0, ok.stderr
    assert "pipeline 'clicks-by-region' is valid" in ok.stdout
    assert "pipeline 'clicks-enriched' is valid" in ok.stdout

    write(tmp_path, "good.yaml", VALID)
    bad = write(tmp_path, "bad.yaml", VALID.replace("clicks", "bad").replace("selector: app", "selector: a in (b"))
    out = run_gazctl(None, "pipelines", "validate", "--dir", str(tmp_path))
    assert out.returncode == 1
    assert f"error: {bad}:3:13: source.selector: invalid selector" in out.stderr
    assert "pipeline 'clicks' is valid" in out.stdout

    one = run_gazctl(None, "pipelines", "validate", "clicks", "--dir", str(tmp_path))
    assert one.returncode == 0, one.stderr
    named_bad = run_gazctl(None, "pipelines", "validate", "bad", "--dir", str(tmp_path))
    assert named_bad.returncode == 1 and f"{bad}:3:13: source.selector" in named_bad.stderr

    listed = run_gazctl(None, "pipelines", "list", "--dir", str(tmp_path))
    assert listed.returncode == 1 and "clicks" in listed.stdout and "bad.yaml:3:13" in listed.stderr


def test_gazctl_default_dir_and_run_errors_before_spark(tmp_path: Path) -> None:
    out = run_gazctl(None, "pipelines", "list", cwd=tmp_path)
    assert out.returncode == 1
    assert "error: pipeline directory 'pipelines' does not exist (pass --dir DIR)" in out.stderr

    (tmp_path / "pipelines").mkdir()
    write(tmp_path / "pipelines", "p.yaml", VALID + "colour: red\n")
    out = run_gazctl(None, "pipelines", "run", "clicks", cwd=tmp_path)
    assert out.returncode == 1
    assert out.stderr == "error: pipelines/p.yaml:6:1: colour: unknown field 'colour' (expected one of name," \
        " description, mode, trigger, checkpoint, source, transform, sink)\n"

    write(tmp_path / "pipelines", "p.yaml", VALID)
    out = run_gazctl(None, "pipelines", "run", "clicks", "--stream", cwd=tmp_path)
    assert out.returncode == 1 and "--stream needs mode: stream" in out.stderr
    out = run_gazctl(None, "pipelines", "run", "nope", cwd=tmp_path)
    assert out.returncode == 1 and "no pipeline named 'nope'" in out.stderr


def test_source_options_checked_as_the_gazette_source_does(tmp_path: Path) -> None:
    err = error_of(
        tmp_path,
        "name: x\nmode: stream\ncheckpoint: c\nsource:\n  selector: app=x\n  options:\n    endingOffsets: latest\n"
        "sink: {console: true}\n",
    )
    assert str(err).startswith(f"{tmp_path / 'p.yaml'}:7:20: source.options.endingOffsets: invalid option: ")
    assert "not supported by streaming reads" in str(err)


_WORKER_TRACEBACK = """\
Traceback (most recent call last):
  File "/spark/python/pyspark/worker.py", line 1955, in func
    yield from map(wrap, verified_iter)
  File "/spark/python/pyspark/sql/worker/plan_data_source_read.py", line 107, in records_to_arrow_batches
    raise PySparkRuntimeError(
pyspark.errors.exceptions.base.PySparkRuntimeError: [DATA_SOURCE_RETURN_SCHEMA_MISMATCH] Expected: journal: string
offset: int64 not null
  child 0, item: string columns.
SQLSTATE: 42K0G"""


@pytest.mark.parametrize(
    "spark_message",
    [
        # PySpark 4.0: the traceback starts on the header's line.
        "An error occurred while calling o53.save.\n: An exception was thrown from the Python worker: "
        + _WORKER_TRACEBACK,
        # PySpark 4.3: the traceback starts on the line after it.
        "An exception was thrown from the Python worker:\n" + _WORKER_TRACEBACK,
    ],
)
def test_spark_errors_shown_as_their_python_exception_line(spark_message: str) -> None:
    assert first_line(spark_message) == (
        "An exception was thrown from the Python worker: pyspark.errors.exceptions.base.PySparkRuntimeError: "
        "[DATA_SOURCE_RETURN_SCHEMA_MISMATCH] Expected: journal: string"
    )
