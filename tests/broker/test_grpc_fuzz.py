"""Generated gRPC input against a real broker: every method of `protocol.Journal` (hypothesis).

Request messages generated from the protobuf descriptors (every field type, nested and repeated
messages, unknown enum values, integer extremes, odd and long strings, bytes), sequences of them for
the streaming methods, and raw bytes as request messages: see tests/fuzz/fuzz_grpc.py, which also
runs longer on its own. For each input: an OK response or a status other than UNKNOWN (INTERNAL only
for a message that does not decode), no hang, the broker still ready and no traceback in its log;
a canary journal no input names reads back exactly what was acknowledged.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.protocol import pb, pb_grpc
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
from tests.support.harness import BrokerProcess, serving_broker

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
        found = [f for f in found if not f.startswith("known:")]  # See fuzz_grpc's Target.known.
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
    assert canary.acknowledged


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


def test_store_errors_log_no_sdk_traceback(
    etcd_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A health check of an S3 store the broker has no credentials for is answered (the store is
    # unhealthy), but at --log.level debug the AWS SDK logged the error's traceback (fuzzing found it).
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with serving_broker(tmp_path, etcd_endpoint) as broker:
        channel, stub = broker.stub()
        with channel:
            req = pb.FragmentStoreHealthRequest(fragment_store="s3://bucket/", check_delete=True,
                                                check_delete_prefix="probe/")
            resp = stub.FragmentStoreHealth(req, timeout=30)
        assert resp.status == pb.FRAGMENT_STORE_UNHEALTHY
        assert "Unable to locate credentials" in resp.store_health_error
        assert "Traceback" not in broker.logs()


@pytest.mark.parametrize("value", ["a" * 100_000, "é/" * 30_000], ids=["ascii", "utf-8"])
def test_huge_values_echoed_in_errors_are_cut(fuzzed: Fuzzed, stub: pb_grpc.JournalStub, value: str) -> None:
    # A status's details echo the client's value: past grpcio's 8 KiB of response metadata the
    # client got RESOURCE_EXHAUSTED instead of INVALID_ARGUMENT (fuzzing found it).
    with pytest.raises(grpc.RpcError) as info:
        stub.FragmentStoreHealth(pb.FragmentStoreHealthRequest(fragment_store=value), timeout=10)
    err: Any = info.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    details: str = err.details()
    assert details.startswith("FragmentStore: ") and value[:1000] in details
    assert details.endswith(" more bytes)") and len(details.encode()) < 2200
