"""List and Apply helpers, ListFragments paging and the journal watcher, against a real broker."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import grpc
import pytest

from broker.client import (
    EtcdTransactionFailed,
    JournalChanges,
    JournalClient,
    JournalNotFound,
    JournalWatcher,
    append,
    apply_journals,
    delete,
    fragments_request,
    iter_list_pages,
    list_all_fragments,
    list_fragments,
    list_journals,
    upsert,
    watch_journals,
)
from broker.client import sync as client_sync
from broker.protocol import pb
from tests.support.harness import BrokerProcess, journal_spec
from tests.support.journals import new_journal, unique, wait_for_primary


def selector(**include: str) -> pb.LabelSelector:
    return pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name=k, value=v) for k, v in sorted(include.items())]))


async def test_list_streams_pages_and_joins_them(client: JournalClient) -> None:
    tag = uuid.uuid4().hex[:8]
    specs = [journal_spec(f"client/list/{tag}/{i:02d}", topic=tag) for i in range(60)]
    resp = await apply_journals(client, [upsert(s) for s in specs], max_txn_size=25)
    assert resp.status == pb.OK and resp.header.etcd.revision > 0

    pages = [page async for page in iter_list_pages(client, selector(topic=tag))]
    assert [len(p.journals) for p in pages] == [25, 25, 10]  # The broker's pages of at most 25.
    assert pages[0].header.etcd.revision >= resp.header.etcd.revision
    joined = await list_journals(client, selector(topic=tag))
    assert [j.spec.name for j in joined.journals] == [s.name for s in specs]
    assert all(j.mod_revision > 0 for j in joined.journals)

    # Apply checks revisions: creating again fails with the typed status error.
    with pytest.raises(EtcdTransactionFailed):
        await apply_journals(client, [upsert(specs[0])])
    await apply_journals(client, [delete(s.name) for s in specs])
    assert len((await list_journals(client, selector(topic=tag))).journals) == 0


async def test_list_teaches_the_route_cache(client: JournalClient, broker: BrokerProcess) -> None:
    journal = await new_journal(client)
    assert client.routes is not None
    client.routes.invalidate(journal)
    await list_journals(client, selector(name=journal))
    route = client.routes.get(journal)
    assert route is not None and list(route.endpoints) == [broker.url]
    assert client.endpoint(journal, primary=True) == broker.url


async def test_list_all_fragments_follows_pages(client: JournalClient) -> None:
    # A fragment rolls once it is longer than `length`: each 1500-byte append then starts a new one.
    journal = await new_journal(client, length=1024)
    for i in range(7):
        await append(client, journal, bytes([65 + i]) * 1500)

    first = await list_fragments(client, fragments_request(journal, page_limit=3))
    assert len(first.fragments) == 3 and first.next_page_token == first.fragments[-1].spec.end

    everything = await list_all_fragments(client, fragments_request(journal, page_limit=2))
    spans = [(f.spec.begin, f.spec.end) for f in everything.fragments]
    assert spans == [(1500 * i, 1500 * (i + 1)) for i in range(7)]
    assert everything.next_page_token == 0
    assert all(f.spec.backing_store == "" and f.spec.journal == journal for f in everything.fragments)

    with pytest.raises(JournalNotFound):
        await list_fragments(client, fragments_request(unique("client/missing")))


async def test_sync_facade(broker: BrokerProcess) -> None:
    name = unique("client/sync")

    def script() -> tuple[bytes, int, int]:
        client_sync.apply_journals(broker.url, [upsert(journal_spec(name))], timeout=30)
        client_sync.append(broker.url, name, b"from ", timeout=30)
        resp = client_sync.append(broker.url, name, b"a script", timeout=30)
        listed = client_sync.list_journals(broker.url, selector(name=name), timeout=30)
        fragments = client_sync.list_all_fragments(broker.url, name, timeout=30)
        data = client_sync.read_all(broker.url, name, timeout=30)
        assert client_sync.read_all(broker.url, name, 5, timeout=30) == b"a script"
        assert resp.commit.end == 13
        return data, len(listed.journals), len(fragments.fragments)

    assert await asyncio.to_thread(script) == (b"from a script", 1, 2)
    with pytest.raises(RuntimeError, match="inside an event loop"):
        client_sync.read_all(broker.url, name)


async def next_change(changes: object, timeout: float = 30.0) -> JournalChanges:
    change: JournalChanges = await asyncio.wait_for(anext(changes), timeout)  # type: ignore[call-overload]
    return change


@pytest.mark.parametrize("poll_interval", [None, 0.1], ids=["watch", "poll"])
async def test_journal_watcher_reports_added_and_removed(client: JournalClient, poll_interval: float | None) -> None:
    tag = uuid.uuid4().hex[:8]
    existing = journal_spec(f"client/watch/{tag}/existing", topic=tag)
    await apply_journals(client, [upsert(existing)])
    watcher = JournalWatcher(client, selector(topic=tag), poll_interval=poll_interval)
    changes = watcher.changes()
    try:
        initial = await next_change(changes)
        assert initial.added == {existing.name} and not initial.removed
        assert set(initial.journals) == {existing.name}

        added = journal_spec(f"client/watch/{tag}/added", topic=tag)
        await apply_journals(client, [upsert(added)])
        change = await next_change(changes)
        assert change.added == {added.name} and not change.removed
        assert set(watcher.journals) == {existing.name, added.name}

        await apply_journals(client, [delete(existing.name)])
        change = await next_change(changes)
        assert change.removed == {existing.name} and not change.added
        assert set(change.journals) == {added.name}
        assert change.revision > initial.revision
    finally:
        await changes.aclose()
    await wait_for_primary(client, added.name)


# Gazette's broker, as grpc-go encodes its watch (`broker/list_apply_api.go`): `header` is not
# nullable, so every response carries one, empty after the first, and a response with no journals
# ends each snapshot.
GO_EMPTY_HEADER = bytes.fromhex("12060a0012001a00")


def _go_list_response(journals: list[pb.ListResponse.Journal], revision: int = 0) -> bytes:
    if revision:  # The first response of a snapshot: an unrouted header (primary -1), status OK omitted.
        header = pb.Header(
            process_id=pb.ProcessSpec.ID(zone="go", suffix="gazette"),
            route=pb.Route(primary=-1),
            etcd=pb.Header.Etcd(cluster_id=1, member_id=2, revision=revision, raft_term=3),
        ).SerializeToString()
        encoded = b"\x12" + _varint(len(header)) + header
    else:
        encoded = GO_EMPTY_HEADER
    for journal in journals:
        body = journal.SerializeToString()
        encoded += b"\x1a" + _varint(len(body)) + body
    return encoded


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _go_journal(name: str, revision: int) -> pb.ListResponse.Journal:
    return pb.ListResponse.Journal(
        spec=journal_spec(name, topic="go"), mod_revision=revision, create_revision=revision,
        route=pb.Route(members=[pb.ProcessSpec.ID(zone="go", suffix="gazette")], primary=0),
    )


@pytest.fixture
async def go_watch() -> AsyncIterator[tuple[str, list[pb.ListRequest], asyncio.Queue[list[bytes]]]]:
    """A List endpoint streaming, as Gazette's broker, the snapshots put on its queue (raw responses)."""
    requests: list[pb.ListRequest] = []
    snapshots: asyncio.Queue[list[bytes]] = asyncio.Queue()

    async def list_(request: pb.ListRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        requests.append(request)
        while True:
            for response in await snapshots.get():
                yield response

    handler = grpc.method_handlers_generic_handler("protocol.Journal", {
        "List": grpc.unary_stream_rpc_method_handler(list_, request_deserializer=pb.ListRequest.FromString),
    })
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"http://127.0.0.1:{port}", requests, snapshots
    await server.stop(None)


async def test_watch_reads_snapshots_as_gazette_encodes_them(
    go_watch: tuple[str, list[pb.ListRequest], asyncio.Queue[list[bytes]]],
) -> None:
    endpoint, requests, snapshots = go_watch
    assert _go_list_response([]) == GO_EMPTY_HEADER  # The end of a snapshot, byte for byte as Go sends it.
    names = [f"go/watch/{i:02d}" for i in range(30)]
    journals = [_go_journal(name, 5) for name in names]
    # 30 journals: pages of 25 and 5 (the second with Go's empty header), then the end.
    snapshots.put_nowait([
        _go_list_response(journals[:25], revision=10), _go_list_response(journals[25:]), GO_EMPTY_HEADER,
    ])
    async with JournalClient(endpoint, route_cache=False) as client:
        watcher = JournalWatcher(client, selector(topic="go"))
        changes = watcher.changes()
        try:
            initial = await next_change(changes, timeout=10)
            assert sorted(initial.journals) == names and initial.added == set(names)
            assert initial.revision == 10  # The first response's header, not a later page's empty one.

            # One journal fewer: a snapshot whose only page holds the journals, then the end.
            snapshots.put_nowait([_go_list_response(journals[1:], revision=12), GO_EMPTY_HEADER])
            change = await next_change(changes, timeout=10)
            assert change.removed == {names[0]} and not change.added and change.revision == 12

            # None match now: Go sends the header alone, then the end.
            snapshots.put_nowait([_go_list_response([], revision=13), GO_EMPTY_HEADER])
            change = await next_change(changes, timeout=10)
            assert change.removed == set(names[1:]) and change.journals == {}
        finally:
            await changes.aclose()
    assert len(requests) == 1 and requests[0].watch and not requests[0].HasField("watch_resume")


async def test_watch_of_our_broker_joins_pages(client: JournalClient) -> None:
    tag = uuid.uuid4().hex[:8]
    specs = [journal_spec(f"client/watch-pages/{tag}/{i:02d}", topic=tag) for i in range(30)]
    await apply_journals(client, [upsert(s) for s in specs])
    snapshots = watch_journals(client, selector(topic=tag))
    try:
        first = await asyncio.wait_for(anext(snapshots), 30)
        assert [j.spec.name for j in first.journals] == [s.name for s in specs]  # Two pages, joined.
        await apply_journals(client, [delete(specs[0].name)])
        second = await asyncio.wait_for(anext(snapshots), 30)
        assert [j.spec.name for j in second.journals] == [s.name for s in specs[1:]]
        assert second.header.etcd.revision > first.header.etcd.revision
    finally:
        await snapshots.aclose()
    await apply_journals(client, [delete(s.name) for s in specs[1:]])
