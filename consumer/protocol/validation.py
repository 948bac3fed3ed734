"""Validation of consumer protocol messages, with Gazette's rules and error texts.

Every `validate_*` function returns None or raises broker.protocol.validation.ValidationError,
whose str() is the dotted field context, `: `, then the message (e.g.
`Sources[0].Journal: not a valid token (journal 2)`). Tokens, journal names, labels, selectors,
routes and headers are checked by the broker's validators; this module adds the consumer's own
rules (Gazette's shard_spec_extensions.go, rpc_extensions.go and recoverylog's FSMHints.Validate).

Two checks are this project's additions, as Gazette has no equivalent: `validate_checkpoint`,
and the upper bound of ShardSpec durations (Go's time.Duration cannot hold a longer protobuf
Duration, so a Go peer would fail to decode such a spec).
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.protocol import labels as lbl
from broker.protocol import validation as bv
from broker.protocol.paths import go_clean
from broker.protocol.validation import ValidationError, in_context
from consumer.protocol import pb, recoverylog_pb
from consumer.protocol.shard_spec import recovery_log

MIN_SHARD_ID_LEN, MAX_SHARD_ID_LEN = 4, 512
SHARD_ID_LABEL = "id"
"""The meta-label naming a shard's ID; reserved, so a ShardSpec's labels cannot hold it."""
PRODUCER_ID_LEN = 6

__all__ = [
    "MAX_SHARD_ID_LEN",
    "MIN_SHARD_ID_LEN",
    "PRODUCER_ID_LEN",
    "SHARD_ID_LABEL",
    "ValidationError",
    "validate_apply_change",
    "validate_apply_request",
    "validate_apply_response",
    "validate_checkpoint",
    "validate_consumer_spec",
    "validate_fsm_hints",
    "validate_get_hints_request",
    "validate_get_hints_response",
    "validate_list_request",
    "validate_list_response",
    "validate_list_response_shard",
    "validate_offsets",
    "validate_replica_status",
    "validate_segment",
    "validate_shard_id",
    "validate_shard_spec",
    "validate_shard_spec_source",
    "validate_stat_request",
    "validate_stat_response",
    "validate_status",
    "validate_unassign_request",
    "validate_unassign_response",
]


# Shards and their specs.


def validate_shard_id(shard_id: str) -> None:
    """Require a 4..512 byte token of letters, numbers and `-_+/.`."""
    bv.validate_token(shard_id, bv.TOKEN_SYMBOLS, MIN_SHARD_ID_LEN, MAX_SHARD_ID_LEN)


def validate_shard_spec(spec: pb.ShardSpec) -> None:
    """Require a well-formed ShardSpec, checking in the order of Gazette's ShardSpec.Validate."""
    with in_context("Id"):
        validate_shard_id(spec.id)
    if spec.recovery_log_prefix:
        with in_context("RecoveryLogPrefix"):
            bv.validate_journal(recovery_log(spec))
    elif spec.hint_prefix:
        raise ValidationError(f"invalid non-empty HintPrefix with empty RecoveryLogPrefix ({spec.hint_prefix})")
    if spec.recovery_log_prefix and not _is_absolute_clean_non_dir_path(spec.hint_prefix):
        raise ValidationError(f"HintPrefix is not an absolute, clean, non-directory path ({spec.hint_prefix})")
    if spec.hint_backups < 0:
        raise ValidationError(f"invalid HintBackups ({spec.hint_backups}; expected >= 0)")
    min_txn = bv.duration_ns(spec.min_txn_duration)
    if min_txn < 0:
        raise ValidationError(f"invalid MinTxnDuration ({min_txn}; expected >= 0)")
    if min_txn > bv.MAX_DURATION_NS:
        raise ValidationError(f"invalid MinTxnDuration ({min_txn}; expected <= {bv.MAX_DURATION_NS})")
    max_txn = bv.duration_ns(spec.max_txn_duration)
    if max_txn <= 0:
        raise ValidationError(f"invalid MaxTxnDuration ({max_txn}; expected > 0)")
    if max_txn > bv.MAX_DURATION_NS:
        raise ValidationError(f"invalid MaxTxnDuration ({max_txn}; expected <= {bv.MAX_DURATION_NS})")
    with in_context("LabelSet"):
        bv.validate_label_set(spec.labels)
        bv.validate_single_value_labels(spec.labels)
    if lbl.values_of(spec.labels, SHARD_ID_LABEL):
        raise ValidationError(f'Labels cannot include label "{SHARD_ID_LABEL}"')
    sources = spec.sources
    for i, source in enumerate(sources):
        with in_context(f"Sources[{i}]"):
            validate_shard_spec_source(source)
        if i != 0 and source.journal <= sources[i - 1].journal:
            raise ValidationError(
                "Sources.Journal not in unique, sorted order "
                f"(index {i}; {source.journal} <= {sources[i - 1].journal})"
            )


