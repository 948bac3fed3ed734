"""Generated gRPC input against a real broker: every method of `protocol.Journal` (hypothesis).

Request messages generated from the protobuf descriptors (every field type, nested and repeated
messages, unknown enum values, integer extremes, odd and long strings, bytes), sequences of them for
the streaming methods, and raw bytes as request messages: see tests/fuzz/fuzz_grpc.py, which also
runs longer on its own. For each input: an OK response or a status other than UNKNOWN (INTERNAL only
for a message that does not decode), no hang, the broker still ready and no traceback in its log;
a canary journal no input names reads back exactly what was acknowledged.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.protocol import pb_grpc
from tests.fuzz.fuzz_grpc import (
    JOURNAL_METHODS,
    Canary,
    Input,
    Method,
    Target,
    broker_target,
    check,
    inputs,
    prepare_journals,
)
from tests.harness import BrokerProcess

EXAMPLES = 60
"""Inputs per method and kind: a few seconds each; `python -m tests.fuzz.fuzz_grpc` runs for minutes."""
BLOCK_DEADLINE = 0.3
"""Seconds a call that may block by design is given (kept short: the suite's budget)."""

FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # Nothing written into the working tree; a failure prints its input.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                           HealthCheck.function_scoped_fixture],
)


class Fuzzed:
    def __init__(self, target: Target, channel: grpc.Channel, canary: Canary) -> None:
        self.target, self.channel, self.canary = target, channel, canary
        self.inputs = 0

    def check(self, inp: Input) -> None:
        _, found = check(self.target, self.channel, inp, timeout=10.0, block_deadline=BLOCK_DEADLINE)
        assert not found, (found, inp.show())
        self.inputs += 1
        if self.inputs % 25 == 0:
            self.canary.append()


@pytest.fixture(scope="module")
def fuzzed(broker: BrokerProcess, stub: pb_grpc.JournalStub) -> Iterator[Fuzzed]:
    """The module's broker, serving the fuzzed journals and a canary; its canary verified at the end."""
    prepare_journals(stub)
    canary = Canary(stub)
    with grpc.insecure_channel(broker.target) as channel:
        fuzzed = Fuzzed(broker_target(broker), channel, canary)
        yield fuzzed
    canary.append()
    assert not canary.verify()
    assert len(canary.acknowledged) > 1


METHODS = pytest.mark.parametrize("method", JOURNAL_METHODS, ids=[m.descriptor.name for m in JOURNAL_METHODS])


@METHODS
@FUZZ_SETTINGS
@given(data=st.data())
def test_generated_messages(fuzzed: Fuzzed, method: Method, data: st.DataObject) -> None:
    fuzzed.check(data.draw(inputs(method, raw=False)))


@METHODS
@FUZZ_SETTINGS
@given(data=st.data())
def test_raw_bytes(fuzzed: Fuzzed, method: Method, data: st.DataObject) -> None:
    fuzzed.check(data.draw(inputs(method, raw=True)))
