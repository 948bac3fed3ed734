"""The Shard gRPC API of a consumer process (Gazette's `consumer/shard_api.go`).

`ShardAPI` implements `consumer.Shard` over a `ConsumerService`:

- **List**: the shards whose labels (with the meta-label `id`) match the request's selector, each
  with its mod and create revisions, its route (members, primary, endpoints) and one
  ReplicaStatus per route member, in the route's order. The header is unrouted.
- **Stat**: resolves the shard. A primary in another process is proxied to (with the resolution's
  header, so the peer does not proxy again); a local primary is waited on until it has read
  through `read_through` (offsets of its source journals; others are ignored), and its
  read-through and publish-at offsets are returned. A primary that stops serving the shard while
  a request waits on it (SHARD_STOPPED, or a peer answering NOT_SHARD_PRIMARY or UNAVAILABLE: a
  hand-off, an exiting member) does not fail a request this process routes: it is resolved again
  once the mirror shows the shard's route changed, until the request's deadline.
- **Apply**: upserts and deletes of ShardSpecs in one etcd transaction, each compared with the
  item's ModRevision unless `expect_mod_revision` is -1 (0 creates). A mismatch answers
  ETCD_TRANSACTION_FAILED; success waits until this process's mirror has read the revision.
  An upsert's `primary_hints` are put, as Gazette's JSON, at the shard's primary hints key.
- **Unassign**: deletes the FAILED assignments of the shards, and their primary (slot 0) unless
  `only_failed`, in one transaction compared with each assignment's ModRevision; `dry_run` only
  reports which shards would be unassigned.
- **GetHints**: the primary and backup FSMHints stored in etcd under the shard's hint keys
  (`consumer.recoverylog.fetch_hints`: JSON or proto, each validated as an FSM of the shard's
  recovery log; an invalid one ends the RPC with FAILED_PRECONDITION naming its key, where
  Gazette's ends with UNKNOWN); absent keys give empty hints, `primary_hints` always being on the
  wire and `backup_hints` one per backup key, as Gazette's. A primary stores recorded hints at
  `.primary` (periodically, and when it stops cleanly), and each recovery stores its hints at
  `.backup.0`, rotating older backups. As Gazette's, GetHints does not validate its request: a
  malformed shard ID answers SHARD_NOT_FOUND.

Other invalid requests end with INVALID_ARGUMENT naming the field; undecodable ones with INTERNAL, as
the broker's (`cluster.server.rpc_decoding.tolerant`).

With auth keys (`--consumer.auth-keys`), every RPC first verifies its token (UNAUTHENTICATED
otherwise): Stat and GetHints need READ, List LIST, Apply and Unassign APPLY; the token's selector,
matched against a shard's labels plus `id`, hides the shards it does not cover (List omits them,
Stat and GetHints answer SHARD_NOT_FOUND) and Apply and Unassign refuse them ("not authorized to
<id>"). Stat proxied to a peer carries this process's own token.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, NoReturn

import grpc

from broker.client.config import dial_target
from broker.protocol import labels
from broker.protocol import pb as bpb
from broker.protocol.auth import Capability, Claims, KeyedAuth, authorized, verify_call
from broker.protocol.credentials import Credentials
from broker.protocol.validation import ValidationError
from cluster.keyspace import compare_mod, delete_op, item_key, put_op, txn
from cluster.server.rpc_decoding import tolerant
from consumer.protocol import pb, pb_grpc
from consumer.protocol.shard_spec import hint_primary_key, label_set_ext
from consumer.protocol.validation import (
    validate_apply_request,
    validate_list_request,
    validate_stat_request,
    validate_unassign_request,
)
from consumer.recoverylog import HintsError, encode_hints, fetch_hints
from consumer.resolver import ResolverError, ResolverStopped

if TYPE_CHECKING:
    from consumer.service import ConsumerService

log = logging.getLogger(__name__)

Code = pb.ReplicaStatus.Code

PROXY_TIMEOUT = 60.0
"""Seconds a proxied Stat may take when the caller set no deadline."""
RESOLVE_AGAIN = frozenset({pb.SHARD_STOPPED, pb.NOT_SHARD_PRIMARY})
"""Statuses of a Stat that waited on (or was proxied to) a primary that is no longer one: a Stat
this process routed resolves again once its mirror shows the shard's route changed."""


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    await context.abort(code, message)
    raise AssertionError("unreachable")


