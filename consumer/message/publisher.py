"""The Publisher: stamps messages with UUIDs, frames them and appends them through an AppendService.

`publish_committed` writes self-committed (OUTSIDE_TXN) messages. `publish_uncommitted` writes
messages of the producer's open transaction (CONTINUE_TXN) and records, per journal touched, an
acknowledgement intent. `build_ack_intents` turns those into framed ACK_TXN messages, one per
journal, in first-publish order, and starts a new transaction: a consumer persists the intents
(atomically with its checkpoint) before appending them with `write_ack_intents`; `commit` does
both steps at once for a producer without a store.

A rollback is expressed by re-appending the ACK intents of the last *committed* transaction
after a restart (same producer ID): their clock equals the readers' last acknowledged clock, so
a Sequencer discards every pending message of the producer with a larger clock.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from typing import Any

from broker.client import AppendService, AsyncAppend
from broker.client.append_service import Dependency
from consumer.message.clock import Clock
from consumer.message.envelope import Message
from consumer.message.framing import Framing, framing_for
from consumer.message.mapping import MappingFunc
from consumer.message.uuid import Flags, ProducerID, build_uuid, new_producer_id


@dataclasses.dataclass(frozen=True, slots=True)
class AckIntent:
    """A framed ACK_TXN message, to be appended to `journal` to commit a transaction there."""

    journal: str
    intent: bytes


@dataclasses.dataclass(slots=True)
class _PendingAck:
    journal: str
    message: Message
    framing: Framing
    last_append: AsyncAppend


class Publisher:
    """Publishes messages to the journals a MappingFunc picks, as Gazette's `message.Publisher`.

    `clock` is the producer's Clock; None means an internal clock updated to the wall-clock
    time on every publish. `producer_id` defaults to a new random ProducerID: pass a recovered
    one to continue (or roll back) a previous instance's transactions. Use it from the event
    loop that runs `append_service`.
    """

    def __init__(
        self, append_service: AppendService, clock: Clock | None = None, producer_id: ProducerID | None = None
    ) -> None:
        self.append_service = append_service
        self.auto_update = clock is None
        self.clock = Clock() if clock is None else clock
        self.producer_id: ProducerID = new_producer_id() if producer_id is None else producer_id
        self._intents: dict[str, _PendingAck] = {}  # Insertion order = first-publish order.

    def publish_committed(self, mapping: MappingFunc, msg: Message) -> AsyncAppend:
        """Publish `msg` as a self-committed (OUTSIDE_TXN) message; returns its append."""
        aa, _ = self._publish(mapping, msg, Flags.OUTSIDE_TXN)
        return aa

    def publish_uncommitted(self, mapping: MappingFunc, msg: Message) -> AsyncAppend:
        """Publish `msg` within the open transaction (CONTINUE_TXN); returns its append.

        It is processed by read-committed readers only once an ACK of the transaction follows.
        """
        aa, (journal, framing) = self._publish(mapping, msg, Flags.CONTINUE_TXN)
        pending = self._intents.get(journal)
        if pending is None:
            self._intents[journal] = _PendingAck(journal, msg.new_acknowledgement(journal), framing, aa)
        else:
            pending.last_append = aa
        return aa

    def pending_journals(self) -> list[str]:
        """Journals the open transaction published to, in first-publish order."""
        return list(self._intents)

    def build_ack_intents(self) -> list[AckIntent]:
        """The framed ACKs of the open transaction, one per journal; a new transaction starts.

        Each ACK gets its own Tick. The caller must persist the intents before appending them
        (`write_ack_intents`), and re-append them after a crash.
        """
        out = []
        for pending in self._intents.values():
            pending.message.set_uuid(build_uuid(self.producer_id, self.clock.tick(), Flags.ACK_TXN))
            out.append(AckIntent(pending.journal, pending.framing.marshal(pending.message)))
        self._intents.clear()
        return out

    def write_ack_intents(
        self, intents: Sequence[AckIntent], dependencies: Iterable[Dependency] = ()
    ) -> list[AsyncAppend]:
        """Append `intents` (e.g. recovered from a store), each after `dependencies`.

        An ACK is always ordered after earlier appends to its own journal; `dependencies` order
        it after writes to other journals too.
        """
        deps = list(dependencies)
        return [self.append_service.append(i.journal, i.intent, dependencies=deps) for i in intents]

    def commit(self) -> tuple[list[AckIntent], list[AsyncAppend]]:
        """Build the open transaction's ACK intents and append them, after all of its appends.

        Returns the intents (which re-committing after a restart needs) and their appends.
        """
        deps = [p.last_append for p in self._intents.values()]
        intents = self.build_ack_intents()
        return intents, self.write_ack_intents(intents, deps)

    def _publish(self, mapping: MappingFunc, msg: Message, flags: Flags) -> tuple[AsyncAppend, tuple[str, Framing]]:
        if self.auto_update:
            self.clock.update(time.time_ns())
        validate: Any = getattr(msg, "validate", None)
        if callable(validate):
            validate()  # Before mapping, and before the UUID is set, as Gazette does.
        journal, content_type = mapping(msg)
        framing = framing_for(content_type)
        # Appends are queued synchronously, in FIFO order per journal: ticking just before
        # queueing keeps clocks monotonic within each journal.
        msg.set_uuid(build_uuid(self.producer_id, self.clock.tick(), flags))
        aa = self.append_service.append(journal, framing.marshal(msg))
        return aa, (journal, framing)
