"""Spool: a replica's transactional state of the fragment it is writing (section 5.5).

Content is written and hashed as it arrives; a proposal then commits it, rolls it back, or
rolls the spool to a new empty fragment. Primary and replicas apply the same messages, so a
pipeline stays in agreement on the fragment, its SHA-1 and the journal's registers.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from broker.fragment.errors import ContentDeltaError
from broker.fragment.fragment import Fragment, SpoolFile, equal_but_end_and_sum, spec_equal
from broker.fragment.sums import DIGEST_SIZE, digest_of, sha1sum_from_digest
from broker.protocol import pb


class SpoolObserver(Protocol):
    """Told of a spool's commits and completions."""

    def on_commit(self, f: Fragment) -> None:
        """`f`, the spool's fragment as far as the peer set is known to hold it (`Spool.acknowledged`),
        grew: it is readable, add it to the index."""

    def on_complete(self, f: Fragment) -> None:
        """`f`, a rolled spool's final fragment, must be persisted.

        During the call the spool's `first_append_time` and `registers` still describe `f`.
        """

    def on_roll(self, offset: int) -> None:
        """The spool begins anew at `offset`: the journal has content before it (which this
        replica may never have held, if it joined the route there)."""


class Spool:
    """The fragment a replica is writing: the last commit plus uncommitted content.

    `fragment` is the last committed Fragment (a new object per commit, sharing one spool file);
    `delta` counts the uncommitted bytes written after it. A running SHA-1 covers the whole
    fragment plus the delta, and a copy saved at each commit restores it on rollback.
    """

    def __init__(
        self,
        journal: str,
        observer: SpoolObserver,
        directory: str | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.journal = journal
        self.fragment = Fragment(pb.Fragment(journal=journal, compression_codec=pb.NONE, sum=pb.SHA1Sum()))
        self.first_append_time: float | None = None
        """Unix seconds of the fragment's first commit; None until then."""
        self.registers = pb.LabelSet()
        self.delta = 0
        self._observer = observer
        self._directory = directory
        self._clock = clock
        self._file: SpoolFile | None = None  # Created by the first content of the fragment.
        self._summer = hashlib.sha1()  # Over [begin, end + delta).
        self._apply_lock = threading.Lock()
        self._committed_summer = hashlib.sha1()  # Over [begin, end).
        self._exposed_end = 0  # The end of the last fragment handed to the observer's on_commit.
        self.acknowledged = _copy(self.fragment.spec)
        """The longest prefix of `fragment` known to be held by the journal's whole peer set: on a
        primary, every commit its peers acknowledged; on a replica, what its primary's proposals
        built on or confirmed (its last commit may be one the primary never heard it take)."""

    @property
    def begin(self) -> int:
        """First offset of the spool's fragment."""
        return self.fragment.begin

    @property
    def end(self) -> int:
        """Committed end offset of the spool's fragment."""
        return self.fragment.end

    def apply(self, req: pb.ReplicateRequest) -> pb.ReplicateResponse:
        """Apply a content or proposal message, returning the reply to a proposal.

        Content gets an OK reply that callers do not send. A proposal that neither rolls, rolls
        back nor commits gets PROPOSAL_MISMATCH with this spool's fragment and registers.
        Raises ContentDeltaError for out-of-order content and SpoolIOError if the spool file
        fails; the spool is unchanged then.
        """
        # Large content is applied in a worker thread; a rollback on the loop must wait for it.
        with self._apply_lock:
            if req.HasField("proposal"):
                return self._apply_proposal(req.proposal, req.registers)
            self._apply_content(req.content_delta, req.content)
            return pb.ReplicateResponse(status=pb.OK)

    def apply_content(self, content_delta: int, content: bytes | memoryview) -> None:
        """Apply content, as `apply` does a content message (without building one)."""
        with self._apply_lock:
            self._apply_content(content_delta, content)

    def acknowledge(self) -> None:
        """The whole committed fragment is held by the peer set (see `acknowledged`)."""
        self.acknowledged = _copy(self.fragment.spec)
        self._expose()

    def _expose(self) -> None:
        """Hand the acknowledged prefix, if it grew, to the observer's index: readers are given only
        what the peer set holds, never a commit that a failure could still undo."""
        spec = self.acknowledged
        if spec.end <= self._exposed_end or spec.begin != self.fragment.begin or self._file is None:
            return
        self._exposed_end = spec.end
        exposed = self.acknowledged_fragment()
        assert exposed is not None
        self._observer.on_commit(exposed)

    def acknowledged_fragment(self) -> Fragment | None:
        """The acknowledged prefix of the spool's fragment as a Fragment over the spool file, or
        None when it has no content."""
        spec = self.acknowledged
        if spec.end <= spec.begin or spec.begin != self.fragment.begin or self._file is None:
            return None
        return self.fragment if spec.end == self.fragment.end else Fragment(_copy(spec), self._file)

    def next(self) -> pb.Fragment:
        """Return the fragment a commit of the pending content would produce."""
        f = pb.Fragment()
        f.CopyFrom(self.fragment.spec)
        f.end += self.delta
        f.sum.CopyFrom(sha1sum_from_digest(self._next_digest()))
        return f

    def _next_digest(self) -> bytes:
        """The digest of next()'s sum: all zero for an empty fragment (not SHA-1 of b""), else the
        SHA-1 of its content."""
        spec = self.fragment.spec
        return bytes(DIGEST_SIZE) if spec.begin == spec.end + self.delta else self._summer.digest()

    def _is_next(self, proposal: pb.Fragment) -> bool:
        """`spec_equal(self.next(), proposal)`, without building the fragment (once per commit)."""
        spec = self.fragment.spec
        return (
            proposal.end == spec.end + self.delta
            and equal_but_end_and_sum(spec, proposal)
            and digest_of(proposal.sum) == self._next_digest()
        )

    def _apply_content(self, content_delta: int, content: bytes | memoryview) -> None:
        if content_delta != self.delta:
            raise ContentDeltaError(
                content_delta, self.delta, journal=self.journal, offset=self.fragment.end + self.delta
            )
        if not content:
            return
        if self._file is None:
            self._file = SpoolFile(self._directory)
        self._file.write_at(self.fragment.content_length + self.delta, content)
        self._summer.update(content)
        self.delta += len(content)

    def _apply_proposal(self, proposal: pb.Fragment, registers: pb.LabelSet) -> pb.ReplicateResponse:
        spec = self.fragment.spec
        # Roll to a new empty fragment if the proposal is beyond anything we hold (a peer
        # catching up, or recovery after a partial commit), or is an empty fragment at our
        # exact end (the primary directing an explicit roll).
        if proposal.end > spec.end + self.delta or (proposal.end == spec.end and proposal.begin == proposal.end):
            self._roll(proposal, registers)
            spec = self.fragment.spec

        if spec_equal(spec, proposal) and self.registers == registers:
            self.delta = 0
            self._summer = self._committed_summer.copy()
            return pb.ReplicateResponse(status=pb.OK)

        if self.delta != 0 and self._is_next(proposal):
            self._commit(proposal, registers)
            return pb.ReplicateResponse(status=pb.OK)

        return pb.ReplicateResponse(status=pb.PROPOSAL_MISMATCH, fragment=_copy(spec), registers=_copy(self.registers))

    def _roll(self, proposal: pb.Fragment, registers: pb.LabelSet) -> None:
        if proposal.begin == proposal.end == self.fragment.end:
            # The primary rolls at our exact end: all of the fragment is the journal's.
            self.acknowledge()
        completed = self.acknowledged_fragment()
        if completed is not None:
            # Rolled past by a proposal beyond our end, a commit no confirmation reached may be one
            # the journal went on without: only the acknowledged prefix is completed.
            self._observer.on_complete(completed)
        elif self._file is not None:
            self._file.close()  # Only rolled-back (or never acknowledged) content: no reader holds it.
        if proposal.end > self.fragment.end:
            self.registers = _copy(registers)
        self.fragment = Fragment(
            pb.Fragment(
                journal=self.journal,
                begin=proposal.end,
                end=proposal.end,
                sum=pb.SHA1Sum(),
                compression_codec=proposal.compression_codec,
            )
        )
        self.first_append_time = None
        self.delta = 0
        self._file = None
        self._summer = hashlib.sha1()
        self._committed_summer = hashlib.sha1()
        self.acknowledged = _copy(self.fragment.spec)
        self._exposed_end = proposal.end
        self._observer.on_roll(proposal.end)

    def _commit(self, proposal: pb.Fragment, registers: pb.LabelSet) -> None:
        # The primary proposes a commit over its own fragment, which holds only what its peers
        # acknowledged (broker.pipeline): what this one builds on is held by the peer set.
        self.acknowledged = self.fragment.spec
        self.fragment = Fragment(_copy(proposal), self._file)
        if self.first_append_time is None:
            self.first_append_time = self._clock()
        self.registers = _copy(registers)
        self.delta = 0
        self._committed_summer = self._summer.copy()
        self._expose()

    def __repr__(self) -> str:
        return f"Spool({self.fragment!r}, delta={self.delta})"


_M = TypeVar("_M", pb.Fragment, pb.LabelSet)


def _copy(msg: _M) -> _M:
    out = type(msg)()
    out.CopyFrom(msg)
    return out
