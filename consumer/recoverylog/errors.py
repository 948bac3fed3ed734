"""The recovery log's errors, `RecoveryLogError` and its subclasses (drawn in the whole tree of
`broker/errors.py`). Each keeps Gazette's wording in `reason`; `str()` is the reason followed by
the context known (log, offset, seq_no, author).
"""

from __future__ import annotations

from broker.errors import GazetteError


class RecoveryLogError(GazetteError):
    """Base of every error raised by `consumer.recoverylog`."""

    def __init__(
        self,
        reason: str,
        *,
        log: str | None = None,
        offset: int | None = None,
        seq_no: int | None = None,
        author: int | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.log = log
        self.offset = offset
        self.seq_no = seq_no
        self.author = author

    def __str__(self) -> str:
        context = []
        if self.log:
            context.append(f"log {self.log}")
        if self.offset is not None:
            context.append(f"offset {self.offset}")
        if self.seq_no is not None:
            context.append(f"seq_no {self.seq_no}")
        if self.author is not None:
            context.append(f"author {self.author:#x}")
        return f"{self.reason} ({', '.join(context)})" if context else self.reason


class SegmentError(RecoveryLogError, ValueError):
    """A Segment is invalid, or adding it would make a SegmentSet inconsistent."""


class HintsError(RecoveryLogError, ValueError):
    """FSMHints are unusable (no log, inconsistent segments), or could not be fetched or stored."""


class FSMError(RecoveryLogError):
    """An op the FSM did not apply. Only FnodeNotTrackedError comes with a transition."""


class NotHintedAuthorError(FSMError):
    """Hints remain, and the op's author is not the next hinted segment's: a dead branch of the log."""


class WrongSeqNoError(FSMError):
    """The op's seq_no is not the FSM's NextSeqNo."""


class ChecksumMismatchError(FSMError):
    """The op's checksum is not the FSM's NextChecksum."""


class LinkExistsError(FSMError):
    """A create or link of a path that is already linked (or a property at a linked path)."""


class PropertyExistsError(FSMError):
    """A create or link at a property path, or a property with other content."""


class NoSuchLinkError(FSMError):
    """An unlink of a path the Fnode is not linked at."""


class FnodeNotTrackedError(FSMError):
    """The op is consistent and the FSM transitioned, but its Fnode is not tracked: either it is
    unknown, or the hints say it is deleted later in the log. Playback skips the op's local effect."""


class ExpectedHintedFnodeError(FSMError):
    """The op is not a create, but the hints say an Fnode is created at its seq_no."""


class OpDecodeError(RecoveryLogError):
    """Bytes of a log that do not decode as a RecordedOp frame."""


class RecorderError(RecoveryLogError):
    """A file operation the Recorder cannot record (Gazette's Recorder panics on these)."""


class RecorderFailedError(RecorderError):
    """The Recorder is failed: an append failed (e.g. REGISTER_MISMATCH, once another author fenced
    the log) or a barrier's dependency failed. Nothing more is appended; `__cause__` says why."""


class PlaybackError(RecoveryLogError):
    """Playback of a log cannot continue."""


class ContentTypeError(PlaybackError):
    """The log journal's content-type label is not `application/x-gazette-recoverylog`."""


class BrokenHistoryError(PlaybackError):
    """An op that can only continue the history played so far does not: an op of the author of the
    last applied op (or of the next hinted segment's author, or the log's first op when it is read
    from its start) with a later seq_no or another checksum than the FSM's next. Such an op means
    log content is corrupt or missing (a lost stretch, a front-truncated log); playing on would
    recover an older store silently, so playback fails instead (Gazette logs it and plays on)."""


__all__ = [
    "BrokenHistoryError",
    "ChecksumMismatchError",
    "ContentTypeError",
    "ExpectedHintedFnodeError",
    "FSMError",
    "FnodeNotTrackedError",
    "HintsError",
    "LinkExistsError",
    "NoSuchLinkError",
    "NotHintedAuthorError",
    "OpDecodeError",
    "PlaybackError",
    "PropertyExistsError",
    "RecorderError",
    "RecorderFailedError",
    "RecoveryLogError",
    "SegmentError",
    "WrongSeqNoError",
]
