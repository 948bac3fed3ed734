"""Messages, the Envelopes that place them in a journal, and per-producer sequencing state."""

from __future__ import annotations

import dataclasses
from typing import Generic, NamedTuple, Protocol, TypeVar, runtime_checkable
from uuid import UUID

from consumer.message.uuid import ProducerID


@runtime_checkable
class Message(Protocol):
    """A message that carries its own UUID.

    The publisher stamps the UUID with `set_uuid` just before marshalling; readers recover it
    with `get_uuid`. A zero UUID opts the message out of exactly-once processing.
    """

    def get_uuid(self) -> UUID:
        """The message's UUID."""
        ...

    def set_uuid(self, value: UUID) -> None:
        """Store the UUID in the message, in a field its framing encodes."""
        ...

    def new_acknowledgement(self, journal: str) -> Message:
        """A zero-valued message of the same type, to become the ACK intent for `journal`."""
        ...


M = TypeVar("M")


@dataclasses.dataclass(slots=True, init=False)
class Envelope(Generic[M]):
    """A message and the byte range [begin, end) of its frame within `journal`.

    `uuid` is the message's UUID as read; it defaults to `message.get_uuid()`. The Sequencer
    uses this field rather than asking the message, since an application may re-stamp a message
    (e.g. by publishing it) while it is being processed.

    Treat an Envelope as a value: nothing assigns its fields after construction. (It is not a
    frozen dataclass only because one is built per message read, and a frozen one costs five
    times as much to build.)
    """

    journal: str
    begin: int
    end: int
    message: M
    uuid: UUID

    def __init__(self, journal: str, begin: int, end: int, message: M, uuid: UUID | None = None) -> None:
        self.journal = journal
        self.begin = begin
        self.end = end
        self.message = message
        if uuid is None:
            get_uuid = getattr(message, "get_uuid", None)
            if get_uuid is None:
                raise TypeError(f"Envelope needs a uuid, or a message with get_uuid(): {message!r}")
            uuid = get_uuid()
        self.uuid = uuid


class JournalProducer(NamedTuple):
    """A producer, as seen within one journal.

    A named tuple, so a plain `(journal, producer)` tuple finds it as a dict key: the Sequencer
    looks one up per message read without building one.
    """

    journal: str
    producer: ProducerID


@dataclasses.dataclass(frozen=True, slots=True)
class ProducerState:
    """What a Sequencer checkpoints per JournalProducer.

    `last_ack` is the clock of the last acknowledged (or consumed) message; `begin` is the offset
    of the first message of the producer's open transaction, or -1 if none is open.
    """

    journal_producer: JournalProducer
    last_ack: int
    begin: int
