"""The client library of Gazette brokers (asyncio, grpc.aio), with a synchronous facade in `sync`.

- `JournalClient` (dial): the default broker address, a channel per endpoint, and a RouteCache
  (routes): requests go straight to a journal's primary (appends) or a same-zone member (reads).
- `Reader` / `RetryReader` (reader): a read of a journal as an async byte stream (a Read RPC, or
  for a plain read of an `http://` broker a GET of its gateway: http_read); the retrying one
  survives transport errors, broker restarts and route changes without losing or repeating a byte.
- http_conn, http_append, http_read: the kept-alive HTTP/1.1 connections, PUTs and GETs that
  `append()` and the Reader use where a broker's gateway takes the request for less than gRPC.
- `Appender` / `append` (appender): one Append RPC; commit on close, abort on error.
- `AppendService` / `AsyncAppend` (append_service): batched, ordered, retried background appends
  with bounded memory (spilling to temporary files).
- listing: `list_journals`, `iter_list_pages`, `watch_journals`, `apply_journals`, `list_fragments`,
  `list_all_fragments`, `iter_fragments`, and `JournalWatcher` (added / removed journals).
- errors: `ClientError` and its subclasses, one per non-OK status (e.g. `WrongAppendOffset`);
  `ConfigError` for an unusable address; all are `GazetteError`s (see `broker.errors`).
- config: the broker address (the one given, `$BROKER_ADDRESS`, `http://localhost:8080`).
- credentials: `Credentials` (a bearer token or auth keys, TLS files) a client presents;
  `Credentials.from_env()` reads `BROKER_AUTH_TOKEN`, `BROKER_AUTH_KEYS` and the TLS variables.
"""

from broker.client.append_service import AppendService, AsyncAppend
from broker.client.appender import Appender, append, append_request
from broker.client.config import DEFAULT_BROKER_ADDRESS, resolve_broker_address
from broker.client.dial import Dialer, JournalClient
from broker.client.errors import (
    STATUS_ERRORS,
    AppendOutcomeUnknown,
    ClientError,
    DependencyFailed,
    EtcdTransactionFailed,
    FragmentReadError,
    FragmentStoreUnhealthy,
    IndexHasGreaterOffset,
    InsufficientJournalBrokers,
    JournalNotFound,
    NoJournalPrimaryBroker,
    NotAllowed,
    NotJournalBroker,
    NotJournalPrimaryBroker,
    OffsetJump,
    OffsetNotYetAvailable,
    ProposalMismatch,
    ProtocolError,
    RegisterMismatch,
    SeekRequiresNewReader,
    ServiceClosed,
    StatusError,
    Suspended,
    TransportError,
    UnexpectedEOF,
    WrongAppendOffset,
    WrongRoute,
    status_error,
)
from broker.client.listing import (
    JournalChanges,
    JournalWatcher,
    apply_journals,
    apply_transactions,
    delete,
    fragments_request,
    iter_fragments,
    iter_list_pages,
    list_all_fragments,
    list_fragments,
    list_journals,
    upsert,
    watch_journals,
)
from broker.client.reader import Reader, RetryReader, read_request
from broker.client.routes import RouteCache
from broker.errors import ConfigError, GazetteError
from broker.protocol.credentials import Credentials, TLSFiles

__all__ = [
    "DEFAULT_BROKER_ADDRESS",
    "STATUS_ERRORS",
    "AppendOutcomeUnknown",
    "AppendService",
    "Appender",
    "AsyncAppend",
    "ClientError",
    "ConfigError",
    "Credentials",
    "DependencyFailed",
    "Dialer",
    "EtcdTransactionFailed",
    "FragmentReadError",
    "FragmentStoreUnhealthy",
    "GazetteError",
    "IndexHasGreaterOffset",
    "InsufficientJournalBrokers",
    "JournalChanges",
    "JournalClient",
    "JournalNotFound",
    "JournalWatcher",
    "NoJournalPrimaryBroker",
    "NotAllowed",
    "NotJournalBroker",
    "NotJournalPrimaryBroker",
    "OffsetJump",
    "OffsetNotYetAvailable",
    "ProposalMismatch",
    "ProtocolError",
    "Reader",
    "RegisterMismatch",
    "RetryReader",
    "RouteCache",
    "SeekRequiresNewReader",
    "ServiceClosed",
    "StatusError",
    "Suspended",
    "TLSFiles",
    "TransportError",
    "UnexpectedEOF",
    "WrongAppendOffset",
    "WrongRoute",
    "append",
    "append_request",
    "apply_journals",
    "apply_transactions",
    "delete",
    "fragments_request",
    "iter_fragments",
    "iter_list_pages",
    "list_all_fragments",
    "list_fragments",
    "list_journals",
    "read_request",
    "resolve_broker_address",
    "status_error",
    "upsert",
    "watch_journals",
]
