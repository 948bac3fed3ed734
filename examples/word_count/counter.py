"""The Counter: word-count's consumer application and its NGram API (Gazette's examples/word-count).

- **Consumer**: each shard reads one partition of `NGramCount` deltas and keeps running totals in
  a `SQLiteStore` recorded to the shard's recovery log, in the table
  `ngrams (n_gram TEXT PRIMARY KEY, count INTEGER)`. `consume_message` adds each delta into the
  store's in-memory cache (filled from the table on a miss); `finalize_txn` writes the cache's
  totals into the table and empties it, and the store commits them with the checkpoint.
- **API** (`init_application`), served on the consumer's port:
  - gRPC `word_count.NGram`: `Publish(text)` lowercases the text, splits it into runs of letters,
    pads them with N `START`s before and N `END`s after, and publishes one committed
    `NGramCount{n_gram, count: 1}` per n-gram with a ModuloMapping of the n-gram over the
    partitions, returning once every append committed (as Gazette's, a failure part-way leaves the
    text partly counted). `Query(prefix, shard?)` resolves the shard (by default the one reading
    the partition `prefix` maps to) and answers from its store, here or proxied to its primary
    (the request then carries the resolution's header, and the peer does not proxy again). An
    empty prefix lists every n-gram of the shard.
  - HTTP: `POST /word_count/publish` (body: the text, or JSON `{"text": ...}`) answers `{}`;
    `GET /word_count/query?prefix=...&shard=...` answers `{"grams": [{"n_gram": ..., "count":
    ...}]}`, proxied as Query is.

Configuration (environment variables of the `gazette consume` process):
`WORD_COUNT_N` (n-gram length, default 2) and `WORD_COUNT_PREFIX` (the journal name prefix,
default `examples/word-count/`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from typing import Any, Final

import grpc

from broker.client import AppendService, list_journals
from broker.protocol import pb
from cluster.server.http.routes import HttpRequest, HttpResponse
from consumer.app_api import AppContext, ShardUnavailable
from consumer.message import Envelope, Flags, Publisher, get_flags, modulo_mapping
from consumer.message.mapping import MappingFunc
from consumer.resolver import Resolution
from consumer.shard import Shard
from consumer.stores import SQLiteStore
from examples.word_count import word_count_pb2 as wpb
from examples.word_count import word_count_pb2_grpc as wpb_grpc
from examples.word_count.messages import MESSAGE_TYPE, NGramCount
from examples.word_count.specs import DEFAULT_PREFIX, partitions_selector

log = logging.getLogger(__name__)

ENV_N: Final = "WORD_COUNT_N"
ENV_PREFIX: Final = "WORD_COUNT_PREFIX"
PARTITIONS_TTL: Final = 60.0
"""Seconds a listing of the partitions is used before it is listed again."""
PROXY_TIMEOUT: Final = 30.0

TABLE_SQL: Final = "CREATE TABLE IF NOT EXISTS ngrams (n_gram TEXT PRIMARY KEY NOT NULL, count INTEGER NOT NULL)"
_WORDS = re.compile(r"[^\W\d_]+")


def tokenize(text: str) -> list[str]:
    """Lowercase runs of letters (Go's `strings.FieldsFunc(ToLower(text), !unicode.IsLetter)`)."""
    return _WORDS.findall(text.lower())


def n_grams(text: str, n: int) -> list[str]:
    """The n-grams Publish counts: words padded with n START before and n END after (so the last
    n-gram is all END, as Gazette's)."""
    words = tokenize(text)
    grams = ["START"] * n
    out = []
    for i in range(len(words) + n):
        grams = [*grams[1:], words[i] if i < len(words) else "END"]
        out.append(" ".join(grams))
    return out


class CountStore:
    """A SQLiteStore and the counts of the transaction in progress (Gazette's word-count store Cache)."""

    def __init__(self, sqlite: SQLiteStore) -> None:
        self.sqlite = sqlite
        self.cache: dict[str, int] = {}

    async def restore_checkpoint(self, shard: Shard) -> Any:
        self.cache.clear()
        return await self.sqlite.restore_checkpoint(shard)

    def start_commit(self, shard: Shard, checkpoint: Any, wait_for: Any) -> Any:
        return self.sqlite.start_commit(shard, checkpoint, wait_for)

    async def destroy(self) -> None:
        await self.sqlite.destroy()

    def count(self, n_gram: str) -> int:
        """The total of `n_gram`, with this transaction's deltas."""
        if n_gram in self.cache:
            return self.cache[n_gram]
        rows = self.sqlite.query("SELECT count FROM ngrams WHERE n_gram = ?", (n_gram,))
        return int(rows[0][0]) if rows else 0

    def query(self, prefix: str) -> list[tuple[str, int]]:
        """The (n_gram, total) of every n-gram starting with `prefix`, in byte order."""
        rows = self.sqlite.query(
            "SELECT n_gram, count FROM ngrams WHERE n_gram >= ? AND substr(n_gram, 1, ?) = ? ORDER BY n_gram",
            (prefix, len(prefix), prefix),
        )
        return [(str(g), int(c)) for g, c in rows]


class Counter(wpb_grpc.NGramServicer):
    """The word-count application (see the module's doc)."""

    def __init__(self, *, n: int | None = None, prefix: str | None = None) -> None:
        self._n = n
        self._prefix = prefix
        self.ctx: AppContext | None = None
        self._appender: AppendService | None = None
        self._publisher: Publisher | None = None
        self._parts: pb.ListResponse | None = None
        self._parts_at = 0.0
        self._parts_lock = asyncio.Lock()
        self.mapping: MappingFunc = modulo_mapping(lambda m: m.n_gram, self._partitions)

    @property
    def n(self) -> int:
        if self._n is None:
            raw = os.environ.get(ENV_N, "2")
            try:
                self._n = int(raw)
            except ValueError:
                raise ValueError(f"${ENV_N} must be an integer, not {raw!r}") from None
        if self._n < 1:
            raise ValueError(f"the n-gram length must be at least 1 (${ENV_N}={self._n})")
        return self._n

    @property
    def prefix(self) -> str:
        if self._prefix is None:
            self._prefix = os.environ.get(ENV_PREFIX) or DEFAULT_PREFIX
        return self._prefix

    # -- Application ----------------------------------------------------------------------------

    async def init_application(self, ctx: AppContext) -> None:
        """Serve the NGram gRPC service and its HTTP routes on the consumer's port."""
        _ = self.n  # A bad $WORD_COUNT_N fails the start.
        self.ctx = ctx
        self._appender = AppendService(ctx.journal_client)
        self._publisher = Publisher(self._appender)
        wpb_grpc.add_NGramServicer_to_server(self, ctx.server)
        ctx.add_route("POST", "/word_count/publish", self.http_publish)
        ctx.add_route("GET", "/word_count/query", self.http_query)
        ctx.add_cleanup(self._close)

    async def _close(self) -> None:
        if self._appender is not None:
            await self._appender.close(cancel=True)

    async def new_store(self, shard: Shard, recorder: Any | None) -> CountStore:
        if recorder is None:
            raise ValueError(f"shard {shard.id} has no recovery_log_prefix: word-count's store is recorded to one")
        sqlite = await SQLiteStore.open(recorder)
        sqlite.execute(TABLE_SQL)
        return CountStore(sqlite)

    def new_message(self, spec: pb.JournalSpec) -> NGramCount:
        return NGramCount()

    async def consume_message(self, shard: Shard, store: Any, envelope: Envelope[Any], publisher: Publisher) -> None:
        if get_flags(envelope.uuid) == Flags.ACK_TXN:
            return
        counts: CountStore = store
        msg: NGramCount = envelope.message
        counts.cache[msg.n_gram] = counts.count(msg.n_gram) + msg.count

    async def finalize_txn(self, shard: Shard, store: Any, publisher: Publisher) -> None:
        counts: CountStore = store
        if counts.cache:
            counts.sqlite.executemany(
                "INSERT INTO ngrams (n_gram, count) VALUES (?, ?) "
                "ON CONFLICT (n_gram) DO UPDATE SET count = excluded.count",
                list(counts.cache.items()),
            )
            counts.cache.clear()

    # -- partitions and shards ------------------------------------------------------------------

    def _partitions(self) -> pb.ListResponse:
        if self._parts is None or not self._parts.journals:
            raise RuntimeError(f"no journals labelled {MESSAGE_TYPE} under {self.prefix!r}")
        return self._parts

    async def refresh_partitions(self, *, force: bool = False) -> None:
        ctx = self._context()
        loop = asyncio.get_running_loop()
        async with self._parts_lock:
            stale = self._parts is None or not self._parts.journals or loop.time() - self._parts_at > PARTITIONS_TTL
            if force or stale:
                self._parts = await list_journals(ctx.journal_client, partitions_selector(self.prefix), retry_for=10.0)
                self._parts_at = loop.time()

    async def shard_of(self, n_gram: str) -> str:
        """The shard reading the partition `n_gram` maps to."""
        await self.refresh_partitions()
        journal, _ = self.mapping(NGramCount(n_gram))
        specs = self._context().shards_with_source(journal)
        if not specs:
            raise LookupError(f"no ShardSpec is consuming mapped journal {journal}")
        return specs[0].id

    def _context(self) -> AppContext:
        if self.ctx is None:
            raise RuntimeError("the application was not initialized (init_application)")
        return self.ctx

    # -- the API, as functions ------------------------------------------------------------------

    async def publish(self, text: str) -> int:
        """Publish the n-grams of `text`; returns how many, once all are committed."""
        await self.refresh_partitions()
        assert self._publisher is not None
        appends = [self._publisher.publish_committed(self.mapping, NGramCount(g, 1)) for g in n_grams(text, self.n)]
        for append in appends:
            await append
        return len(appends)

    async def query(self, request: wpb.QueryRequest, timeout: float = PROXY_TIMEOUT) -> wpb.QueryResponse:
        """Answer `request` from its shard's store, here or at its primary."""
        ctx = self._context()
        shard = request.shard or await self.shard_of(request.prefix)
        header = request.header if request.HasField("header") else None

        async def local(res: Resolution) -> wpb.QueryResponse:
            assert isinstance(res.store, CountStore)
            return wpb.QueryResponse(
                grams=[wpb.NGramCount(n_gram=g, count=c) for g, c in res.store.query(request.prefix)]
            )

        async def proxy(res: Resolution) -> wpb.QueryResponse:
            forwarded = wpb.QueryRequest(prefix=request.prefix, shard=shard)
            forwarded.header.CopyFrom(res.header)
            response: wpb.QueryResponse = await wpb_grpc.NGramStub(ctx.channel_to(res)).Query(
                forwarded, timeout=timeout
            )
            return response

        return await ctx.serve(shard, local=local, proxy=proxy, proxy_header=header, timeout=timeout)

    # -- gRPC -----------------------------------------------------------------------------------

    async def Publish(
        self, request: wpb.PublishRequest, context: grpc.aio.ServicerContext
    ) -> wpb.PublishResponse:
        try:
            await self.publish(request.text)
        except RuntimeError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return wpb.PublishResponse()

    async def Query(
        self, request: wpb.QueryRequest, context: grpc.aio.ServicerContext
    ) -> wpb.QueryResponse:
        remaining = context.time_remaining()
        try:
            return await self.query(request, timeout=min(remaining, PROXY_TIMEOUT) if remaining else PROXY_TIMEOUT)
        except ShardUnavailable as exc:
            await context.abort(exc.grpc_code, str(exc))
        except LookupError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except RuntimeError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except grpc.aio.AioRpcError as exc:  # The primary's own error (not UNAVAILABLE).
            await context.abort(exc.code(), f"proxying Query: {exc.details()}")
        raise AssertionError("unreachable")

    # -- HTTP -----------------------------------------------------------------------------------

    async def http_publish(self, request: HttpRequest) -> HttpResponse:
        text = request.body.decode("utf-8", "replace")
        if (request.header("content-type") or "").startswith("application/json"):
            try:
                doc = request.json()
                text = doc["text"]
                if not isinstance(text, str):
                    raise TypeError("text is not a string")
            except (ValueError, KeyError, TypeError) as exc:
                return HttpResponse.text(f'expected a JSON object {{"text": "..."}}: {exc}\n', 400)
        published = await self.publish(text)
        return HttpResponse.json({"published": published})

    async def http_query(self, request: HttpRequest) -> HttpResponse:
        query = wpb.QueryRequest(prefix=request.param("prefix", "") or "", shard=request.param("shard", "") or "")
        try:
            response = await self.query(query)
        except ShardUnavailable as exc:
            return HttpResponse.text(f"{exc}\n", exc.http_status)
        except LookupError as exc:
            return HttpResponse.text(f"{exc}\n", 404)
        return HttpResponse.json({"grams": [{"n_gram": g.n_gram, "count": g.count} for g in response.grams]})


__all__ = ["ENV_N", "ENV_PREFIX", "CountStore", "Counter", "n_grams", "tokenize"]
