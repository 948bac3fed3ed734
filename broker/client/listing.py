"""Listing and applying journals, listing fragments, and watching the set of journals a selector matches.

List replies stream one snapshot as pages of at most 25 journals (Gazette's `broker/list_apply_api.go`); the helpers
here stream or join those pages, and teach the client's route cache every journal's route.
ListFragments pages are followed by `next_page_token` (`broker/fragments_api.go`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import grpc

from broker.client.dial import JournalClient
from broker.client.errors import ProtocolError, TransportError, status_error
from broker.client.retry import DEFAULT_MAX_BACKOFF, backoff
from broker.protocol import pb

log = logging.getLogger(__name__)

Journal = pb.ListResponse.Journal


def _transport_error(exc: grpc.aio.AioRpcError, endpoint: str, journal: str = "") -> TransportError:
    return TransportError.from_rpc_error(exc, endpoint=endpoint, journal=journal)


def _learn_routes(client: JournalClient, journals: Sequence[Any], revision: int) -> None:
    if client.routes is not None:
        for j in journals:
            client.routes.update(j.spec.name, j.route, revision)


async def iter_list_pages(
    client: JournalClient, selector: pb.LabelSelector | None = None
) -> AsyncIterator[pb.ListResponse]:
    """The pages of one List snapshot, as the broker streams them; the first carries status and header."""
    req = pb.ListRequest(selector=selector or pb.LabelSelector())
    endpoint = client.address
    call = client.stub(endpoint).List(req)
    revision = -1  # Of the snapshot, from its first page's header.
    try:
        while True:
            try:
                resp = await call.read()
            except grpc.aio.AioRpcError as exc:
                raise _transport_error(exc, endpoint) from exc
            if resp is grpc.aio.EOF:
                return
            if revision < 0:
                if resp.status != pb.OK:
                    raise status_error(resp.status, response=resp)
                revision = resp.header.etcd.revision
            _learn_routes(client, resp.journals, revision)
            yield resp
    finally:
        call.cancel()


async def list_journals(
    client: JournalClient, selector: pb.LabelSelector | None = None, *, retry_for: float = 0.0
) -> pb.ListResponse:
    """Every journal matching `selector` (all if None), joined into one ListResponse, in name order.

    A transport failure is retried, with backoff, for up to `retry_for` seconds (a broker may be
    restarting); then, or at once by default, it raises.
    """
    deadline = asyncio.get_running_loop().time() + retry_for
    attempt = 0
    while True:
        try:
            out: pb.ListResponse | None = None
            async for page in iter_list_pages(client, selector):
                if out is None:
                    out = page
                else:
                    out.journals.extend(page.journals)
            return out if out is not None else pb.ListResponse()
        except TransportError:
            if asyncio.get_running_loop().time() >= deadline:
                raise
            await asyncio.sleep(backoff(attempt))
            attempt += 1


async def watch_journals(
    client: JournalClient, selector: pb.LabelSelector | None = None, *, max_backoff: float = DEFAULT_MAX_BACKOFF
) -> AsyncGenerator[pb.ListResponse, None]:
    """Joined snapshots of a watching List, each yielded when the matched set changed.

    A snapshot is read as Gazette's client reads one (`broker/client/list.go`, ReadListResponse):
    its first response carries the status and header, later ones add journals, and the first
    response without journals ends it. Which responses carry a header says nothing: Go always
    encodes an empty one. Reconnects after transport failures and broken streams (resuming after
    the last snapshot's revision); a non-OK status raises its StatusError.
    """
    resume: pb.Header | None = None
    attempt = 0
    endpoint = client.address
    while True:
        req = pb.ListRequest(selector=selector or pb.LabelSelector(), watch=True)
        if resume is not None:
            req.watch_resume.CopyFrom(resume)
        call = client.stub(endpoint).List(req)
        snapshot: pb.ListResponse | None = None
        try:
            while True:
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    if snapshot is None:
                        attempt = 0  # A clean close between snapshots (e.g. the broker is stopping).
                    break
                if snapshot is None:  # The first response of a snapshot.
                    if resp.status != pb.OK:
                        raise status_error(resp.status, response=resp)
                    snapshot = resp
                elif resp.journals:
                    snapshot.journals.extend(resp.journals)
                else:  # The first response without journals ends the snapshot.
                    done, snapshot = snapshot, None
                    if resume is not None and done.header.etcd.revision <= resume.etcd.revision:
                        continue  # Not newer than what we saw before reconnecting.
                    resume = done.header
                    attempt = 0
                    _learn_routes(client, done.journals, done.header.etcd.revision)
                    yield done
        except grpc.aio.AioRpcError as exc:
            log.warning("journal watch failed; will retry", extra={"endpoint": endpoint, "error": exc.details()})
        finally:
            call.cancel()
        await asyncio.sleep(backoff(attempt, max_backoff))
        attempt += 1


def apply_transactions(changes: int, max_txn_size: int) -> int:
    """How many transactions `apply_journals` uses for `changes` changes."""
    return -(-changes // max_txn_size) if max_txn_size > 0 and changes else 1


async def apply_journals(
    client: JournalClient,
    changes: Sequence[pb.ApplyRequest.Change],
    *,
    max_txn_size: int = 0,
    on_applied: Callable[[int, int], None] | None = None,
) -> pb.ApplyResponse:
    """Apply `changes` as one transaction, or in transactions of `max_txn_size` (if > 0); return the last reply.

    `on_applied(done, total)` is called after each transaction with the changes applied so far.
    A failed transaction raises its StatusError (e.g. EtcdTransactionFailed) or TransportError;
    the transactions before it stay applied, and the error's `detail` says how many changes they held.
    """
    size = max_txn_size if max_txn_size > 0 else max(len(changes), 1)
    resp = pb.ApplyResponse()
    endpoint = client.address
    for begin in range(0, len(changes), size):
        batch = changes[begin : begin + size]
        earlier = f"{begin} of {len(changes)} changes were applied by earlier transactions" if begin else ""
        try:
            resp = await client.stub(endpoint).Apply(pb.ApplyRequest(changes=batch))
        except grpc.aio.AioRpcError as exc:
            raise TransportError.from_rpc_error(exc, endpoint=endpoint, detail=earlier) from exc
        if resp.status != pb.OK:
            raise status_error(resp.status, response=resp, detail=earlier)
        log.debug("applied batch", extra={"changes": len(batch), "revision": resp.header.etcd.revision})
        if on_applied is not None:
            on_applied(begin + len(batch), len(changes))
    return resp


def upsert(spec: pb.JournalSpec, expect_mod_revision: int = 0) -> pb.ApplyRequest.Change:
    """A change creating (revision 0), updating (its mod revision) or overwriting (-1) `spec`."""
    return pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=expect_mod_revision)


def delete(journal: str, expect_mod_revision: int = -1) -> pb.ApplyRequest.Change:
    """A change deleting `journal` (at its mod revision, or whatever it is with -1)."""
    return pb.ApplyRequest.Change(delete=journal, expect_mod_revision=expect_mod_revision)


def fragments_request(
    journal: str,
    *,
    begin_mod_time: int = 0,
    end_mod_time: int = 0,
    page_limit: int = 0,
    signature_ttl: float | None = None,
    next_page_token: int = 0,
    do_not_proxy: bool = False,
) -> pb.FragmentsRequest:
    """A FragmentsRequest; `signature_ttl` (seconds) asks for signed URLs of persisted fragments."""
    req = pb.FragmentsRequest(
        journal=journal, begin_mod_time=begin_mod_time, end_mod_time=end_mod_time, page_limit=page_limit,
        next_page_token=next_page_token, do_not_proxy=do_not_proxy,
    )
    if signature_ttl is not None:
        req.signatureTTL.FromTimedelta(timedelta(seconds=signature_ttl))
    return req


async def list_fragments(client: JournalClient, request: pb.FragmentsRequest) -> pb.FragmentsResponse:
    """One page of a journal's fragments, from a member of its route (when cached)."""
    endpoint = client.endpoint(request.journal, primary=False)
    try:
        resp: pb.FragmentsResponse = await client.stub(endpoint).ListFragments(request)
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            client.failed(request.journal, endpoint)
        raise _transport_error(exc, endpoint, request.journal) from exc
    client.update_route(request.journal, resp.header)
    if resp.status != pb.OK:
        raise status_error(resp.status, journal=request.journal, response=resp)
    return resp


async def iter_fragments(
    client: JournalClient, request: pb.FragmentsRequest
) -> AsyncIterator[pb.FragmentsResponse._Fragment]:
    """Every fragment `request` selects, following pages from its `next_page_token`."""
    req = pb.FragmentsRequest()
    req.CopyFrom(request)
    while True:
        resp = await list_fragments(client, req)
        for fragment in resp.fragments:
            yield fragment
        if resp.next_page_token == 0:
            return
        if resp.next_page_token <= req.next_page_token:
            raise ProtocolError(f"ListFragments page token did not advance ({resp.next_page_token})",
                                journal=req.journal)
        req.next_page_token = resp.next_page_token


async def list_all_fragments(client: JournalClient, request: pb.FragmentsRequest) -> pb.FragmentsResponse:
    """Every fragment `request` selects, across pages, as one FragmentsResponse (next_page_token 0)."""
    out = pb.FragmentsResponse(status=pb.OK)
    async for fragment in iter_fragments(client, request):
        out.fragments.append(fragment)
    return out


@dataclass(frozen=True)
class JournalChanges:
    """A change of the journals a selector matches: the names added, removed and updated (new spec)."""

    journals: Mapping[str, Journal]
    """Every matching journal, by name, after the change."""
    added: frozenset[str]
    removed: frozenset[str]
    updated: frozenset[str]
    revision: int
    """The etcd revision of the listing."""


class JournalWatcher:
    """The journals matching a selector, reporting membership changes as they happen.

    `async for changes in watcher` yields the initial set (everything `added`), then one
    JournalChanges per change. It watches with a streaming List, or lists every
    `poll_interval` seconds if that is given. Transport failures are retried; a non-OK status
    raises.
    """

    def __init__(
        self,
        client: JournalClient,
        selector: pb.LabelSelector | None = None,
        *,
        poll_interval: float | None = None,
        max_backoff: float = DEFAULT_MAX_BACKOFF,
    ) -> None:
        self.client = client
        self.selector = selector or pb.LabelSelector()
        self.poll_interval = poll_interval
        self.max_backoff = max_backoff
        self.journals: dict[str, Journal] = {}
        """The matching journals as of the last yielded change."""

    async def _polled(self) -> AsyncGenerator[pb.ListResponse, None]:
        assert self.poll_interval is not None
        attempt = 0
        while True:
            try:
                snapshot = await list_journals(self.client, self.selector)
            except TransportError as exc:
                log.warning("listing journals failed; will retry", extra={"error": str(exc)})
                await asyncio.sleep(backoff(attempt, self.max_backoff))
                attempt += 1
                continue
            attempt = 0
            yield snapshot
            await asyncio.sleep(self.poll_interval)

    def _diff(self, snapshot: pb.ListResponse) -> JournalChanges:
        now = {j.spec.name: j for j in snapshot.journals}
        before = self.journals
        added = frozenset(now.keys() - before.keys())
        removed = frozenset(before.keys() - now.keys())
        updated = frozenset(
            name for name in now.keys() & before.keys() if now[name].mod_revision != before[name].mod_revision
        )
        self.journals = now
        return JournalChanges(dict(now), added, removed, updated, snapshot.header.etcd.revision)

    async def changes(self) -> AsyncIterator[JournalChanges]:
        """The initial set, then each change (see the class docstring)."""
        snapshots: AsyncGenerator[pb.ListResponse, None]
        if self.poll_interval is not None:
            snapshots = self._polled()
        else:
            snapshots = watch_journals(self.client, self.selector, max_backoff=self.max_backoff)
        first = True
        try:
            async for snapshot in snapshots:
                change = self._diff(snapshot)
                if first or change.added or change.removed or change.updated:
                    first = False
                    yield change
        finally:
            await snapshots.aclose()

    def __aiter__(self) -> AsyncIterator[JournalChanges]:
        return self.changes()

