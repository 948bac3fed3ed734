"""`JSONFileStore`: a small shard state kept as one JSON file, recorded to a recovery log
(Gazette's `consumer/store_json_file.go`).

The store lives in its Recorder's directory, as `state.json`: three JSON documents, one per
line, exactly as Gazette writes them:

1. the legacy offsets map `{journal: offset}` (always `{}` when this store writes it; a legacy
   file's offsets override the checkpoint's read-through offsets when restored);
2. the application's state;
3. the shard's `Checkpoint`, in Go `encoding/json` form (`checkpoint_to_json`): `sources`,
   `read_through`, `producers`, `id` and ACK intents in base64, `last_ack` as a number. A legacy
   file may lack it.

Use from an application
-----------------------
The state is any value the `json` module encodes (a dict, by default), or a flat dataclass::

    @dataclass
    class Counts:
        words: dict[str, int] = field(default_factory=dict)

    async def new_store(self, shard, recorder):
        return JSONFileStore(recorder, Counts())      # Loads state.json, if it exists.

    async def consume_message(self, shard, store, envelope, publisher):
        store.state.words[envelope.message.word] = store.state.words.get(envelope.message.word, 0) + 1

`store.state` is the application's mutable object; `start_commit` snapshots it (encodes it) at
once, so the next transaction may change it while the commit is in flight. Another shape of
state takes an `encode` (state -> JSON value) and `decode` (JSON value -> state) pair.

Commits
-------
`start_commit(shard, checkpoint, wait_for)`: `recorder.barrier(wait_for)`, if any (nothing recorded from
then on reaches the log before the transaction's appends committed); write `next.json` and
record it (a create and its writes); rename it over `state.json` and record the rename (an unlink
of the old Fnode, a link of the new one, an unlink of `next.json`); return a future of
`recorder.barrier()`. The rename is atomic on disk, and its ops are appended together (a large
state's write is followed by a barrier first), so a playback of the log yields the old or the new
`state.json`; should a log end between the rename's unlink and link, a complete `next.json` is
read in its place.

The commit fails with `StoreDependencyError` when a `wait_for` operation failed (the Recorder then
appends nothing more), with `FenceError` when another author took the recovery log (a new primary
injected its hand-off: the append fails REGISTER_MISMATCH), and with `ConsumerStoreError` otherwise. In
every case the Recorder is failed for good, and so is the store: the shard must be recovered from
the log, where the failed commit left no trace. (Gazette's Recorder instead retries a fenced
append until the shard is cancelled; either way, a fenced commit never succeeds.)

`destroy` removes the directory.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from broker.client import RegisterMismatch
from consumer.protocol import pb
from consumer.recoverylog.errors import RecoveryLogError
from consumer.recoverylog.recorder import FileRecorder, Recorder
from consumer.store import OpFuture
from consumer.stores.errors import ConsumerStoreError, FenceError, StoreClosedError, StoreDependencyError
from consumer.stores.layout import check_recorded_layout

if TYPE_CHECKING:
    from consumer.shard import Shard

S = TypeVar("S")

STATE_FILE = "state.json"
NEXT_FILE = "next.json"

LOG_FENCED = "recovery log was fenced (ie, by a new primary)"

_RENAME_BARRIER_BYTES = 1 << 20

# -- the Checkpoint as Go's encoding/json writes it (`consumer/store_json_file.go`) ----------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def checkpoint_to_json(cp: pb.Checkpoint) -> dict[str, Any]:
    """`cp` as Go's `encoding/json` encodes Gazette's `pc.Checkpoint`: `sources` (null when empty),
    `ack_intents` (omitted when empty, values base64); per source `read_through` (omitted when 0)
    and `producers` (null when empty); per producer `id` (base64, omitted when empty) and `state`
    with `last_ack` (a number) and `begin` (each omitted when 0)."""
    sources: dict[str, Any] | None = None
    if cp.sources:
        sources = {}
        for journal in sorted(cp.sources):
            src = cp.sources[journal]
            doc: dict[str, Any] = {}
            if src.read_through:
                doc["read_through"] = src.read_through
            producers = []
            for entry in src.producers:
                p: dict[str, Any] = {}
                if entry.id:
                    p["id"] = _b64(entry.id)
                state: dict[str, Any] = {}
                if entry.state.last_ack:
                    state["last_ack"] = entry.state.last_ack
                if entry.state.begin:
                    state["begin"] = entry.state.begin
                p["state"] = state
                producers.append(p)
            doc["producers"] = producers or None
            sources[journal] = doc
    out: dict[str, Any] = {"sources": sources}
    if cp.ack_intents:
        out["ack_intents"] = {j: _b64(cp.ack_intents[j]) for j in sorted(cp.ack_intents)}
    return out


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} is not an integer: {value!r}")
    return value


def _obj(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not an object: {value!r}")
    return value


def checkpoint_from_json(doc: Any) -> pb.Checkpoint:
    """The Checkpoint of a `checkpoint_to_json` document (or one Go wrote); raises ValueError."""
    cp = pb.Checkpoint()
    for journal, src in _obj(_obj(doc, "checkpoint").get("sources"), "sources").items():
        src = _obj(src, f"source {journal}")
        out = cp.sources[journal]
        out.read_through = _int(src.get("read_through", 0), f"read_through of {journal}")
        for entry in src.get("producers") or ():
            entry = _obj(entry, f"a producer of {journal}")
            p = out.producers.add()
            p.id = base64.b64decode(entry.get("id") or "", validate=True)
            state = _obj(entry.get("state"), f"a producer state of {journal}")
            p.state.last_ack = _int(state.get("last_ack", 0), "last_ack")
            p.state.begin = _int(state.get("begin", 0), "begin")
    for journal, intent in _obj(doc.get("ack_intents"), "ack_intents").items():
        if not isinstance(intent, str):
            raise ValueError(f"the ACK intent of {journal} is not a base64 string")
        cp.ack_intents[journal] = base64.b64decode(intent, validate=True)
    return cp


_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                             "\u2029": "\\u2029"})


def go_json_line(value: Any) -> bytes:
    """`value` as one line of Go's `json.Encoder.Encode`: compact, HTML-escaped, UTF-8, then a newline."""
    return (json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            .translate(_GO_ESCAPES) + "\n").encode("utf-8")


