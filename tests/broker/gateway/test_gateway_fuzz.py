"""Generated HTTP input against a real broker's gateway, over raw sockets (hypothesis).

Request lines, methods, targets (percent-escapes, non-ASCII, huge numbers), headers (sizes,
duplicates, odd transfer-encodings), bodies and pipelines, ending now and then in malformed HTTP or
bytes that are no HTTP: see tests/fuzz/fuzz_http.py, which also runs longer on its own. For each
input: well-formed answers with a status below 500 (or the 5xx Gazette gives), no connection dropped
without an answer, the broker still ready, and no traceback in its log.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from broker.protocol import pb, pb_grpc
from tests.fuzz.fuzz_http import HOSTILE, JOURNAL, Item, LogWatch, Wire, exchange, problems, ready, requests, wires
from tests.support.harness import BrokerProcess, apply_specs, journal_spec, wait_for_primary

EXAMPLES = 300
"""Inputs per test: a few seconds each on a laptop; `python -m tests.fuzz.fuzz_http` runs for minutes."""

FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # Nothing written into the working tree; a failure prints its input.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


@pytest.fixture(scope="module")
def gateway(broker: BrokerProcess, stub: pb_grpc.JournalStub) -> Iterator[LogWatch]:
    """The module's broker, serving the fuzzed journal; the watch of its log."""
    assert apply_specs(stub, journal_spec(JOURNAL)).status == pb.OK
    wait_for_primary(stub, JOURNAL)
    logs = LogWatch(broker.log_path)
    yield logs
    assert not logs.new_tracebacks()


def check(broker: BrokerProcess, logs: LogWatch, wire: Wire) -> None:
    ex = exchange(broker.port, wire, timeout=10.0)
    assert not problems(wire, ex), (problems(wire, ex), wire.show())
    assert ready(broker.port), f"the broker does not answer /debug/ready after {wire.show()}"
    tracebacks = logs.new_tracebacks()
    assert not tracebacks, (tracebacks[0], wire.show())


@FUZZ_SETTINGS
@given(wire=wires())
def test_pipelines(broker: BrokerProcess, gateway: LogWatch, wire: Wire) -> None:
    check(broker, gateway, wire)


@FUZZ_SETTINGS
@given(item=requests(terminal=True))
def test_last_requests(broker: BrokerProcess, gateway: LogWatch, item: Item) -> None:
    # One request that ends the connection (HTTP/1.0, `Connection: close`) or is malformed; the
    # client ends its side after a malformed one, which may lack some of what it announced.
    check(broker, gateway, Wire([item], half_close=item.kind == HOSTILE))
