"""Journal RPC behaviours against a real broker: Apply, List, registers, offsets, suspend, flags."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from broker.fragment import sha1sum_hex
from broker.protocol import pb, pb_grpc
from tests.support.harness import BrokerProcess, apply_specs, journal_spec, wait_for_primary

AS = pb.AppendRequest


def append(stub: pb_grpc.JournalStub, journal: str, *chunks: bytes, **params: object) -> pb.AppendResponse:
    def requests() -> Iterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=journal, **params)  # type: ignore[arg-type]
        for chunk in chunks:
            yield pb.AppendRequest(content=chunk)
        yield pb.AppendRequest()

    resp: pb.AppendResponse = stub.Append(requests())
    return resp


def read_all(stub: pb_grpc.JournalStub, journal: str, offset: int = 0) -> bytes:
    return b"".join(r.content for r in stub.Read(pb.ReadRequest(journal=journal, offset=offset)))


def selector(**include: str) -> pb.LabelSelector:
    return pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name=k.replace("_", "-"), value=v)
                                                        for k, v in sorted(include.items())]))


def list_names(stub: pb_grpc.JournalStub, sel: pb.LabelSelector) -> list[str]:
    return [j.spec.name for r in stub.List(pb.ListRequest(selector=sel)) for j in r.journals]


def create(stub: pb_grpc.JournalStub, name: str, **labels: str) -> pb.JournalSpec:
    spec = journal_spec(name, **labels)
    assert apply_specs(stub, spec).status == pb.OK
    wait_for_primary(stub, name)
    return spec


def test_apply_checks_revisions(stub: pb_grpc.JournalStub) -> None:
    spec = journal_spec("rev/one")
    first = apply_specs(stub, spec)
    assert first.status == pb.OK and first.header.etcd.revision > 0
    # Creating again (expect 0) fails: the journal exists.
    assert apply_specs(stub, spec).status == pb.ETCD_TRANSACTION_FAILED
    [listed] = [j for r in stub.List(pb.ListRequest(selector=selector(name="rev/one"))) for j in r.journals]
    assert listed.mod_revision == first.header.etcd.revision
    assert listed.create_revision == first.header.etcd.revision
    spec.replication = 2
    assert apply_specs(stub, spec, revision=listed.mod_revision + 100).status == pb.ETCD_TRANSACTION_FAILED
    updated = apply_specs(stub, spec, revision=listed.mod_revision)
    assert updated.status == pb.OK
    # A failed change in a request fails the whole transaction.
    resp = stub.Apply(pb.ApplyRequest(changes=[
        pb.ApplyRequest.Change(upsert=journal_spec("rev/two"), expect_mod_revision=0),
        pb.ApplyRequest.Change(delete="rev/one", expect_mod_revision=listed.mod_revision),
    ]))
    assert resp.status == pb.ETCD_TRANSACTION_FAILED
    assert list_names(stub, selector(name="rev/two")) == []
    resp = stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(delete="rev/one", expect_mod_revision=-1)]))
    assert resp.status == pb.OK
    assert list_names(stub, selector(name="rev/one")) == []


def test_list_selectors_and_watch(stub: pb_grpc.JournalStub) -> None:
    specs = [
        journal_spec("sel/a/1", region="us"),
        journal_spec("sel/a/2", region="eu"),
        journal_spec("sel/b/1", region="us"),
    ]
    assert apply_specs(stub, *specs).status == pb.OK
    assert list_names(stub, selector(region="us")) == ["sel/a/1", "sel/b/1"]
    assert list_names(stub, selector(prefix="sel/a/")) == ["sel/a/1", "sel/a/2"]
    exclude = pb.LabelSelector(include=selector(prefix="sel/").include,
                               exclude=pb.LabelSet(labels=[pb.Label(name="region", value="us")]))
    assert list_names(stub, exclude) == ["sel/a/2"]
    prefix_label = pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name="name", value="sel/b", prefix=True)]))
    assert list_names(stub, prefix_label) == ["sel/b/1"]

    # A watch sends a snapshot, ended by an empty response, and a new one on change.
    call = stub.List(pb.ListRequest(selector=selector(prefix="sel/"), watch=True))
    snapshots: list[list[str]] = []
    current: list[str] = []

    def consume() -> None:
        for resp in call:
            if not resp.journals and resp.status == pb.OK and not resp.HasField("header"):
                snapshots.append(current.copy())
                current.clear()
                if len(snapshots) == 2:
                    return
            current.extend(j.spec.name for j in resp.journals)

    t = threading.Thread(target=consume)
    t.start()
    # The change comes once the first snapshot is in: made before the broker answered the watch, it
    # would be in that snapshot.
    deadline = time.monotonic() + 30
    while not snapshots:
        assert t.is_alive() and time.monotonic() < deadline, "no first snapshot"
        time.sleep(0.05)
    assert apply_specs(stub, journal_spec("sel/c/1")).status == pb.OK
    t.join(30)
    call.cancel()
    assert snapshots == [["sel/a/1", "sel/a/2", "sel/b/1"], ["sel/a/1", "sel/a/2", "sel/b/1", "sel/c/1"]]


def test_commit_carries_sha1_and_offsets(stub: pb_grpc.JournalStub) -> None:
    create(stub, "commit/j")
    resp = append(stub, "commit/j", b"hello ", b"world\n")
    assert resp.status == pb.OK
    assert (resp.commit.begin, resp.commit.end) == (0, 12)
    assert sha1sum_hex(resp.commit.sum) == hashlib.sha1(b"hello world\n").hexdigest()
    empty = append(stub, "commit/j")
    assert empty.status == pb.OK and empty.commit.begin == empty.commit.end == 12
    assert sha1sum_hex(empty.commit.sum) == hashlib.sha1(b"").hexdigest()


def test_expected_offset(stub: pb_grpc.JournalStub) -> None:
    create(stub, "offset/j")
    assert append(stub, "offset/j", b"0123456789").status == pb.OK
    assert append(stub, "offset/j", b"x", offset=5).status == pb.WRONG_APPEND_OFFSET
    assert append(stub, "offset/j", b"x", offset=11).status == pb.WRONG_APPEND_OFFSET
    ok = append(stub, "offset/j", b"abc", offset=10)
    assert ok.status == pb.OK and ok.commit.begin == 10
    assert read_all(stub, "offset/j") == b"0123456789abc"


def test_registers(stub: pb_grpc.JournalStub) -> None:
    create(stub, "registers/j")
    cookie_a = pb.LabelSet(labels=[pb.Label(name="cookie", value="a")])
    resp = append(stub, "registers/j", b"one", union_registers=cookie_a)
    assert resp.status == pb.OK and list(resp.registers.labels) == list(cookie_a.labels)
    check_b = pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name="cookie", value="b")]))
    mismatch = append(stub, "registers/j", b"two", check_registers=check_b)
    assert mismatch.status == pb.REGISTER_MISMATCH
    assert list(mismatch.registers.labels) == list(cookie_a.labels)
    check_a = pb.LabelSelector(include=cookie_a)
    swapped = append(stub, "registers/j", b"two", check_registers=check_a, subtract_registers=cookie_a,
                     union_registers=pb.LabelSet(labels=[pb.Label(name="cookie", value="b")]))
    assert swapped.status == pb.OK and swapped.registers.labels[0].value == "b"
    # A register change with no content is refused.
    with pytest.raises(grpc.RpcError, match="register modification requires non-empty Append"):
        append(stub, "registers/j", union_registers=cookie_a)
    assert read_all(stub, "registers/j") == b"onetwo"


def test_flags(stub: pb_grpc.JournalStub) -> None:
    ro = journal_spec("flags/ro")
    ro.flags = pb.JournalSpec.O_RDONLY
    wo = journal_spec("flags/wo")
    wo.flags = pb.JournalSpec.O_WRONLY
    assert apply_specs(stub, ro, wo).status == pb.OK
    wait_for_primary(stub, "flags/ro")
    wait_for_primary(stub, "flags/wo")
    assert append(stub, "flags/ro", b"nope").status == pb.NOT_ALLOWED
    assert append(stub, "flags/wo", b"yes").status == pb.OK
    [first] = list(stub.Read(pb.ReadRequest(journal="flags/wo")))
    assert first.status == pb.NOT_ALLOWED
    assert next(iter(stub.Read(pb.ReadRequest(journal="flags/ro")))).status == pb.OFFSET_NOT_YET_AVAILABLE


def test_suspend_and_resume(stub: pb_grpc.JournalStub) -> None:
    create(stub, "suspend/j")
    assert append(stub, "suspend/j", b"data").status == pb.OK
    # Content is not allowed with a suspending mode. An empty SUSPEND_NOW suspends the journal
    # and, as in Gazette, answers SUSPENDED once it is.
    assert append(stub, "suspend/j", b"x", suspend=AS.SUSPEND_KEEP).status == pb.NOT_ALLOWED
    assert append(stub, "suspend/j", suspend=AS.SUSPEND_NOW).status == pb.SUSPENDED

    def level() -> int:
        [j] = [j for r in stub.List(pb.ListRequest(selector=selector(name="suspend/j"))) for j in r.journals]
        return j.spec.suspend.level

    assert level() == pb.JournalSpec.Suspend.PARTIAL
    assert append(stub, "suspend/j", b"x", suspend=AS.SUSPEND_NO_RESUME).status == pb.SUSPENDED
    # A default append resumes the journal and lands after the existing content.
    resumed = append(stub, "suspend/j", b"more")
    assert resumed.status == pb.OK and resumed.commit.begin == 4
    assert level() == pb.JournalSpec.Suspend.NONE
    assert read_all(stub, "suspend/j") == b"datamore"


def test_full_suspend_of_empty_journal(stub: pb_grpc.JournalStub) -> None:
    create(stub, "suspend/empty")
    # An empty journal suspends fully: it then has no replicas at all.
    assert append(stub, "suspend/empty", suspend=AS.SUSPEND_IF_FLUSHED).status == pb.SUSPENDED
    [resp] = list(stub.Read(pb.ReadRequest(journal="suspend/empty")))
    assert resp.status == pb.SUSPENDED
    assert append(stub, "suspend/empty", b"x", suspend=AS.SUSPEND_NO_RESUME).status == pb.SUSPENDED
    resumed = append(stub, "suspend/empty", b"wake")
    assert resumed.status == pb.OK and resumed.commit.begin == 0


def test_unknown_journal(stub: pb_grpc.JournalStub) -> None:
    assert append(stub, "does/not/exist", b"x").status == pb.JOURNAL_NOT_FOUND
    [resp] = list(stub.Read(pb.ReadRequest(journal="does/not/exist")))
    assert resp.status == pb.JOURNAL_NOT_FOUND


def test_non_blocking_read_at_head(stub: pb_grpc.JournalStub, broker: BrokerProcess) -> None:
    create(stub, "head/j")
    assert append(stub, "head/j", b"abc").status == pb.OK
    responses = list(stub.Read(pb.ReadRequest(journal="head/j", offset=3)))
    assert [r.status for r in responses] == [pb.OFFSET_NOT_YET_AVAILABLE]
    assert responses[0].write_head == 3
    meta = list(stub.Read(pb.ReadRequest(journal="head/j", offset=1, metadata_only=True)))
    assert len(meta) == 1 and meta[0].fragment.end == 3 and not meta[0].content
    ranged = b"".join(r.content for r in stub.Read(pb.ReadRequest(journal="head/j", offset=0, end_offset=2)))
    assert ranged == b"ab"


def test_large_chunks_commit_in_order_with_their_sha1(stub: pb_grpc.JournalStub) -> None:
    # Large chunks land in the spool behind the ones being received: order and sum must hold.
    create(stub, "large/j")
    chunks = [bytes([65 + i]) * (1 << 20) + b"%d\n" % i for i in range(12)]
    resp = append(stub, "large/j", *chunks)
    assert resp.status == pb.OK and (resp.commit.begin, resp.commit.end) == (0, sum(map(len, chunks)))
    assert sha1sum_hex(resp.commit.sum) == hashlib.sha1(b"".join(chunks)).hexdigest()
    assert read_all(stub, "large/j") == b"".join(chunks)


def test_append_abandoned_mid_stream_leaves_nothing(stub: pb_grpc.JournalStub) -> None:
    create(stub, "abandoned/j")
    assert append(stub, "abandoned/j", b"before\n").status == pb.OK

    class ClientGaveUp(Exception):
        pass

    def requests() -> Iterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal="abandoned/j")
        for _ in range(12):  # More than the broker lets land behind the chunk it receives.
            yield pb.AppendRequest(content=b"x" * (1 << 20))
        raise ClientGaveUp()  # The client dies before the empty request that commits.

    with pytest.raises(grpc.RpcError):
        stub.Append(requests())
    after = append(stub, "abandoned/j", b"after\n")
    assert after.status == pb.OK and (after.commit.begin, after.commit.end) == (7, 13)
    assert read_all(stub, "abandoned/j") == b"before\nafter\n"