class ShardAPI(pb_grpc.ShardServicer):
    """The `consumer.Shard` service of one consumer process."""

    def __init__(
        self, service: ConsumerService, auth: KeyedAuth | None = None, peer_credentials: Credentials | None = None
    ) -> None:
        self.service = service
        self.auth = auth
        self.peer_credentials = peer_credentials or Credentials()
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, pb_grpc.ShardStub] = {}

    async def close(self) -> None:
        """Close the channels opened to proxy Stat to peers."""
        channels, self._channels = self._channels, {}
        self._stubs = {}
        for channel in channels.values():
            await channel.close()

    # -- helpers --------------------------------------------------------------------------------

    def _unrouted_header(self) -> bpb.Header:
        zone, suffix = self.service.member_id
        header = bpb.Header(
            process_id=bpb.ProcessSpec.ID(zone=zone, suffix=suffix), etcd=self.service.keyspace.etcd_header()
        )
        header.route.primary = -1
        return header

    def _peer(self, endpoint: str) -> pb_grpc.ShardStub:
        stub = self._stubs.get(endpoint)
        if stub is None:
            target = dial_target(endpoint)
            channel = self._channels[endpoint] = self.peer_credentials.tls.channel(target.target, tls=target.tls)
            stub = self._stubs[endpoint] = self.peer_credentials.authorize(pb_grpc.ShardStub(channel))
        return stub

    def _visible(self, claims: Claims | None, shard_id: str) -> bool:
        """Whether the shard exists and `claims` cover it."""
        item = self.service.keyspace.items.get(shard_id)
        return item is not None and authorized(claims, label_set_ext(item.spec))

    @staticmethod
    async def _authorize(
        context: grpc.aio.ServicerContext, claims: Claims | None, shard_id: str, label_set: bpb.LabelSet
    ) -> None:
        if not authorized(claims, label_set):
            await _abort(context, grpc.StatusCode.UNAUTHENTICATED, f"not authorized to {shard_id}")

    async def _commit(
        self, context: grpc.aio.ServicerContext, what: str, compares: list[Any], ops: list[Any]
    ) -> tuple[bool, int]:
        """Run one etcd transaction; an error of etcd's ends the RPC with etcd's status."""
        try:
            ok, revision = await txn(self.service.etcd, compares, ops, [])
        except grpc.aio.AioRpcError as exc:
            await _abort(
                context, exc.code(),
                f"etcd rejected the {what} transaction of {len(ops)} operations: {exc.details()}"
                " (etcd limits operations per transaction with --max-txn-ops, default 128; apply in"
                " smaller transactions, e.g. gazctl's --max-txn-size)",
            )
        if ok:
            await self.service.keyspace.wait_for_revision(revision)
        return ok, revision

    # -- RPCs -----------------------------------------------------------------------------------

    async def List(self, request: pb.ListRequest, context: grpc.aio.ServicerContext) -> pb.ListResponse:
        claims = await verify_call(self.auth, context, Capability.LIST)
        if claims is not None and claims.matches_all:
            claims = None
        try:
            validate_list_request(request)
        except ValidationError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        keyspace = self.service.keyspace
        selector = request.selector
        match_all = not selector.include.labels and not selector.exclude.labels
        response = pb.ListResponse(status=pb.OK, header=self._unrouted_header())
        for shard_id in sorted(keyspace.items):
            item = keyspace.items[shard_id]
            if not match_all or claims is not None:
                label_set = label_set_ext(item.spec)
                if not (match_all or labels.matches(selector, label_set)) or not authorized(claims, label_set):
                    continue
            shard = response.shards.add(
                spec=item.spec, mod_revision=item.mod_revision, create_revision=item.create_revision,
                route=keyspace.route(shard_id),
            )
            # The route's members and the assignments are both ordered by (zone, suffix, slot).
            shard.status.extend(a.value for a in keyspace.assignments(shard_id))
        return response

    async def Stat(self, request: pb.StatRequest, context: grpc.aio.ServicerContext) -> pb.StatResponse:
        claims = await verify_call(self.auth, context, Capability.READ)
        try:
            validate_stat_request(request)
        except ValidationError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if claims is not None and not self._visible(claims, request.shard):
            return pb.StatResponse(status=pb.SHARD_NOT_FOUND, header=self._unrouted_header())
        proxied = request.HasField("header")
        loop = asyncio.get_running_loop()
        remaining = context.time_remaining()
        deadline = loop.time() + (remaining if remaining is not None else PROXY_TIMEOUT)
        while True:
            try:
                res = await self.service.resolver.resolve(
                    request.shard,
                    may_proxy=not proxied,
                    proxy_header=request.header if proxied else None,
                    read_through=dict(request.read_through),
                )
            except ResolverStopped as exc:
                await _abort(context, grpc.StatusCode.UNAVAILABLE, f"{exc} (the consumer is stopping; retry)")
            except ResolverError as exc:
                await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            unavailable = ""
            status: int
            if res.status == pb.OK and res.shard is None:
                response = await self._proxy_stat(request, res.header, context, retry=not proxied)
                if isinstance(response, pb.StatResponse) and response.status not in RESOLVE_AGAIN:
                    return response
                if isinstance(response, str):
                    status, header, unavailable = pb.SHARD_STOPPED, res.header, response
                else:
                    # The peer stopped serving the shard, or already knows another primary.
                    status, header = int(response.status), response.header
            elif res.status != pb.OK:
                status, header = int(res.status), res.header
            else:
                break
            # A primary that stopped (handed off, or exiting) while the request waited on it: a
            # request this process may route again waits for the shard's route to change, then
            # resolves again, until its deadline.
            if proxied or status not in RESOLVE_AGAIN or self._primary_failed(request.shard) or not (
                await self._route_changes(request.shard, res.header.route, deadline)
            ):
                if unavailable:
                    await _abort(context, grpc.StatusCode.UNAVAILABLE, unavailable)
                return pb.StatResponse(status=status, header=header)  # type: ignore[arg-type]
        assert res.shard is not None
        try:
            progress = res.shard.progress
            return pb.StatResponse(
                status=pb.OK, header=res.header,
                read_through=dict(progress.read_through), publish_at=dict(progress.publish_at),
            )
        finally:
            res.done()

    def _primary_failed(self, shard: str) -> bool:
        """Whether the shard's primary is FAILED: its store will never be ready, and its route does
        not change until it is unassigned, so a Stat waiting on it answers SHARD_STOPPED at once."""
        return any(a.slot == 0 and a.value.code == Code.FAILED for a in self.service.keyspace.assignments(shard))

    async def _route_changes(self, shard: str, route: bpb.Route, deadline: float) -> bool:
        """Wait until the shard's route differs from `route` (True), or the deadline passes (False)."""
        keyspace = self.service.keyspace
        loop = asyncio.get_running_loop()
        while keyspace.route(shard) == route:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            await keyspace.wait_for_change_within(remaining)
        return True

    async def _proxy_stat(
        self, request: pb.StatRequest, header: bpb.Header, context: grpc.aio.ServicerContext, *, retry: bool
    ) -> pb.StatResponse | str:
        """Forward Stat to the primary. With `retry`, a peer that is unavailable (exiting, or gone)
        gives the error's text: the caller resolves again once the route changes."""
        route = header.route
        endpoint = route.endpoints[route.primary] if 0 <= route.primary < len(route.endpoints) else ""
        peer = f"{header.process_id.zone}#{header.process_id.suffix}"
        if not endpoint:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"primary {peer} of {request.shard} has no endpoint")
        forwarded = pb.StatRequest()
        forwarded.CopyFrom(request)
        forwarded.header.CopyFrom(header)
        remaining = context.time_remaining()
        try:
            response: pb.StatResponse = await self._peer(endpoint).Stat(
                forwarded, timeout=remaining if remaining is not None else PROXY_TIMEOUT
            )
        except grpc.aio.AioRpcError as exc:
            if retry and exc.code() == grpc.StatusCode.UNAVAILABLE:
                log.info("proxying Stat of %s to %s failed (%s); resolving again", request.shard, peer,
                         exc.details())
                return f"proxying Stat of {request.shard} to {peer}: {exc.details()}"
            await _abort(context, exc.code(), f"proxying Stat of {request.shard} to {peer}: {exc.details()}")
        return response

    async def Apply(self, request: pb.ApplyRequest, context: grpc.aio.ServicerContext) -> pb.ApplyResponse:
        claims = await verify_call(self.auth, context, Capability.APPLY)
        try:
            validate_apply_request(request)
        except ValidationError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        root = self.service.root
        compares: list[Any] = []
        ops: list[Any] = []
        for change in request.changes:
            shard_id = change.upsert.id if change.HasField("upsert") else change.delete
            if claims is not None:
                # Gazette's: an upsert by all its labels (and id), a delete by its id.
                upserted = label_set_ext(change.upsert) if change.HasField("upsert") else None
                await self._authorize(context, claims, shard_id, upserted or _id_labels(shard_id))
            key = item_key(root, shard_id)
            if change.expect_mod_revision != -1:
                compares.append(compare_mod(key, change.expect_mod_revision))
            if change.HasField("upsert"):
                ops.append(put_op(key, change.upsert.SerializeToString()))
                if change.HasField("primary_hints"):
                    ops.append(put_op(hint_primary_key(change.upsert), encode_hints(change.primary_hints)))
            else:
                ops.append(delete_op(key))
        ok, revision = await self._commit(context, "Apply", compares, ops)
        header = self._unrouted_header()
        if not ok:
            return pb.ApplyResponse(status=pb.ETCD_TRANSACTION_FAILED, header=header)
        header.etcd.revision = revision
        return pb.ApplyResponse(status=pb.OK, header=header)

    async def Unassign(self, request: pb.UnassignRequest, context: grpc.aio.ServicerContext) -> pb.UnassignResponse:
        claims = await verify_call(self.auth, context, Capability.APPLY)
        try:
            validate_unassign_request(request)
        except ValidationError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if claims is not None:
            for shard_id in request.shards:
                await self._authorize(context, claims, shard_id, _id_labels(shard_id))
        keyspace = self.service.keyspace
        compares: list[Any] = []
        ops: list[Any] = []
        unassigned: list[str] = []
        for shard_id in request.shards:
            removed = False
            for a in keyspace.assignments(shard_id):
                if a.value.code == Code.FAILED or (not request.only_failed and a.slot == 0):
                    compares.append(compare_mod(a.key, a.mod_revision))
                    ops.append(delete_op(a.key))
                    removed = True
            if removed and shard_id not in unassigned:
                unassigned.append(shard_id)
        if request.dry_run or not ops:
            return pb.UnassignResponse(status=pb.OK, shards=unassigned)
        ok, _ = await self._commit(context, "Unassign", compares, ops)
        if not ok:
            return pb.UnassignResponse(status=pb.ETCD_TRANSACTION_FAILED)
        return pb.UnassignResponse(status=pb.OK, shards=unassigned)

    async def GetHints(self, request: pb.GetHintsRequest, context: grpc.aio.ServicerContext) -> pb.GetHintsResponse:
        claims = await verify_call(self.auth, context, Capability.READ)
        # Gazette's ShardGetHints does not validate the request: a malformed ID is not found.
        # primary_hints is non-nullable there, so always on the wire (empty when the key is).
        header = self._unrouted_header()
        item = self.service.keyspace.items.get(request.shard)
        if item is None or not authorized(claims, label_set_ext(item.spec)):
            return pb.GetHintsResponse(
                status=pb.SHARD_NOT_FOUND, header=header, primary_hints=pb.GetHintsResponse.ResponseHints()
            )
        try:
            fetched = await fetch_hints(self.service.etcd, item.spec)
        except HintsError as exc:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        found = [
            pb.GetHintsResponse.ResponseHints(hints=h) if h is not None else pb.GetHintsResponse.ResponseHints()
            for h in fetched.hints
        ]
        return pb.GetHintsResponse(status=pb.OK, header=header, primary_hints=found[0], backup_hints=found[1:])


def _id_labels(shard_id: str) -> bpb.LabelSet:
    return labels.label_set(("id", shard_id))


def add_shard_service(api: ShardAPI, server: grpc.aio.Server) -> None:
    """Register `api` as the generated `add_ShardServicer_to_server` does, except that a request
    that does not decode ends its RPC with INTERNAL (see `cluster.server.rpc_decoding`)."""

    class Capture:
        def __init__(self) -> None:
            self.handlers: dict[str, grpc.RpcMethodHandler] = {}

        def add_generic_rpc_handlers(self, _generic: object) -> None:
            pass

        def add_registered_method_handlers(self, _name: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
            self.handlers = dict(handlers)

    capture = Capture()
    pb_grpc.add_ShardServicer_to_server(api, capture)
    handlers = {name: tolerant(handler) for name, handler in capture.handlers.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("consumer.Shard", handlers),))
    server.add_registered_method_handlers("consumer.Shard", handlers)


__all__ = ["ShardAPI", "add_shard_service"]
