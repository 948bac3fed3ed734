"""Generated gRPC input against a real `gazette consume` process: every method of `consumer.Shard`
(hypothesis), as tests/broker/test_grpc_fuzz.py does for the broker's Journal service.

Request messages generated from the protobuf descriptors (ShardSpecs, FSMHints, selectors, maps of
offsets, unknown enum values, integer extremes, odd and long strings) and raw bytes as request
messages: see tests/fuzz/fuzz_grpc.py. For each input: an OK response or a status other than
UNKNOWN (INTERNAL only for a message that does not decode), no hang, the consumer still ready and
no traceback in its log.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.protocol import pb as bpb
from broker.protocol import pb_grpc
from consumer.protocol import pb as cpb
from consumer.protocol import pb_grpc as cpb_grpc
from tests.fuzz.fuzz_grpc import (
    SHARD_METHODS,
    Input,
    Method,
    Target,
    check,
    consumer_target,
    consuming,
    inputs,
    prepare_journals,
    reset_shards,
)
from tests.support.harness import BrokerProcess, journal_spec

EXAMPLES = 60
"""Inputs per method and kind: a few seconds each; `python -m tests.fuzz.fuzz_grpc` runs for minutes."""
BLOCK_DEADLINE = 0.3
"""Seconds a call that may block by design is given (kept short: the suite's budget)."""

FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                           HealthCheck.function_scoped_fixture],
)


class Fuzzed:
    def __init__(self, target: Target, channel: grpc.Channel) -> None:
        self.target, self.channel = target, channel

    def check(self, inp: Input) -> None:
        _, found = check(self.target, self.channel, inp, timeout=10.0, block_deadline=BLOCK_DEADLINE)
        found = [f for f in found if not f.startswith("known:")]  # See fuzz_grpc's Target.known.
        assert not found, (found, inp.show())


@pytest.fixture(scope="module")
def fuzzed(
    broker: BrokerProcess, stub: pb_grpc.JournalStub, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fuzzed]:
    """A consumer of the module's broker, whose journals the fuzzed shards may read."""
    prepare_journals(stub)
    with consuming(tmp_path_factory.mktemp("consumer"), broker, etcd_endpoint) as consumer:
        with grpc.insecure_channel(consumer.url.removeprefix("http://")) as channel:
            yield Fuzzed(consumer_target(consumer), channel)
            reset_shards(channel)


METHODS = pytest.mark.parametrize("method", SHARD_METHODS, ids=[m.descriptor.name for m in SHARD_METHODS])


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


def test_applies_that_change_nothing_answer(fuzzed: Fuzzed, stub: pb_grpc.JournalStub) -> None:
    # An Apply of no changes, or deleting what is absent, commits at etcd's last revision, which was
    # here a write under the other process's root: each process's keyspace mirror waited for an
    # event that never came (fuzzing found it), until it learnt to ask etcd for its watch's progress.
    shard_stub = cpb_grpc.ShardStub(fuzzed.channel)
    for _ in range(2):
        assert stub.Apply(bpb.ApplyRequest(changes=[bpb.ApplyRequest.Change(
            upsert=journal_spec("fuzz/nothing"), expect_mod_revision=-1)]), timeout=10).status == bpb.OK
        assert shard_stub.Apply(cpb.ApplyRequest(), timeout=5).status == cpb.OK
        delete = cpb.ApplyRequest.Change(delete="fuzz-absent", expect_mod_revision=-1)
        assert shard_stub.Apply(cpb.ApplyRequest(changes=[delete]), timeout=5).status == cpb.OK

        spec = cpb.ShardSpec(id="fuzz-nothing", disable=True, max_txn_duration=Duration(seconds=1))
        upsert = cpb.ApplyRequest.Change(upsert=spec, expect_mod_revision=-1)
        assert shard_stub.Apply(cpb.ApplyRequest(changes=[upsert]), timeout=10).status == cpb.OK
        assert stub.Apply(bpb.ApplyRequest(), timeout=5).status == bpb.OK
        absent = bpb.ApplyRequest.Change(delete="fuzz/absent", expect_mod_revision=-1)
        assert stub.Apply(bpb.ApplyRequest(changes=[absent]), timeout=5).status == bpb.OK


def test_stat_of_a_failed_shard_is_shard_stopped_at_once(fuzzed: Fuzzed) -> None:
    # Gazette's resolver answers SHARD_STOPPED for a primary whose store will never be ready (a
    # FAILED replica, `TestResolverErrorCases`). Stat waits for a hand-off to resolve again, but a
    # FAILED primary's route does not change until it is unassigned: it answers at once (it did so
    # only at the caller's deadline, 60 s without one, before fuzzing found it).
    shard_stub = cpb_grpc.ShardStub(fuzzed.channel)
    spec = cpb.ShardSpec(id="fuzz-failing", sources=[cpb.ShardSpec.Source(journal="fuzz/target")],
                         recovery_log_prefix="fuzz/no-such-recovery-log", hint_prefix="/fuzz/hints",
                         max_txn_duration=Duration(seconds=1))
    upsert = cpb.ApplyRequest.Change(upsert=spec, expect_mod_revision=-1)
    assert shard_stub.Apply(cpb.ApplyRequest(changes=[upsert]), timeout=10).status == cpb.OK
    selector = bpb.LabelSelector(include=bpb.LabelSet(labels=[bpb.Label(name="id", value="fuzz-failing")]))
    deadline = time.monotonic() + 30
    while True:
        [listed] = shard_stub.List(cpb.ListRequest(selector=selector), timeout=10).shards
        if listed.status and listed.status[0].code == cpb.ReplicaStatus.FAILED:
            break
        assert time.monotonic() < deadline, listed
        time.sleep(0.1)
    try:
        # "At once": well inside a deadline that a Stat waiting for the hand-off would run out (a loaded
        # host's round trip and the resolution take a fraction of it).
        resp = shard_stub.Stat(cpb.StatRequest(shard="fuzz-failing"), timeout=15)
    finally:
        delete = cpb.ApplyRequest.Change(delete="fuzz-failing", expect_mod_revision=-1)
        shard_stub.Apply(cpb.ApplyRequest(changes=[delete]), timeout=10)
    assert resp.status == cpb.SHARD_STOPPED
