"""What every framing shares: the `Frame`, the `Framing` interface and the incremental `Unpacker`.

An Unpacker splits one journal's byte stream, fed in chunks of any size, into whole Frames that
know their journal offsets [begin, end). An error consumes the bytes it reports (and an
oversized frame's remaining bytes after it), so the caller may log it and keep reading.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import ClassVar, NamedTuple, TypeVar

from consumer.message.errors import DecodeError, FramingError, MessageError, TruncatedFrameError

T = TypeVar("T")

DEFAULT_MAX_FRAME_SIZE = 1 << 28
"""256 MiB. A longer frame is more likely a corrupt length or a missing newline than a message."""


class Frame(NamedTuple):
    """The bytes of one whole frame, which spans [begin, end) of `journal`.

    A named tuple: one is built per message read, and a tuple is the cheapest immutable record.
    """

    journal: str
    begin: int
    end: int
    data: bytes


class Unpacker(abc.ABC):
    """Splits one journal's byte stream into frames, incrementally.

    `feed` chunks as they arrive; call `next_frame` until it returns None (more bytes needed).
    At the end of the stream pass `eof=True`: a partial frame then raises TruncatedFrameError.
    """

    def __init__(self, framing: Framing, journal: str = "", offset: int = 0, max_frame_size: int | None = None) -> None:
        self.framing = framing
        self.journal = journal
        self.max_frame_size = DEFAULT_MAX_FRAME_SIZE if max_frame_size is None else max_frame_size
        self._buf = bytearray()
        self._pos = 0  # Index in _buf of the next unconsumed byte.
        self._base = offset  # Journal offset of _buf[0].
        self._pending: FramingError | None = None  # Raised by the next next_frame().

    @property
    def offset(self) -> int:
        """Journal offset of the next byte not yet consumed: where the next frame begins."""
        return self._base + self._pos

    @property
    def end_offset(self) -> int:
        """Journal offset just past the last byte fed."""
        return self._base + len(self._buf)

    @property
    def buffered(self) -> int:
        """Count of fed bytes not yet consumed."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes, offset: int | None = None) -> None:
        """Append a chunk that starts at journal `offset` (default: where the last chunk ended).

        A chunk past the end of the last one means the journal skipped content (Gazette's
        offset jump): buffered bytes of a partial frame are dropped, and the next `next_frame`
        raises TruncatedFrameError for them.
        """
        expect = self.end_offset
        if offset is not None and offset != expect:
            if offset < expect:
                raise FramingError(
                    f"chunk at offset {offset} overlaps bytes already fed through offset {expect}",
                    journal=self.journal,
                    offset=offset,
                    content_type=self.framing.content_type,
                )
            if self.buffered:
                self._pending = TruncatedFrameError(
                    f"journal content jumped from offset {expect} to {offset}, truncating a frame",
                    journal=self.journal,
                    offset=self.offset,
                    end=expect,
                    content_type=self.framing.content_type,
                )
            self._buf.clear()
            self._pos = 0
            self._base = offset
            self._on_jump()
        if self._pos:
            # Compact once per chunk: cheap, and keeps the buffer from growing without bound.
            del self._buf[: self._pos]
            self._base += self._pos
            self._pos = 0
        self._buf += data

    def next_frame(self, *, eof: bool = False) -> Frame | None:
        """The next whole frame, or None if more bytes are needed (or, with `eof`, none remain).

        Raises a FramingError for garbage, having consumed it; calling again continues after it.
        """
        if self._pending is not None:
            error, self._pending = self._pending, None
            raise error
        return self._scan(eof)

    def frames(self, *, eof: bool = False) -> Iterator[Frame]:
        """Yield whole frames until more bytes are needed. An error ends this iterator only."""
        while (frame := self.next_frame(eof=eof)) is not None:
            yield frame

    def take_frames(self, limit: int, *, eof: bool = False) -> list[Frame]:
        """Up to `limit` whole frames, as `next_frame` returns them (empty: more bytes are needed,
        or with `eof`, none remain). A FramingError after the first frame is held, and raised by
        the next call of this or `next_frame`."""
        frames: list[Frame] = []
        try:
            while len(frames) < limit and (frame := self.next_frame(eof=eof)) is not None:
                frames.append(frame)
        except FramingError as e:
            if not frames:
                raise
            self._pending = e
        return frames

    @abc.abstractmethod
    def _scan(self, eof: bool) -> Frame | None:
        """Framing-specific: find, consume and return the frame at `_pos`."""

    def _on_jump(self) -> None:  # noqa: B027  # An optional hook; most unpackers need nothing.
        """Hook: the stream jumped ahead; forget any state about the dropped bytes."""

    def _take(self, size: int) -> Frame:
        begin = self.offset
        data = bytes(self._buf[self._pos : self._pos + size])
        self._pos += size
        return Frame(self.journal, begin, begin + size, data)

    def _error(self, cls: type[FramingError], reason: str, begin: int) -> FramingError:
        return cls(reason, journal=self.journal, offset=begin, content_type=self.framing.content_type)

    def _truncated(self, reason: str) -> TruncatedFrameError:
        """Consume every buffered byte and describe them as a truncated frame."""
        begin, end = self.offset, self.end_offset
        self._pos = len(self._buf)
        return TruncatedFrameError(
            reason, journal=self.journal, offset=begin, end=end, content_type=self.framing.content_type
        )


class Framing(abc.ABC):
    """Marshals messages to frames and unmarshals frames to messages, for one content type."""

    content_type: ClassVar[str]

    @abc.abstractmethod
    def marshal(self, message: object) -> bytes:
        """The whole frame of `message`. Raises EncodeError."""

    @abc.abstractmethod
    def unmarshal(self, frame: Frame | bytes, message: T) -> T:
        """Decode a whole frame into `message` (in place) and return it. Raises DecodeError."""

    @abc.abstractmethod
    def unpacker(self, journal: str = "", offset: int = 0, *, max_frame_size: int | None = None) -> Unpacker:
        """A new Unpacker for the byte stream of `journal` that starts at `offset`."""

    def _decode_error(self, frame: Frame | bytes, error: BaseException) -> DecodeError:
        reason = error.reason if isinstance(error, MessageError) else (str(error) or type(error).__name__)
        if isinstance(frame, Frame):
            return DecodeError(reason, journal=frame.journal, offset=frame.begin, content_type=self.content_type)
        return DecodeError(reason, content_type=self.content_type)
