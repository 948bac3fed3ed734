"""Errors of pipeline definitions and runs; gazctl reports each as one line."""

from __future__ import annotations

from broker.specs import SpecError
from pipelines.errors import SparkPipelineError

DefinitionError = SpecError
"""A pipeline file which does not decode or validate: `file:line:column: field: message`."""


class PipelineNotFound(SparkPipelineError):
    """No pipeline of the asked name in the pipeline directory."""


class PipelineDirError(SparkPipelineError):
    """A pipeline directory which is missing or holds no pipeline files."""


class PipelineRunError(SparkPipelineError):
    """Spark failed to run a pipeline (an analysis error in its SQL, a failed job or streaming query)."""
