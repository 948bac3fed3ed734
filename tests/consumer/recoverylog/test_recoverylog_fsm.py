"""The recovery log FSM: Gazette's fsm_test.go fixtures, and wire fixtures of `recorded_op.proto`.

As Gazette's FSMSuite does, ops are digested over a stand-in "frame", the decimal string of a
counter bumped by every apply (failed ones too), which fixes the checksums below.
"""

from __future__ import annotations

import pytest

from consumer.protocol import recoverylog_pb
from consumer.recoverylog.errors import (
    ChecksumMismatchError,
    ExpectedHintedFnodeError,
    FnodeNotTrackedError,
    FSMError,
    HintsError,
    LinkExistsError,
    NoSuchLinkError,
    NotHintedAuthorError,
    PropertyExistsError,
    WrongSeqNoError,
)
from consumer.recoverylog.fsm import FSM, live_log_segments
from consumer.recoverylog.ops import RecordedOp, crc32c, create_op, encode_op, link_op

LOG = "a/recovery/log"
FSMHints = recoverylog_pb.FSMHints
Seg = recoverylog_pb.Segment
Node = recoverylog_pb.FnodeSegments
Prop = recoverylog_pb.Property


class Driver:
    """Applies ops to an FSM with Gazette's test "frames"."""

    def __init__(self, hints: FSMHints) -> None:
        self.fsm = FSM(hints)
        self.offset = 0

    def apply(self, op: RecordedOp) -> type[FSMError] | None:
        self.offset += 1
        op.first_offset = self.offset
        op.last_offset = self.offset + 1
        op.log = LOG
        try:
            self.fsm.apply(op, str(self.offset).encode())
        except FSMError as exc:
            return type(exc)
        return None

    def create(self, seq: int, checksum: int, author: int, path: str) -> type[FSMError] | None:
        return self.apply(RecordedOp(seq_no=seq, checksum=checksum, author=author,
                                     create=RecordedOp.Create(path=path)))

    def link(self, seq: int, checksum: int, author: int, fnode: int, path: str) -> type[FSMError] | None:
        return self.apply(RecordedOp(seq_no=seq, checksum=checksum, author=author,
                                     link=RecordedOp.Link(fnode=fnode, path=path)))

    def unlink(self, seq: int, checksum: int, author: int, fnode: int, path: str) -> type[FSMError] | None:
        return self.apply(RecordedOp(seq_no=seq, checksum=checksum, author=author,
                                     unlink=RecordedOp.Link(fnode=fnode, path=path)))

    def write(self, seq: int, checksum: int, author: int, fnode: int) -> type[FSMError] | None:
        return self.apply(RecordedOp(seq_no=seq, checksum=checksum, author=author, write=RecordedOp.Write(fnode=fnode)))

    def property(self, seq: int, checksum: int, author: int, path: str, content: str) -> type[FSMError] | None:
        return self.apply(RecordedOp(seq_no=seq, checksum=checksum, author=author,
                                     property=Prop(path=path, content=content)))


def links_of(fsm: FSM) -> dict[str, int]:
    return dict(fsm.links)


def test_wire_fixture_create_op() -> None:
    op = create_op("/path/to/file")
    op.seq_no, op.checksum, op.author = 1, 0, 1234
    frame, op_bytes = encode_op(op)
    assert len(op_bytes) == 24
    assert len(frame) == 32
    assert crc32c(op_bytes) == 0x568E8E4E
    # The checksum covers the op bytes only: not the frame header.
    assert crc32c(frame) != 0x568E8E4E


def test_real_ops_chain_checksums() -> None:
    fsm = FSM(FSMHints(log=LOG))
    op = create_op("/path/to/file")
    op.seq_no, op.checksum, op.author, op.log = 1, 0, 1234, LOG
    _, op_bytes = encode_op(op)
    fsm.apply(op, op_bytes)
    assert fsm.next_checksum == 0x568E8E4E
    nxt = link_op(1, "/other")
    nxt.seq_no, nxt.checksum, nxt.author, nxt.log = 2, 0x568E8E4E, 1234, LOG
    _, nxt_bytes = encode_op(nxt)
    fsm.apply(nxt, nxt_bytes)
    assert fsm.next_checksum == crc32c(nxt_bytes, 0x568E8E4E)
    assert fsm.links == {"/path/to/file": 1, "/other": 1}