def iter_json_docs(text: str) -> Iterator[Any]:
    """The JSON documents concatenated in `text` (whitespace between them), as Go's json.Decoder reads them."""
    decoder = json.JSONDecoder()
    pos, end = 0, len(text)
    while True:
        while pos < end and text[pos] in " \t\r\n":
            pos += 1
        if pos == end:
            return
        value, pos = decoder.raw_decode(text, pos)
        yield value


# -- commits through a Recorder, shared with the SQLite store ---------------------------------------------------------


def failed_future(exc: BaseException) -> OpFuture:
    """An OpFuture already failed with `exc` (its failure is marked retrieved)."""
    future: OpFuture = asyncio.get_running_loop().create_future()
    future.set_exception(exc)
    future.add_done_callback(lambda f: f.exception())
    return future


def commit_error(
    exc: BaseException, wait_for: Sequence[asyncio.Future[Any]], shard_id: str | None
) -> ConsumerStoreError:
    """The ConsumerStoreError of a recorded commit that failed with `exc` (its `__cause__`)."""
    err: ConsumerStoreError | None = None
    for op in wait_for:
        if op.done() and (op.cancelled() or op.exception() is not None):
            why = "an operation was cancelled" if op.cancelled() else str(op.exception())
            err = StoreDependencyError(f"dependency failed: {why}", shard=shard_id)
            break
    cause: BaseException | None = exc
    while err is None and cause is not None:
        if isinstance(cause, RegisterMismatch):
            err = FenceError(LOG_FENCED, shard=shard_id)
        cause = cause.__cause__
    if err is None:
        err = ConsumerStoreError(f"recording the commit failed: {exc}", shard=shard_id)
    err.__cause__ = exc
    return err


