"""FSMHints in etcd (Gazette's `consumer/recovery.go`): the JSON codec, fetching, and storing with backups.

A shard's hints live at absolute keys named by its spec (not under the consumer's root):
`{hint_prefix}/{id}.primary`, written by the primary's Recorder every so often, and
`{hint_prefix}/{id}.backup.{0..hint_backups-1}`, written after each recovery, the older ones
rotated one slot down. Values are Go `encoding/json` of FSMHints (`log` omitted when empty,
`live_nodes`, `properties` and `segments` null when empty, other fields omitted when zero);
readers sniff the first byte: `{` is JSON, anything else protobuf.

Both writes are fenced by the shard's assignment: the etcd transaction requires the assignment
key's CreateRevision to be unchanged (CreateRevision, so racing status updates don't fail it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from cluster.keyspace.keyspace import compare_create, compare_mod, prefix_response, put_op, txn_response
from consumer.protocol import pb as cpb
from consumer.protocol import recoverylog_pb
from consumer.protocol.shard_spec import hint_backup_keys, hint_primary_key, recovery_log
from consumer.recoverylog.errors import HintsError, RecoveryLogError
from consumer.recoverylog.fsm import FSM

log = logging.getLogger(__name__)

FSMHints = recoverylog_pb.FSMHints

_SEGMENT_FIELDS = ("author", "first_seq_no", "first_offset", "first_checksum", "last_seq_no", "last_offset", "log")


def encode_hints(hints: FSMHints) -> bytes:
    """FSMHints as Go's encoding/json writes them (the form Gazette stores in etcd)."""
    doc: dict[str, Any] = {}
    if hints.log:
        doc["log"] = hints.log
    doc["live_nodes"] = [
        {
            **({"fnode": node.fnode} if node.fnode else {}),
            "segments": [
                {name: getattr(seg, name) for name in _SEGMENT_FIELDS if getattr(seg, name)} for seg in node.segments
            ] or None,
        }
        for node in hints.live_nodes
    ] or None
    doc["properties"] = [
        {**({"path": p.path} if p.path else {}), **({"content": p.content} if p.content else {})}
        for p in hints.properties
    ] or None
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_hints(value: bytes) -> FSMHints:
    """Hints from an etcd value: JSON if it starts with `{`, else protobuf. Raises HintsError."""
    try:
        if not value.startswith(b"{"):
            return FSMHints.FromString(value)
        doc = json.loads(value)
        hints = FSMHints(log=doc.get("log") or "")
        for node in doc.get("live_nodes") or ():
            out = hints.live_nodes.add(fnode=int(node.get("fnode") or 0))
            for seg in node.get("segments") or ():
                out.segments.add(**{name: seg[name] for name in _SEGMENT_FIELDS if seg.get(name)})
        for prop in doc.get("properties") or ():
            hints.properties.add(path=prop.get("path") or "", content=prop.get("content") or "")
        return hints
    except (ValueError, TypeError, AttributeError, KeyError, DecodeError) as exc:
        kind = "json.Unmarshal(hints)" if value.startswith(b"{") else "hints.Unmarshal"
        raise HintsError(f"{kind}: {exc}") from exc


@dataclass
class FetchedHints:
    """The hints stored for a shard: primary first, then each backup (None where a key is empty)."""

    log: str
    """The shard's recovery log."""
    keys: list[str]
    hints: list[FSMHints | None]
    mod_revisions: list[int] = field(default_factory=list)
    """Each key's ModRevision (0 where empty)."""
    values: list[bytes | None] = field(default_factory=list)
    """Each key's raw value."""

    @property
    def primary(self) -> FSMHints | None:
        return self.hints[0]

    @property
    def backups(self) -> list[FSMHints | None]:
        return self.hints[1:]


def pick_first_hints(hints: Sequence[FSMHints | None], log: str) -> FSMHints:
    """The primary hints, else the first stored backup, else empty hints of `log` (Gazette's PickFirstHints)."""
    for h in hints:
        if h is not None:
            return h
    return FSMHints(log=log)