def test_init_from_seq_no_zero() -> None:
    d = Driver(FSMHints(log=LOG))
    assert d.create(1, 0, 100, "/path/A") is None
    assert d.link(2, 0x90F599E3, 100, 1, "/path/B") is None
    assert d.fsm.next_checksum == 0x7355C460
    assert d.fsm.next_seq_no == 3
    assert d.fsm.last_log == LOG


def test_hinted_log_required() -> None:
    with pytest.raises(HintsError, match="hinted log not provided"):
        FSM(FSMHints())


def test_flattening_live_log_segments() -> None:
    hints = FSMHints(log="other/log", live_nodes=[
        Node(fnode=2, segments=[Seg(author=1, first_seq_no=2, last_seq_no=7, first_offset=200, last_offset=700,
                                    first_checksum=0x22, log=LOG)]),
        Node(fnode=4, segments=[Seg(author=1, first_seq_no=4, last_seq_no=9, first_offset=400, last_offset=901,
                                    first_checksum=0x44, log=LOG)]),
        Node(fnode=10, segments=[Seg(author=2, first_seq_no=10, last_seq_no=10, first_offset=1000, last_offset=1001,
                                     first_checksum=0x10)]),
    ])
    fnodes, segments = live_log_segments(hints)
    assert fnodes == [2, 4, 10]
    assert list(segments) == [
        Seg(author=1, first_seq_no=2, last_seq_no=9, first_offset=200, last_offset=901, first_checksum=0x22, log=LOG),
        Seg(author=2, first_seq_no=10, last_seq_no=10, first_offset=1000, last_offset=1001, first_checksum=0x10,
            log="other/log"),
    ]

    hints.live_nodes[2].segments[0].log = "whoops"
    with pytest.raises(HintsError, match=r"expected hints\.Log other/log to equal the last Segment Log whoops"):
        live_log_segments(hints)

    hints.live_nodes.add(fnode=13, segments=[Seg(first_seq_no=14)])
    with pytest.raises(HintsError, match="expected Fnode to match Segment FirstSeqNo: "):
        live_log_segments(hints)

    hints.live_nodes[1].segments[0].author = 3
    with pytest.raises(HintsError, match="expected Segment Author equality: "):
        FSM(hints)

    first, second = FSMHints(), FSMHints()
    first.CopyFrom(hints)
    second.live_nodes.extend([first.live_nodes[1], first.live_nodes[0]])
    with pytest.raises(HintsError, match="expected monotonic Fnode ordering: "):
        live_log_segments(second)


def test_initialization_from_hints() -> None:
    hints = FSMHints(
        log=LOG,
        live_nodes=[Node(fnode=42, segments=[Seg(author=100, first_checksum=0xFEEDBEEF, first_offset=1234,
                                                 first_seq_no=42, last_seq_no=43)])],
        properties=[Prop(path="/IDENTITY", content="foo-bar-baz")],
    )
    d = Driver(hints)
    assert d.fsm.hinted_segments[0].first_offset == 1234
    assert d.fsm.next_checksum == 0xFEEDBEEF
    assert d.fsm.next_seq_no == 42
    assert d.fsm.last_log == LOG
    assert d.fsm.properties == {"/IDENTITY": "foo-bar-baz"}

    d.offset = 1234
    assert d.create(41, 0xFEEDBEEF, 100, "/path/A") is WrongSeqNoError
    assert d.create(42, 0xFEEDBEEF, 100, "/path/A") is None
    assert d.link(43, 0xC132D1D7, 100, 42, "/path/B") is None

    hints.live_nodes[0].segments[0].first_offset = 1236
    hints.live_nodes[0].segments[0].last_offset = 1238
    assert d.fsm.build_hints(LOG) == hints
    assert not d.fsm.has_remaining_hints()


