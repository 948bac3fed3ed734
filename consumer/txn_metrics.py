"""The metrics of a shard's transactions (Gazette's consumer metrics): transactions, messages and
bytes read, and the seconds of each phase a transaction went through (`TxnPhase`)."""

from __future__ import annotations

import enum
import logging
from typing import Final, Protocol

from prometheus_client import Counter

log = logging.getLogger("consumer.transaction")

SHARD_TXN_TOTAL = Counter("gazette_shard_transactions_total", "Total number of consumer transactions.", ["shard"])
SHARD_READ_MSGS_TOTAL = Counter(
    "gazette_shard_read_messages_total",
    "Total number of messages processed by completed consumer transactions.",
    ["shard"],
)
SHARD_READ_BYTES_TOTAL = Counter(
    "gazette_shard_read_bytes_total",
    "Total byte-length of messages processed by completed consumer transactions.",
    ["shard"],
)
SHARD_PHASE_SECONDS_TOTAL = Counter(
    "gazette_shard_phase_seconds_total", "Cumulative number of seconds processing transactions.",
    ["shard", "phase", "type"],
)


class TxnPhase(enum.Enum):
    """Where a transaction is; values are the labels of Gazette's phase metrics."""

    NOT_RUNNING = "10-not-running"
    """No message consumed yet."""
    CONSUMING = "20-consuming"
    STALLED = "30-stalled"
    """The max duration elapsed while the prior transaction was still committing: no more reads."""
    PREPARING = "40-preparing"
    """FinalizeTxn, the checkpoint, StartCommit."""
    COMMITTING = "50-committing"
    """The store commit is in flight (the next transaction runs meanwhile)."""
    ACKNOWLEDGING = "60-acknowledging"
    """Committed; its ACK appends are in flight."""
    DONE = "done"
    """Committed and acknowledged."""


PHASE_KINDS: Final = (
    (TxnPhase.NOT_RUNNING, "sync"), (TxnPhase.CONSUMING, "sync"), (TxnPhase.STALLED, "sync"),
    (TxnPhase.PREPARING, "sync"), (TxnPhase.COMMITTING, "async"), (TxnPhase.ACKNOWLEDGING, "async"),
)


class ShardCounters:
    """A shard's labelled transaction counters, looked up once (`labels()` costs a lock and a
    dict lookup, at every transaction of a shard that commits hundreds a second)."""

    def __init__(self, fqn: str) -> None:
        self.fqn = fqn
        self.txns = SHARD_TXN_TOTAL.labels(fqn)
        self.messages = SHARD_READ_MSGS_TOTAL.labels(fqn)
        self.bytes = SHARD_READ_BYTES_TOTAL.labels(fqn)
        self.phases = [SHARD_PHASE_SECONDS_TOTAL.labels(fqn, phase.value, kind) for phase, kind in PHASE_KINDS]


class TxnTimes(Protocol):
    """What the metrics read of a completed transaction (`consumer.transaction.Transaction`)."""

    consumed_count: int
    consumed_bytes: int
    prev_prepare_done_at: int | None
    began_at: int | None
    stalled_at: int | None
    prepare_began_at: int | None
    prepare_done_at: int | None
    committed_at: int | None
    acked_at: int | None


def record_metrics(counters: ShardCounters, shard_id: str, txn: TxnTimes) -> None:
    """Count a completed transaction and the seconds of each of its phases."""
    counters.txns.inc()
    counters.messages.inc(txn.consumed_count)
    counters.bytes.inc(txn.consumed_bytes)
    debug = log.isEnabledFor(logging.DEBUG)
    phases: dict[str, float] = {}
    spans = (
        (txn.prev_prepare_done_at, txn.began_at), (txn.began_at, txn.stalled_at),
        (txn.stalled_at, txn.prepare_began_at), (txn.prepare_began_at, txn.prepare_done_at),
        (txn.prepare_done_at, txn.committed_at), (txn.committed_at, txn.acked_at),
    )
    for phase_seconds, (phase, _), (begin, end) in zip(counters.phases, PHASE_KINDS, spans, strict=True):
        if begin is not None and end is not None and end > begin:
            phase_seconds.inc((end - begin) / 1e9)
            if debug:
                phases[f"{phase.name.lower()}_ms"] = round((end - begin) / 1e6, 1)
    if debug:
        log.debug(
            "transaction metrics",
            extra={"shard": shard_id, "messages": txn.consumed_count, "bytes": txn.consumed_bytes, **phases},
        )


__all__ = [
    "SHARD_PHASE_SECONDS_TOTAL",
    "SHARD_READ_BYTES_TOTAL",
    "SHARD_READ_MSGS_TOTAL",
    "SHARD_TXN_TOTAL",
    "ShardCounters",
    "TxnPhase",
    "TxnTimes",
    "record_metrics",
]
