"""Decoding and validating pipeline files: strict YAML, every error naming file:line:column and field.

Everything here runs before Spark starts: a pipeline which loads is one Spark can be asked to run.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.protocol.selectors import parse_selector
from broker.specs import SpecError, strict
from broker.specs.strict import At
from pipelines.definitions.errors import PipelineDirError, PipelineNotFound, PipelineRunError
from pipelines.definitions.model import (
    ConsoleSink,
    JournalsSink,
    Mode,
    PathSink,
    Pipeline,
    Sink,
    Source,
    Transform,
    Trigger,
    TriggerKind,
)
from pipelines.source.options import GazetteOptionError, parse_options

SUFFIXES = (".yaml", ".yml")
"""Pipeline files in a pipeline directory (searched recursively)."""

SDP_SPECS = ("spark-pipeline.yml", "spark-pipeline.yaml")
"""The spec files of Spark Declarative Pipelines projects (`spark-pipelines run`): not pipeline files.
gazctl does not run them (spark-pipelines does all a wrapper could), and says so when given one."""

READER_OPTIONS = (
    "broker",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "framing",
    "failOnDataLoss",
    "maxBytesPerTrigger",
    "isolation",
    "parse",
    "fileRoot",
    "signatureTTL",
)
"""Options of format `gazette` as a source; `selector` has its own field, `source.selector`."""

WRITER_OPTIONS = ("broker", "framing", "batchBytes")
"""Options of format `gazette` as a sink besides those with their own field (selector, mapping)."""

MAPPINGS = ("modulo", "rendezvous")
"""How the writer maps a partition key onto the journals its selector matches."""

FILE_FORMATS = ("parquet", "json", "csv", "orc", "text")
"""File formats Spark ships (Delta and Avro need extra packages)."""

FILE_MODES = ("append", "overwrite")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_VIEW = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PYTHON_REF = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*):([A-Za-z_][A-Za-z0-9_]*)")
# Spark's interval syntax, with the unit names it documents (`10 seconds`, `1 minute`).
_INTERVAL = re.compile(r"[1-9]\d* (?:milliseconds?|seconds?|minutes?|hours?|days?)", re.IGNORECASE)

_TOP = ("name", "description", "mode", "trigger", "checkpoint", "source", "transform", "sink")
_SOURCE = ("selector", "options", "view")
_TRANSFORM = ("sql", "python")
_SINK = ("journals", "path", "format", "mode", "options", "console")
_JOURNALS = ("selector", "mapping", "key", "journal", "options")


@dataclass
class Loaded:
    """The pipelines of a directory which loaded, and the errors of those which did not."""

    pipelines: list[Pipeline] = field(default_factory=list)
    errors: list[SpecError] = field(default_factory=list)


def load_file(path: Path, *, check_imports: bool = True) -> Pipeline:
    """Decode and validate one pipeline file; with `check_imports`, also import its Python transform."""
    file = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(f"cannot read: {err}", file=file, line=1, column=1) from None
    return load_text(text, path, check_imports=check_imports)


def load_text(text: str, path: Path, *, check_imports: bool = True) -> Pipeline:
    """Decode and validate pipeline YAML `text` as if read from `path`."""
    doc, at = strict.load(text, str(path))
    if doc is None:
        raise at.error("empty pipeline file (expected a mapping with fields name, source, sink)")
    fields = strict.mapping(doc, at, _TOP)
    name = _required_string(fields, "name", at)
    if not _NAME.fullmatch(name):
        raise fields["name"][1].error(
            f"invalid name {name!r} (letters, digits, '.', '_' and '-', starting with a letter or digit)"
        )
    mode = _mode(fields)
    source = _source(fields, at, mode)
    transform = _transform(fields, path, check_imports)
    sink = _sink(fields, at, mode)
    trigger, checkpoint = _streaming(fields, at, mode)
    description = strict.string(*fields["description"]) if "description" in fields else ""
    return Pipeline(
        name=name,
        file=path,
        source=source,
        sink=sink,
        transform=transform,
        description=description.strip(),
        mode=mode,
        trigger=trigger,
        checkpoint=checkpoint,
    )


def pipeline_files(directory: Path) -> list[Path]:
    """The pipeline files under `directory`, sorted; PipelineDirError if it is missing or has none."""
    if not directory.is_dir():
        raise PipelineDirError(f"pipeline directory {str(directory)!r} does not exist (pass --dir DIR)")
    files = sorted(
        p for p in directory.rglob("*") if p.suffix in SUFFIXES and p.name not in SDP_SPECS and p.is_file()
    )
    if not files:
        spec = sdp_spec(directory)
        if spec is not None:
            raise PipelineDirError(_not_ours(directory, spec))
        raise PipelineDirError(f"no pipeline files (*.yaml, *.yml) under {str(directory)!r} (pass --dir DIR)")
    return files


def sdp_spec(path: Path) -> Path | None:
    """The Spark Declarative Pipelines spec `path` is, or that the directory `path` holds; else None."""
    if path.name in SDP_SPECS and path.is_file():
        return path
    if path.is_dir():
        return next((path / name for name in SDP_SPECS if (path / name).is_file()), None)
    return None


def _not_ours(path: Path, spec: Path) -> str:
    return (
        f"{str(path)!r} is a Spark Declarative Pipelines project, not a gazctl pipeline: run it with"
        f" `spark-pipelines run --spec {spec}` (PySpark 4.1+; see docs/pipeline-definitions.md)"
    )


def load_dir(directory: Path, *, check_imports: bool = True) -> Loaded:
    """Load every pipeline file under `directory`, collecting errors (a duplicated name is one)."""
    out = Loaded()
    seen: dict[str, Pipeline] = {}
    for path in pipeline_files(directory):
        try:
            pipeline = load_file(path, check_imports=check_imports)
        except SpecError as err:
            out.errors.append(err)
            continue
        if pipeline.name in seen:
            out.errors.append(
                SpecError(
                    f"duplicate pipeline name {pipeline.name!r} (also in {seen[pipeline.name].file})",
                    file=str(path), line=1, column=1, field="name",
                )
            )
            continue
        seen[pipeline.name] = pipeline
        out.pipelines.append(pipeline)
    return out


def find(directory: Path, name: str, *, check_imports: bool = True) -> Pipeline:
    """The pipeline called `name` under `directory`, or the file `name` if it is a path to a YAML file.

    Only the file defining `name` must be valid; PipelineNotFound names the pipelines there are, or
    says how to run `name` if it is a Spark Declarative Pipelines project or spec.
    """
    as_path = Path(name)
    spec = sdp_spec(as_path)
    if spec is not None:
        raise PipelineNotFound(_not_ours(as_path, spec))
    if as_path.suffix in SUFFIXES and as_path.is_file():
        return load_file(as_path, check_imports=check_imports)
    loaded = load_dir(directory, check_imports=False)
    for pipeline in loaded.pipelines:
        if pipeline.name == name:
            return load_file(pipeline.file, check_imports=check_imports)
    for err in loaded.errors:
        if _declares(err, name):
            raise err
    names = ", ".join(sorted(p.name for p in loaded.pipelines)) or "none valid"
    raise PipelineNotFound(f"no pipeline named {name!r} under {str(directory)!r} (there: {names})")


def check_run_flags(pipeline: Pipeline, *, once: bool, stream: bool) -> None:
    """Refuse `--once` with `--stream`, and `--stream` for a batch pipeline (before Spark starts)."""
    if once and stream:
        raise PipelineRunError("give one of --once or --stream, not both")
    if stream and pipeline.mode is Mode.batch:
        raise PipelineRunError(
            f"{pipeline.file}: pipeline {pipeline.name!r} is mode: batch; --stream needs mode: stream"
        )


def resolve_python(ref: str, search: Path) -> Callable[..., Any]:
    """Import `module:function`, looking in `search` (the pipeline file's directory) first."""
    match = _PYTHON_REF.fullmatch(ref)
    if match is None:
        raise ValueError(f"expected module:function, e.g. transforms.clicks:enrich; got {ref!r}")
    module_name, function_name = match.groups()
    # A pipeline repository keeps its transforms beside its YAML files, as a user would expect to import them.
    entry = str(search.resolve())
    if entry not in sys.path:
        sys.path.insert(0, entry)
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # Any error of the user's module: report it, not a traceback.
        raise ValueError(f"cannot import module {module_name!r}: {type(err).__name__}: {err}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ValueError(f"module {module_name!r} has no function {function_name!r}")
    return function


def _declares(err: SpecError, name: str) -> bool:
    """Whether the invalid file of `err` has `name: NAME` (so running NAME should show its error)."""
    try:
        text = Path(err.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return re.search(rf"^name:\s*['\"]?{re.escape(name)}['\"]?\s*(#.*)?$", text, re.MULTILINE) is not None


def _required(fields: Mapping[str, tuple[Any, At]], key: str, parent: At) -> tuple[Any, At]:
    if key not in fields or fields[key][0] is None:
        raise parent.child(key, None).error(f"missing required field {key!r}")
    return fields[key]


def _required_string(fields: Mapping[str, tuple[Any, At]], key: str, parent: At) -> str:
    value, at = _required(fields, key, parent)
    text = strict.string(value, at).strip()
    if not text:
        raise at.error(f"{key!r} must not be empty")
    return text


def _selector(value: Any, at: At) -> str:
    text = strict.string(value, at).strip()
    if not text:
        raise at.error("selector must not be empty (e.g. app.gazette.dev/message-type=Click)")
    try:
        parse_selector(text)
    except ValueError as err:
        raise at.error(f"invalid selector {text!r}: {err}") from None
    return text


def _source(fields: Mapping[str, tuple[Any, At]], at: At, mode: Mode) -> Source:
    value, source_at = _required(fields, "source", at)
    source = strict.mapping(value, source_at, _SOURCE)
    selector = _selector(*_required(source, "selector", source_at))
    options = _reader_options(*source["options"]) if "options" in source else {}
    _check_with_source(selector, options, source, source_at, mode)
    view = "source"
    if "view" in source:
        view = strict.string(*source["view"]).strip()
        if not _VIEW.fullmatch(view):
            raise source["view"][1].error(f"invalid view name {view!r} (a SQL identifier such as clicks)")
    return Source(selector=selector, options=options, view=view)


def _check_with_source(
    selector: str, options: dict[str, str], source: Mapping[str, tuple[Any, At]], at: At, mode: Mode
) -> None:
    """Validate the options as the `gazette` source will (e.g. no endingOffsets for a stream), now."""
    try:
        parse_options({**options, "selector": selector}, streaming=mode is Mode.stream)
    except GazetteOptionError as err:
        # Its messages start with the option's name, as users spell it.
        name = str(err).split(":", 1)[0]
        where = at.child("options", None)
        if "options" in source and isinstance(source["options"][0], Mapping):
            where = source["options"][1]
            for key in source["options"][0]:
                if str(key).lower() == name.lower():
                    where = where.child(str(key), _lookup_value(source["options"][0], key))
        raise where.error(f"invalid option: {err}") from None


def _lookup_value(value: Any, key: Any) -> tuple[int, int] | None:
    try:
        line, column = value.lc.value(key)
    except (AttributeError, KeyError, TypeError):
        return None
    return int(line), int(column)


def _reader_options(value: Any, at: At) -> dict[str, str]:
    if value is None:
        return {}
    out: dict[str, str] = {}
    for key, (item, item_at) in _options_mapping(value, at, READER_OPTIONS, "source.selector").items():
        if key in ("startingOffsets", "endingOffsets"):
            out[key] = _offsets(item, item_at)
        elif key == "failOnDataLoss":
            out[key] = _flag(item, item_at)
        elif key == "maxBytesPerTrigger":
            out[key] = _positive(item, item_at)
        else:
            out[key] = _scalar(item, item_at)
    return out


def _options_mapping(value: Any, at: At, known: Iterable[str], moved: str) -> dict[str, tuple[Any, At]]:
    """Decode an options mapping; `selector` there is pointed at its own field (`moved`)."""
    known = tuple(known)
    if isinstance(value, Mapping) and "selector" in value:
        decoded = strict.mapping(value, at, (*known, "selector"))
        raise decoded["selector"][1].error(f"set the selector as {moved}, not as an option")
    return strict.mapping(value, at, known)


def _scalar(value: Any, at: At) -> str:
    """An option value: a string, an integer or a boolean, as Spark takes options (strings)."""
    if isinstance(value, float) and not isinstance(value, bool):
        return repr(float(value))
    text = strict.string(value, at)
    if not text:
        raise at.error("option value must not be empty")
    return text


def _flag(value: Any, at: At) -> str:
    text = strict.string(value, at).lower()
    if text not in ("true", "false"):
        raise at.error(f"expected true or false; got {text!r}")
    return text


def _positive(value: Any, at: At) -> str:
    text = strict.string(value, at)
    if not text.isdigit() or int(text) <= 0:
        raise at.error(f"expected a positive integer (bytes); got {text!r}")
    return text


def _offsets(value: Any, at: At) -> str:
    """`earliest`, `latest`, or journal -> offset given as a YAML mapping or as JSON text."""
    if isinstance(value, Mapping):
        parsed: Any = {str(k): v for k, v in value.items()}
    else:
        text = strict.string(value, at).strip()
        if text in ("earliest", "latest"):
            return text
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            raise at.error(f"expected earliest, latest or a JSON object of journal -> offset; got {text!r}") from None
    if not isinstance(parsed, dict) or not parsed:
        raise at.error("expected earliest, latest or a non-empty mapping of journal -> offset")
    for journal, offset in parsed.items():
        # -2 and -1 are Kafka's earliest and latest; a journal's own offset is never negative.
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < -2:
            raise at.error(f"offset of journal {journal!r} must be an integer >= -2; got {offset!r}")
    return json.dumps({k: int(v) for k, v in parsed.items()}, sort_keys=True)


def _transform(fields: Mapping[str, tuple[Any, At]], path: Path, check_imports: bool) -> Transform:
    if "transform" not in fields or fields["transform"][0] is None:
        return Transform()
    value, at = fields["transform"]
    transform = strict.mapping(value, at, _TRANSFORM)
    if "sql" in transform and "python" in transform:
        raise transform["python"][1].error("give one of transform.sql or transform.python, not both")
    if "sql" in transform:
        sql, sql_at = transform["sql"]
        text = strict.string(sql, sql_at).strip()
        if not text:
            raise sql_at.error("SQL must not be empty")
        return Transform(sql=text, at=sql_at)
    if "python" in transform:
        ref, ref_at = transform["python"]
        text = strict.string(ref, ref_at).strip()
        if not _PYTHON_REF.fullmatch(text):
            raise ref_at.error(f"expected module:function, e.g. transforms.clicks:enrich; got {text!r}")
        if check_imports:
            try:
                resolve_python(text, path.parent)
            except ValueError as err:
                raise ref_at.error(str(err)) from None
        return Transform(python=text, at=ref_at)
    raise at.error("expected one of transform.sql or transform.python (omit transform for identity)")


def _mode(fields: Mapping[str, tuple[Any, At]]) -> Mode:
    if "mode" not in fields or fields["mode"][0] is None:
        return Mode.batch
    value, at = fields["mode"]
    text = strict.string(value, at)
    try:
        return Mode(text)
    except ValueError:
        raise at.error(f"invalid mode {text!r} (expected batch or stream)") from None


def _sink(fields: Mapping[str, tuple[Any, At]], at: At, mode: Mode) -> Sink:
    if "sink" not in fields or fields["sink"][0] is None:
        raise at.child("sink", None).error(
            "missing required field 'sink' (journals: {...}, path: + format:, or console: true)"
        )
    value, sink_at = fields["sink"]
    sink = strict.mapping(value, sink_at, _SINK)
    kinds = [k for k in sink if k in ("journals", "path", "console")]  # In file order: point at the second.
    if len(kinds) != 1:
        where = sink[kinds[1]][1] if len(kinds) > 1 else sink_at
        given = " and ".join(f"sink.{k}" for k in kinds)
        raise where.error(
            f"give exactly one of sink.journals, sink.path or sink.console; got {given or 'none'}"
        )
    kind = kinds[0]
    if kind != "path":
        for key in ("format", "mode", "options"):
            if key in sink:
                raise sink[key][1].error(f"sink.{key} applies to a path sink only (with sink.path)")
    if kind == "console":
        if strict.boolean(*sink["console"]) is not True:
            raise sink["console"][1].error("expected console: true")
        return ConsoleSink()
    if kind == "journals":
        return _journals_sink(*sink["journals"])
    return _path_sink(sink, sink_at, mode)


def _journals_sink(value: Any, at: At) -> JournalsSink:
    fields = strict.mapping(value, at, _JOURNALS)
    journal = strict.string(*fields["journal"]).strip() if "journal" in fields else ""
    if "journal" in fields and not journal:
        raise fields["journal"][1].error("journal must not be empty")
    for key in ("selector", "mapping", "key"):
        if journal and key in fields:
            raise fields[key][1].error(f"give sink.journals.journal (a fixed journal) or {key}, not both")
    selector = _selector(*fields["selector"]) if "selector" in fields else ""
    if not journal and not selector:
        raise at.error("expected sink.journals.journal (a fixed journal) or sink.journals.selector")
    mapping = ""
    if "mapping" in fields:
        mapping = strict.string(*fields["mapping"])
        if mapping not in MAPPINGS:
            raise fields["mapping"][1].error(f"invalid mapping {mapping!r} (expected one of {', '.join(MAPPINGS)})")
    key = strict.string(*fields["key"]).strip() if "key" in fields else ""
    if "key" in fields and not key:
        raise fields["key"][1].error("key must not be empty (a column or SQL expression)")
    options: dict[str, str] = {}
    if "options" in fields and fields["options"][0] is not None:
        decoded = _options_mapping(*fields["options"], WRITER_OPTIONS, "sink.journals.selector")
        options = {k: _scalar(v, v_at) for k, (v, v_at) in decoded.items()}
    return JournalsSink(selector=selector, mapping=mapping, key=key, journal=journal, options=options)


def _path_sink(sink: Mapping[str, tuple[Any, At]], at: At, mode: Mode) -> PathSink:
    path = strict.string(*sink["path"]).strip()
    if not path:
        raise sink["path"][1].error("path must not be empty")
    fmt = _required_string(sink, "format", at)
    if fmt not in FILE_FORMATS:
        raise sink["format"][1].error(f"invalid format {fmt!r} (expected one of {', '.join(FILE_FORMATS)})")
    write_mode = "append"
    if "mode" in sink:
        write_mode = strict.string(*sink["mode"])
        if write_mode not in FILE_MODES:
            raise sink["mode"][1].error(f"invalid mode {write_mode!r} (expected one of {', '.join(FILE_MODES)})")
        if mode is Mode.stream and write_mode != "append":
            raise sink["mode"][1].error("a stream appends files; sink.mode must be append (or omitted)")
    options: dict[str, str] = {}
    if "options" in sink and sink["options"][0] is not None:
        options_value, options_at = sink["options"]
        if not isinstance(options_value, Mapping):
            raise options_at.error("expected a mapping of Spark writer options")
        options = {
            str(k): _scalar(v, options_at.child(str(k), None)) for k, v in options_value.items()
        }
    return PathSink(path=path, format=fmt, mode=write_mode, options=options)


def _streaming(fields: Mapping[str, tuple[Any, At]], at: At, mode: Mode) -> tuple[Trigger | None, str]:
    if mode is Mode.batch:
        for key in ("trigger", "checkpoint"):
            if key in fields:
                raise fields[key][1].error(f"{key} applies to mode: stream only")
        return None, ""
    if "checkpoint" not in fields or fields["checkpoint"][0] is None:
        raise at.child("checkpoint", None).error(
            "missing required field 'checkpoint' (a stream's Spark checkpoint location, e.g. checkpoints/NAME)"
        )
    checkpoint = strict.string(*fields["checkpoint"]).strip()
    if not checkpoint:
        raise fields["checkpoint"][1].error("checkpoint must not be empty")
    trigger = _trigger(*fields["trigger"]) if "trigger" in fields and fields["trigger"][0] is not None else None
    return trigger, checkpoint


def _trigger(value: Any, at: At) -> Trigger:
    """`availableNow`, an interval such as `10 seconds`, or `processingTime: 10 seconds`."""
    if isinstance(value, Mapping):
        fields = strict.mapping(value, at, ("processingTime", "availableNow"))
        if len(fields) != 1:
            raise at.error("expected one of trigger.processingTime or trigger.availableNow")
        if "availableNow" in fields:
            if strict.boolean(*fields["availableNow"]) is not True:
                raise fields["availableNow"][1].error("expected availableNow: true")
            return Trigger(TriggerKind.available_now)
        value, at = fields["processingTime"]
    text = strict.string(value, at).strip()
    if text == TriggerKind.available_now.value:
        return Trigger(TriggerKind.available_now)
    if _INTERVAL.fullmatch(text):
        return Trigger(TriggerKind.processing_time, text)
    raise at.error(f"invalid trigger {text!r} (expected availableNow or an interval such as '10 seconds')")
