"""The append FSM (`broker.append.Append`), state by state, on in-process brokers.

Each test drives `Append` directly (`prepare()`, then its status response, its proxy decision, or
`stream()`) against brokers assembled in the test's event loop over the session's real etcd (see
`inprocess.py`), with routes the test assigns itself. The model is Gazette's
`broker/append_fsm.go` (the FSM), `broker/fragment/spool.go` (the spool) and `broker/replica.go` (rolling).

"""

from __future__ import annotations

import asyncio
import hashlib
import io
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import broker.append
from broker.append import Append
from broker.errors import AppendError, BrokerError, PipelineError
from broker.fragment import content_path, sha1sum_from_digest
from broker.pipeline import Pipeline
from broker.protocol import labels, pb
from broker.pulse import STABLE_PULSES_TO_SUSPEND, pulse, run_pulses
from broker.service import _content_chunks
from broker.stores.memory import bucket_objects
from cluster.keyspace import put_op, txn
from tests.support.harness import journal_spec
from tests.support.inprocess import InProcessBroker, InProcessCluster, append, content

AS = pb.AppendRequest
LEVEL = pb.JournalSpec.Suspend
J = "fsm/journal"
EMPTY_SHA1 = "da39a3ee5e6b4b0d3255bfef95601890afd80709"
WAIT = 5.0  # Seconds anything a test awaits may take before the test fails instead of hanging.

Pair = tuple[InProcessBroker, InProcessBroker]


# --- helpers --------------------------------------------------------------------------------------


def sha1(data: bytes) -> pb.SHA1Sum:
    return sha1sum_from_digest(hashlib.sha1(data).digest())


def hexsum(s: pb.SHA1Sum) -> str:
    return f"{s.part1:016x}{s.part2:016x}{s.part3:08x}"


def regs(**values: str) -> pb.LabelSet:
    return labels.label_set_from_mapping(values)


def selector(**values: str) -> pb.LabelSelector:
    return pb.LabelSelector(include=regs(**values))


def route_of(*members: InProcessBroker, primary: int = 0) -> pb.Route:
    """The route of `members` as etcd assignment values hold it (sorted members, no endpoints)."""
    ids = sorted((m.local_id for m in members), key=lambda i: (i.zone, i.suffix))
    return pb.Route(members=ids, primary=ids.index(members[primary].local_id))


async def new_journal(
    cluster: InProcessCluster, *members: InProcessBroker, name: str = J, replication: int | None = None,
    store: bool = False, **fields: Any,
) -> pb.JournalSpec:
    """Put a journal's spec (replication defaults to the number of members) and assign it to
    `members`, the first one primary."""
    spec = journal_spec(name, replication=len(members) if replication is None else replication)
    if store:
        spec.fragment.stores.append(cluster.store_url)
    for key, value in fields.items():
        if key == "suspend":
            spec.suspend.CopyFrom(value)
        else:
            setattr(spec, key, value)
    await cluster.put_spec(spec)
    if members:
        await cluster.assign(name, *members)
    return spec


async def eventually(condition: Callable[[], bool], what: str) -> None:
    """Wait (at most WAIT seconds) until `condition()` holds."""
    async with asyncio.timeout(WAIT):
        while not condition():
            await asyncio.sleep(0.005)
    assert condition(), what


def fragment_of(b: InProcessBroker, journal: str = J) -> pb.Fragment:
    return b.replica(journal).spool.fragment.spec


def spool_content(b: InProcessBroker, journal: str = J) -> bytes:
    """The committed bytes of the broker's spool fragment."""
    f = b.replica(journal).spool.fragment
    return f.file.read_at(0, f.content_length) if f.file is not None and f.content_length else b""


def assert_spools_agree(*brokers: InProcessBroker, journal: str = J) -> None:
    """Every broker's spool holds the same committed fragment and registers, with nothing pending."""
    first = brokers[0].replica(journal).spool
    for b in brokers:
        spool = b.replica(journal).spool
        assert spool.delta == 0, f"{b.suffix} has {spool.delta} uncommitted bytes"
        assert spool.fragment.spec == first.fragment.spec, b.suffix
        assert spool.registers == first.registers, b.suffix
    data = spool_content(brokers[0], journal)
    assert first.fragment.spec.sum == (sha1(data) if data else pb.SHA1Sum()), "the fragment's sum covers its content"


async def prepared(b: InProcessBroker, journal: str = J, **params: Any) -> Append:
    """An Append on `b` that `prepare()` brought to StreamContent (it holds the replica's lock)."""
    fsm = Append(b.state, pb.AppendRequest(journal=journal, **params))
    await fsm.prepare()
    assert fsm.response is None, pb.Status.Name(fsm.response.status)
    assert fsm.proxy is None
    return fsm


# --- Resolve ----------------------------------------------------------------------------------------


async def test_resolve_journal_not_found(inproc_pair: Pair) -> None:
    a, _ = inproc_pair
    resp = await append(a, "fsm/missing", b"data")
    assert resp.status == pb.JOURNAL_NOT_FOUND
    assert resp.header.process_id == a.local_id
    assert resp.header.route.primary == -1 and not resp.header.route.members
    assert resp.header.etcd.revision == a.keyspace.revision
    assert not resp.HasField("commit")


async def test_resolve_without_primary_waits_for_an_assignment(inproc_cluster: InProcessCluster) -> None:
    a = await inproc_cluster.add_broker("broker-a")
    await new_journal(inproc_cluster, replication=1)  # No assignment: no primary yet.
    pending = asyncio.ensure_future(append(a, J, b"first"))
    await asyncio.sleep(0.2)
    assert not pending.done(), "an append to a journal without a primary waits for the allocator"
    await inproc_cluster.assign(J, a)
    resp = await asyncio.wait_for(pending, WAIT)
    assert resp.status == pb.OK
    assert (resp.commit.begin, resp.commit.end) == (0, 5)