def validate_shard_spec_source(source: pb.ShardSpec.Source) -> None:
    """Require a valid journal and a non-negative MinOffset (Gazette's text says `> 0`)."""
    with in_context("Journal"):
        bv.validate_journal(source.journal)
    if source.min_offset < 0:
        raise ValidationError(f"invalid MinOffset ({source.min_offset}; expected > 0)")


def validate_consumer_spec(spec: pb.ConsumerSpec) -> None:
    """Require a valid ProcessSpec (no added context, as Go embeds it)."""
    bv.validate_process_spec(spec.process_spec)


_REPLICA_CODES = frozenset(pb.ReplicaStatus.Code.values())
_STATUSES = frozenset(pb.Status.values())


def validate_replica_status(status: pb.ReplicaStatus) -> None:
    """Require a defined Code, and Errors if and only if the Code is FAILED."""
    if status.code not in _REPLICA_CODES:
        raise ValidationError(f"invalid code ({status.code})", ["Code"])
    if not status.errors:
        if status.code == pb.ReplicaStatus.FAILED:
            raise ValidationError("expected non-empty Errors with Code FAILED")
    elif status.code != pb.ReplicaStatus.FAILED:
        raise ValidationError("expected Code FAILED with non-empty Errors")


def validate_status(status: int) -> None:
    """Require a defined consumer Status value."""
    if status not in _STATUSES:
        raise ValidationError(f"invalid status ({status})")


def validate_offsets(offsets: Mapping[str, int]) -> None:
    """Require valid journals with non-negative offsets (Gazette's pb.Offsets.Validate).

    Journals are checked in sorted order, so the first error reported is deterministic.
    """
    for journal in sorted(offsets):
        with in_context(f"Offsets[{journal}]"):
            bv.validate_journal(journal)
            if offsets[journal] < 0:
                raise ValidationError(f"invalid offset ({offsets[journal]}; expected >= 0)")


def validate_checkpoint(cp: pb.Checkpoint) -> None:
    """Require valid source and ack-intent journals, read-through offsets >= 0, 6-byte producer
    IDs and producer Begin offsets >= -1 (this project's addition: Gazette does not validate)."""
    for journal in sorted(cp.sources):
        source = cp.sources[journal]
        with in_context(f"Sources[{journal}]"):
            bv.validate_journal(journal)
            if source.read_through < 0:
                raise ValidationError(f"invalid ReadThrough ({source.read_through}; expected >= 0)")
            for i, entry in enumerate(source.producers):
                with in_context(f"Producers[{i}]"):
                    if len(entry.id) != PRODUCER_ID_LEN:
                        raise ValidationError(f"invalid Id length ({len(entry.id)}; expected {PRODUCER_ID_LEN})")
                    if entry.state.begin < -1:
                        raise ValidationError(f"invalid Begin ({entry.state.begin}; expected >= -1)")
    for journal in sorted(cp.ack_intents):
        with in_context(f"AckIntents[{journal}]"):
            bv.validate_journal(journal)


# Recovery log hints.


def validate_segment(segment: recoverylog_pb.Segment) -> None:
    """Require a consistent Segment (Gazette's recoverylog Segment.Validate)."""
    if segment.author == 0:
        raise ValidationError("Author is zero")
    if segment.first_seq_no <= 0:
        raise ValidationError("FirstSeqNo <= 0")
    if segment.first_offset < 0:
        raise ValidationError("FirstOffset < 0")
    if segment.last_seq_no < segment.first_seq_no:
        raise ValidationError("LastSeqNo < segment.FirstSeqNo")
    if segment.last_offset != 0 and segment.last_offset <= segment.first_offset:
        raise ValidationError("LastOffset <= segment.FirstOffset")
    with in_context("Log"):
        bv.validate_journal(segment.log)


def validate_fsm_hints(hints: recoverylog_pb.FSMHints) -> None:
    """Require valid segments, where a segment's empty Log implies the hints' Log, and a
    segment never repeats that Log (Gazette's FSMHints.Validate)."""
    for node in hints.live_nodes:
        for segment in node.segments:
            if not segment.log:
                implied = recoverylog_pb.Segment()
                implied.CopyFrom(segment)
                implied.log = hints.log
                segment = implied
            elif segment.log == hints.log:
                raise ValidationError("contained segment.Log duplicates FSMHints.Log")
            with in_context("Segment"):
                validate_segment(segment)


# Requests and responses of the Shard service.


def validate_stat_request(req: pb.StatRequest) -> None:
    """Require a valid Header (if set), Shard and ReadThrough offsets."""
    if req.HasField("header"):
        with in_context("Header"):
            bv.validate_header(req.header)
    with in_context("Shard"):
        validate_shard_id(req.shard)
    with in_context("ReadThrough"):
        validate_offsets(req.read_through)


