"""Spool: content, commit, rollback, roll and mismatch, per section 5.5."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from broker.fragment import (
    ContentDeltaError,
    Fragment,
    Index,
    Spool,
    digest_of,
    sha1sum_from_digest,
    spec_equal,
)
from broker.protocol import pb

JOURNAL = "a/journal"


class Recorder:
    """A SpoolObserver that records its calls and feeds commits to an Index."""

    def __init__(self) -> None:
        self.commits: list[Fragment] = []
        self.completes: list[Fragment] = []
        self.rolls: list[int] = []
        self.index = Index(JOURNAL)

    def on_commit(self, f: Fragment) -> None:
        self.commits.append(f)
        self.index.spool_commit(f)

    def on_complete(self, f: Fragment) -> None:
        self.completes.append(f)

    def on_roll(self, offset: int) -> None:
        self.rolls.append(offset)


def labels(**kv: str) -> pb.LabelSet:
    return pb.LabelSet(labels=[pb.Label(name=k, value=v) for k, v in sorted(kv.items())])


def content(data: bytes, delta: int) -> pb.ReplicateRequest:
    return pb.ReplicateRequest(content=data, content_delta=delta)


def proposal(f: pb.Fragment, registers: pb.LabelSet | None = None) -> pb.ReplicateRequest:
    return pb.ReplicateRequest(proposal=f, registers=registers or pb.LabelSet(), acknowledge=True)


def empty(at: int, codec: pb.CompressionCodec.ValueType = pb.NONE) -> pb.Fragment:
    return pb.Fragment(journal=JOURNAL, begin=at, end=at, compression_codec=codec)


def sha1sum(data: bytes) -> pb.SHA1Sum:
    return sha1sum_from_digest(hashlib.sha1(data).digest())


def new_spool(tmp_path: Path) -> tuple[Spool, Recorder]:
    obs = Recorder()
    return Spool(JOURNAL, obs, str(tmp_path), clock=lambda: 1234.5), obs


def read_all(f: Fragment) -> bytes:
    assert f.file is not None
    return f.file.read_at(0, f.end - f.begin)


def ok(resp: pb.ReplicateResponse) -> None:
    assert resp.status == pb.OK, resp


def commit(spool: Spool, req: pb.ReplicateRequest) -> None:
    """Apply a commit and acknowledge it, as a primary's pipeline does once its peers took it."""
    ok(spool.apply(req))
    spool.acknowledge()


def test_initial_state(tmp_path: Path) -> None:
    spool, _ = new_spool(tmp_path)
    assert (spool.begin, spool.end, spool.delta, spool.first_append_time) == (0, 0, 0, None)
    assert spool.fragment.spec.compression_codec == pb.NONE and spool.fragment.file is None
    assert spec_equal(spool.next(), empty(0))
    ok(spool.apply(proposal(empty(0))))  # The current, empty fragment: a no-op rollback.


def test_commit(tmp_path: Path) -> None:
    spool, obs = new_spool(tmp_path)
    ok(spool.apply(content(b"hello, ", 0)))
    ok(spool.apply(content(b"world", 7)))
    assert spool.delta == 12
    nxt = spool.next()
    assert (nxt.begin, nxt.end) == (0, 12)
    assert digest_of(nxt.sum) == hashlib.sha1(b"hello, world").digest()

    regs = labels(foo="bar")
    ok(spool.apply(proposal(nxt, regs)))
    assert spool.delta == 0 and spool.registers == regs
    assert spool.first_append_time == 1234.5
    assert obs.commits == [], "readers get a commit only once the peer set holds it"
    spool.acknowledge()
    assert len(obs.commits) == 1 and obs.commits[0] is spool.fragment
    assert spec_equal(spool.fragment.spec, nxt)
    assert read_all(spool.fragment) == b"hello, world"

    # A second commit grows the same fragment; its sum covers the whole fragment.
    ok(spool.apply(content(b"!!", 0)))
    nxt = spool.next()
    assert (nxt.begin, nxt.end) == (0, 14)
    assert digest_of(nxt.sum) == hashlib.sha1(b"hello, world!!").digest()
    commit(spool, proposal(nxt, regs))
    assert len(obs.commits) == 2 and obs.commits[1].file is obs.commits[0].file
    assert obs.commits[0].end == 12  # Earlier snapshots are not mutated.
    assert [(f.begin, f.end) for f in obs.index.fragments()] == [(0, 14)]
    assert spool.first_append_time == 1234.5