def test_fnode_creation() -> None:
    d = Driver(FSMHints(log=LOG, properties=[Prop(path="/property/path", content="content")]))
    d.fsm.next_seq_no, d.fsm.next_checksum = 42, 0xFEEDBEEF
    assert d.create(42, 0xFEEDBEEF, 100, "/path/A") is None
    assert d.create(43, 0x2D28E063, 100, "/another/path") is None
    assert d.create(44, 0xF11E2261, 100, "/path/A") is LinkExistsError
    assert d.create(44, 0xF11E2261, 100, "/property/path") is PropertyExistsError
    assert d.create(44, 0xF11E2261, 100, "/path/B") is None
    assert links_of(d.fsm) == {"/path/A": 42, "/another/path": 43, "/path/B": 44}
    assert {f: (n.links, n.segments) for f, n in d.fsm.live_nodes.items()} == {
        42: ({"/path/A"}, [Seg(author=100, first_seq_no=42, first_offset=1, first_checksum=0xFEEDBEEF,
                               last_seq_no=42, last_offset=2, log=LOG)]),
        43: ({"/another/path"}, [Seg(author=100, first_seq_no=43, first_offset=2, first_checksum=0x2D28E063,
                                     last_seq_no=43, last_offset=3, log=LOG)]),
        44: ({"/path/B"}, [Seg(author=100, first_seq_no=44, first_offset=5, first_checksum=0xF11E2261,
                               last_seq_no=44, last_offset=6, log=LOG)]),
    }


def _two_hinted_fnodes() -> FSMHints:
    return FSMHints(log=LOG, live_nodes=[
        Node(fnode=42, segments=[Seg(author=100, first_checksum=0xFEEDBEEF, first_offset=1234, first_seq_no=42,
                                     last_seq_no=100)]),
        Node(fnode=44, segments=[Seg(author=100, first_checksum=0xF11E2261, first_offset=1234, first_seq_no=44,
                                     last_seq_no=100)]),
    ])


def test_fnode_creation_not_hinted() -> None:
    d = Driver(_two_hinted_fnodes())
    d.fsm.next_seq_no, d.fsm.next_checksum = 42, 0xFEEDBEEF
    assert d.create(42, 0xFEEDBEEF, 100, "/path/A") is None
    assert d.create(43, 0x2D28E063, 100, "/another/path") is FnodeNotTrackedError
    assert d.create(44, 0xF11E2261, 100, "/final/path") is None
    assert links_of(d.fsm) == {"/path/A": 42, "/final/path": 44}
    assert d.fsm.live_nodes[44].segments == [Seg(author=100, first_seq_no=44, first_offset=3,
                                                 first_checksum=0xF11E2261, last_seq_no=44, last_offset=4, log=LOG)]


def test_hinted_fnode_not_created() -> None:
    d = Driver(_two_hinted_fnodes())
    assert d.create(42, 0xFEEDBEEF, 100, "/path/A") is None
    assert d.write(43, d.fsm.next_checksum, 100, 42) is None
    assert d.write(44, d.fsm.next_checksum, 100, 42) is ExpectedHintedFnodeError


def test_fnode_linking() -> None:
    d = Driver(FSMHints(log="empty/log"))
    d.fsm.next_seq_no, d.fsm.next_checksum = 42, 0xFEEDBEEF
    assert d.create(42, 0xFEEDBEEF, 100, "/existing/path") is None
    assert d.create(43, 0x2D28E063, 100, "/source/path") is None
    assert d.link(44, 0xF11E2261, 100, 42, "/target/one") is None
    assert d.property(45, 0xE292E757, 100, "/property/path", "content") is None
    assert d.link(46, 0x2009A120, 100, 43, "/existing/path") is LinkExistsError
    assert d.link(46, 0x2009A120, 100, 15, "/existing/path") is LinkExistsError
    assert d.link(46, 0x2009A120, 100, 44, "/property/path") is PropertyExistsError
    # An unknown Fnode: not tracked, yet the seq_no and checksum step on.
    assert d.link(46, 0x2009A120, 100, 15, "/target/two") is FnodeNotTrackedError
    assert d.link(47, 0xC8DAC550, 200, 43, "/target/two") is None
    assert links_of(d.fsm) == {"/existing/path": 42, "/source/path": 43, "/target/one": 42, "/target/two": 43}
    assert d.fsm.live_nodes[42].segments == [Seg(author=100, first_seq_no=42, first_offset=1,
                                                 first_checksum=0xFEEDBEEF, last_seq_no=44, last_offset=4, log=LOG)]
    assert d.fsm.live_nodes[43].segments == [
        Seg(author=100, first_seq_no=43, first_offset=2, first_checksum=0x2D28E063, last_seq_no=43, last_offset=3,
            log=LOG),
        Seg(author=200, first_seq_no=47, first_offset=9, first_checksum=0xC8DAC550, last_seq_no=47, last_offset=10,
            log=LOG),
    ]
    assert d.fsm.properties == {"/property/path": "content"}


