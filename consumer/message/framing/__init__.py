"""Framings: how messages are laid out as bytes in a journal, chosen by its `content-type` label.

| content-type                   | Framing              | frame                                            |
|--------------------------------|----------------------|--------------------------------------------------|
| `application/x-ndjson`         | JSONFraming          | one compact JSON document and `\\n`               |
| `application/x-protobuf-fixed` | ProtoFixedFraming    | `66 33 93 36`, uint32 LE payload length, payload |
| `text/csv`                     | CSVFraming           | one RFC 4180 record and `\\n`                     |

A Framing marshals a message to bytes and unmarshals a frame into a message. An `Unpacker`
splits one journal's byte stream, fed in chunks of any size, into whole `Frame`s that know
their journal offsets [begin, end). An error consumes the bytes it reports (and an oversized
frame's remaining bytes after it), so the caller may log it and keep reading.

Where this differs from Gazette: a CSV record left without its newline at the end of the
stream is an error, as it is for JSON lines (Go's encoding/csv would accept it); unpackers cap
frames at `max_frame_size`; and feeding a chunk past a gap in offsets reports a partial frame
as truncated instead of splicing the bytes together.

- `base`: `Frame`, the `Framing` interface and the incremental `Unpacker` every framing uses.
- `json_lines`, `proto_fixed`, `csv_framing`: one module per framing, with its Unpacker.
- `csv_parser`: CSV records parsed as Go's encoding/csv does.
- `registry`: the framings by content type (`framing_for`, `register_framing`).
"""

from consumer.message.framing.base import (
    DEFAULT_MAX_FRAME_SIZE,
    Frame,
    Framing,
    T,
    Unpacker,
)
from consumer.message.framing.csv_framing import (
    CSVFrameable,
    CSVFraming,
    CSVRecord,
    CSVUnpacker,
)
from consumer.message.framing.csv_parser import parse_csv_record
from consumer.message.framing.json_lines import (
    JSONFraming,
    JSONMarshaler,
    JSONUnmarshaler,
    LineUnpacker,
)
from consumer.message.framing.proto_fixed import (
    FIXED_FRAME_HEADER_LENGTH,
    FIXED_FRAME_WORD,
    FixedUnpacker,
    ProtoFixedFraming,
    ProtoFrameable,
    encode_fixed_frame,
)
from consumer.message.framing.registry import (
    CSV_FRAMING,
    JSON_FRAMING,
    PROTO_FIXED_FRAMING,
    framing_for,
    register_framing,
    supported_content_types,
)

__all__ = [
    "CSV_FRAMING",
    "DEFAULT_MAX_FRAME_SIZE",
    "FIXED_FRAME_HEADER_LENGTH",
    "FIXED_FRAME_WORD",
    "JSON_FRAMING",
    "PROTO_FIXED_FRAMING",
    "CSVFrameable",
    "CSVFraming",
    "CSVRecord",
    "CSVUnpacker",
    "FixedUnpacker",
    "Frame",
    "Framing",
    "JSONFraming",
    "JSONMarshaler",
    "JSONUnmarshaler",
    "LineUnpacker",
    "ProtoFixedFraming",
    "ProtoFrameable",
    "T",
    "Unpacker",
    "encode_fixed_frame",
    "framing_for",
    "parse_csv_record",
    "register_framing",
    "supported_content_types",
]
