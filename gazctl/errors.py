"""Errors which gazctl reports to the user as one line on stderr with a non-zero exit status."""

from __future__ import annotations


class GazctlError(Exception):
    """A failure to report without a traceback; str() is the complete message."""


class SpecError(GazctlError, ValueError):
    """A spec file which does not decode or validate, naming the file, line, column and field."""

    def __init__(self, message: str, *, file: str, line: int, column: int, field: str = "") -> None:
        self.message = message
        self.file = file
        self.line = line
        self.column = column
        self.field = field
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}"
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"


class ConfigError(GazctlError):
    """A configuration value (flag, environment variable or INI file) which cannot be used."""


class BrokerError(GazctlError):
    """A broker reply with a non-OK status, or a failed RPC."""