def test_fnode_unlinking() -> None:
    d = Driver(FSMHints(log="empty/log"))
    d.fsm.next_seq_no, d.fsm.next_checksum = 42, 0xFEEDBEEF
    assert d.create(42, 0xFEEDBEEF, 100, "/path/A") is None
    assert d.create(43, 0x2D28E063, 100, "/another/path") is None
    assert d.link(44, 0xF11E2261, 200, 43, "/link/one") is None
    assert len(d.fsm.links) == 3
    assert d.unlink(45, 0xE292E757, 200, 43, "/does/not/exist") is NoSuchLinkError
    assert d.unlink(45, 0xE292E757, 200, 42, "/another/path") is NoSuchLinkError
    assert d.unlink(45, 0xE292E757, 200, 15, "/some/path") is FnodeNotTrackedError
    assert d.unlink(46, 0xC132D1D7, 200, 43, "/another/path") is None
    assert links_of(d.fsm) == {"/path/A": 42, "/link/one": 43}
    assert d.fsm.live_nodes[43].links == {"/link/one"}
    assert d.fsm.build_hints(LOG) == FSMHints(log=LOG, live_nodes=[
        Node(fnode=42, segments=[Seg(author=0x64, first_seq_no=42, first_offset=1, first_checksum=0xFEEDBEEF,
                                     last_seq_no=42, last_offset=2)]),
        Node(fnode=43, segments=[
            Seg(author=0x64, first_seq_no=43, first_offset=2, first_checksum=0x2D28E063, last_seq_no=43,
                last_offset=3),
            Seg(author=0xC8, first_seq_no=44, first_offset=3, first_checksum=0xF11E2261, last_seq_no=46,
                last_offset=8),
        ]),
    ])
    assert d.unlink(47, 0xB18CC99A, 200, 43, "/link/one") is None
    assert links_of(d.fsm) == {"/path/A": 42}
    assert d.create(48, 0x11BC1AC9, 300, "/other/path") is None
    assert d.unlink(49, 0xA102803E, 300, 42, "/path/A") is None
    assert d.fsm.build_hints(LOG) == FSMHints(log=LOG, live_nodes=[
        Node(fnode=48, segments=[Seg(author=0x12C, first_seq_no=48, first_offset=9, first_checksum=0x11BC1AC9,
                                     last_seq_no=48, last_offset=10)]),
    ])
    assert d.unlink(50, 0xA40DAEE4, 400, 48, "/other/path") is None
    assert d.fsm.links == {}
    assert d.fsm.live_nodes == {}
    assert d.fsm.build_hints(LOG) == FSMHints(log=LOG)


def test_property_updates() -> None:
    d = Driver(FSMHints(log=LOG, properties=[Prop(path="/a/property", content="content")]))
    d.fsm.next_seq_no, d.fsm.next_checksum = 42, 0xFEEDBEEF
    assert d.create(42, 0xFEEDBEEF, 100, "/a/path") is None
    assert d.property(43, 0x2D28E063, 100, "/another/property", "other-content") is None
    assert d.fsm.properties == {"/a/property": "content", "/another/property": "other-content"}
    assert d.property(44, 0xF11E2261, 100, "/a/path", "bad") is LinkExistsError
    assert d.property(44, 0xF11E2261, 100, "/a/property", "update") is PropertyExistsError
    assert d.fsm.properties == {"/a/property": "content", "/another/property": "other-content"}


def test_fnode_writes() -> None:
    d = Driver(FSMHints(log=LOG))
    d.fsm.next_seq_no, d.fsm.next_checksum = 42, 0xFEEDBEEF
    assert d.create(42, 0xFEEDBEEF, 100, "/path/A") is None
    assert d.write(43, 0x2D28E063, 100, 42) is None
    assert d.write(44, 0xF11E2261, 100, 42) is None
    assert d.write(45, 0xE292E757, 100, 15) is FnodeNotTrackedError
    assert d.write(46, 0x2009A120, 100, 42) is None
    assert d.fsm.build_hints(LOG) == FSMHints(log=LOG, live_nodes=[
        Node(fnode=42, segments=[Seg(author=0x64, first_seq_no=42, first_offset=1, first_checksum=0xFEEDBEEF,
                                     last_seq_no=46, last_offset=6)]),
    ])


