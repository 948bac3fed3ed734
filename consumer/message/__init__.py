"""Gazette's message layer: UUIDs, clocks, framings, mappings and the read-committed Sequencer.

- `uuid`: message UUIDs laid out as Gazette lays them out (`build_uuid`, `get_clock`, ...).
- `clock`: the monotonic `Clock` producers mint UUID clocks from.
- `envelope`: the `Message` protocol, `Envelope`, and per-producer `ProducerState`.
- `framing`: framings by content type (`framing_for`) and their incremental `Unpacker`s.
- `decoder`: `EnvelopeDecoder`, which turns a journal's byte chunks into Envelopes.
- `mapping`: modulo, rendezvous and random mappings of messages to journals.
- `sequencer`: the `Sequencer`, which orders, deduplicates and commits envelopes.
- `publisher`: the `Publisher` (committed and transactional publishing, ACK intents).
- `readers`: `read_uncommitted` (`read_uncommitted_batches`) and `read_committed` async iterators over a journal.
- `errors`: the `MessageError` hierarchy.
"""

from consumer.message.clock import TICK, Clock, clock_at, clock_unix_ns
from consumer.message.decoder import EnvelopeDecoder, NewMessage, decode_chunks
from consumer.message.envelope import Envelope, JournalProducer, Message, ProducerState
from consumer.message.errors import (
    DecodeError,
    DesyncError,
    EmptyPartitionsError,
    EncodeError,
    FrameTooLargeError,
    FramingError,
    MappingError,
    MessageError,
    ReplayError,
    SequencerError,
    SequencerStateError,
    TruncatedFrameError,
    UnknownContentTypeError,
    UUIDError,
)
from consumer.message.framing import (
    CSV_FRAMING,
    FIXED_FRAME_HEADER_LENGTH,
    FIXED_FRAME_WORD,
    JSON_FRAMING,
    PROTO_FIXED_FRAMING,
    CSVFrameable,
    CSVFraming,
    CSVRecord,
    Frame,
    Framing,
    JSONFraming,
    JSONMarshaler,
    JSONUnmarshaler,
    ProtoFixedFraming,
    ProtoFrameable,
    Unpacker,
    encode_fixed_frame,
    framing_for,
    register_framing,
    supported_content_types,
)
from consumer.message.mapping import (
    MappingFunc,
    MappingKeyFunc,
    PartitionsFunc,
    fnv1a32,
    modulo_mapping,
    random_mapping,
    rendezvous_mapping,
)
from consumer.message.publisher import AckIntent, Publisher
from consumer.message.readers import fetch_journal_spec, read_committed, read_uncommitted, read_uncommitted_batches
from consumer.message.sequencer import QueueOutcome, ReplayRequest, Sequencer
from consumer.message.uuid import (
    ZERO_UUID,
    Flags,
    ProducerID,
    build_uuid,
    flags_string,
    get_clock,
    get_flags,
    get_producer_id,
    new_producer_id,
    parse_uuid,
)

__all__ = [
    "CSV_FRAMING",
    "FIXED_FRAME_HEADER_LENGTH",
    "FIXED_FRAME_WORD",
    "JSON_FRAMING",
    "PROTO_FIXED_FRAMING",
    "TICK",
    "ZERO_UUID",
    "AckIntent",
    "CSVFrameable",
    "CSVFraming",
    "CSVRecord",
    "Clock",
    "DecodeError",
    "DesyncError",
    "EmptyPartitionsError",
    "EncodeError",
    "Envelope",
    "EnvelopeDecoder",
    "Flags",
    "Frame",
    "FrameTooLargeError",
    "Framing",
    "FramingError",
    "JSONFraming",
    "JSONMarshaler",
    "JSONUnmarshaler",
    "JournalProducer",
    "MappingError",
    "MappingFunc",
    "MappingKeyFunc",
    "Message",
    "MessageError",
    "NewMessage",
    "PartitionsFunc",
    "ProducerID",
    "ProducerState",
    "ProtoFixedFraming",
    "ProtoFrameable",
    "Publisher",
    "QueueOutcome",
    "ReplayError",
    "ReplayRequest",
    "Sequencer",
    "SequencerError",
    "SequencerStateError",
    "TruncatedFrameError",
    "UUIDError",
    "UnknownContentTypeError",
    "Unpacker",
    "build_uuid",
    "clock_at",
    "clock_unix_ns",
    "decode_chunks",
    "encode_fixed_frame",
    "fetch_journal_spec",
    "flags_string",
    "fnv1a32",
    "framing_for",
    "get_clock",
    "get_flags",
    "get_producer_id",
    "modulo_mapping",
    "new_producer_id",
    "parse_uuid",
    "random_mapping",
    "read_committed",
    "read_uncommitted",
    "read_uncommitted_batches",
    "register_framing",
    "rendezvous_mapping",
    "supported_content_types",
]