def test_rollback(tmp_path: Path) -> None:
    spool, obs = new_spool(tmp_path)
    ok(spool.apply(content(b"keep", 0)))
    commit(spool, proposal(spool.next()))
    committed = spool.fragment.spec

    ok(spool.apply(content(b"discard", 0)))
    ok(spool.apply(proposal(committed)))  # Proposing the current fragment rolls back.
    assert spool.delta == 0 and spec_equal(spool.fragment.spec, committed)

    # The hash was restored: new content commits with the sum of the kept bytes only.
    ok(spool.apply(content(b"more", 0)))
    nxt = spool.next()
    assert digest_of(nxt.sum) == hashlib.sha1(b"keepmore").digest()
    commit(spool, proposal(nxt))
    assert read_all(spool.fragment) == b"keepmore"
    assert len(obs.commits) == 2


def test_rollback_requires_equal_registers(tmp_path: Path) -> None:
    spool, _ = new_spool(tmp_path)
    ok(spool.apply(content(b"x", 0)))
    ok(spool.apply(proposal(spool.next(), labels(a="1"))))
    resp = spool.apply(proposal(spool.fragment.spec, labels(a="2")))
    assert resp.status == pb.PROPOSAL_MISMATCH
    assert resp.registers == labels(a="1")


def test_content_delta_error(tmp_path: Path) -> None:
    spool, _ = new_spool(tmp_path)
    ok(spool.apply(content(b"abc", 0)))
    with pytest.raises(ContentDeltaError) as info:
        spool.apply(content(b"def", 2))
    assert str(info.value) == "invalid ContentDelta (2; expected 3)"
    assert (info.value.journal, info.value.offset) == (JOURNAL, 3)
    assert spool.delta == 3  # Unchanged.


def test_mismatch(tmp_path: Path) -> None:
    spool, obs = new_spool(tmp_path)
    ok(spool.apply(content(b"abc", 0)))
    regs = labels(r="1")
    commit(spool, proposal(spool.next(), regs))

    # A wrong sum or a short end mismatches.
    ok(spool.apply(content(b"def", 0)))
    bad = spool.next()
    bad.sum.CopyFrom(sha1sum(b"nope"))
    short = spool.next()
    short.end -= 1
    for p in [bad, short]:
        resp = spool.apply(proposal(p, regs))
        assert resp.status == pb.PROPOSAL_MISMATCH
        assert spec_equal(resp.fragment, spool.fragment.spec) and resp.registers == regs
    assert spool.delta == 3  # Still pending: a mismatch changes nothing.
    commit(spool, proposal(spool.next(), regs))
    assert len(obs.commits) == 2
    assert spool.apply(proposal(spool.next(), regs)).status == pb.OK  # Rollback of nothing.

    # A commit of the wrong size with nothing pending mismatches.
    nxt = spool.next()
    nxt.end -= 1
    assert spool.apply(proposal(nxt, regs)).status == pb.PROPOSAL_MISMATCH
    assert len(obs.completes) == 0

    # A non-empty proposal beyond our end completes our fragment, rolls to its end, and
    # mismatches with the new empty fragment.
    nxt.end += 2
    resp = spool.apply(proposal(nxt, regs))
    assert resp.status == pb.PROPOSAL_MISMATCH
    assert spec_equal(resp.fragment, empty(7))
    assert [(f.begin, f.end) for f in obs.completes] == [(0, 6)]


