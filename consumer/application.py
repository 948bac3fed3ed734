"""The `Application` protocol: what a consumer application implements (Gazette's `consumer.Application`).

`gazette consume MODULE:ATTR` runs the object ATTR of MODULE. Its handlers are coroutines:

- `new_store(shard, recorder)`: the shard's Store (`recorder` is None for stores that are not
  recorded to a recovery log).
- `new_message(spec)`: an empty message to decode a source journal's content into.
- `consume_message(shard, store, envelope, publisher)`: apply one read-committed message to the
  store's transaction, publishing any derived messages with `publisher` (their ACKs follow the
  commit). Raise `DeferToNextTransaction` to end the transaction before this message. It may
  also be a plain function (`def`, as Gazette's ConsumeMessage is), called without a coroutine:
  a third of a microsecond less per message, for a handler that never awaits.
- `finalize_txn(shard, store, publisher)`: the transaction is about to commit.

Optional (`BeginFinisher`): `begin_txn(shard, store)` before a transaction's first message, and
`finished_txn(shard, store, committed)` once it is started, with the commit's future.

Optional (`consumer.app_api.InitApplication`, Gazette's `InitApplication`; "Building APIs" in docs/consumers.md):
`init_application(ctx)`, awaited once before the consumer's gRPC server starts and its member
announces, with a `consumer.app_api.AppContext`: register gRPC servicers on `ctx.server`, HTTP
routes with `ctx.add_route(method, path, handler)`, and serve requests about a shard with
`ctx.serve(shard_id, local=..., proxy=...)` (locally from the shard's store when this process is
its primary, else proxied to the primary) or `ctx.resolve(...)`. An exception from it fails the
process's start.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from consumer.errors import ConsumerError

if TYPE_CHECKING:
    from broker.protocol import pb
    from consumer.message import Envelope, Message, Publisher
    from consumer.shard import Shard
    from consumer.store import OpFuture, Store


class DeferToNextTransaction(ConsumerError):  # Gazette: ErrDeferToNextTransaction (a signal, not an error).
    """Raised by `consume_message`: end the transaction before this message, which the next one
    consumes first. Raising it for a transaction's first message fails the shard."""


@runtime_checkable
class Application(Protocol):
    """A consumer application."""

    async def new_store(self, shard: Shard, recorder: Any | None) -> Store: ...

    def new_message(self, spec: pb.JournalSpec) -> Message: ...

    def consume_message(
        self, shard: Shard, store: Store, envelope: Envelope[Any], publisher: Publisher
    ) -> Awaitable[None] | None: ...  # `async def`, or a plain `def`.

    async def finalize_txn(self, shard: Shard, store: Store, publisher: Publisher) -> None: ...


@runtime_checkable
class BeginFinisher(Protocol):
    """The optional transaction hooks of an Application."""

    async def begin_txn(self, shard: Shard, store: Store) -> None: ...

    def finished_txn(self, shard: Shard, store: Store, committed: OpFuture) -> None: ...
