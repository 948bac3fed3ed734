"""The recovery log FSM (Gazette's `consumer/recoverylog/fsm.go`).

The FSM applies RecordedOps in order, checking each op's seq_no and checksum, so only a linear,
consistent history is applied. It tracks the live Fnodes (a file across its links and renames,
named by the seq_no of the op that created it), their links, the properties, and for each live
Fnode the log segments holding its ops, from which `build_hints` makes FSMHints.

An FSM made from hints replays only the hinted history: ops of other authors where a hinted
segment is expected are refused (NotHintedAuthorError), creates of Fnodes the hints do not list
transition without tracking the Fnode (FnodeNotTrackedError), and when a hinted segment is
exhausted the FSM jumps to the next one's first seq_no and checksum.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    SegmentError,
    WrongSeqNoError,
)
from consumer.recoverylog.ops import RecordedOp, crc32c
from consumer.recoverylog.segments import Segment, SegmentSet, copy_segment

FSMHints = recoverylog_pb.FSMHints


@dataclass
class FnodeState:
    """A live Fnode: its current links (paths), and the ordered log segments holding its ops."""

    links: set[str] = field(default_factory=set)
    segments: list[Segment] = field(default_factory=list)


def live_log_segments(hints: FSMHints) -> tuple[list[int], SegmentSet]:
    """The hinted Fnodes (ascending) and the SegmentSet of all their segments, with an empty
    segment log read as `hints.log`. Raises HintsError (or SegmentError) for inconsistent hints."""
    fnodes: list[int] = []
    segments = SegmentSet()
    for node in hints.live_nodes:
        if not node.segments or node.segments[0].first_seq_no != node.fnode:
            raise HintsError(f"expected Fnode to match Segment FirstSeqNo: fnode {node.fnode}", log=hints.log)
        if fnodes and fnodes[-1] >= node.fnode:
            raise HintsError(f"expected monotonic Fnode ordering: {fnodes[-1]} vs {node.fnode}", log=hints.log)
        fnodes.append(node.fnode)
        for seg in node.segments:
            if not seg.log:
                seg = copy_segment(seg)
                seg.log = hints.log
            segments.add(seg)
    if segments and segments[-1].log != hints.log:
        raise HintsError(
            f"expected hints.Log {hints.log} to equal the last Segment Log {segments[-1].log}", log=hints.log
        )
    return fnodes, segments


class FSM:
    """Applies RecordedOps in order; see the module doc."""

    def __init__(self, hints: FSMHints) -> None:
        """An FSM ready to apply the hinted history (or a log from its start: `FSMHints(log=...)`).

        Raises HintsError if `hints.log` is empty or the hints are inconsistent.
        """
        if not hints.log:
            raise HintsError("hinted log not provided")
        try:
            fnodes, segments = live_log_segments(hints)
        except SegmentError as exc:
            raise HintsError(str(exc), log=hints.log) from exc
        self.next_seq_no = 1
        """The seq_no the next op must have."""
        self.next_checksum = 0
        """The checksum the next op must have."""
        self.last_log = hints.log
        """The log of the last applied op (or the hints' log)."""
        self.last_author = 0
        """The author of the last applied op (0 until one applied): its later ops must chain from it."""
        self.properties: dict[str, str] = {p.path: p.content for p in hints.properties}
        self.live_nodes: dict[int, FnodeState] = {}
        self.links: dict[str, int] = {}
        """Path -> Fnode of every live link."""
        self.hinted_segments: list[Segment] = list(segments)
        """Hinted segments not yet applied (the first is the current one)."""
        self.hinted_fnodes: list[int] = fnodes
        """Hinted Fnodes not yet created."""
        if self.hinted_segments:
            self.next_seq_no = self.hinted_segments[0].first_seq_no
            self.next_checksum = self.hinted_segments[0].first_checksum

    def has_remaining_hints(self) -> bool:
        return bool(self.hinted_segments or self.hinted_fnodes)

    def apply(self, op: RecordedOp, op_bytes: bytes) -> None:
        """Transition by `op`, whose marshalled bytes are `op_bytes` (the checksum covers them).

        Checks, in order: the hinted author, seq_no, checksum, then the op itself. Raises an
        FSMError and leaves the FSM unchanged, except for FnodeNotTrackedError, which is raised
        *after* the transition (the op is consistent, but its Fnode is not tracked).
        Meta-fields `op.first_offset`, `op.last_offset` and `op.log` feed segment tracking.
        """
        if self.hinted_segments and self.hinted_segments[0].author != op.author:
            raise self._error(NotHintedAuthorError, "op author does not match the next hinted author", op)
        if op.seq_no != self.next_seq_no:
            raise self._error(WrongSeqNoError, f"wrong sequence number (expected {self.next_seq_no})", op)
        if op.checksum != self.next_checksum:
            raise self._error(
                ChecksumMismatchError, f"checksum mismatch (expected {self.next_checksum:#x}, got {op.checksum:#x})", op
            )

        not_tracked: FnodeNotTrackedError | None = None
        try:
            if op.HasField("create"):
                self._apply_create(op)
            elif self.hinted_fnodes and self.hinted_fnodes[0] == op.seq_no:
                raise self._error(ExpectedHintedFnodeError, "op is not create, and an Fnode was hinted", op)
            elif op.HasField("link"):
                self._apply_link(op)
            elif op.HasField("unlink"):
                self._apply_unlink(op)
            elif op.HasField("write"):
                self._apply_write(op)
            elif op.HasField("property"):
                self._apply_property(op)
        except FnodeNotTrackedError as exc:
            not_tracked = exc

        # Step to the next state.
        self.next_seq_no += 1
        self.next_checksum = crc32c(op_bytes, self.next_checksum)
        self.last_log = op.log
        self.last_author = op.author
        # Once the current hinted segment is exhausted, skip to the next one.
        if self.hinted_segments and self.hinted_segments[0].last_seq_no < self.next_seq_no:
            del self.hinted_segments[0]
            if self.hinted_segments:
                self.next_seq_no = self.hinted_segments[0].first_seq_no
                self.next_checksum = self.hinted_segments[0].first_checksum
        if not_tracked is not None:
            raise not_tracked

    def _error(self, cls: type[FSMError], reason: str, op: RecordedOp) -> FSMError:
        return cls(reason, log=op.log or None, offset=op.first_offset if op.log else None, seq_no=op.seq_no,
                   author=op.author)

    def _apply_create(self, op: RecordedOp) -> None:
        path = op.create.path
        if path in self.links:
            raise self._error(LinkExistsError, f"link exists ({path})", op)
        if path in self.properties:
            raise self._error(PropertyExistsError, f"property exists ({path})", op)
        fnode = op.seq_no
        if self.hinted_fnodes:
            if self.hinted_fnodes[0] != fnode:
                raise self._error(FnodeNotTrackedError, f"fnode not tracked ({fnode})", op)
            del self.hinted_fnodes[0]
        node = FnodeState(links={path})
        self._extend_segments(node, op)
        self.live_nodes[fnode] = node
        self.links[path] = fnode

    def _apply_link(self, op: RecordedOp) -> None:
        path, fnode = op.link.path, op.link.fnode
        if path in self.links:
            raise self._error(LinkExistsError, f"link exists ({path})", op)
        if path in self.properties:
            raise self._error(PropertyExistsError, f"property exists ({path})", op)
        node = self.live_nodes.get(fnode)
        if node is None:
            raise self._error(FnodeNotTrackedError, f"fnode not tracked ({fnode})", op)
        node.links.add(path)
        self.links[path] = fnode
        self._extend_segments(node, op)

    def _apply_unlink(self, op: RecordedOp) -> None:
        path, fnode = op.unlink.path, op.unlink.fnode
        node = self.live_nodes.get(fnode)
        if node is None:
            raise self._error(FnodeNotTrackedError, f"fnode not tracked ({fnode})", op)
        if path not in node.links:
            raise self._error(NoSuchLinkError, f"fnode has no such link ({fnode}, {path})", op)
        del self.links[path]
        node.links.discard(path)
        self._extend_segments(node, op)
        if not node.links:
            del self.live_nodes[fnode]  # No link remains: the Fnode is no longer live.

    def _apply_write(self, op: RecordedOp) -> None:
        node = self.live_nodes.get(op.write.fnode)
        if node is None:
            raise self._error(FnodeNotTrackedError, f"fnode not tracked ({op.write.fnode})", op)
        self._extend_segments(node, op)

    def _apply_property(self, op: RecordedOp) -> None:
        path, content = op.property.path, op.property.content
        if path in self.links:
            raise self._error(LinkExistsError, f"link exists ({path})", op)
        if self.properties.get(path, content) != content:
            raise self._error(PropertyExistsError, f"property exists ({path})", op)
        self.properties[path] = content

    @staticmethod
    def _extend_segments(node: FnodeState, op: RecordedOp) -> None:
        segs = node.segments
        if segs and segs[-1].author == op.author and segs[-1].log == op.log:
            segs[-1].last_seq_no = op.seq_no
            segs[-1].last_offset = op.last_offset
            return
        segs.append(Segment(
            author=op.author, first_seq_no=op.seq_no, first_offset=op.first_offset, first_checksum=op.checksum,
            last_seq_no=op.seq_no, last_offset=op.last_offset, log=op.log,
        ))

    def build_hints(self, log: str) -> FSMHints:
        """FSMHints from which a new FSM rebuilds this one's state, reading `log` (segments of
        `log` leave their log empty). Live nodes ascend by Fnode; properties are sorted by path."""
        hints = FSMHints(log=log)
        for fnode in sorted(self.live_nodes):
            node = hints.live_nodes.add(fnode=fnode)
            for seg in self.live_nodes[fnode].segments:
                out = node.segments.add()
                out.CopyFrom(seg)
                if out.log == log:
                    out.log = ""
        for path in sorted(self.properties):
            hints.properties.add(path=path, content=self.properties[path])
        return hints


def new_fsm(hints: FSMHints) -> FSM:
    """Gazette's NewFSM(hints)."""
    return FSM(hints)


__all__ = ["FSM", "FSMHints", "FnodeState", "live_log_segments", "new_fsm"]
