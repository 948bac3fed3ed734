"""Decoding journal bytes into read-uncommitted Envelopes, for a reader to drive.

A reader yields `(offset, bytes)` chunks of one journal. An EnvelopeDecoder frames and
unmarshals them into `Envelope`s with exact offsets; feed those to a Sequencer. For a replay,
`decode_chunks` turns the chunks of `Sequencer.replay_range()` into the iterator that
`Sequencer.start_replay` takes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from broker.protocol import pb
from consumer.message.envelope import Envelope
from consumer.message.errors import DecodeError
from consumer.message.framing import Frame, Framing, Unpacker, framing_for

M = TypeVar("M")

NewMessage = Callable[[str], M]
"""Makes an empty message to unmarshal one frame of a journal into (Gazette's NewMessageFunc)."""


class EnvelopeDecoder(Generic[M]):
    """Turns the byte stream of one journal into Envelopes of read-uncommitted messages.

    Errors (MessageError subclasses, carrying journal, offset and content type) consume the
    frame or bytes they report; call `next` again to continue after them.
    """

    def __init__(
        self,
        journal: str,
        framing: Framing,
        new_message: NewMessage[M],
        offset: int = 0,
        *,
        max_frame_size: int | None = None,
    ) -> None:
        self.journal = journal
        self.framing = framing
        self.new_message = new_message
        self._unpacker: Unpacker = framing.unpacker(journal, offset, max_frame_size=max_frame_size)
        self._frames: list[Frame] = []  # Taken from the unpacker, not yet decoded (after an error).
        self._error: Exception | None = None  # Raised by the next take() or next().

    @classmethod
    def for_spec(
        cls, spec: pb.JournalSpec, new_message: NewMessage[M], offset: int = 0, *, max_frame_size: int | None = None
    ) -> EnvelopeDecoder[M]:
        """A decoder for the journal of `spec`, framed by its `content-type` label.

        Raises UnknownContentTypeError if the label names no registered framing.
        """
        return cls(spec.name, framing_for(spec), new_message, offset, max_frame_size=max_frame_size)

    @property
    def offset(self) -> int:
        """Offset where the next envelope begins: everything before it has been decoded."""
        return self._frames[0].begin if self._frames else self._unpacker.offset

    @property
    def end_offset(self) -> int:
        """Offset just past the last byte fed: where the next chunk should start."""
        return self._unpacker.end_offset

    def feed(self, data: bytes, offset: int | None = None) -> None:
        """Add a chunk starting at `offset` (default: where the previous chunk ended)."""
        self._unpacker.feed(data, offset)

    def take(self, limit: int, *, eof: bool = False) -> list[Envelope[M]]:
        """Up to `limit` envelopes, in order (empty: more bytes are needed, or with `eof`, none remain).

        An error after the first envelope is held, and raised by the next call of this or `next`;
        it consumes the frame or bytes it reports, so calling again continues after it.
        """
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self._frames:
            frames, self._frames = self._frames[:limit], self._frames[limit:]
        else:
            frames = self._unpacker.take_frames(limit, eof=eof)
        # The loop of every reader, once per message: its names bound once.
        journal, new_message, unmarshal = self.journal, self.new_message, self.framing.unmarshal
        envelopes: list[Envelope[M]] = []
        append = envelopes.append
        try:
            for frame in frames:
                try:
                    message = new_message(journal)
                except Exception as e:
                    raise self._decode_error(f"newMessage: {e}", frame) from e
                unmarshal(frame, message)
                try:
                    append(Envelope(journal, frame.begin, frame.end, message))
                except Exception as e:
                    # get_uuid() of a malformed message, e.g. a CSV record whose first field isn't one.
                    raise self._decode_error(f"reading message UUID: {e}", frame) from e
        except Exception as e:
            self._frames[:0] = frames[len(envelopes) + 1 :]
            if not envelopes:
                raise
            self._error = e
        return envelopes

    def next(self, *, eof: bool = False) -> Envelope[M] | None:
        """The next envelope, or None when more bytes are needed (or, with `eof`, none remain)."""
        envelopes = self.take(1, eof=eof)
        return envelopes[0] if envelopes else None

    def envelopes(self, *, eof: bool = False, batch: int = 128) -> Iterator[Envelope[M]]:
        """Yield envelopes until more bytes are needed, decoding `batch` at a time. An error ends
        this iterator only."""
        while envelopes := self.take(batch, eof=eof):
            yield from envelopes

    def _decode_error(self, reason: str, frame: Frame) -> DecodeError:
        return DecodeError(reason, journal=self.journal, offset=frame.begin, content_type=self.framing.content_type)


def decode_chunks(
    journal: str,
    framing: Framing,
    new_message: NewMessage[M],
    chunks: Iterable[tuple[int, bytes]],
    *,
    max_frame_size: int | None = None,
) -> Iterator[Envelope[M]]:
    """Envelopes of a complete byte range given as `(offset, bytes)` chunks; a partial final frame raises.

    The first chunk's offset is where decoding starts.
    """
    decoder: EnvelopeDecoder[M] | None = None
    for offset, data in chunks:
        if decoder is None:
            decoder = EnvelopeDecoder(journal, framing, new_message, offset, max_frame_size=max_frame_size)
        decoder.feed(data, offset)
        yield from decoder.envelopes()
    if decoder is not None:
        yield from decoder.envelopes(eof=True)
