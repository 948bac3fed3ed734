"""Errors of the fragment package, each naming the journal (and offset or path) concerned."""

from __future__ import annotations

from broker.errors import GazetteError


class FragmentError(GazetteError):
    """Base of this package's errors; str() is the message, `journal` and `offset` say where."""

    def __init__(self, message: str, *, journal: str = "", offset: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.journal = journal
        self.offset = offset


class FragmentNameError(FragmentError):
    """A fragment file name or path that does not parse as a Fragment (Gazette's error texts)."""

    def __init__(self, message: str, *, journal: str = "", path: str = "") -> None:
        super().__init__(message, journal=journal)
        self.path = path


class UnknownCodecError(FragmentError):
    """A compression codec value that has no file extension (INVALID or undefined)."""

    def __init__(self, codec: int, *, journal: str = "") -> None:
        super().__init__(f"invalid CompressionCodec ({codec})", journal=journal)
        self.codec = codec


class ContentDeltaError(FragmentError):
    """Replicated content whose content_delta does not continue the spool's uncommitted bytes."""

    def __init__(self, got: int, expected: int, *, journal: str = "", offset: int | None = None) -> None:
        super().__init__(f"invalid ContentDelta ({got}; expected {expected})", journal=journal, offset=offset)
        self.got = got
        self.expected = expected


class SpoolIOError(FragmentError):
    """A failed read or write of a spool file."""