async def fetch_hints(etcd: Any, spec: cpb.ShardSpec) -> FetchedHints:
    """The shard's primary and backup hints, read in one etcd Range of the keys they share as a
    prefix (`{hint_prefix}/{id}.`; Gazette reads them in one Txn). Each is decoded and must make a
    valid FSM of the shard's recovery log, or HintsError is raised."""
    keys = [hint_primary_key(spec), *hint_backup_keys(spec)]
    out = FetchedHints(log=recovery_log(spec), keys=keys, hints=[])
    try:
        resp = await prefix_response(etcd, f"{spec.hint_prefix}/{spec.id}.")
    except grpc.aio.AioRpcError as exc:
        raise HintsError(f"fetching ShardSpec.HintKeys: {exc.details() or exc.code()}") from exc
    found = {bytes(kv.key): kv for kv in resp.kvs}
    for key in keys:
        kv = found.get(key.encode())
        if kv is None:
            out.hints.append(None)
            out.mod_revisions.append(0)
            out.values.append(None)
            continue
        value = bytes(kv.value)
        try:
            h = decode_hints(value)
            try:
                FSM(h)
            except RecoveryLogError as exc:
                raise HintsError(f"validating FSMHints: {exc}", log=h.log) from exc
            if h.log != out.log:
                raise HintsError(f"hints.Log {h.log} != ShardSpec.RecoveryLog {out.log}", log=h.log)
        except HintsError as exc:
            raise HintsError(f"{exc.reason} (at {key})", log=exc.log) from exc
        out.hints.append(h)
        out.mod_revisions.append(int(kv.mod_revision))
        out.values.append(value)
    return out


async def store_recorded_hints(
    etcd: Any, spec: cpb.ShardSpec, hints: FSMHints, assignment_key: str, assignment_create_revision: int
) -> bool:
    """Put `hints` at the primary hints key, if the assignment still exists as created.

    Returns whether they were stored. Recorded hints are advisory: an etcd that is unavailable is
    only logged (the next flush retries), and a changed assignment skips the write, as Gazette does.
    """
    key = hint_primary_key(spec)
    try:
        resp = await txn_response(
            etcd, [compare_create(assignment_key, assignment_create_revision)], [put_op(key, encode_hints(hints))]
        )
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            log.warning("failed to store recorded FSMHints (will retry)", extra={"key": key, "error": str(exc)})
            return False
        raise HintsError(f"storing recorded hints at {key}: {exc.details() or exc.code()}", log=hints.log) from exc
    return bool(resp.succeeded)


async def store_recovered_hints(
    etcd: Any, spec: cpb.ShardSpec, hints: FSMHints, assignment_key: str, assignment_create_revision: int
) -> None:
    """Put `hints` at backup slot 0, rotating slot i to i+1 (up to hint_backups, stopping at the
    first empty slot), in one transaction comparing each slot's ModRevision and the assignment's
    CreateRevision. Raises HintsError if the transaction fails (a raced write, or a lost assignment)."""
    backups = hint_backup_keys(spec)
    fetched = await fetch_hints(etcd, spec)
    compares = [compare_create(assignment_key, assignment_create_revision)]
    ops = []
    value: bytes | None = encode_hints(hints)
    for i, key in enumerate(backups):
        if value is None:
            break
        ops.append(put_op(key, value))
        compares.append(compare_mod(key, fetched.mod_revisions[i + 1]))
        value = fetched.values[i + 1]  # Rotated into the next slot (None: nothing to rotate).
    if not ops:
        return
    try:
        resp = await txn_response(etcd, compares, ops)
    except grpc.aio.AioRpcError as exc:
        raise HintsError(f"storing recovered hints: {exc.details() or exc.code()}", log=hints.log) from exc
    if not resp.succeeded:
        raise HintsError("unexpected Etcd transaction failure", log=hints.log)


__all__ = [
    "FetchedHints",
    "decode_hints",
    "encode_hints",
    "fetch_hints",
    "pick_first_hints",
    "store_recorded_hints",
    "store_recovered_hints",
]