def test_roll_to_empty_fragment_at_end(tmp_path: Path) -> None:
    spool, obs = new_spool(tmp_path)
    ok(spool.apply(content(b"first", 0)))
    ok(spool.apply(proposal(spool.next(), labels(a="1"))))
    completed = spool.fragment

    # The end did not grow, so the registers are kept and the differing proposal mismatches;
    # the new spool has the proposal's codec.
    resp = spool.apply(proposal(empty(5, pb.GZIP), labels(a="2")))
    assert resp.status == pb.PROPOSAL_MISMATCH
    assert spec_equal(resp.fragment, empty(5, pb.GZIP)) and resp.registers == labels(a="1")
    assert obs.completes == [completed]
    ok(spool.apply(proposal(empty(5, pb.GZIP), labels(a="1"))))
    assert len(obs.completes) == 1  # The new spool is empty: nothing more to complete.
    assert (spool.begin, spool.end, spool.fragment.spec.compression_codec) == (5, 5, pb.GZIP)
    assert spool.fragment.file is None and spool.first_append_time is None

    # The completed fragment stays readable, and the index keeps serving it.
    assert read_all(completed) == b"first"
    ok(spool.apply(content(b"second", 0)))
    commit(spool, proposal(spool.next(), labels(a="1")))
    assert read_all(completed) == b"first"
    assert read_all(spool.fragment) == b"second"
    assert spool.fragment.file is not completed.file
    assert [(f.begin, f.end) for f in obs.index.fragments()] == [(0, 5), (5, 11)]


def test_roll_forward_adopts_registers(tmp_path: Path) -> None:
    spool, obs = new_spool(tmp_path)
    ok(spool.apply(content(b"abc", 0)))
    commit(spool, proposal(spool.next(), labels(a="1")))

    # A peer reports a greater end: roll there and take its registers.
    resp = spool.apply(proposal(empty(100), labels(a="9")))
    ok(resp)
    assert (spool.begin, spool.end) == (100, 100)
    assert spool.registers == labels(a="9")
    assert len(obs.completes) == 1

    # A non-empty proposal past our end rolls to its end, then mismatches so the primary
    # learns our (empty) fragment.
    p = pb.Fragment(journal=JOURNAL, begin=100, end=200, compression_codec=pb.NONE)
    p.sum.CopyFrom(sha1sum(b"x" * 100))
    resp = spool.apply(proposal(p, labels(a="10")))
    assert resp.status == pb.PROPOSAL_MISMATCH
    assert spec_equal(resp.fragment, empty(200)) and resp.registers == labels(a="10")
    assert len(obs.completes) == 1  # The spool at 100 had no content.
    assert obs.rolls == [100, 200]  # Each roll is told where the spool begins anew.


def test_roll_discards_uncommitted_content(tmp_path: Path) -> None:
    spool, obs = new_spool(tmp_path)
    ok(spool.apply(content(b"pending", 0)))
    ok(spool.apply(proposal(empty(50))))  # 50 > 0 + 7: roll.
    assert obs.completes == [] and spool.delta == 0 and (spool.begin, spool.end) == (50, 50)


def test_sum_of_empty_and_unset_sums(tmp_path: Path) -> None:
    spool, _ = new_spool(tmp_path)
    # A proposal without a `sum` field equals one with an all-zero sum.
    p = empty(0)
    assert not p.HasField("sum")
    ok(spool.apply(proposal(p)))
    ok(spool.apply(content(b"", 0)))  # Empty content is accepted and changes nothing.
    assert spool.delta == 0
    assert spool.apply(proposal(spool.next())).status == pb.OK


def test_large_content_sha1(tmp_path: Path) -> None:
    spool, _ = new_spool(tmp_path)
    data = bytes(range(256)) * 4096  # 1 MiB.
    delta = 0
    for i in range(0, len(data), 65536):
        ok(spool.apply(content(data[i : i + 65536], delta)))
        delta += 65536
    nxt = spool.next()
    assert digest_of(nxt.sum) == hashlib.sha1(data).digest()
    ok(spool.apply(proposal(nxt)))
    assert read_all(spool.fragment) == data
    assert spool.fragment.file is not None and spool.fragment.file.read_at(len(data) - 10, 100) == data[-10:]


