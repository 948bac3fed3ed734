"""Test messages and an envelope generator shared by the message-layer tests (Gazette's testMsg)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from uuid import UUID

from consumer.message import ZERO_UUID, Envelope, build_uuid

JOURNAL = "test/journal"


@dataclasses.dataclass
class TestMsg:
    """Gazette's testMsg: a UUID and a string, encoded as `{"UUID":"…","Str":"…"}`."""

    __test__ = False  # Not a pytest test class.

    UUID: UUID = ZERO_UUID
    Str: str = ""

    def get_uuid(self) -> UUID:
        return self.UUID

    def set_uuid(self, value: UUID) -> None:
        self.UUID = value

    def new_acknowledgement(self, journal: str) -> TestMsg:
        return TestMsg()


def new_test_msg(journal: str) -> TestMsg:
    return TestMsg()


Generator = Callable[[bytes, int, int], Envelope[TestMsg]]


def envelope_generator(journal: str = JOURNAL) -> Generator:
    """Gazette's newTestMsgGenerator: envelopes 100 bytes long, 102 bytes apart.

    The 2-byte gaps check the Sequencer copes with non-contiguous envelopes.
    """
    offset = 0

    def generate(producer: bytes, clock: int, flags: int) -> Envelope[TestMsg]:
        nonlocal offset
        msg = TestMsg(build_uuid(producer, clock, flags), str(clock))
        env = Envelope(journal, offset, offset + 100, msg)
        offset += 102
        return env

    return generate
