"""The Journal gRPC service: List, Apply, Read, Append, Replicate, ListFragments, FragmentStoreHealth.

With auth keys configured (`auth`), every RPC first verifies its token for the capability it
needs (Gazette's VerifiedJournalServer; UNAUTHENTICATED otherwise), and the token's selector
decides which journals it sees: List omits the others, Read, Append, Replicate and ListFragments
answer JOURNAL_NOT_FOUND for them, and Apply refuses to write them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import NoReturn

import grpc

from broker import metrics
from broker.append import Append, readable
from broker.append_requests import ContentChunk, as_message, parse_append_request
from broker.errors import BrokerError, PipelineError
from broker.flow_control import MinRateError, MinRateGuard
from broker.fragment import Fragment, FragmentError
from broker.pipeline import same_id
from broker.protocol import labels, pb, pb_grpc
from broker.protocol.auth import Capability, Claims, KeyedAuth, authorized, verify_call
from broker.protocol.metadata import APPEND_BEGUN, WANT_APPEND_BEGUN, never_begun, wants_append_begun
from broker.protocol.validation import (
    ValidationError,
    validate_append_request,
    validate_apply_request,
    validate_fragment_store_health_request,
    validate_fragments_request,
    validate_list_request,
    validate_read_request,
)
from broker.read import RemoteOpener, URLSigner, serve_read
from broker.replicate import serve_replicate
from broker.state import BrokerState
from broker.stores import StoreError
from cluster.keyspace import compare_mod, delete_op, item_key, put_op, txn
from cluster.server.rpc_decoding import tolerant

log = logging.getLogger(__name__)

LIST_CHUNK = 25  # Journals per ListResponse.
PROXY_TIMEOUT = 10.0
"""Seconds an append keeps looking for a reachable primary (proxied) or a pipeline of reachable
peers (on the primary), while none of its content was read, before answering UNAVAILABLE."""
PROXY_RETRY_INTERVAL = 0.25
DEFAULT_PAGE_LIMIT = 1000
# Checks a fragment store's health; returns an error text, or "" when healthy.
StoreHealthCheck = Callable[[str, bool, str], Awaitable[str]]


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    await context.abort(code, message)
    raise AssertionError("unreachable")


async def _abort_proxied(
    context: grpc.aio.ServicerContext, exc: grpc.aio.AioRpcError, journal: str, header: pb.Header
) -> NoReturn:
    """End an RPC whose proxied call failed with the peer's status, which clients know how to
    handle (UNAVAILABLE for a peer that is gone: retry once the route has changed)."""
    peer = f"{header.process_id.zone}#{header.process_id.suffix}"
    log.info("proxied call failed", extra={"journal": journal, "peer": peer, "code": exc.code().name})
    await _abort(context, exc.code(), f"proxying {journal} to {peer}: {exc.details()}")


class _Forwarding:
    """An Append's request stream as a proxy forwards it, noting whether any of the client's content
    has been taken from it (after which a failed proxy cannot be tried again)."""

    def __init__(self, first: pb.AppendRequest, rest: AsyncIterator[pb.AppendRequest | ContentChunk]) -> None:
        self.first = first
        self._rest = rest
        self.consumed = False

    async def requests(self, header: pb.Header) -> AsyncIterator[pb.AppendRequest]:
        proxied = pb.AppendRequest()
        proxied.CopyFrom(self.first)
        proxied.header.CopyFrom(header)
        yield proxied
        async for req in self._rest:
            self.consumed = True
            yield as_message(req)


class JournalService(pb_grpc.JournalServicer):
    """Implements protocol.Journal over a BrokerState."""

    def __init__(
        self,
        state: BrokerState,
        open_remote: RemoteOpener | None = None,
        sign_url: URLSigner | None = None,
        store_health: StoreHealthCheck | None = None,
        auth: KeyedAuth | None = None,
    ) -> None:
        self.state = state
        self.auth = auth
        self.open_remote = open_remote
        self.sign_url = sign_url
        self.store_health = store_health

    # --- List and Apply --------------------------------------------------------------------

    async def List(
        self, request: pb.ListRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ListResponse]:
        claims = await verify_call(self.auth, context, Capability.LIST)
        try:
            validate_list_request(request)
        except ValidationError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        selector = labels.rewrite_prefix_meta_label(request.selector)
        keyspace = self.state.keyspace
        if request.watch and request.HasField("watch_resume"):
            await keyspace.wait_for_revision(request.watch_resume.etcd.revision + 1)
        last: tuple[int, int] | None = None
        # An empty selector matches every journal: skip building each one's label set.
        match_all = not selector.include.labels and not selector.exclude.labels
        if claims is not None and claims.matches_all:
            claims = None
        while True:
            journals = []
            for name in sorted(keyspace.journals):
                item = keyspace.journals[name]
                if match_all and claims is None:
                    selected = True
                else:
                    label_set = labels.journal_label_set(item.spec)
                    selected = (match_all or labels.matches(selector, label_set)) and authorized(claims, label_set)
                if selected:
                    journals.append(
                        pb.ListResponse.Journal(
                            spec=item.spec,
                            mod_revision=item.mod_revision,
                            create_revision=item.create_revision,
                            route=keyspace.route(name),
                        )
                    )
            fingerprint = (len(journals), max((j.mod_revision for j in journals), default=0))
            if fingerprint != last:
                last = fingerprint
                first = pb.ListResponse(status=pb.OK, header=self.state.resolver.header())
                first.journals.extend(journals[:LIST_CHUNK])
                yield first
                for i in range(LIST_CHUNK, len(journals), LIST_CHUNK):
                    yield pb.ListResponse(journals=journals[i : i + LIST_CHUNK])
                if not request.watch:
                    return
                yield pb.ListResponse()  # Ends this snapshot.
            await keyspace.wait_for_change()

    async def Apply(
        self, request: pb.ApplyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ApplyResponse:
        claims = await verify_call(self.auth, context, Capability.APPLY)
        try:
            validate_apply_request(request)
        except ValidationError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        await self._authorize_changes(context, claims, request)
        root = self.state.root
        compares, ops = [], []
        for change in request.changes:
            name = change.upsert.name if change.HasField("upsert") else change.delete
            key = item_key(root, name)
            if change.expect_mod_revision != -1:
                compares.append(compare_mod(key, change.expect_mod_revision))
            if change.HasField("upsert"):
                ops.append(put_op(key, change.upsert.SerializeToString()))
            else:
                ops.append(delete_op(key))
        try:
            ok, revision = await txn(self.state.etcd, compares, ops, [])
        except grpc.aio.AioRpcError as exc:
            # etcd refused the transaction itself (e.g. more operations than its --max-txn-ops, or a
            # request above --max-request-bytes): say so, and how to apply in smaller transactions.
            await _abort(
                context, exc.code(),
                f"etcd rejected the Apply transaction of {len(request.changes)} changes: {exc.details()}"
                " (etcd limits operations per transaction with --max-txn-ops, default 128; apply in"
                " smaller transactions, e.g. gazctl's --max-txn-size)",
            )
        if not ok:
            return pb.ApplyResponse(status=pb.ETCD_TRANSACTION_FAILED, header=self.state.resolver.header())
        await self.state.keyspace.wait_for_revision(revision)
        header = self.state.resolver.header()
        header.etcd.revision = revision
        return pb.ApplyResponse(status=pb.OK, header=header)

    @staticmethod
    async def _authorize_changes(
        context: grpc.aio.ServicerContext, claims: Claims | None, request: pb.ApplyRequest
    ) -> None:
        """Gazette's Apply authorization: an upsert's labels plus `name`, a delete's `name`, must
        match the claims' selector."""
        if claims is None or claims.matches_all:
            return
        for change in request.changes:
            if change.HasField("upsert"):
                name, label_set = change.upsert.name, labels.journal_label_set(change.upsert)
            else:
                name, label_set = change.delete, labels.label_set((labels.META_NAME, change.delete))
            if not claims.authorizes(label_set):
                await _abort(context, grpc.StatusCode.UNAUTHENTICATED, f"not authorized to {name}")

    # --- Read --------------------------------------------------------------------------------

    async def Read(
        self, request: pb.ReadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ReadResponse]:
        claims = await verify_call(self.auth, context, Capability.READ)
        try:
            validate_read_request(request)
        except ValidationError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        res = await self.state.resolver.resolve(
            request.journal,
            may_proxy=not request.do_not_proxy,
            require_primary=False,
            min_etcd_revision=request.min_etcd_revision,
            proxy_header=request.header if request.HasField("header") else None,
            claims=claims,
        )
        if res.status == pb.OK and res.spec is not None and not readable(res.spec):
            res.status = pb.NOT_ALLOWED
        if res.status != pb.OK:
            yield pb.ReadResponse(status=res.status, header=res.header)  # type: ignore[arg-type]
            return
        if not same_id(res.header.process_id, self.state.resolver.local_id):
            try:
                async for resp in self._proxy_read(request, res.header):
                    yield resp
            except grpc.aio.AioRpcError as exc:
                await _abort_proxied(context, exc, request.journal, res.header)
            return
        assert res.replica is not None
        journal = res.spec.name if res.spec else request.journal
        metrics.READ_REQUESTS.labels(journal).inc()
        read_bytes = metrics.READ_BYTES.labels(journal)
        try:
            async for resp in serve_read(
                request, res.header, res.replica, self.open_remote, self.sign_url, on_content=read_bytes.inc
            ):
                yield resp
        except (StoreError, FragmentError) as exc:
            # A persisted fragment could not be fetched or decoded: the reader may retry later.
            log.warning("reading persisted fragment failed", extra={"journal": journal, "error": str(exc)})
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"reading fragment of {journal}: {exc}")

    async def _proxy_read(self, request: pb.ReadRequest, header: pb.Header) -> AsyncIterator[pb.ReadResponse]:
        proxied = pb.ReadRequest()
        proxied.CopyFrom(request)
        proxied.header.CopyFrom(header)
        endpoint = self.state.resolver.endpoint_of(header.process_id, header.route)
        call = self.state.dialer.stub(endpoint).Read(proxied)
        async for resp in call:
            yield resp

    # --- Append ------------------------------------------------------------------------------

    async def Append(
        self, request_iterator: AsyncIterator[pb.AppendRequest | ContentChunk], context: grpc.aio.ServicerContext
    ) -> pb.AppendResponse:
        claims = await verify_call(self.auth, context, Capability.APPEND)
        if wants_append_begun(context.invocation_metadata()):
            # Before anything else: a client whose append ends CANCELLED without it knows it was never begun.
            await context.send_initial_metadata(APPEND_BEGUN)
        try:
            first = await anext(request_iterator)
        except StopAsyncIteration:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "expected first AppendRequest")
        if isinstance(first, ContentChunk):
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "expected Journal")
        assert isinstance(first, pb.AppendRequest)
        try:
            validate_append_request(first)
            if not first.journal:
                raise ValidationError("expected Journal", ["Journal"])
        except ValidationError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        deadline = asyncio.get_running_loop().time() + PROXY_TIMEOUT
        forwarding = _Forwarding(first, request_iterator)
        while True:
            append = Append(self.state, first, claims)
            try:
                await append.prepare()
            except PipelineError as exc:
                # The pipeline could not be synced (a peer is gone or restarting). Nothing of the
                # client's content was read: try again once the route changes, for a while.
                if asyncio.get_running_loop().time() >= deadline:
                    await _abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))
                await self.state.keyspace.wait_for_change_within(PROXY_RETRY_INTERVAL)
                continue
            if append.response is not None:
                return append.response
            if append.proxy is None:
                break
            proxied = await self._proxy_append(context, forwarding, append.proxy.header, deadline)
            if proxied is not None:
                return proxied
            if self.state.stopping.is_set():
                # This broker is about to cut its RPCs off: say that it wrote nothing, so that the
                # client retries elsewhere, rather than be cancelled with its outcome unknown.
                return self._not_primary(append.proxy.header)
            # The primary cannot be reached and nothing of the client's stream is spent: resolve
            # again once the mirror changes (the primary's lease expires, the allocator moves on).
            await self.state.keyspace.wait_for_change_within(PROXY_RETRY_INTERVAL)
        try:
            resp = await append.stream(
                _content_chunks(request_iterator, first.journal, self.state.min_append_rate)
            )
        except BrokerError as exc:
            await _abort(context, grpc.StatusCode.ABORTED, str(exc))
        if resp.status == pb.OK:
            requests, appended = metrics.append_counters(first.journal)
            requests.inc()
            appended.inc(resp.commit.end - resp.commit.begin)
        return resp

    async def _proxy_append(
        self, context: grpc.aio.ServicerContext, forwarding: _Forwarding, header: pb.Header, deadline: float
    ) -> pb.AppendResponse | None:
        """Forward the append to the primary `header` names; None if that primary cannot be reached
        before anything of the client's stream was forwarded, so that the append may be resolved again.
        Other failures end the RPC with the primary's status."""
        endpoint = self.state.resolver.endpoint_of(header.process_id, header.route)
        remaining = deadline - asyncio.get_running_loop().time()
        if await self.state.dialer.connected(endpoint, min(PROXY_RETRY_INTERVAL * 4, max(remaining, 0.0))):
            call = self.state.dialer.stub(endpoint).Append(forwarding.requests(header), metadata=WANT_APPEND_BEGUN)
            try:
                resp: pb.AppendResponse | None = await self._unless_primary_replaced(context, call, forwarding, header)
                return resp
            except grpc.aio.AioRpcError as exc:
                begun = not never_begun(exc.code(), exc.details(), await call.initial_metadata())
                retryable = (exc.code() == grpc.StatusCode.UNAVAILABLE or not begun) and not forwarding.consumed
                if retryable and asyncio.get_running_loop().time() < deadline:
                    return None
                if not begun:
                    # The primary (stopping) never began it, and the client's content is spent: say
                    # so with a status, which the client retries knowing that nothing was written.
                    return self._not_primary(header)
                await _abort_proxied(context, exc, forwarding.first.journal, header)
        if asyncio.get_running_loop().time() >= deadline:
            peer = f"{header.process_id.zone}#{header.process_id.suffix}"
            await _abort(
                context, grpc.StatusCode.UNAVAILABLE,
                f"proxying {forwarding.first.journal} to {peer}: primary unreachable for {PROXY_TIMEOUT:g}s",
            )
        return None

    async def _unless_primary_replaced(
        self, context: grpc.aio.ServicerContext, call: grpc.aio.StreamUnaryCall, forwarding: _Forwarding,
        header: pb.Header,
    ) -> pb.AppendResponse | None:
        """The proxied call's response, unless etcd replaces the primary first, its lease expired: a
        primary cut off by a partition neither answers nor closes the connection. The call is then
        cancelled: None (resolve again) if none of the client's content was forwarded, else
        UNAVAILABLE, the outcome unknown."""
        journal = forwarding.first.journal
        answered = asyncio.ensure_future(call)
        replaced = asyncio.ensure_future(self._primary_replaced(journal, header.process_id))
        loop = asyncio.get_running_loop()
        sent = loop.time()
        try:
            await asyncio.wait({answered, replaced}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            replaced.cancel()
            unanswered = not answered.done()
            if unanswered:  # Replaced, or this RPC was cancelled: the proxied call goes too.
                call.cancel()
                answered.cancel()
                answered.add_done_callback(lambda done: done.cancelled() or done.exception())  # No report.
                if loop.time() - sent >= self.state.peer_timeout:
                    # Nothing from the primary for that long: the connection may be one a partition stalled.
                    self.state.dialer.forget(self.state.resolver.endpoint_of(header.process_id, header.route))
        if not unanswered:
            resp: pb.AppendResponse = answered.result()
            return resp
        if not forwarding.consumed:
            return None
        peer = f"{header.process_id.zone}#{header.process_id.suffix}"
        await _abort(
            context, grpc.StatusCode.UNAVAILABLE,
            f"proxying {journal} to {peer}: it was replaced as primary mid-append; the append's outcome is unknown",
        )

    async def _primary_replaced(self, journal: str, primary: pb.ProcessSpec.ID) -> None:
        """Return once the mirror names another primary of `journal` than `primary` (or none) and
        `primary` holds no member key (its lease expired). A primary handing off is still a member:
        it answers the appends it took."""
        keyspace = self.state.keyspace
        while True:
            route = keyspace.route(journal, endpoints=False)
            replaced = route.primary < 0 or not same_id(route.members[route.primary], primary)
            if replaced and (primary.zone, primary.suffix) not in keyspace.members:
                return
            await keyspace.wait_for_change()

    def _not_primary(self, header: pb.Header) -> pb.AppendResponse:
        """NOT_JOURNAL_PRIMARY_BROKER from this broker, with the route of `header`: the append was
        not written, and the client may retry it at the primary the route names."""
        reply = pb.AppendResponse(status=pb.NOT_JOURNAL_PRIMARY_BROKER, header=header)
        reply.header.process_id.CopyFrom(self.state.resolver.local_id)
        return reply

    # --- Replicate ---------------------------------------------------------------------------

    async def Replicate(
        self, request_iterator: AsyncIterator[pb.ReplicateRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ReplicateResponse]:
        # Peers sign their Replicate calls with the cluster's key: a client's token has no REPLICATE.
        claims = await verify_call(self.auth, context, Capability.REPLICATE)
        try:
            async for resp in serve_replicate(self.state, request_iterator, claims):
                yield resp
        except BrokerError as exc:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    # --- Fragments ---------------------------------------------------------------------------

    async def ListFragments(
        self, request: pb.FragmentsRequest, context: grpc.aio.ServicerContext
    ) -> pb.FragmentsResponse:
        claims = await verify_call(self.auth, context, Capability.READ)
        try:
            validate_fragments_request(request)
        except ValidationError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        res = await self.state.resolver.resolve(
            request.journal,
            may_proxy=not request.do_not_proxy,
            require_primary=False,
            proxy_header=request.header if request.HasField("header") else None,
            claims=claims,
        )
        if res.status == pb.OK and res.spec is not None and not readable(res.spec):
            res.status = pb.NOT_ALLOWED
        if res.status != pb.OK:
            return pb.FragmentsResponse(status=res.status, header=res.header)  # type: ignore[arg-type]
        if not same_id(res.header.process_id, self.state.resolver.local_id):
            proxied = pb.FragmentsRequest()
            proxied.CopyFrom(request)
            proxied.header.CopyFrom(res.header)
            endpoint = self.state.resolver.endpoint_of(res.header.process_id, res.route)
            try:
                resp: pb.FragmentsResponse = await self.state.dialer.stub(endpoint).ListFragments(proxied)
            except grpc.aio.AioRpcError as exc:
                await _abort_proxied(context, exc, request.journal, res.header)
            return resp
        assert res.replica is not None
        await res.replica.index.first_refresh.wait()
        limit = request.page_limit or DEFAULT_PAGE_LIMIT
        ttl = request.signatureTTL.ToTimedelta().total_seconds() if request.HasField("signatureTTL") else 0
        out = pb.FragmentsResponse(status=pb.OK, header=res.header)
        for fragment in res.replica.index.fragments():
            if fragment.begin < request.next_page_token or not _in_mod_time_range(fragment, request):
                continue
            if len(out.fragments) == limit:
                out.next_page_token = fragment.begin
                break
            entry = out.fragments.add()
            entry.spec.CopyFrom(fragment.spec)
            if ttl > 0 and fragment.spec.backing_store and self.sign_url is not None:
                try:
                    entry.signed_url = await self.sign_url(fragment, ttl)
                except StoreError as exc:
                    await _abort(context, grpc.StatusCode.UNAVAILABLE, f"signing fragment URL: {exc}")
        return out

    async def FragmentStoreHealth(
        self, request: pb.FragmentStoreHealthRequest, context: grpc.aio.ServicerContext
    ) -> pb.FragmentStoreHealthResponse:
        await verify_call(self.auth, context, Capability.READ)
        try:
            validate_fragment_store_health_request(request)
        except ValidationError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if self.store_health is None:
            error = "this broker has no fragment store support"
        else:
            error = await self.store_health(
                request.fragment_store, request.check_delete, request.check_delete_prefix
            )
        return pb.FragmentStoreHealthResponse(
            status=pb.FRAGMENT_STORE_UNHEALTHY if error else pb.OK,
            header=self.state.resolver.header(),
            store_health_error=error,
        )


def _in_mod_time_range(fragment: Fragment, request: pb.FragmentsRequest) -> bool:
    mod_time = fragment.mod_time
    if mod_time != 0 and mod_time < request.begin_mod_time:
        return False
    return not (request.end_mod_time != 0 and (mod_time == 0 or mod_time > request.end_mod_time))


async def _content_chunks(
    requests: AsyncIterator[pb.AppendRequest | ContentChunk], journal: str, min_rate: int = 0
) -> AsyncIterator[bytes | memoryview]:
    """The content of an Append stream, ending at its commit marker (an empty message, then EOF).

    A client sending less than `min_rate` bytes/second in any second (after one of grace) is cut off.
    """
    guard = MinRateGuard(min_rate)
    while True:
        try:
            req = await guard.receive(anext(requests))
        except StopAsyncIteration:
            raise BrokerError("unexpected EOF (append rolled back)", journal) from None
        except MinRateError as exc:
            raise BrokerError(str(exc), journal) from None
        if isinstance(req, ContentChunk):
            guard.received(len(req.content))
            yield req.content
            continue
        if req.journal:
            raise BrokerError("expected Content chunk", journal)
        try:
            validate_append_request(req)
        except ValidationError as exc:
            raise BrokerError(str(exc), journal) from exc
        content = req.content  # Each access copies the bytes out of the message: take them once.
        if not content:
            async for _ in requests:
                raise BrokerError("expected EOF after empty Content chunk", journal)
            return
        guard.received(len(content))
        yield content


def add_journal_service(service: JournalService, server: grpc.aio.Server) -> None:
    """Register `service` as the generated `add_JournalServicer_to_server` does, except that
    Append's requests are parsed by `parse_append_request`, and a request that does not decode
    ends its RPC with INTERNAL (see `rpc_decoding`)."""

    class Capture:
        def __init__(self) -> None:
            self.handlers: dict[str, grpc.RpcMethodHandler] = {}

        def add_generic_rpc_handlers(self, _generic: object) -> None:
            pass

        def add_registered_method_handlers(self, _name: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
            self.handlers = dict(handlers)

    capture = Capture()
    pb_grpc.add_JournalServicer_to_server(service, capture)
    handlers = capture.handlers
    handlers["Append"] = grpc.stream_unary_rpc_method_handler(
        service.Append,
        request_deserializer=parse_append_request,
        response_serializer=pb.AppendResponse.SerializeToString,
    )
    handlers = {name: tolerant(handler) for name, handler in handlers.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("protocol.Journal", handlers),))
    server.add_registered_method_handlers("protocol.Journal", handlers)
