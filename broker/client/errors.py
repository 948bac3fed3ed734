"""The client's one exception hierarchy.

Every error the client raises is a `ClientError`, carrying the journal and offset it concerns
when known. A non-OK `pb.Status` becomes the `StatusError` subclass named after it (e.g.
`WRONG_APPEND_OFFSET` -> `WrongAppendOffset`), whose text starts with the status name as
Gazette's does. A failed gRPC call is a `TransportError`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import grpc

from broker.errors import GazetteError
from broker.protocol import pb


class ClientError(GazetteError):
    """Base of every client error. `journal` is "" and `offset` None when not applicable; `detail`
    adds context the failed operation knows (e.g. what earlier steps of it did)."""

    def __init__(self, message: str, *, journal: str = "", offset: int | None = None, detail: str = "") -> None:
        self.message = message
        self.journal = journal
        self.offset = offset
        self.detail = detail
        super().__init__(self._text())

    def _text(self) -> str:
        where = []
        if self.journal:
            where.append(f"journal {self.journal}")
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        text = f"{self.message} ({', '.join(where)})" if where else self.message
        return f"{text} ({self.detail})" if self.detail else text


class ProtocolError(ClientError):
    """A broker reply which violates the protocol (e.g. an invalid ReadResponse)."""


class TransportError(ClientError):
    """A gRPC call failed (broker unreachable, stream reset, deadline, ...); `code` is the gRPC status code."""

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode | None = None,
        journal: str = "",
        offset: int | None = None,
        detail: str = "",
    ) -> None:
        self.code = code
        super().__init__(message, journal=journal, offset=offset, detail=detail)

    @classmethod
    def from_rpc_error(
        cls, err: BaseException, *, endpoint: str = "", journal: str = "", offset: int | None = None, detail: str = ""
    ) -> TransportError:
        """Wrap a grpc error (or any exception of a failed call)."""
        code = err.code() if isinstance(err, grpc.aio.AioRpcError | grpc.Call) else None
        details = err.details() if isinstance(err, grpc.aio.AioRpcError | grpc.Call) else str(err)
        name = code.name if code is not None else type(err).__name__
        at = f"broker {endpoint}: " if endpoint else ""
        return cls(f"{at}{name}: {details}", code=code, journal=journal, offset=offset, detail=detail)


class AppendOutcomeUnknown(TransportError):
    """The transport failed after an append asked to commit: its bytes may or may not be in the journal.

    Such an append is never retried automatically, as a retry could write its bytes twice. A caller
    that must know reads the journal (e.g. for its own record IDs) before writing again.
    """


class OffsetJump(ClientError):
    """The read continues at `to`, after the requested `offset` (for -1, or content that was removed).

    The reader is still valid: its offset is already `to`, and the next read continues there.
    """

    def __init__(self, *, journal: str, offset: int, to: int) -> None:
        self.to = to
        super().__init__(f"offset jump to {to}", journal=journal, offset=offset)


class UnexpectedEOF(ClientError):
    """A fragment's content ended before `fragment.end` (at `offset`)."""


class FragmentReadError(ClientError):
    """A fragment could not be fetched or decoded, or its content ran past `fragment.end`."""


class SeekRequiresNewReader(ClientError):
    """A Reader can only seek forward within a directly read fragment; start a new Reader instead."""


class DependencyFailed(ClientError):
    """An append was not attempted because one of its dependencies failed (see `__cause__`)."""


class ServiceClosed(ClientError):
    """The AppendService was closed before the append was attempted or finished."""


class StatusError(ClientError):
    """A broker reply with a non-OK status. `status` is the pb.Status; `response` the reply, if any."""

    status: ClassVar[int]

    def __init__(
        self, *, journal: str = "", offset: int | None = None, response: Any = None, detail: str = ""
    ) -> None:
        self.response = response
        super().__init__(
            pb.Status.Name(self.status), journal=journal, offset=offset, detail=detail  # type: ignore[arg-type]
        )


class JournalNotFound(StatusError):
    status = pb.JOURNAL_NOT_FOUND


class NoJournalPrimaryBroker(StatusError):
    status = pb.NO_JOURNAL_PRIMARY_BROKER


class NotJournalPrimaryBroker(StatusError):
    status = pb.NOT_JOURNAL_PRIMARY_BROKER


class InsufficientJournalBrokers(StatusError):
    status = pb.INSUFFICIENT_JOURNAL_BROKERS


class NotJournalBroker(StatusError):
    status = pb.NOT_JOURNAL_BROKER


class OffsetNotYetAvailable(StatusError):
    status = pb.OFFSET_NOT_YET_AVAILABLE


class WrongRoute(StatusError):
    status = pb.WRONG_ROUTE


class ProposalMismatch(StatusError):
    status = pb.PROPOSAL_MISMATCH


class EtcdTransactionFailed(StatusError):
    status = pb.ETCD_TRANSACTION_FAILED


class NotAllowed(StatusError):
    status = pb.NOT_ALLOWED


class WrongAppendOffset(StatusError):
    status = pb.WRONG_APPEND_OFFSET


class IndexHasGreaterOffset(StatusError):
    status = pb.INDEX_HAS_GREATER_OFFSET


class RegisterMismatch(StatusError):
    status = pb.REGISTER_MISMATCH


class Suspended(StatusError):
    status = pb.SUSPENDED


class FragmentStoreUnhealthy(StatusError):
    status = pb.FRAGMENT_STORE_UNHEALTHY


STATUS_ERRORS: dict[int, type[StatusError]] = {
    cls.status: cls
    for cls in (
        JournalNotFound, NoJournalPrimaryBroker, NotJournalPrimaryBroker, InsufficientJournalBrokers,
        NotJournalBroker, OffsetNotYetAvailable, WrongRoute, ProposalMismatch, EtcdTransactionFailed,
        NotAllowed, WrongAppendOffset, IndexHasGreaterOffset, RegisterMismatch, Suspended, FragmentStoreUnhealthy,
    )
}
"""The StatusError subclass of each non-OK status."""


def status_error(
    status: int, *, journal: str = "", offset: int | None = None, response: Any = None, detail: str = ""
) -> StatusError:
    """The StatusError of non-OK `status`; a status unknown to this client raises ProtocolError."""
    try:
        cls = STATUS_ERRORS[status]
    except KeyError:
        raise ProtocolError(f"unknown status {status}", journal=journal, offset=offset, detail=detail) from None
    # FRAGMENT_STORE_UNHEALTHY replies (AppendResponse, FragmentStoreHealthResponse) say why.
    detail = detail or getattr(response, "store_health_error", "")
    return cls(journal=journal, offset=offset, response=response, detail=detail)
