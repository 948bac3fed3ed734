"""The message layer's exceptions: one hierarchy rooted at MessageError.

Each error keeps Gazette's own wording in `reason` (tests and logs compare it with the Go
fixtures) and carries whatever context is known: journal, byte offset and content type.
`str(error)` is the reason followed by that context.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.errors import GazetteError


class MessageError(GazetteError):
    """Base of every error raised by `consumer.message`."""

    def __init__(
        self,
        reason: str,
        *,
        journal: str | None = None,
        offset: int | None = None,
        content_type: str | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.journal = journal
        self.offset = offset
        self.content_type = content_type

    def __str__(self) -> str:
        context = []
        if self.journal is not None:
            context.append(f"journal {self.journal}")
        if self.offset is not None:
            context.append(f"offset {self.offset}")
        if self.content_type is not None:
            context.append(f"content-type {self.content_type}")
        return f"{self.reason} ({', '.join(context)})" if context else self.reason


class UUIDError(MessageError, ValueError):
    """A UUID could not be built or parsed (flags out of range, malformed text, bad producer)."""


class UnknownContentTypeError(MessageError, LookupError):
    """No framing is registered for a content type."""

    def __init__(self, content_type: str, supported: Sequence[str]) -> None:
        self.supported = tuple(supported)
        # The first clause is Gazette's exact wording; the list says what would have worked.
        super().__init__(
            f"unrecognized content-type ({content_type}); supported content-types are {', '.join(self.supported)}",
            content_type=content_type,
        )


class FramingError(MessageError):
    """Journal bytes could not be split into frames, or a frame could not be encoded or decoded."""


class TruncatedFrameError(FramingError):
    """The stream ended (or jumped ahead) partway through a frame: Go's `io.ErrUnexpectedEOF`.

    `offset` is where the partial frame began; `end` is where the lost bytes stopped.
    """

    def __init__(
        self,
        reason: str,
        *,
        journal: str | None = None,
        offset: int | None = None,
        end: int | None = None,
        content_type: str | None = None,
    ) -> None:
        super().__init__(reason, journal=journal, offset=offset, content_type=content_type)
        self.end = end


class DesyncError(FramingError):
    """Fixed framing found bytes that do not start with the magic word; they were skipped.

    `skipped` holds those bytes, which span [offset, end). The next frame follows them.
    """

    def __init__(
        self, skipped: bytes, *, journal: str | None = None, offset: int | None = None, content_type: str | None = None
    ) -> None:
        super().__init__("detected de-synchronization", journal=journal, offset=offset, content_type=content_type)
        self.skipped = skipped
        self.end = None if offset is None else offset + len(skipped)


class FrameTooLargeError(FramingError):
    """A frame is longer than the unpacker's `max_frame_size`; its bytes are skipped."""


class DecodeError(FramingError):
    """A whole frame was read but could not be decoded into a message; the frame is consumed."""


class EncodeError(FramingError):
    """A message could not be marshalled with the framing."""


class MappingError(MessageError):
    """A message could not be mapped to a journal."""


class EmptyPartitionsError(MappingError):
    """A mapping was asked to choose among zero partitions (Go's `ErrEmptyListResponse`)."""

    def __init__(self) -> None:
        super().__init__("empty ListResponse")


class SequencerError(MessageError):
    """The Sequencer could not continue."""


class ReplayError(SequencerError):
    """A replay reader failed, or returned envelopes outside the requested replay range."""


class SequencerStateError(SequencerError, RuntimeError):
    """The Sequencer was driven out of protocol (a caller bug; Go panics here)."""
