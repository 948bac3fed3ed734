"""The root of the pipelines package's errors (see `broker.errors` for the whole tree)."""

from __future__ import annotations

from broker.errors import GazetteError


class SparkPipelineError(GazetteError):
    """Base of the errors of the `gazette` Spark source and sink and of pipeline definitions and runs."""
