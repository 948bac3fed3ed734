"""Protobuf, fixed framing (`application/x-protobuf-fixed`), as Gazette's `FixedFraming`.

A frame is the magic word `66 33 93 36`, the payload's length as a uint32 little-endian, and
the payload: a serialized protobuf message.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from broker.protocol import labels as lbl
from consumer.message.errors import DesyncError, EncodeError, FrameTooLargeError
from consumer.message.framing.base import Frame, Framing, T, Unpacker

FIXED_FRAME_WORD = bytes((0x66, 0x33, 0x93, 0x36))
"""The magic word that begins every fixed frame, for de-synchronization detection."""
FIXED_FRAME_HEADER_LENGTH = 8
"""The magic word and a uint32 little-endian payload length."""


@runtime_checkable
class ProtoFrameable(Protocol):
    """A message with protobuf's serialization methods (every generated protobuf message)."""

    def SerializeToString(self) -> bytes: ...

    def ParseFromString(self, data: bytes) -> object: ...


def encode_fixed_frame(payload: bytes) -> bytes:
    """A fixed frame of `payload`: the magic word, its little-endian uint32 length, then it."""
    if len(payload) > 0xFFFFFFFF:
        raise EncodeError(f"payload of {len(payload)} bytes exceeds the uint32 frame length")
    return FIXED_FRAME_WORD + len(payload).to_bytes(4, "little") + payload


class ProtoFixedFraming(Framing):
    """Protobuf messages, each preceded by an 8-byte header: magic word and payload length."""

    content_type = lbl.CONTENT_TYPE_PROTO_FIXED

    def marshal(self, message: object) -> bytes:
        if not isinstance(message, ProtoFrameable):
            raise EncodeError(f"{message!r} is not ProtoFrameable", content_type=self.content_type)
        try:
            payload = message.SerializeToString()
        except Exception as e:
            raise EncodeError(str(e), content_type=self.content_type) from e
        return encode_fixed_frame(payload)

    def unmarshal(self, frame: Frame | bytes, message: T) -> T:
        data = frame.data if isinstance(frame, Frame) else frame
        try:
            if not isinstance(message, ProtoFrameable):
                raise TypeError(f"{message!r} is not ProtoFrameable")
            if data[:4] != FIXED_FRAME_WORD or len(data) < FIXED_FRAME_HEADER_LENGTH:
                raise ValueError("frame does not begin with a fixed frame header")
            message.ParseFromString(bytes(data[FIXED_FRAME_HEADER_LENGTH:]))
        except Exception as e:
            raise self._decode_error(frame, e) from e
        return message

    def unpacker(self, journal: str = "", offset: int = 0, *, max_frame_size: int | None = None) -> Unpacker:
        return FixedUnpacker(self, journal, offset, max_frame_size)


class FixedUnpacker(Unpacker):
    """Frames are a fixed header and a payload; garbage is skipped to the next magic word.

    As Gazette's UnpackFixedFrame does: when the bytes at a frame boundary are not the magic
    word, scan the buffered bytes for the next one and raise DesyncError for the bytes skipped
    (all but the last 3 buffered, if no magic word is buffered: they may begin one). At the end
    of the stream, a single leftover `\\n` is a clean end (a Hadoop-streaming legacy).
    """

    def _scan(self, eof: bool) -> Frame | None:
        pos, avail = self._pos, self.buffered
        if avail < FIXED_FRAME_HEADER_LENGTH:
            if not eof or avail == 0:
                return None
            if avail == 1 and self._buf[pos] == 0x0A:
                self._pos += 1
                return None
            raise self._truncated("Peek(FixedFrameHeaderLength): unexpected EOF")

        if self._buf[pos : pos + 4] != FIXED_FRAME_WORD:
            found = self._buf.find(FIXED_FRAME_WORD, pos + 1)
            skip = (found - pos) if found != -1 else avail - (len(FIXED_FRAME_WORD) - 1)
            begin = self.offset
            skipped = bytes(self._buf[pos : pos + skip])
            self._pos += skip
            raise DesyncError(skipped, journal=self.journal, offset=begin, content_type=self.framing.content_type)

        size = FIXED_FRAME_HEADER_LENGTH + int.from_bytes(self._buf[pos + 4 : pos + 8], "little")
        if size > self.max_frame_size:
            # Drop only the header: the next call resynchronizes at the next magic word.
            begin = self.offset
            self._pos += FIXED_FRAME_HEADER_LENGTH
            raise self._error(
                FrameTooLargeError, f"frame size {size} exceeds the maximum frame size of {self.max_frame_size}", begin
            )
        if avail < size:
            if eof:
                raise self._truncated(f"reading frame (size {size}): unexpected EOF")
            return None
        return self._take(size)