async def await_recorded_commit(
    barrier: asyncio.Future[Any], wait_for: Sequence[asyncio.Future[Any]], shard_id: str | None
) -> None:
    """Await the `barrier` closing a recorded commit; its failure as a ConsumerStoreError."""
    try:
        await barrier
    except RecoveryLogError as exc:
        raise commit_error(exc, wait_for, shard_id) from exc


# -- the store ------------------------------------------------------------------------------------------------------


def _default_codec(initial: Any) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    if dataclasses.is_dataclass(initial) and not isinstance(initial, type):
        cls = type(initial)
        return dataclasses.asdict, lambda doc: cls(**_obj(doc, "the state"))
    return (lambda s: s), (lambda doc: doc)


class JSONFileStore(Generic[S]):
    """A shard's state (`state`, any JSON value or a flat dataclass) and checkpoint in
    `<recorder dir>/state.json`, recorded to the recovery log. See the module doc."""

    def __init__(
        self,
        recorder: Recorder,
        state: S,
        *,
        encode: Callable[[S], Any] | None = None,
        decode: Callable[[Any], S] | None = None,
    ) -> None:
        """A store of `recorder`'s directory. `state` is the initial state, replaced by the one of
        `state.json` if it exists (decoded by `decode`; a dataclass `state` decodes from its
        fields by default). Raises ConsumerStoreError if `state.json` does not decode, ForeignStoreError if
        the directory holds another store's files (`consumer.stores.layout`)."""
        if recorder is None:
            raise ConsumerStoreError("JSONFileStore needs a recovery log: the shard's spec has no recovery_log_prefix")
        check_recorded_layout(recorder, "a JSONFileStore", lambda p: p in (f"/{STATE_FILE}", f"/{NEXT_FILE}"))
        default_encode, default_decode = _default_codec(state)
        self.recorder = recorder
        self.dir = recorder.dir
        self.state: S = state
        """The application's state: change it in transactions; each commit writes it."""
        self._encode: Callable[[S], Any] = encode or default_encode
        self._decode: Callable[[Any], S] = decode or default_decode
        self._closed = False
        self._shard_id: str | None = None
        docs = self._read()
        if docs is not None and len(docs) >= 2:
            try:
                self.state = self._decode(docs[1])
            except Exception as exc:
                raise ConsumerStoreError(f"the state of {self.path} does not decode: {exc}") from exc

    @property
    def path(self) -> str:
        """The state file: `<dir>/state.json`."""
        return os.path.join(self.dir, STATE_FILE)

    def _read(self) -> list[Any] | None:
        """The JSON documents of state.json, or None if there is none.

        A log cut between the rename's unlink of the old state.json and its link of next.json
        leaves no state.json but a complete next.json: it is used. (Its ops were appended after
        the commit's dependencies, so it is a consistent state and checkpoint, only its commit's
        barrier is unacknowledged; a next.json cut short doesn't decode, and is ignored.)
        """
        text = self._read_text(self.path)
        if text is None:
            nxt = os.path.join(self.dir, NEXT_FILE)
            text = self._read_text(nxt)
            if text is None:
                return None
            try:
                docs = list(iter_json_docs(text))
            except ValueError:
                return None
            return docs if len(docs) == 3 else None
        try:
            docs = list(iter_json_docs(text))
        except ValueError as exc:
            raise ConsumerStoreError(
                f"{self.path} is not concatenated JSON documents: {exc}", shard=self._shard_id
            ) from exc
        if not 2 <= len(docs) <= 3:
            raise ConsumerStoreError(f"{self.path} holds {len(docs)} JSON documents (expected offsets, state and "
                             "checkpoint)", shard=self._shard_id)
        return docs

    def _read_text(self, path: str) -> str | None:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConsumerStoreError(f"reading {path}: {exc}", shard=self._shard_id) from exc

    # ---- the Store protocol ----

    async def restore_checkpoint(self, shard: Shard) -> pb.Checkpoint:
        """The checkpoint of state.json (an empty one if there is none); a legacy file's offsets
        map overrides its sources' read-through offsets. (The log's register fence, taken by the
        Player's hand-off, fences older primaries.)"""
        self._shard_id = shard.id
        if self._closed:
            raise StoreClosedError("the store was destroyed", shard=shard.id)
        docs = self._read()
        if docs is None:
            return pb.Checkpoint()
        try:
            cp = checkpoint_from_json(docs[2]) if len(docs) == 3 else pb.Checkpoint()
            for journal, offset in _obj(docs[0], "the offsets map").items():
                cp.sources[journal].read_through = _int(offset, f"the offset of {journal}")
        except (ValueError, TypeError) as exc:
            raise ConsumerStoreError(f"the checkpoint of {self.path} does not decode: {exc}", shard=shard.id) from exc
        return cp

    def start_commit(
        self, shard: Shard, checkpoint: pb.Checkpoint, wait_for: Sequence[asyncio.Future[Any]]
    ) -> OpFuture:
        """Write and record state.json with `checkpoint` once `wait_for` committed; returns at once."""
        self._shard_id = shard.id
        if self._closed:
            raise StoreClosedError("the store was destroyed", shard=shard.id)
        deps = list(wait_for)
        try:
            content = b"".join((go_json_line({}), go_json_line(self._encode(self.state)),
                                go_json_line(checkpoint_to_json(checkpoint))))
        except (TypeError, ValueError) as exc:
            return failed_future(ConsumerStoreError(f"the state does not encode as JSON: {exc}", shard=shard.id))
        try:
            if deps:
                self.recorder.barrier(deps)
            self._write(content)
        except RecoveryLogError as exc:
            return failed_future(commit_error(exc, deps, shard.id))
        except OSError as exc:
            return failed_future(ConsumerStoreError(f"writing {self.path}: {exc}", shard=shard.id))
        return asyncio.ensure_future(await_recorded_commit(self.recorder.barrier(), deps, shard.id))

    def _write(self, content: bytes) -> None:
        nxt = os.path.join(self.dir, NEXT_FILE)
        fd = os.open(nxt, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, content)
        finally:
            os.close(fd)
        FileRecorder(self.recorder, self.recorder.record_open_file(
            nxt, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)).record_write(content)
        if self.recorder.pending_bytes > _RENAME_BARRIER_BYTES:
            # Appends batch recorded ops up to a few MiB: after a large write, a barrier puts the
            # rename's ops in one append of their own, so no log ends between them.
            self.recorder.barrier()
        os.rename(nxt, self.path)
        self.recorder.record_rename(nxt, self.path)

    async def destroy(self) -> None:
        """Remove the store's directory."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(shutil.rmtree, self.dir, True)


def load_json_state(path: str | os.PathLike[str]) -> tuple[Mapping[str, int], Any, pb.Checkpoint | None]:
    """The offsets map, state and checkpoint (None in a legacy file) of a state.json file, for tools."""
    with open(path, encoding="utf-8") as f:
        docs = list(iter_json_docs(f.read()))
    if not 2 <= len(docs) <= 3:
        raise ValueError(f"{path} holds {len(docs)} JSON documents")
    return _obj(docs[0], "the offsets map"), docs[1], checkpoint_from_json(docs[2]) if len(docs) == 3 else None


__all__ = [
    "LOG_FENCED",
    "NEXT_FILE",
    "STATE_FILE",
    "JSONFileStore",
    "checkpoint_from_json",
    "checkpoint_to_json",
    "go_json_line",
    "load_json_state",
]
