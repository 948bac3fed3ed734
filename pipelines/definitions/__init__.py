"""Pipeline definitions: YAML files naming a source (journals by label), a transform and a sink.

- model: the decoded pipeline (dataclasses)
- load: strict decoding and validation, before Spark starts (errors name file:line:column and field)
- run: running a pipeline on a SparkSession (imports PySpark; load does not)
- errors: the errors gazctl reports as one line
"""

from pipelines.definitions.errors import DefinitionError, PipelineDirError, PipelineNotFound, PipelineRunError
from pipelines.definitions.load import Loaded, find, load_dir, load_file, load_text, pipeline_files
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

__all__ = [
    "ConsoleSink",
    "DefinitionError",
    "JournalsSink",
    "Loaded",
    "Mode",
    "PathSink",
    "Pipeline",
    "PipelineDirError",
    "PipelineNotFound",
    "PipelineRunError",
    "Sink",
    "Source",
    "Transform",
    "Trigger",
    "TriggerKind",
    "find",
    "load_dir",
    "load_file",
    "load_text",
    "pipeline_files",
]