def test_wrong_seq_no_and_checksum_leave_the_fsm_unchanged() -> None:
    d = Driver(FSMHints(log=LOG))
    assert d.create(2, 0, 100, "/a") is WrongSeqNoError
    assert d.create(1, 0x1234, 100, "/a") is ChecksumMismatchError
    assert (d.fsm.next_seq_no, d.fsm.next_checksum, d.fsm.links) == (1, 0, {})
    op = RecordedOp(seq_no=1, checksum=5, author=100, create=RecordedOp.Create(path="/a"), log=LOG, first_offset=77)
    with pytest.raises(ChecksumMismatchError) as info:
        d.fsm.apply(op, b"x")
    assert (info.value.log, info.value.offset, info.value.seq_no, info.value.author) == (LOG, 77, 1, 100)
    assert "seq_no 1" in str(info.value) and LOG in str(info.value)


def test_use_of_hinted_authors() -> None:
    hints = FSMHints(log=LOG, live_nodes=[
        Node(fnode=42, segments=[
            Seg(author=100, first_offset=2, first_seq_no=42, last_seq_no=42, last_offset=3),
            Seg(author=200, first_offset=5, first_seq_no=44, last_seq_no=44, last_offset=6),
            Seg(author=300, first_offset=8, first_seq_no=45, last_seq_no=45, last_offset=9),
        ]),
        Node(fnode=46, segments=[Seg(author=400, first_offset=11, first_seq_no=46, last_seq_no=47, last_offset=13)]),
    ])
    d = Driver(hints)
    assert d.create(42, 0, 666, "/evil/path") is NotHintedAuthorError
    assert d.create(42, 0, 100, "/good/path") is None
    assert d.write(43, d.fsm.next_checksum, 100, 42) is NotHintedAuthorError
    assert d.write(43, d.fsm.next_checksum, 200, 15) is WrongSeqNoError
    assert d.write(44, 0, 200, 42) is None  # The checksum was reset to the next segment's.
    assert d.write(45, d.fsm.next_checksum, 200, 42) is NotHintedAuthorError
    assert d.write(45, d.fsm.next_checksum, 666, 42) is NotHintedAuthorError
    assert d.write(45, 0, 300, 42) is None
    assert d.write(46, d.fsm.next_checksum, 300, 42) is NotHintedAuthorError
    assert d.write(46, d.fsm.next_checksum, 666, 42) is NotHintedAuthorError
    assert d.create(46, 0, 400, "/another/path") is None
    assert d.write(47, d.fsm.next_checksum, 400, 46) is None
    assert list(d.fsm.build_hints(LOG).live_nodes) == list(hints.live_nodes)
    # The hinted range is done: any author may go on.
    assert d.unlink(48, d.fsm.next_checksum, 666, 42, "/good/path") is None
    assert d.write(49, d.fsm.next_checksum, 666, 46) is None
    assert d.fsm.build_hints(LOG) == FSMHints(log=LOG, live_nodes=[Node(fnode=46, segments=[
        Seg(author=400, first_seq_no=46, first_offset=11, last_seq_no=47, last_offset=13),
        Seg(author=666, first_seq_no=49, first_offset=14, first_checksum=0x1CAB6124, last_seq_no=49, last_offset=15),
    ])])


def test_hints_round_trip() -> None:
    d = Driver(FSMHints(log=LOG))
    assert d.create(1, 0, 100, "/a") is None
    assert d.link(2, d.fsm.next_checksum, 100, 1, "/b") is None
    assert d.create(3, d.fsm.next_checksum, 200, "/c") is None
    assert d.write(4, d.fsm.next_checksum, 200, 1) is None
    assert d.property(5, d.fsm.next_checksum, 200, "/IDENTITY", "id") is None
    hints = d.fsm.build_hints(LOG)
    again = FSM(hints)
    assert again.next_seq_no == 1 and again.next_checksum == 0
    assert again.properties == {"/IDENTITY": "id"}
    assert again.hinted_fnodes == [1, 3]
    # Replaying the same ops through the hinted FSM rebuilds the same hints.
    replay = Driver(hints)
    assert replay.create(1, 0, 100, "/a") is None
    assert replay.link(2, replay.fsm.next_checksum, 100, 1, "/b") is None
    assert replay.create(3, replay.fsm.next_checksum, 200, "/c") is None
    assert replay.write(4, replay.fsm.next_checksum, 200, 1) is None
    assert not replay.fsm.has_remaining_hints()
    assert replay.fsm.build_hints(LOG) == hints
    assert replay.fsm.links == d.fsm.links
