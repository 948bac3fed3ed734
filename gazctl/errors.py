"""gazctl's own errors: what a command cannot do. gazctl reports every GazetteError (these, and
those of the packages it drives) as one line on stderr with a non-zero exit status."""

from __future__ import annotations

from broker.errors import GazetteError


class GazctlError(GazetteError):
    """A failure to report without a traceback; str() is the complete message."""
