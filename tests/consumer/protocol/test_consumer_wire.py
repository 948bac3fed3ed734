"""Wire facts of the consumer protocol that Gazette's own schema relies on."""

from __future__ import annotations

import struct

from consumer.protocol import pb, pb_grpc, recoverylog_pb


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _old_source(read_through: int, producer: bytes, last_ack: int, begin: int) -> bytes:
    """Checkpoint.Source as Gazette encoded it before ProducerEntry: map<string, ProducerState> producers = 2."""
    state = _varint(1 << 3 | 1) + struct.pack("<Q", last_ack) + _varint(2 << 3) + _varint(begin)
    entry = _field(1, producer) + _field(2, state)
    return _varint(1 << 3) + _varint(read_through) + _field(2, entry)


def test_producer_entries_decode_the_old_map_encoding() -> None:
    """Gazette's TestProducerIDMapRegression fixture, encoded as the old map<string, ProducerState>."""
    raw = (
        _field(1, _field(1, b"bar") + _field(2, _old_source(222, bytes.fromhex("aabbccddeeff"), 789, 101)))
        + _field(1, _field(1, b"foo") + _field(2, _old_source(111, bytes.fromhex("010203040506"), 456, 789)))
        + _field(2, _field(1, b"baz") + _field(2, b"intent"))
        + _field(2, _field(1, b"bing") + _field(2, b"other-intent"))
    )
    cp = pb.Checkpoint.FromString(raw)
    assert cp.sources["foo"].read_through == 111
    assert cp.sources["bar"].read_through == 222
    (foo,) = cp.sources["foo"].producers
    assert (foo.id, foo.state.last_ack, foo.state.begin) == (bytes.fromhex("010203040506"), 456, 789)
    (bar,) = cp.sources["bar"].producers
    assert (bar.id, bar.state.last_ack, bar.state.begin) == (bytes.fromhex("aabbccddeeff"), 789, 101)
    assert dict(cp.ack_intents) == {"baz": b"intent", "bing": b"other-intent"}


def test_field_numbers_follow_gazette() -> None:
    spec = pb.ShardSpec.DESCRIPTOR.fields_by_name
    assert {name: f.number for name, f in spec.items()} == {
        "id": 1, "sources": 2, "recovery_log_prefix": 3, "hint_prefix": 4, "hint_backups": 5,
        "max_txn_duration": 6, "min_txn_duration": 7, "disable": 8, "hot_standbys": 9, "labels": 10,
        "disable_wait_for_ack": 11, "ring_buffer_size": 12, "read_channel_size": 13,
    }
    assert {n: f.number for n, f in pb.ShardSpec.Source.DESCRIPTOR.fields_by_name.items()} == {
        "journal": 1, "min_offset": 3,
    }
    assert pb.ConsumerSpec.DESCRIPTOR.fields_by_name["exiting"].number == 3
    assert pb.ListResponse.Shard.DESCRIPTOR.fields_by_name["create_revision"].number == 5
    hints_type = pb.ApplyRequest.Change.DESCRIPTOR.fields_by_name["primary_hints"].message_type
    assert hints_type is not None and hints_type.full_name == "recoverylog.FSMHints"
    for msg in (pb.ListRequest, pb.ListResponse, pb.ApplyRequest, pb.ApplyResponse, pb.StatRequest,
                pb.StatResponse, pb.GetHintsRequest, pb.GetHintsResponse):
        assert msg.DESCRIPTOR.fields_by_name["extension"].number == 100
    for unassign in (pb.UnassignRequest, pb.UnassignResponse):
        assert "extension" not in unassign.DESCRIPTOR.fields_by_name
    assert [v.number for v in pb.ReplicaStatus.Code.DESCRIPTOR.values] == [0, 100, 200, 300, 400]
    assert pb.Status.Name(pb.SHARD_STOPPED) == "SHARD_STOPPED" and pb.SHARD_STOPPED == 5
    assert pb.DESCRIPTOR.services_by_name["Shard"].full_name == "consumer.Shard"
    assert hasattr(pb_grpc, "add_ShardServicer_to_server")


def test_recorded_op_fixture_size() -> None:
    """`recorder.go`'s wire format: Create{"/path/to/file"} with seq 1, checksum 0, author 1234 is 24 bytes."""
    op = recoverylog_pb.RecordedOp(seq_no=1, checksum=0, author=1234)
    op.create.path = "/path/to/file"
    assert len(op.SerializeToString()) == 24
