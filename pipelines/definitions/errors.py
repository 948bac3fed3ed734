"""Errors of pipeline definitions and runs; each is a GazctlError, so gazctl reports it as one line."""

from __future__ import annotations

from gazctl.errors import GazctlError, SpecError

DefinitionError = SpecError
"""A pipeline file which does not decode or validate: `file:line:column: field: message`."""


class PipelineNotFound(GazctlError):
    """No pipeline of the asked name in the pipeline directory."""


class PipelineDirError(GazctlError):
    """A pipeline directory which is missing or holds no pipeline files."""


class PipelineRunError(GazctlError):
    """Spark failed to run a pipeline (an analysis error in its SQL, a failed job or streaming query)."""
