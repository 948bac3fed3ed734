"""Errors of the broker runtime. Each carries the journal (and offset) it concerns."""

from __future__ import annotations


class BrokerError(Exception):
    """Base of the broker runtime's errors."""

    def __init__(self, message: str, journal: str = "", offset: int | None = None) -> None:
        super().__init__(message)
        self.journal = journal
        self.offset = offset


class AppendError(BrokerError):
    """An append failed without a protocol status: a gRPC-level error is returned to the client."""


class PipelineError(BrokerError):
    """The replication pipeline broke: a peer failed, disagreed, or closed its stream."""


class ReplicationError(BrokerError):
    """A Replicate stream received a message it cannot apply."""