@pytest.mark.parametrize(
    "change",
    ["none", "journal", "begin", "end", "sum", "zero sum", "codec", "backing_store", "mod_time", "path_postfix"],
)
def test_a_commit_is_recognized_as_next_would_be(tmp_path: Path, change: str) -> None:
    # The commit check compares a proposal with the pending fragment without building it: it must
    # agree with comparing next() field by field, whichever field differs.
    spool, _ = new_spool(tmp_path)
    spool.apply(proposal(empty(0)))
    spool.apply(content(b"first", 0))
    spool.apply(proposal(spool.next()))
    spool.apply(content(b"second", 0))
    p = spool.next()
    if change == "journal":
        p.journal = "other/journal"
    elif change in ("begin", "end"):
        setattr(p, change, getattr(p, change) + 1)
    elif change == "sum":
        p.sum.part3 ^= 1
    elif change == "zero sum":
        p.sum.CopyFrom(pb.SHA1Sum())
    elif change == "codec":
        p.compression_codec = pb.GZIP
    elif change != "none":
        setattr(p, change, 7 if change == "mod_time" else "x")
    assert spool._is_next(p) == spec_equal(spool.next(), p) == (change == "none")
    resp = spool.apply(proposal(p))
    assert (resp.status == pb.OK) == (change == "none")


def test_acknowledged_prefix_as_a_replica_sees_it(tmp_path: Path) -> None:
    """A replica's last commit is not known to be held by its peer set until its primary builds on
    it (the next commit) or confirms it (broker.replicate acknowledges a proposal of the fragment as
    it is); a roll starts anew."""
    spool, _ = new_spool(tmp_path)
    assert spool.acknowledged_fragment() is None
    ok(spool.apply(content(b"one", 0)))
    ok(spool.apply(proposal(spool.next())))
    assert spool.acknowledged.end == 0 and spool.acknowledged_fragment() is None

    ok(spool.apply(content(b"two", 0)))
    ok(spool.apply(proposal(spool.next())))  # Built on "one": the primary held it, so did every peer.
    f = spool.acknowledged_fragment()
    assert f is not None and (f.begin, f.end) == (0, 3) and read_all(f) == b"one"
    assert digest_of(f.spec.sum) == hashlib.sha1(b"one").digest()

    ok(spool.apply(proposal(spool.fragment.spec)))  # Proposed as it is: serve_replicate then acknowledges.
    assert spool.acknowledged.end == 3
    spool.acknowledge()
    f = spool.acknowledged_fragment()
    assert f is not None and (f.begin, f.end) == (0, 6) and read_all(f) == b"onetwo"

    ok(spool.apply(proposal(empty(6))))  # Rolled: the new fragment holds nothing yet.
    assert spool.acknowledged_fragment() is None and spool.acknowledged.begin == 6


def test_acknowledge_marks_the_whole_fragment(tmp_path: Path) -> None:
    """A primary acknowledges each commit once every peer took it (broker.pipeline.Pipeline.commit)."""
    spool, _ = new_spool(tmp_path)
    ok(spool.apply(content(b"abc", 0)))
    ok(spool.apply(proposal(spool.next())))
    spool.acknowledge()
    f = spool.acknowledged_fragment()
    assert f is not None and (f.begin, f.end) == (0, 3) and spec_equal(f.spec, spool.fragment.spec)


def test_a_commit_never_confirmed_is_not_completed_when_rolled_past(tmp_path: Path) -> None:
    """A replica's last commit, never confirmed, then a proposal beyond its end (the journal went on
    without it, e.g. while this replica was cut off): its bytes may not be the journal's at those
    offsets, so neither readers nor the store get them; the confirmed prefix is completed."""
    spool, obs = new_spool(tmp_path)
    ok(spool.apply(content(b"kept", 0)))
    ok(spool.apply(proposal(spool.next())))
    ok(spool.apply(content(b"maybe", 0)))
    ok(spool.apply(proposal(spool.next())))  # Builds on "kept": that is the peer set's.
    assert [(f.begin, f.end) for f in obs.index.fragments()] == [(0, 4)]
    ok(spool.apply(proposal(empty(20))))
    assert [(f.begin, f.end) for f in obs.completes] == [(0, 4)]
    assert read_all(obs.completes[0]) == b"kept"

    # Rolled at its exact end, a fragment is the journal's whole.
    ok(spool.apply(content(b"all", 0)))
    ok(spool.apply(proposal(spool.next())))
    ok(spool.apply(proposal(empty(23))))
    assert [(f.begin, f.end) for f in obs.completes] == [(0, 4), (20, 23)]
    assert [(f.begin, f.end) for f in obs.index.fragments()] == [(0, 4), (20, 23)]
