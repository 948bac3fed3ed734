"""Consumer validation rules and exact error texts, following Gazette's Go test tables.

(Named apart from tests/broker/protocol/test_validation.py: equal test basenames collide under
pytest's default import mode.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from broker.protocol import labels as lbl
from broker.protocol import pb as bpb
from broker.protocol.validation import ValidationError
from consumer.protocol import pb, recoverylog_pb
from consumer.protocol import validation as v


def expect_error(fn: Callable[[Any], None], arg: Any, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        fn(arg)
    assert str(info.value) == message


def ls(*nv: str) -> bpb.LabelSet:
    return lbl.label_set(*zip(nv[::2], nv[1::2], strict=True))


def header() -> bpb.Header:
    return bpb.Header(
        process_id=bpb.ProcessSpec.ID(zone="zone", suffix="name"),
        route=bpb.Route(primary=0, members=[bpb.ProcessSpec.ID(zone="zone", suffix="name")]),
        etcd=bpb.Header.Etcd(cluster_id=12, member_id=34, revision=56, raft_term=78),
    )


def valid_spec(shard_id: str = "a-shard-id") -> pb.ShardSpec:
    spec = pb.ShardSpec(
        id=shard_id,
        sources=[pb.ShardSpec.Source(journal="journal/1"), pb.ShardSpec.Source(journal="journal/2")],
        recovery_log_prefix="recovery/logs",
        hint_prefix="/rooted/path",
        hint_backups=2,
    )
    spec.max_txn_duration.FromNanoseconds(1)
    return spec


def segment(**kw: Any) -> recoverylog_pb.Segment:
    fields: dict[str, Any] = dict(
        author=0xFEFE, first_seq_no=10, first_checksum=0xABAB, first_offset=0, last_seq_no=10,
        last_offset=1, log="a/log",
    )
    fields.update(kw)
    return recoverylog_pb.Segment(**fields)


# ShardID (Gazette TestShardValidationCases).


@pytest.mark.parametrize("shard_id, message", [
    ("not-$%|-a-token", "not a valid token (not-$%|-a-token)"),
    ("", "invalid length (0; expected 4 <= length <= 512)"),
    ("zz", "invalid length (2; expected 4 <= length <= 512)"),
    ("x" * 513, "invalid length (513; expected 4 <= length <= 512)"),
    ("has=equals", "not a valid token (has=equals)"),
    ("a shard", "not a valid token (a shard)"),
])
def test_shard_id_errors(shard_id: str, message: str) -> None:
    expect_error(v.validate_shard_id, shard_id, message)


@pytest.mark.parametrize("shard_id", ["a-valid-shard", "a/b.c+d_e", "ünïcödé-1", "x" * 512])
def test_shard_id_valid(shard_id: str) -> None:
    v.validate_shard_id(shard_id)


# ShardSpec (Gazette TestShardSpecValidationCases: each fix reveals the next error).


def test_shard_spec_checks_in_order() -> None:
    spec = pb.ShardSpec(
        id="bad id",
        sources=[pb.ShardSpec.Source(journal="journal 2"), pb.ShardSpec.Source(journal="journal/1", min_offset=-1)],
        recovery_log_prefix="bad prefix",
        hint_prefix="not empty",
        hint_backups=-1,
        labels=bpb.LabelSet(labels=[bpb.Label(name="bad label", value="value")]),
    )
    spec.min_txn_duration.FromNanoseconds(-1)
    check = v.validate_shard_spec

    expect_error(check, spec, "Id: not a valid token (bad id)")
    spec.id = "a-shard-id"
    expect_error(check, spec, "RecoveryLogPrefix: not a valid token (bad prefix/a-shard-id)")
    spec.recovery_log_prefix = ""
    expect_error(check, spec, "invalid non-empty HintPrefix with empty RecoveryLogPrefix (not empty)")
    spec.hint_prefix, spec.recovery_log_prefix = "", "recovery/logs"
    expect_error(check, spec, "HintPrefix is not an absolute, clean, non-directory path ()")
    for bad in ("relative/path", "/rooted/dir/", "/rooted//path", "/rooted/./path", "/a/../b"):
        spec.hint_prefix = bad
        expect_error(check, spec, f"HintPrefix is not an absolute, clean, non-directory path ({bad})")
    spec.hint_prefix = "/rooted/path"
    expect_error(check, spec, "invalid HintBackups (-1; expected >= 0)")
    spec.hint_backups = 2
    expect_error(check, spec, "invalid MinTxnDuration (-1; expected >= 0)")
    spec.ClearField("min_txn_duration")
    expect_error(check, spec, "invalid MaxTxnDuration (0; expected > 0)")
    spec.max_txn_duration.FromNanoseconds(1)
    expect_error(check, spec, "LabelSet.Labels[0].Name: not a valid token (bad label)")
    spec.labels.CopyFrom(ls(lbl.INSTANCE, "a", lbl.INSTANCE, "b"))
    expect_error(
        check, spec,
        f"LabelSet: expected single-value Label has multiple values (index 1; label {lbl.INSTANCE} value b)",
    )
    spec.labels.CopyFrom(ls("id", "an-id"))
    expect_error(check, spec, 'Labels cannot include label "id"')
    spec.labels.CopyFrom(ls("id", ""))  # Rejected even when empty.
    expect_error(check, spec, 'Labels cannot include label "id"')
    spec.labels.CopyFrom(ls(lbl.INSTANCE, "an-instance", lbl.MANAGED_BY, "a-tool"))

    expect_error(check, spec, "Sources[0].Journal: not a valid token (journal 2)")
    spec.sources[0].journal = "journal/2"
    expect_error(check, spec, "Sources[1]: invalid MinOffset (-1; expected > 0)")
    spec.sources[1].min_offset = 1024
    expect_error(check, spec, "Sources.Journal not in unique, sorted order (index 1; journal/1 <= journal/2)")
    first, second = pb.ShardSpec.Source(), pb.ShardSpec.Source()
    first.CopyFrom(spec.sources[1])
    second.CopyFrom(spec.sources[0])
    del spec.sources[:]
    spec.sources.extend([first, second])

    check(spec)


def test_shard_spec_duplicate_sources_are_unsorted() -> None:
    spec = valid_spec()
    spec.sources[1].journal = "journal/1"
    expect_error(
        v.validate_shard_spec, spec, "Sources.Journal not in unique, sorted order (index 1; journal/1 <= journal/1)"
    )


def test_shard_spec_without_recovery_log_needs_no_hints() -> None:
    spec = valid_spec()
    spec.recovery_log_prefix = spec.hint_prefix = ""
    v.validate_shard_spec(spec)
    spec.hint_prefix = "/"  # Go's path rules: "/" is absolute, clean, and its Base is "/".
    expect_error(v.validate_shard_spec, spec, "invalid non-empty HintPrefix with empty RecoveryLogPrefix (/)")
    spec.recovery_log_prefix = "recovery/logs"
    v.validate_shard_spec(spec)


def test_shard_spec_durations_must_fit_go() -> None:
    spec = valid_spec()
    spec.max_txn_duration.FromSeconds(10**10)
    expect_error(
        v.validate_shard_spec, spec,
        f"invalid MaxTxnDuration ({10**19}; expected <= 9223372036854775807)",
    )
    spec.max_txn_duration.FromSeconds(1)
    spec.min_txn_duration.FromSeconds(10**10)
    expect_error(
        v.validate_shard_spec, spec,
        f"invalid MinTxnDuration ({10**19}; expected <= 9223372036854775807)",
    )


def test_shard_spec_recovery_log_of_long_prefix() -> None:
    spec = valid_spec()
    spec.recovery_log_prefix = "p" * 510
    expect_error(
        v.validate_shard_spec, spec, "RecoveryLogPrefix: invalid length (521; expected 4 <= length <= 512)"
    )


# ConsumerSpec (Gazette TestConsumerSpecValidationCases).


def test_consumer_spec() -> None:
    spec = pb.ConsumerSpec(
        process_spec=bpb.ProcessSpec(id=bpb.ProcessSpec.ID(zone="not valid", suffix="name"), endpoint="http://foo"),
        shard_limit=5,
    )
    expect_error(v.validate_consumer_spec, spec, "Id.Zone: not a valid token (not valid)")
    spec.process_spec.id.zone = "zone"
    spec.process_spec.endpoint = "foo"
    expect_error(v.validate_consumer_spec, spec, "Endpoint: not absolute: foo")
    spec.process_spec.endpoint = "http://foo"
    v.validate_consumer_spec(spec)
    spec.exiting = True
    v.validate_consumer_spec(spec)


# ReplicaStatus and Status.


def test_replica_status() -> None:
    status = pb.ReplicaStatus(code=pb.ReplicaStatus.FAILED)
    expect_error(v.validate_replica_status, status, "expected non-empty Errors with Code FAILED")
    status.errors.append("an error")
    v.validate_replica_status(status)
    status.code = pb.ReplicaStatus.PRIMARY
    expect_error(v.validate_replica_status, status, "expected Code FAILED with non-empty Errors")
    status.code = 7  # type: ignore[assignment]
    expect_error(v.validate_replica_status, status, "Code: invalid code (7)")
    for code in (pb.ReplicaStatus.IDLE, pb.ReplicaStatus.BACKFILL, pb.ReplicaStatus.STANDBY):
        v.validate_replica_status(pb.ReplicaStatus(code=code))


def test_status() -> None:
    expect_error(v.validate_status, 6, "invalid status (6)")
    for status in pb.Status.values():
        v.validate_status(status)


# Offsets and Checkpoint.


def test_offsets() -> None:
    v.validate_offsets({"a/journal": 0, "b/journal": 10})
    expect_error(
        v.validate_offsets, {"a/journal": 0, "b/journal": -1}, "Offsets[b/journal]: invalid offset (-1; expected >= 0)"
    )
    expect_error(v.validate_offsets, {"bad journal": 1}, "Offsets[bad journal]: not a valid token (bad journal)")


def test_checkpoint() -> None:
    cp = pb.Checkpoint()
    v.validate_checkpoint(cp)
    cp.sources["a/journal"].read_through = 100
    entry = cp.sources["a/journal"].producers.add(id=bytes(6))
    entry.state.last_ack = 160
    entry.state.begin = -1
    cp.ack_intents["b/journal"] = b"intent"
    v.validate_checkpoint(cp)

    entry.state.begin = -2
    expect_error(v.validate_checkpoint, cp, "Sources[a/journal].Producers[0]: invalid Begin (-2; expected >= -1)")
    entry.state.begin = 0
    entry.id = b"short"
    expect_error(v.validate_checkpoint, cp, "Sources[a/journal].Producers[0]: invalid Id length (5; expected 6)")
    entry.id = bytes(6)
    cp.sources["a/journal"].read_through = -1
    expect_error(v.validate_checkpoint, cp, "Sources[a/journal]: invalid ReadThrough (-1; expected >= 0)")
    cp.sources["a/journal"].read_through = 0
    cp.sources["bad journal"].read_through = 1
    expect_error(v.validate_checkpoint, cp, "Sources[bad journal]: not a valid token (bad journal)")
    del cp.sources["bad journal"]
    cp.ack_intents["/abs"] = b"x"
    expect_error(v.validate_checkpoint, cp, "AckIntents[/abs]: cannot begin with '/' (/abs)")


# Recovery log hints (Gazette TestSegmentValidationCases, FSMHints.Validate).


@pytest.mark.parametrize("change, message", [
    ({"author": 0}, "Author is zero"),
    ({"first_seq_no": 0}, "FirstSeqNo <= 0"),
    ({"first_seq_no": -1}, "FirstSeqNo <= 0"),
    ({"first_offset": -1}, "FirstOffset < 0"),
    ({"last_seq_no": 9}, "LastSeqNo < segment.FirstSeqNo"),
    ({"first_offset": 100, "last_offset": 99}, "LastOffset <= segment.FirstOffset"),
    ({"log": ""}, "Log: invalid length (0; expected 4 <= length <= 512)"),
])
def test_segment_errors(change: dict[str, Any], message: str) -> None:
    v.validate_segment(segment())
    expect_error(v.validate_segment, segment(**change), message)


def test_segment_last_offset_may_be_zero() -> None:
    v.validate_segment(segment(last_offset=0))


def test_fsm_hints() -> None:
    hints = recoverylog_pb.FSMHints(
        log="a/log",
        live_nodes=[recoverylog_pb.FnodeSegments(fnode=10, segments=[segment(log="")])],
    )
    v.validate_fsm_hints(hints)
    assert hints.live_nodes[0].segments[0].log == ""  # The implied log is not written back.
    hints.live_nodes[0].segments[0].log = "a/log"
    expect_error(v.validate_fsm_hints, hints, "contained segment.Log duplicates FSMHints.Log")
    hints.live_nodes[0].segments[0].log = "other/log"
    v.validate_fsm_hints(hints)
    hints.live_nodes[0].segments[0].author = 0
    expect_error(v.validate_fsm_hints, hints, "Segment: Author is zero")
    hints.live_nodes[0].segments[0].author = 1
    hints.live_nodes[0].segments[0].log = ""
    hints.log = ""
    expect_error(v.validate_fsm_hints, hints, "Segment.Log: invalid length (0; expected 4 <= length <= 512)")
    v.validate_fsm_hints(recoverylog_pb.FSMHints())


# Requests and responses (Gazette rpc_extensions_test.go).


def test_stat_request() -> None:
    req = pb.StatRequest(shard="a-shard", read_through={"a/journal": 1})
    v.validate_stat_request(req)
    req.header.CopyFrom(header())
    v.validate_stat_request(req)
    req.header.etcd.cluster_id = 0
    expect_error(v.validate_stat_request, req, "Header.Etcd: invalid ClusterId (expected != 0)")
    req.ClearField("header")
    req.shard = "bad shard"
    expect_error(v.validate_stat_request, req, "Shard: not a valid token (bad shard)")
    req.shard = "a-shard"
    req.read_through["a/journal"] = -1
    expect_error(
        v.validate_stat_request, req, "ReadThrough.Offsets[a/journal]: invalid offset (-1; expected >= 0)"
    )


def test_stat_response() -> None:
    resp = pb.StatResponse(status=9, header=header(), read_through={"a/journal": 1}, publish_at={"b/journal": 2})  # type: ignore[arg-type]
    expect_error(v.validate_stat_response, resp, "Status: invalid status (9)")
    resp.status = pb.OK
    resp.header.etcd.revision = 0
    expect_error(v.validate_stat_response, resp, "Header.Etcd: invalid Revision (0; expected 0 < revision)")
    resp.header.etcd.revision = 1
    resp.read_through["bad journal"] = 1
    expect_error(
        v.validate_stat_response, resp, "ReadThrough.Offsets[bad journal]: not a valid token (bad journal)"
    )
    del resp.read_through["bad journal"]
    resp.publish_at["b/journal"] = -2
    expect_error(v.validate_stat_response, resp, "PublishAt.Offsets[b/journal]: invalid offset (-2; expected >= 0)")
    resp.publish_at["b/journal"] = 2
    v.validate_stat_response(resp)


def test_list_request() -> None:
    req = pb.ListRequest(selector=bpb.LabelSelector(include=ls("aa", "b"), exclude=ls("id", "a-shard")))
    v.validate_list_request(req)
    req.selector.include.labels[0].name = "a"
    expect_error(
        v.validate_list_request, req, "Selector.Include.Labels[0].Name: invalid length (1; expected 2 <= length <= 64)"
    )


def test_list_response() -> None:
    resp = pb.ListResponse(status=pb.OK, header=header())
    shard = resp.shards.add(spec=valid_spec(), mod_revision=1)
    shard.route.CopyFrom(header().route)
    shard.status.add(code=pb.ReplicaStatus.PRIMARY)
    v.validate_list_response(resp)

    shard.spec.id = "bad id"
    expect_error(v.validate_list_response, resp, "Shards[0].Spec.Id: not a valid token (bad id)")
    shard.spec.id = "a-shard-id"
    shard.mod_revision = 0
    expect_error(v.validate_list_response, resp, "Shards[0]: invalid ModRevision (0; expected > 0)")
    shard.mod_revision = 1
    shard.route.primary = 1
    expect_error(v.validate_list_response, resp, "Shards[0].Route: invalid Primary (1; expected -1 <= Primary < 1)")
    shard.route.primary = 0
    shard.status.add(code=pb.ReplicaStatus.STANDBY)
    expect_error(v.validate_list_response, resp, "Shards[0]: length of Route.Members and Status are not equal (1 vs 2)")
    del shard.status[1]
    shard.status[0].code = pb.ReplicaStatus.FAILED
    expect_error(v.validate_list_response, resp, "Shards[0].Status[0]: expected non-empty Errors with Code FAILED")
    shard.status[0].code = pb.ReplicaStatus.IDLE
    resp.status = 42  # type: ignore[assignment]
    expect_error(v.validate_list_response, resp, "Status: invalid status (42)")
    resp.status = pb.OK
    resp.header.etcd.member_id = 0
    expect_error(v.validate_list_response, resp, "Header.Etcd: invalid MemberId (expected != 0)")


def test_apply_request() -> None:
    req = pb.ApplyRequest(changes=[
        pb.ApplyRequest.Change(upsert=valid_spec(), expect_mod_revision=1),
        pb.ApplyRequest.Change(delete="other-shard", expect_mod_revision=1),
    ])
    v.validate_apply_request(req)
    upsert, delete = req.changes

    upsert.upsert.id = "bad id"
    expect_error(v.validate_apply_request, req, "Changes[0].Upsert.Id: not a valid token (bad id)")
    upsert.upsert.id = "a-shard-id"
    upsert.expect_mod_revision = -2
    expect_error(v.validate_apply_request, req, "Changes[0]: invalid ExpectModRevision (-2; expected >= 0 or -1)")
    for ok in (0, -1):
        upsert.expect_mod_revision = ok
        v.validate_apply_request(req)
    upsert.delete = "a-shard-id"
    expect_error(v.validate_apply_request, req, "Changes[0]: both Upsert and Delete are set (expected exactly one)")
    upsert.delete = ""

    upsert.primary_hints.log = "a/log"
    upsert.primary_hints.live_nodes.add(fnode=1, segments=[segment(log="", first_seq_no=0)])
    expect_error(v.validate_apply_request, req, "Changes[0].PrimaryHints.Segment: FirstSeqNo <= 0")
    upsert.primary_hints.live_nodes[0].segments[0].first_seq_no = 1
    v.validate_apply_request(req)

    delete.delete = "bad shard"
    expect_error(v.validate_apply_request, req, "Changes[1].Delete: not a valid token (bad shard)")
    delete.delete = "other-shard"
    delete.expect_mod_revision = 0
    expect_error(v.validate_apply_request, req, "Changes[1]: invalid ExpectModRevision (0; expected > 0 or -1)")
    delete.expect_mod_revision = -1
    v.validate_apply_request(req)
    delete.primary_hints.SetInParent()
    expect_error(v.validate_apply_request, req, "Changes[1]: hints may be set only with an upsert, not a delete")
    delete.ClearField("primary_hints")
    delete.delete = ""
    expect_error(v.validate_apply_request, req, "Changes[1]: neither Upsert nor Delete are set (expected exactly one)")


def test_apply_response() -> None:
    resp = pb.ApplyResponse(status=pb.ETCD_TRANSACTION_FAILED, header=header())
    v.validate_apply_response(resp)
    resp.header.etcd.raft_term = 0
    expect_error(v.validate_apply_response, resp, "Header.Etcd: invalid RaftTerm (expected != 0)")


def test_get_hints() -> None:
    v.validate_get_hints_request(pb.GetHintsRequest(shard="a-shard"))
    expect_error(v.validate_get_hints_request, pb.GetHintsRequest(shard="zz"),
                 "Shard: invalid length (2; expected 4 <= length <= 512)")

    resp = pb.GetHintsResponse(status=pb.OK)  # Gazette checks no Header here.
    resp.backup_hints.add()  # An absent key: no hints.
    v.validate_get_hints_response(resp)
    resp.primary_hints.hints.live_nodes.add(fnode=1, segments=[segment(author=0)])
    expect_error(v.validate_get_hints_response, resp, "primary hints.Segment: Author is zero")
    resp.primary_hints.hints.live_nodes[0].segments[0].author = 1
    v.validate_get_hints_response(resp)
    resp.backup_hints.add().hints.live_nodes.add(fnode=1, segments=[segment(last_seq_no=1)])
    expect_error(v.validate_get_hints_response, resp, "backup hints.Segment: LastSeqNo < segment.FirstSeqNo")
    resp.status = 77  # type: ignore[assignment]
    expect_error(v.validate_get_hints_response, resp, "Status: invalid status (77)")


def test_unassign() -> None:
    v.validate_unassign_request(pb.UnassignRequest(shards=["shard-a", "shard-b"], only_failed=True))
    v.validate_unassign_request(pb.UnassignRequest())
    expect_error(v.validate_unassign_request, pb.UnassignRequest(shards=["shard-a", "bad shard"]),
                 "Shards[1]: not a valid token (bad shard)")

    v.validate_unassign_response(pb.UnassignResponse(status=pb.OK, shards=["shard-a"]))
    expect_error(v.validate_unassign_response, pb.UnassignResponse(status=pb.SHARD_NOT_FOUND),
                 "bad status: SHARD_NOT_FOUND")
    expect_error(v.validate_unassign_response, pb.UnassignResponse(status=99),  # type: ignore[arg-type]
                 "Status: invalid status (99)")