async def test_resolve_without_primary_after_the_settle_timeout(
    inproc_cluster: InProcessCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(broker.append, "SETTLE_TIMEOUT", 0.1)
    a = await inproc_cluster.add_broker("broker-a")
    await new_journal(inproc_cluster, replication=1)
    pending = asyncio.ensure_future(append(a, J, b"x"))
    await asyncio.sleep(0.3)
    # Any keyspace change wakes the waiting append, which is past its deadline now.
    await inproc_cluster.put_spec(journal_spec("fsm/unrelated"))
    resp = await asyncio.wait_for(pending, WAIT)
    assert resp.status == pb.NO_JOURNAL_PRIMARY_BROKER
    assert resp.header.route.primary == -1
    assert resp.header.process_id == a.local_id


async def test_resolve_without_primary_answers_within_the_settle_timeout(
    inproc_cluster: InProcessCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(broker.append, "SETTLE_TIMEOUT", 0.1)
    a = await inproc_cluster.add_broker("broker-a")
    await new_journal(inproc_cluster, replication=1)
    resp = await asyncio.wait_for(append(a, J, b"x"), 1.0)
    assert resp.status == pb.NO_JOURNAL_PRIMARY_BROKER


async def test_resolve_not_primary_chooses_the_primary_as_proxy_target(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b)
    fsm = Append(b.state, pb.AppendRequest(journal=J))
    await fsm.prepare()
    assert fsm.response is None
    assert fsm.proxy is not None
    header = fsm.proxy.header
    assert header.process_id == a.local_id
    assert header.route.members[header.route.primary] == a.local_id
    assert list(header.route.endpoints) == [a.endpoint, b.endpoint]
    assert b.resolver.endpoint_of(header.process_id, header.route) == a.endpoint
    # Nothing of the local replica is held for a proxied append.
    assert fsm.pipeline is None and fsm.replica is None
    assert not b.replica(J).lock.locked()
    assert b.replica(J).pipeline is None


async def test_resolve_do_not_proxy_is_not_journal_primary_broker(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b)
    resp = await append(b, J, b"data", do_not_proxy=True)
    assert resp.status == pb.NOT_JOURNAL_PRIMARY_BROKER
    assert resp.header.process_id == b.local_id
    assert resp.header.route.members[resp.header.route.primary] == a.local_id
    assert not b.replica(J).lock.locked()
    assert fragment_of(a).end == fragment_of(b).end == 0


@pytest.mark.parametrize("via", ["min_etcd_revision", "proxy_header"])
async def test_resolve_waits_for_the_requested_revision(
    inproc_cluster: InProcessCluster, inproc_pair: Pair, via: str
) -> None:
    a, b = inproc_pair
    spec = await new_journal(inproc_cluster, a, b)
    # A spec change a's mirror applies only after a delay.
    a.keyspace.watch_delay = 0.3
    spec.labels.labels.add(name="changed", value="yes")
    revision = await inproc_cluster.put_spec(spec, wait_for=())
    assert a.keyspace.revision < revision
    params: dict[str, Any] = {"min_etcd_revision": revision}
    if via == "proxy_header":
        # What a proxying broker sends: its own header, at the revision it resolved at.
        params = {"header": pb.Header(process_id=a.local_id, etcd=pb.Header.Etcd(revision=revision))}
    fsm = await prepared(a, **params)
    resp = await fsm.stream(content(b"data"))
    assert resp.status == pb.OK
    assert fsm.resolution is not None and fsm.resolution.mod_revision == revision
    assert fsm.resolution.spec is not None and labels.value_of(fsm.resolution.spec.labels, "changed") == "yes"
    assert resp.header.etcd.revision >= revision


async def test_update_assignments_advertises_the_route(inproc_cluster: InProcessCluster, inproc_pair: Pair) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b)
    # The allocator creates assignments with empty values.
    assert all(r == pb.Route() for r in (await inproc_cluster.assignment_values(J)).values())

    resp = await append(a, J, b"one")
    assert resp.status == pb.OK
    values = await inproc_cluster.assignment_values(J)
    assert len(values) == 2
    assert all(r == route_of(a, b) for r in values.values()), "the route, without endpoints, in every assignment"
    written = max([kv.mod_revision for kv in await inproc_cluster.client.get_prefix(
        f"{inproc_cluster.root}/assign/{J}#".encode())])
    # The FSM re-resolved at the revision it wrote: the response header is no older.
    assert resp.header.etcd.revision >= written
    assert resp.header.route.primary == route_of(a, b).primary
    assert list(resp.header.route.members) == list(route_of(a, b).members)
    assert list(resp.header.route.endpoints) == [a.endpoint, b.endpoint]

    # Consistent assignments are left alone.
    assert (await append(a, J, b"two")).status == pb.OK
    assert max([kv.mod_revision for kv in await inproc_cluster.client.get_prefix(
        f"{inproc_cluster.root}/assign/{J}#".encode())]) == written


async def test_assignment_update_that_loses_a_race_does_not_stall(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b)
    # a's mirror lags while another writer (as the allocator might) rewrites an assignment, so a's
    # update, guarded by the mod revisions a has seen, fails.
    a.keyspace.watch_delay = 0.3
    await inproc_cluster.assign(J, a, b, wait_for=[b])
    # etcd's revision moves on outside this keyspace (another cluster, consumers, ...).
    await txn(inproc_cluster.client, [], [put_op(f"{inproc_cluster.root}-elsewhere/key", b"x")])
    # A stall would be an append waiting for a revision its mirror never reaches, until SETTLE_TIMEOUT (10 s)
    # ends it in an error: the bound is well under that, and well over the mirror's 0.3 s delays and etcd's
    # round trips on a loaded host.
    resp = await asyncio.wait_for(append(a, J, b"data"), broker.append.SETTLE_TIMEOUT / 2)
    assert resp.status == pb.OK


# --- AwaitDesiredReplicas ---------------------------------------------------------------------------


async def test_fewer_members_than_replication_is_insufficient_journal_brokers(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, _ = inproc_pair
    await new_journal(inproc_cluster, a, replication=2)
    resp = await append(a, J, b"data")
    assert resp.status == pb.INSUFFICIENT_JOURNAL_BROKERS
    assert resp.header.process_id == a.local_id
    assert not a.replica(J).lock.locked()
    assert fragment_of(a).end == 0


async def test_more_members_than_replication_waits_for_the_route_to_shrink(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b, replication=1)
    pending = asyncio.ensure_future(append(a, J, b"data"))
    await asyncio.sleep(0.2)
    assert not pending.done(), "the FSM waits while the allocator shrinks the route"
    await inproc_cluster.assign(J, a)
    resp = await asyncio.wait_for(pending, WAIT)
    assert resp.status == pb.OK
    assert list(resp.header.route.members) == [a.local_id]
    pipeline = a.replica(J).pipeline
    assert pipeline is not None and pipeline.peers == 0


async def test_a_route_shrunk_while_the_append_syncs_is_not_waited_for_again(
    inproc_cluster: InProcessCluster, inproc_pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The allocator shrinks the route after the append resolved it with too many members, so the
    mirror is already past that resolution when the FSM checks the desired replication: it resolves
    again at once (no later revision need ever come)."""
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b, replication=1)
    check = Append._await_desired_replicas
    shrunk: list[bool] = []

    async def shrunk_first(self: Append, res: Any) -> bool | None:
        if not shrunk:
            shrunk.append(True)
            await inproc_cluster.assign(J, a)  # Waits until every broker's mirror has it.
        return await check(self, res)

    monkeypatch.setattr(Append, "_await_desired_replicas", shrunk_first)
    resp = await asyncio.wait_for(append(a, J, b"data"), WAIT)
    assert shrunk and resp.status == pb.OK
    assert list(resp.header.route.members) == [a.local_id]


@pytest.mark.parametrize("replication", [1, 3])
async def test_proxy_decision_awaits_desired_replication(
    inproc_cluster: InProcessCluster, inproc_pair: Pair, replication: int
) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b, replication=replication)
    fsm = Append(b.state, pb.AppendRequest(journal=J))
    done = asyncio.ensure_future(fsm.prepare())
    try:
        if replication == 1:
            await asyncio.wait({done}, timeout=0.2)
            assert not done.done(), "too many members: wait for the allocator before proxying"
        else:
            # Answered without waiting for the allocator (which, here, never changes the route).
            await asyncio.wait({done}, timeout=WAIT)
            assert done.done() and fsm.response is not None
            assert fsm.response.status == pb.INSUFFICIENT_JOURNAL_BROKERS
            assert fsm.proxy is None
    finally:
        done.cancel()


# --- AcquirePipeline and sync -----------------------------------------------------------------------


async def test_pipeline_is_built_then_reused_while_the_route_is_equivalent(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b)
    assert a.replica(J).pipeline is None

    fsm = await prepared(a)
    pipeline = a.replica(J).pipeline
    assert isinstance(pipeline, Pipeline) and fsm.pipeline is pipeline
    assert pipeline.peers == 1
    assert list(pipeline.route.members) == list(route_of(a, b).members)
    assert pipeline.header.process_id == a.local_id
    assert (await fsm.stream(content(b"one"))).status == pb.OK
    assert not a.replica(J).lock.locked(), "stream() releases the replica"

    fsm = await prepared(a)
    assert fsm.pipeline is pipeline and a.replica(J).pipeline is pipeline
    assert (await fsm.stream(content(b"two"))).status == pb.OK
    assert pipeline.broken is None
    assert_spools_agree(a, b)


async def test_pipeline_is_rebuilt_when_the_route_changes_and_a_new_peer_rolls_to_our_end(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, b = inproc_pair
    c = await inproc_cluster.add_broker("broker-c")
    await new_journal(inproc_cluster, a, b)
    assert (await append(a, J, b"before")).status == pb.OK
    old = a.replica(J).pipeline
    assert old is not None

    await inproc_cluster.assign(J, a, c)
    fsm = await prepared(a)
    new = a.replica(J).pipeline
    assert new is not None and new is not old
    assert old.peers == 0, "the old pipeline's streams are closed"
    assert list(new.route.members) == list(route_of(a, c).members)
    # c's empty spool answered the sync with an empty fragment at our end: both rolled there (5.5).
    assert fragment_of(a).begin == fragment_of(a).end == 6
    assert fragment_of(c).begin == fragment_of(c).end == 6
    resp = await fsm.stream(content(b"after"))
    assert (resp.commit.begin, resp.commit.end) == (6, 11)
    assert_spools_agree(a, c)
    assert await c.read(J, 6) == b"after"


async def test_sync_rolls_to_the_furthest_peer_and_adopts_its_registers(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, b = inproc_pair
    c = await inproc_cluster.add_broker("broker-c")
    await new_journal(inproc_cluster, b, c)
    resp = await append(b, J, b"written by b", union_registers=regs(owner="b"))
    assert resp.status == pb.OK and resp.commit.end == 12

    # a becomes primary with an empty spool; b holds the journal's head.
    await inproc_cluster.assign(J, a, b)
    assert fragment_of(a).end == 0
    fsm = await prepared(a)
    assert fragment_of(a).begin == fragment_of(a).end == 12, "rolled to the peer's end"
    assert a.replica(J).spool.registers == regs(owner="b"), "and took the peer's registers"
    assert fragment_of(b).begin == 12, "the peer rolled too, to the agreed empty fragment"
    resp = await fsm.stream(content(b"by a"))
    assert resp.status == pb.OK
    assert (resp.commit.begin, resp.commit.end) == (12, 16)
    assert resp.registers == regs(owner="b")
    assert_spools_agree(a, b)
    assert await b.read(J) == b"written by bby a"


async def test_sync_wrong_route_from_a_newer_peer_re_resolves(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b)
    # b becomes primary; a's mirror learns it only after b has.
    a.keyspace.watch_delay = 0.5
    revision = await inproc_cluster.assign(J, b, a, wait_for=[b])
    assert a.keyspace.revision < revision and b.keyspace.revision >= revision

    fsm = Append(a.state, pb.AppendRequest(journal=J))
    await asyncio.wait_for(fsm.prepare(), WAIT)
    # b answered the sync WRONG_ROUTE at its newer revision: a dropped its pipeline, waited for that
    # revision and re-resolved, to find b primary.
    assert fsm.response is None
    assert fsm.proxy is not None
    assert fsm.proxy.header.process_id == b.local_id
    assert fsm.proxy.header.etcd.revision >= revision
    assert a.replica(J).pipeline is None
    assert not a.replica(J).lock.locked()


async def test_sync_failure_drops_the_pipeline(inproc_cluster: InProcessCluster, inproc_pair: Pair) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b)
    assert (await append(a, J, b"kept")).status == pb.OK
    # Consistency is lost: both spools hold [0, 7), with different content.
    replica = a.replica(J)
    pipeline, replica.pipeline = replica.pipeline, None
    assert pipeline is not None
    await pipeline.close()
    await eventually(lambda: not b.replica(J).lock.locked(), "b's Replicate stream ended")
    for x, extra in ((a, b"abc"), (b, b"xyz")):
        spool = x.replica(J).spool
        spool.apply(pb.ReplicateRequest(content=extra, content_delta=0))
        spool.apply(pb.ReplicateRequest(proposal=spool.next(), registers=spool.registers, acknowledge=True))
        assert spool.fragment.end == 7

    with pytest.raises(PipelineError, match="peer broker-b replied PROPOSAL_MISMATCH to sync"):
        await append(a, J, b"next")
    # Every further append fails at its sync too, and commits nothing anywhere.
    with pytest.raises(PipelineError, match="peer broker-b replied PROPOSAL_MISMATCH to sync"):
        await append(a, J, b"next")
    assert fragment_of(a).end == fragment_of(b).end == 7


# --- ValidatePreconditions: registers and offsets ---------------------------------------------------


async def test_register_mismatch_returns_the_registers(inproc_cluster: InProcessCluster, inproc_pair: Pair) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b)
    assert (await append(a, J, b"one", union_registers=regs(owner="a"))).status == pb.OK

    resp = await append(a, J, b"two", check_registers=selector(owner="other"))
    assert resp.status == pb.REGISTER_MISMATCH
    assert resp.registers == regs(owner="a")
    assert not resp.HasField("commit")
    assert not a.replica(J).lock.locked()
    assert fragment_of(a).end == 3

    resp = await append(a, J, b"two", check_registers=selector(owner="a"))
    assert resp.status == pb.OK and resp.commit.begin == 3
    assert_spools_agree(a, b)


async def test_empty_registers_match_any_selector(inproc_cluster: InProcessCluster, inproc_pair: Pair) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b)
    resp = await append(a, J, b"one", check_registers=selector(owner="anyone"))
    assert resp.status == pb.OK
    assert resp.registers == pb.LabelSet()


async def test_wrong_append_offset(inproc_cluster: InProcessCluster, inproc_pair: Pair) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b)
    assert (await append(a, J, b"12345")).status == pb.OK
    for offset in (4, 6):
        resp = await append(a, J, b"x", offset=offset)
        assert resp.status == pb.WRONG_APPEND_OFFSET, offset
        assert not a.replica(J).lock.locked()
    resp = await append(a, J, b"x", offset=5)
    assert resp.status == pb.OK
    assert (resp.commit.begin, resp.commit.end) == (5, 6)
    assert_spools_agree(a, b)


async def test_index_has_greater_offset_until_an_explicit_offset_rolls_the_spool(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, b = inproc_pair
    # The store holds [0, 100) persisted by an earlier primary; these brokers' spools are empty.
    persisted = pb.Fragment(journal=J, begin=0, end=100, sum=sha1(b"p" * 100), compression_codec=pb.NONE)
    store = a.core.persistence.registry.get(inproc_cluster.store_url)
    await store.put(content_path(persisted), io.BytesIO(b"p" * 100))
    await new_journal(inproc_cluster, a, b, store=True)
    await asyncio.wait_for(a.replica(J).index.first_refresh.wait(), WAIT)
    assert a.replica(J).index.summary()[:2] == (0, 100)

    resp = await append(a, J, b"data")
    assert resp.status == pb.INDEX_HAS_GREATER_OFFSET
    assert fragment_of(a).end == 0
    assert (await append(a, J, b"data", offset=50)).status == pb.WRONG_APPEND_OFFSET

    resp = await append(a, J, b"data", offset=100)
    assert resp.status == pb.OK
    assert (resp.commit.begin, resp.commit.end) == (100, 104)
    assert fragment_of(a).begin == fragment_of(b).begin == 100, "both spools rolled to the offset"
    assert_spools_agree(a, b)
    # The head is consistent now: offset 0 appends are accepted again.
    assert (await append(a, J, b"more")).commit.begin == 104


async def test_read_only_journal_is_exempt_from_the_offset_check_but_refuses_content(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b)
    assert (await append(a, J, b"abc")).status == pb.OK
    spec, _ = await inproc_cluster.spec(J)
    spec.flags = pb.JournalSpec.O_RDONLY
    await inproc_cluster.put_spec(spec)

    resp = await append(a, J, b"refused")
    assert resp.status == pb.NOT_ALLOWED
    assert fragment_of(a).end == 3 and a.replica(J).spool.delta == 0
    resp = await append(a, J)
    assert resp.status == pb.OK and (resp.commit.begin, resp.commit.end) == (3, 3)
    assert_spools_agree(a, b)


# --- ValidatePreconditions: suspension --------------------------------------------------------------


def suspend(level: int, offset: int = 0) -> pb.JournalSpec.Suspend:
    return pb.JournalSpec.Suspend(level=level, offset=offset)  # type: ignore[arg-type]


async def test_fully_suspended_journal_without_resume_is_suspended(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, _ = inproc_pair
    await new_journal(inproc_cluster, a, replication=1, suspend=suspend(LEVEL.FULL, 40))
    resp = await append(a, J, b"data", suspend=AS.SUSPEND_NO_RESUME)
    assert resp.status == pb.SUSPENDED
    spec, _ = await inproc_cluster.spec(J)
    assert (spec.suspend.level, spec.suspend.offset) == (LEVEL.FULL, 40)


async def test_a_pulse_does_not_resume_a_suspended_journal(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, _ = inproc_pair
    await new_journal(inproc_cluster, a, replication=1, suspend=suspend(LEVEL.FULL, 40))
    assert await pulse(a.state, J) == pb.SUSPENDED
    spec, _ = await inproc_cluster.spec(J)
    assert (spec.suspend.level, spec.suspend.offset) == (LEVEL.FULL, 40)


async def test_resume_of_a_fully_suspended_journal_rolls_to_its_offset(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b, suspend=suspend(LEVEL.FULL, 40))
    resp = await append(a, J, b"resumed")  # SUSPEND_RESUME is the default.
    assert resp.status == pb.OK
    assert (resp.commit.begin, resp.commit.end) == (40, 47)
    spec, _ = await inproc_cluster.spec(J)
    assert (spec.suspend.level, spec.suspend.offset) == (LEVEL.NONE, 40)
    assert fragment_of(a).begin == fragment_of(b).begin == 40
    assert_spools_agree(a, b)


async def test_partially_suspended_journal(inproc_cluster: InProcessCluster, inproc_pair: Pair) -> None:
    a, _ = inproc_pair
    await new_journal(inproc_cluster, a, replication=1, suspend=suspend(LEVEL.PARTIAL, 0))
    for mode in (AS.SUSPEND_NO_RESUME, AS.SUSPEND_IF_FLUSHED, AS.SUSPEND_NOW):
        resp = await append(a, J, suspend=mode)
        assert resp.status == pb.SUSPENDED, AS.Suspend.Name(mode)
    resp = await append(a, J, b"data", suspend=AS.SUSPEND_RESUME)
    assert resp.status == pb.OK and resp.commit.end == 4
    spec, _ = await inproc_cluster.spec(J)
    assert (spec.suspend.level, spec.suspend.offset) == (LEVEL.NONE, 0)


async def test_suspend_now_of_an_empty_journal_suspends_it_fully(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, _ = inproc_pair
    await new_journal(inproc_cluster, a, replication=1)
    resp = await append(a, J, suspend=AS.SUSPEND_NOW)
    assert resp.status == pb.SUSPENDED
    spec, _ = await inproc_cluster.spec(J)
    assert (spec.suspend.level, spec.suspend.offset) == (LEVEL.FULL, 0)


async def test_suspend_now_of_a_written_journal_suspends_it_partially_and_rolls(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, _ = inproc_pair
    await new_journal(inproc_cluster, a, replication=1)
    assert (await append(a, J, b"abc")).status == pb.OK
    assert (await append(a, J, b"defg")).status == pb.OK
    resp = await append(a, J, suspend=AS.SUSPEND_NOW)
    assert resp.status == pb.SUSPENDED
    spec, _ = await inproc_cluster.spec(J)
    assert (spec.suspend.level, spec.suspend.offset) == (LEVEL.PARTIAL, 7)
    assert fragment_of(a).begin == fragment_of(a).end == 7, "the spool rolled at the suspend offset"


async def test_suspend_if_flushed_leaves_a_dirty_journal_alone(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, _ = inproc_pair
    await new_journal(inproc_cluster, a, replication=1)
    assert (await append(a, J, b"abc")).status == pb.OK  # Local, unpersisted: the index is dirty.
    resp = await append(a, J, suspend=AS.SUSPEND_IF_FLUSHED)
    assert resp.status == pb.OK and (resp.commit.begin, resp.commit.end) == (3, 3)
    spec, _ = await inproc_cluster.spec(J)
    assert spec.suspend.level == LEVEL.NONE
    resp = await append(a, J, b"content", suspend=AS.SUSPEND_IF_FLUSHED)
    assert resp.status == pb.NOT_ALLOWED, "suspend requests carry no content"
    assert fragment_of(a).end == 3 and a.replica(J).spool.delta == 0


@pytest.mark.parametrize("auto_suspend", [True, False], ids=["auto-suspend", "off"])
async def test_pulses_auto_suspend_a_journal_whose_route_held_still(
    inproc_cluster: InProcessCluster, inproc_pair: Pair, auto_suspend: bool
) -> None:
    a, _ = inproc_pair
    await new_journal(inproc_cluster, a, replication=1)
    stop = asyncio.Event()
    interval = 0.02  # Gazette's one-minute health check, shortened.
    pulses = asyncio.create_task(run_pulses(a.state, stop, auto_suspend=auto_suspend, interval=interval))
    try:
        # STABLE_PULSES_TO_SUSPEND periodic pulses (0.3 s here), then SUSPEND_IF_FLUSHED: with no
        # fragment anywhere, the journal is suspended fully.
        # Without auto-suspend, three times as many pulses change nothing.
        waited = WAIT if auto_suspend else 3 * STABLE_PULSES_TO_SUSPEND * interval
        deadline = asyncio.get_running_loop().time() + waited
        while asyncio.get_running_loop().time() < deadline:
            spec, _ = await inproc_cluster.spec(J)
            if spec.suspend.level != LEVEL.NONE:
                break
            await asyncio.sleep(interval)
    finally:
        stop.set()
        await pulses
    if auto_suspend:
        assert (spec.suspend.level, spec.suspend.offset) == (LEVEL.FULL, 0)
        assert (await append(a, J, b"resumed")).status == pb.OK, "an append resumes it"
        spec, _ = await inproc_cluster.spec(J)
        assert spec.suspend.level == LEVEL.NONE
    else:
        assert spec.suspend.level == LEVEL.NONE, "without --broker.auto-suspend, pulses never suspend"


# --- First-write rule -------------------------------------------------------------------------------


async def test_first_write_rule_closes_the_first_fragment(inproc_cluster: InProcessCluster, inproc_pair: Pair) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b, store=True)
    assert (await append(a, J, b"first")).status == pb.OK
    assert (fragment_of(a).begin, fragment_of(a).end) == (0, 5)

    # The next append rolls at the spool's end: the journal's first fragment is complete...
    assert (await append(a, J, b"second")).status == pb.OK
    for x in (a, b):
        assert (fragment_of(x).begin, fragment_of(x).end) == (5, 11), x.suffix
    # ...and persisted.
    await asyncio.wait_for(a.core.persistence.drain(), WAIT)
    first = pb.Fragment(journal=J, begin=0, end=5, sum=sha1(b"first"), compression_codec=pb.NONE)
    assert bucket_objects(inproc_cluster.bucket)[content_path(first)].content == b"first"

    # Later appends extend the second fragment.
    assert (await append(a, J, b"third")).status == pb.OK
    assert (fragment_of(a).begin, fragment_of(a).end) == (5, 16)
    assert_spools_agree(a, b)
    assert await a.read(J) == b"firstsecondthird"


# --- StreamContent and commit -----------------------------------------------------------------------


async def test_commit_offsets_sum_spool_and_index(inproc_cluster: InProcessCluster, inproc_pair: Pair) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b)
    resp = await append(a, J, b"hello", b"world")
    assert resp.status == pb.OK
    assert resp.commit == pb.Fragment(
        journal=J, begin=0, end=10, sum=sha1(b"helloworld"), compression_codec=pb.NONE
    )
    assert (resp.total_chunks, resp.delayed_chunks) == (2, 0)
    assert resp.header.process_id == a.local_id
    assert a.replica(J).index.summary()[:2] == (0, 10)
    # The replica committed before it acknowledged; readers get the commit once the primary's
    # confirmation (sent before the reply) arrives.
    assert fragment_of(b).end == 10
    await eventually(lambda: b.replica(J).index.summary()[:2] == (0, 10), "the replica's index has the commit")
    assert_spools_agree(a, b)

    # Large chunks (written and hashed in worker threads) and small ones, in order.
    big = bytes(range(256)) * 512  # 128 KiB
    resp = await append(a, J, big, b"tail", big)
    data = big + b"tail" + big
    assert resp.commit.begin == 10 and resp.commit.end == 10 + len(data)
    assert resp.commit.sum == sha1(data), "the commit's sum covers this append only"
    assert_spools_agree(a, b)
    assert await b.read(J) == b"helloworld" + data
    assert await a.read(J) == b"helloworld" + data


async def test_zero_byte_append_commits_nothing(inproc_cluster: InProcessCluster, inproc_pair: Pair) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b)
    assert (await append(a, J, b"abc")).status == pb.OK
    assert (await append(a, J, b"de")).status == pb.OK  # Past the first-write roll: [3, 5).
    before = pb.Fragment()
    before.CopyFrom(fragment_of(a))
    resp = await append(a, J)
    assert resp.status == pb.OK
    assert (resp.commit.begin, resp.commit.end) == (5, 5)
    assert hexsum(resp.commit.sum) == EMPTY_SHA1
    assert resp.total_chunks == 0
    assert fragment_of(a) == before
    assert_spools_agree(a, b)


async def test_registers_union_and_subtract(inproc_cluster: InProcessCluster, inproc_pair: Pair) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b)
    resp = await append(a, J, b"1", union_registers=regs(alpha="1", beta="2"))
    assert resp.registers == regs(alpha="1", beta="2")
    # Subtract first, then union, whose values win per name.
    resp = await append(
        a, J, b"2", subtract_registers=regs(alpha="1"), union_registers=regs(beta="9", gamma="3")
    )
    assert resp.registers == regs(beta="9", gamma="3")
    # A subtracted label is removed only if its values match.
    resp = await append(a, J, b"3", subtract_registers=regs(beta="2"))
    assert resp.registers == regs(beta="9", gamma="3")
    resp = await append(a, J, b"4")
    assert resp.registers == regs(beta="9", gamma="3"), "appends without changes keep the registers"
    for x in (a, b):
        assert x.replica(J).spool.registers == regs(beta="9", gamma="3"), x.suffix
    assert_spools_agree(a, b)


async def test_register_modification_requires_content(inproc_cluster: InProcessCluster, inproc_pair: Pair) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b)
    assert (await append(a, J, b"abc", union_registers=regs(key="v"))).status == pb.OK
    fsm = await prepared(a, union_registers=regs(key="other"))
    with pytest.raises(AppendError, match="register modification requires non-empty Append"):
        await fsm.stream(content())
    assert not a.replica(J).lock.locked()
    assert a.replica(J).spool.registers == regs(key="v")
    assert (await append(a, J, b"d")).commit.begin == 3
    assert_spools_agree(a, b)


# --- Rollback ---------------------------------------------------------------------------------------


async def client_stream(*messages: pb.AppendRequest) -> AsyncIterator[pb.AppendRequest]:
    for message in messages:
        yield message


BIG = b"b" * (200 << 10)  # Past THREADED_APPLY_MIN: applied in a worker thread.

ROLLBACKS: dict[str, tuple[Callable[[], AsyncIterator[bytes | memoryview]], type[BaseException], str]] = {
    "eof-without-commit-marker": (
        lambda: _content_chunks(client_stream(AS(content=b"lost"), AS(content=BIG)), J),
        BrokerError, "unexpected EOF",
    ),
    "message-after-commit-marker": (
        lambda: _content_chunks(client_stream(AS(content=b"lost"), AS(), AS(content=b"x")), J),
        BrokerError, "expected EOF after empty Content chunk",
    ),
    "client-stream-raises": (
        lambda: content(b"lost", BIG, then=ConnectionResetError("client went away")),
        ConnectionResetError, "client went away",
    ),
}


@pytest.mark.parametrize("case", sorted(ROLLBACKS))
async def test_rollback_leaves_nothing_visible(inproc_cluster: InProcessCluster, inproc_pair: Pair, case: str) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b)
    assert (await append(a, J, b"kept", union_registers=regs(key="v"))).status == pb.OK
    chunks, error, message = ROLLBACKS[case]

    fsm = await prepared(a, union_registers=regs(key="lost"))
    with pytest.raises(error, match=message):
        await fsm.stream(chunks())
    await assert_rolled_back(a, b)


async def assert_rolled_back(a: InProcessBroker, b: InProcessBroker) -> None:
    """After an append on top of `kept` (registers key=v) rolled back on `a`, its primary: nothing of
    it is left anywhere, the pipeline is kept, and the next append commits right after `kept`."""
    assert not a.replica(J).lock.locked()
    for x in (a, b):
        assert fragment_of(x).end == 4, x.suffix
        assert x.replica(J).spool.delta == 0, x.suffix
        assert x.replica(J).spool.registers == regs(key="v"), x.suffix
        assert x.replica(J).index.summary()[1] == 4, x.suffix
    assert await a.read(J) == b"kept"
    assert a.replica(J).pipeline is not None, "a rolled-back append keeps its healthy pipeline"

    resp = await append(a, J, b"next")
    assert (resp.commit.begin, resp.commit.end) == (4, 8)
    assert resp.commit.sum == sha1(b"next")
    assert_spools_agree(a, b)
    assert await b.read(J) == b"keptnext"


async def test_rollback_completes_though_the_append_is_cancelled_meanwhile(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    # The client's stream ends without the commit marker and the RPC is cancelled as the append
    # begins to roll back (grpc.aio cancels the handler once its client is gone): the rollback
    # finishes first, so the next append finds the spool as it was.
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b)
    assert (await append(a, J, b"kept", union_registers=regs(key="v"))).status == pb.OK
    fsm = await prepared(a, union_registers=regs(key="lost"))
    running: list[asyncio.Task[pb.AppendResponse]] = []

    async def abandoned() -> AsyncIterator[bytes]:
        yield b"lost"
        yield BIG
        asyncio.get_running_loop().call_soon(running[0].cancel)  # Lands in the rollback's first await.
        raise ConnectionResetError("client went away")

    running.append(asyncio.ensure_future(fsm.stream(abandoned())))
    with pytest.raises(asyncio.CancelledError):
        await running[0]
    await assert_rolled_back(a, b)


@pytest.mark.parametrize("where", ["proposing", "awaiting-acknowledgements"])
async def test_commit_cancelled_midway_leaves_no_acknowledgement_for_a_later_append(
    inproc_cluster: InProcessCluster, inproc_pair: Pair, where: str
) -> None:
    # The RPC is cancelled (its client went away) while the commit is proposed to the peer, or while
    # its acknowledgement is awaited. Either way no reply is left for a later append of the pipeline
    # to take for its own: an append the peer refuses fails (the cancelled read ends the Replicate
    # call, and the rollback then tears the pipeline down).
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b)
    assert (await append(a, J, b"kept")).status == pb.OK
    fsm = await prepared(a)
    pipeline = fsm.pipeline
    assert pipeline is not None
    send, gather_ok = pipeline._send, pipeline.gather_ok
    running: list[asyncio.Task[pb.AppendResponse]] = []

    def cancel_soon() -> None:
        pipeline._send, pipeline.gather_ok = send, gather_ok  # type: ignore[method-assign]  # Once.
        asyncio.get_running_loop().call_soon(running[0].cancel)  # Lands in the next await that waits.

    async def proposing(req: pb.ReplicateRequest) -> None:
        if req.HasField("proposal") and req.acknowledge:
            cancel_soon()
        await send(req)

    async def awaiting_acknowledgements() -> None:
        cancel_soon()
        await gather_ok()

    if where == "proposing":
        pipeline._send = proposing  # type: ignore[method-assign]
    else:
        pipeline.gather_ok = awaiting_acknowledgements  # type: ignore[method-assign]
    running.append(asyncio.ensure_future(fsm.stream(content(b"sent"))))
    with pytest.raises(asyncio.CancelledError):
        await running[0]
    assert not a.replica(J).lock.locked()
    assert a.replica(J).spool.delta == 0

    # The peer refuses the next append's commit: that append fails, and none after it.
    fsm = await prepared(a)
    with pytest.raises(PipelineError, match="peer broker-b replied PROPOSAL_MISMATCH"):
        await fsm.stream(diverging_on(b))
    assert a.replica(J).pipeline is None, "the broken pipeline is dropped"
    resp = await append(a, J, b"next")
    assert resp.status == pb.OK
    assert_spools_agree(a, b)
    assert (await a.read(J, resp.commit.begin)) == b"next"


# --- ReadAcknowledgements: peers that fail ----------------------------------------------------------


async def diverging_on(peer: InProcessBroker) -> AsyncIterator[bytes]:
    """An append's content `abc`; once `peer` has it, its spool gains bytes the primary never sent,
    so that it cannot agree on the commit."""
    spool = peer.replica(J).spool
    yield b"abc"
    await eventually(lambda: spool.delta == 3, "the peer received the content")
    spool.apply(pb.ReplicateRequest(content=b"zz", content_delta=3))


def stream_ended(fsm: Append, peer: InProcessBroker) -> Callable[[], bool]:
    """Whether the Replicate call of `fsm`'s pipeline to `peer` has terminated (as the primary sees it)."""
    assert fsm.pipeline is not None
    [call] = [call for member, call in fsm.pipeline._streams if member == peer.local_id]
    return call.done


async def test_peer_disagreeing_on_the_commit_fails_the_append(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, b = inproc_pair
    await new_journal(inproc_cluster, a, b)
    assert (await append(a, J, b"kept")).status == pb.OK
    peer = b.replica(J).spool
    fsm = await prepared(a)
    with pytest.raises(PipelineError, match="peer broker-b replied PROPOSAL_MISMATCH"):
        await fsm.stream(diverging_on(b))
    assert not a.replica(J).lock.locked()
    assert a.replica(J).pipeline is None, "the broken pipeline is dropped"
    await eventually(lambda: peer.delta == 0, "the peer rolled back when the pipeline closed")
    # The primary applies a commit only once every peer took it (Gazette's applies it as it sends it):
    # the commit the peer refused is nowhere, and the client saw an error.
    assert fragment_of(a).end == 4
    assert fragment_of(b).end == 4

    # Appends continue where the peer set agrees.
    resp = await append(a, J, b"next")
    assert (resp.commit.begin, resp.commit.end) == (4, 8)
    assert_spools_agree(a, b)
    assert await b.read(J, 4) == b"next"
    assert await a.read(J, 4) == b"next"


async def test_peer_dying_before_the_commit_fails_the_append_until_the_route_heals(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, b = inproc_pair
    c = await inproc_cluster.add_broker("broker-c")
    await new_journal(inproc_cluster, a, b)
    assert (await append(a, J, b"kept")).status == pb.OK
    peer = b.replica(J).spool
    fsm = await prepared(a)

    async def peer_dies() -> AsyncIterator[bytes]:
        yield b"abc"
        await eventually(lambda: peer.delta == 3, "the peer received the content")
        await b.kill()
        await eventually(stream_ended(fsm, b), "the primary saw the peer's stream end")

    with pytest.raises(PipelineError, match="replicate to broker-b failed"):
        await fsm.stream(peer_dies())
    assert not a.replica(J).lock.locked()
    assert a.replica(J).pipeline is None, "the broken pipeline is dropped"
    assert fragment_of(a).end == 4 and a.replica(J).spool.delta == 0, "nothing was committed"
    assert await a.read(J) == b"kept"
    # While the dead broker is in the route, appends fail (the client retries).
    with pytest.raises(PipelineError, match="broker-b"):
        await append(a, J, b"next")
    assert fragment_of(a).end == 4

    # The route heals: c replaces the dead broker.
    await inproc_cluster.assign(J, a, c)
    resp = await append(a, J, b"next")
    assert resp.status == pb.OK
    assert (resp.commit.begin, resp.commit.end) == (4, 8)
    assert_spools_agree(a, c)
    assert await a.read(J) == b"keptnext"
    assert await c.read(J, 4) == b"next"


async def test_commit_reaching_only_some_peers_is_won_at_the_next_sync(
    inproc_cluster: InProcessCluster, inproc_pair: Pair
) -> None:
    a, b = inproc_pair
    c = await inproc_cluster.add_broker("broker-c")
    d = await inproc_cluster.add_broker("broker-d")
    await new_journal(inproc_cluster, a, b, c)
    assert (await append(a, J, b"kept")).status == pb.OK
    fsm = await prepared(a, union_registers=regs(key="maybe"))

    async def last_peer_dies() -> AsyncIterator[bytes]:
        yield b"maybe"
        await eventually(lambda: c.replica(J).spool.delta == 5, "the last peer received the content")
        await c.kill()
        await eventually(stream_ended(fsm, c), "the primary saw c's stream end")

    # The commit goes to b, then fails on c before the primary applies it.
    with pytest.raises(PipelineError, match="replicate to broker-c failed"):
        await fsm.stream(last_peer_dies())
    assert fragment_of(a).end == 4, "the primary rolled back"
    assert fragment_of(b).end == 9, "b committed"
    assert b.replica(J).spool.registers == regs(key="maybe")

    # d replaces c. At the next sync b's further end and its registers win (7.2).
    await inproc_cluster.assign(J, a, b, d)
    resp = await append(a, J, b"next")
    assert resp.status == pb.OK
    assert (resp.commit.begin, resp.commit.end) == (9, 13)
    assert resp.registers == regs(key="maybe")
    assert_spools_agree(a, b, d)
    assert await b.read(J) == b"keptmaybenext"
    assert await a.read(J, 9) == b"next"