def validate_stat_response(resp: pb.StatResponse) -> None:
    """Require a valid Status, Header, ReadThrough and PublishAt."""
    with in_context("Status"):
        validate_status(resp.status)
    with in_context("Header"):
        bv.validate_header(resp.header)
    with in_context("ReadThrough"):
        validate_offsets(resp.read_through)
    with in_context("PublishAt"):
        validate_offsets(resp.publish_at)


def validate_list_request(req: pb.ListRequest) -> None:
    """Require a valid Selector."""
    with in_context("Selector"):
        bv.validate_label_selector(req.selector)


def validate_list_response(resp: pb.ListResponse) -> None:
    """Require a valid Status, Header, and shards as `validate_list_response_shard`."""
    with in_context("Status"):
        validate_status(resp.status)
    with in_context("Header"):
        bv.validate_header(resp.header)
    for i, shard in enumerate(resp.shards):
        with in_context(f"Shards[{i}]"):
            validate_list_response_shard(shard)


def validate_list_response_shard(shard: pb.ListResponse.Shard) -> None:
    """Require a valid Spec, ModRevision > 0, a valid Route, and one valid status per member."""
    with in_context("Spec"):
        validate_shard_spec(shard.spec)
    if shard.mod_revision <= 0:
        raise ValidationError(f"invalid ModRevision ({shard.mod_revision}; expected > 0)")
    with in_context("Route"):
        bv.validate_route(shard.route)
    if len(shard.route.members) != len(shard.status):
        raise ValidationError(
            "length of Route.Members and Status are not equal "
            f"({len(shard.route.members)} vs {len(shard.status)})"
        )
    for i, status in enumerate(shard.status):
        with in_context(f"Status[{i}]"):
            validate_replica_status(status)


def validate_apply_request(req: pb.ApplyRequest) -> None:
    """Require every change to be a valid upsert (with optional hints) or delete."""
    for i, change in enumerate(req.changes):
        with in_context(f"Changes[{i}]"):
            validate_apply_change(change)


def validate_apply_change(change: pb.ApplyRequest.Change) -> None:
    """Require exactly one of Upsert (expect >= 0 or -1) and Delete (expect > 0 or -1);
    PrimaryHints only with an Upsert, and valid."""
    if change.HasField("upsert"):
        if change.delete:
            raise ValidationError("both Upsert and Delete are set (expected exactly one)")
        with in_context("Upsert"):
            validate_shard_spec(change.upsert)
        if change.expect_mod_revision < 0 and change.expect_mod_revision != -1:
            raise ValidationError(f"invalid ExpectModRevision ({change.expect_mod_revision}; expected >= 0 or -1)")
        if change.HasField("primary_hints"):
            with in_context("PrimaryHints"):
                validate_fsm_hints(change.primary_hints)
    elif change.delete:
        with in_context("Delete"):
            validate_shard_id(change.delete)
        if change.expect_mod_revision <= 0 and change.expect_mod_revision != -1:
            raise ValidationError(f"invalid ExpectModRevision ({change.expect_mod_revision}; expected > 0 or -1)")
        if change.HasField("primary_hints"):
            raise ValidationError("hints may be set only with an upsert, not a delete")
    else:
        raise ValidationError("neither Upsert nor Delete are set (expected exactly one)")


def validate_apply_response(resp: pb.ApplyResponse) -> None:
    """Require a valid Status and Header."""
    with in_context("Status"):
        validate_status(resp.status)
    with in_context("Header"):
        bv.validate_header(resp.header)


def validate_get_hints_request(req: pb.GetHintsRequest) -> None:
    """Require a valid Shard."""
    with in_context("Shard"):
        validate_shard_id(req.shard)


def validate_get_hints_response(resp: pb.GetHintsResponse) -> None:
    """Require a valid Status and valid primary and backup hints where present (Gazette checks
    no Header here)."""
    with in_context("Status"):
        validate_status(resp.status)
    if resp.primary_hints.HasField("hints"):
        with in_context("primary hints"):
            validate_fsm_hints(resp.primary_hints.hints)
    for backup in resp.backup_hints:
        if backup.HasField("hints"):
            with in_context("backup hints"):
                validate_fsm_hints(backup.hints)


def validate_unassign_request(req: pb.UnassignRequest) -> None:
    """Require valid shard IDs."""
    for i, shard in enumerate(req.shards):
        with in_context(f"Shards[{i}]"):
            validate_shard_id(shard)


def validate_unassign_response(resp: pb.UnassignResponse) -> None:
    """Require a valid Status that is OK."""
    with in_context("Status"):
        validate_status(resp.status)
    if resp.status != pb.OK:
        raise ValidationError(f"bad status: {pb.Status.Name(resp.status)}")


def _is_absolute_clean_non_dir_path(path: str) -> bool:
    # Go: path.IsAbs(p) && path.Clean(p) == p && path.Base(p) != "" (Base is never "").
    return path.startswith("/") and go_clean(path) == path
