"""The project's one error tree, and the broker runtime's own errors.

Every public error the project raises is a `GazetteError`; its str() is the whole message a user
sees (gazctl prints it as one line and exits 1). Each package hangs its errors from the root and
carries the journal, offset, spec or file that failed. The whole tree, and where each family lives
(`tests/test_error_tree.py` fails on a public error class missing from it, not under the root, or
sharing a name with another):

    GazetteError
    ├── ConfigError                 a flag, environment variable, INI file or option that cannot be used
    │   ├── TLSFileError            a TLS file that cannot be used (its flag, the problem)
    │   └── ListenError             cluster.server.listener: a port that cannot be listened on (also OSError)
    ├── AuthError                   broker.protocol.auth: a token that does not verify or grant, keys that do not decode
    ├── ValidationError             broker.protocol: a value that breaks Gazette's rules (also ValueError)
    │   └── SelectorError           broker.protocol: a label selector that does not parse
    ├── URLError                    broker.protocol: a URL Go's net/url rejects (also ValueError)
    ├── SpecError                   broker.specs: a spec document, at file:line:column and field (also ValueError)
    ├── DurationError               broker.specs: a Go duration string that does not parse (also ValueError)
    ├── FragmentError               broker.fragment: names, codecs, spools
    │   ├── FragmentNameError, UnknownCodecError, CodecError (also ValueError), ContentDeltaError
    │   └── SpoolIOError, PostfixTemplateError
    ├── StoreError                  broker.stores: a fragment store operation failed (store URL, path)
    │   └── StoreConfigError        a store URL or its arguments are invalid
    ├── KeySpaceError               cluster.keyspace: etcd, the mirror, announcements
    │   └── EtcdAddressError, EtcdUnavailableError, EtcdStartError, KeyFormatError,
    │       KeySpaceClosedError, AnnounceError, LeaseLostError
    ├── ChildExitedError            cluster.server.supervisor: a broker process of `gazette serve
    │                               --broker.processes N` exited on its own (the others were stopped)
    ├── BrokerError                 broker: the service (journal, offset)
    │   └── AppendError, PipelineError, ReplicationError, MinRateError (an append stream too slow)
    ├── GatewayError                cluster.server.http, broker.gateway: a request answered with an HTTP error,
    │                               a route not added
    │   └── BadRequest, BadTarget, BodyError (also h11.RemoteProtocolError), RouteError (also ValueError)
    ├── ClientError                 broker.client (journal, offset)
    │   ├── ProtocolError, OffsetJump, UnexpectedEOF, FragmentReadError, SeekRequiresNewReader,
    │   │   DependencyFailed, ServiceClosed, NotHttp (a gRPC-only endpoint: the client uses gRPC there)
    │   ├── TransportError          a failed gRPC call (its status code)
    │   │   └── AppendOutcomeUnknown
    │   └── StatusError             a non-OK pb.Status, one subclass per status:
    │       └── JournalNotFound, NoJournalPrimaryBroker, NotJournalPrimaryBroker, NotJournalBroker,
    │           InsufficientJournalBrokers, OffsetNotYetAvailable, WrongRoute, ProposalMismatch,
    │           EtcdTransactionFailed, NotAllowed, WrongAppendOffset, IndexHasGreaterOffset,
    │           RegisterMismatch, Suspended, FragmentStoreUnhealthy
    ├── MessageError                consumer.message (journal, offset, content type)
    │   ├── UUIDError (also ValueError), UnknownContentTypeError (also LookupError)
    │   ├── MappingError            EmptyPartitionsError
    │   ├── FramingError            TruncatedFrameError, DesyncError, FrameTooLargeError, DecodeError,
    │   │                           EncodeError, CSVSyntaxError, NeedMore (a CSV record goes on: a signal)
    │   └── SequencerError          ReplayError, SequencerStateError (also RuntimeError)
    ├── RecoveryLogError            consumer.recoverylog (log, offset, seq_no, author)
    │   ├── SegmentError            a Segment is invalid, or would break a SegmentSet's invariants (also ValueError)
    │   │   └── NotReducible        two segments that cannot merge (a signal, caught where raised)
    │   ├── HintsError              FSMHints no FSM can start from, or that etcd could not store (also ValueError)
    │   ├── FSMError                an op the FSM did not apply (one subclass per Gazette sentinel)
    │   │   ├── NotHintedAuthorError, WrongSeqNoError, ChecksumMismatchError
    │   │   ├── LinkExistsError, PropertyExistsError, NoSuchLinkError
    │   │   ├── FnodeNotTrackedError     (the FSM *did* transition: see its doc)
    │   │   └── ExpectedHintedFnodeError
    │   ├── OpDecodeError           bytes of the log that are not a RecordedOp frame
    │   ├── RecorderError           a recorded file operation that is inconsistent with the FSM
    │   │   └── RecorderFailedError the Recorder cannot append any more (fenced, or an append failed)
    │   └── PlaybackError           playback cannot go on (possible data loss, a file error, ...)
    │       ├── ContentTypeError    the log journal is not labelled as a recovery log
    │       └── BrokenHistoryError  an op that must continue the history does not
    ├── ConsumerStoreError          consumer.stores: a store could not restore or commit (shard ID)
    │   ├── FenceError              another process restored the shard: its checkpoint fence moved
    │   ├── StoreDependencyError    a commit's `wait_for` operation failed
    │   ├── StoreClosedError        the store was destroyed, or a transaction used after its commit
    │   └── ForeignStoreError       the recovery log holds another store's files (Gazette's RocksDB...)
    ├── ConsumerError               consumer: the runtime (consumer/errors.py)
    │   ├── ReplicaError            serving a shard failed (Gazette's prefixes: `completeRecovery: ...`)
    │   ├── TransactionError        a transaction failed (`txnStartCommit: app.FinalizeTxn: ...`)
    │   ├── DeferToNextTransaction  raised by an application: end the transaction before this message
    │   ├── ChannelClosed           sending to a closed message channel
    │   ├── ResolverError           a resolution that cannot be answered with a status
    │   │   └── ResolverStopped     the service stopped serving local shards
    │   ├── ShardUnavailable, PeerUnavailable   an application API request not served here or by a peer
    │   ├── ApplicationLoadError    `MODULE:ATTR` does not name an application
    │   ├── ApplicationInitError    its `init_application` failed (also ValueError)
    │   └── StartError              `gazette consume` could not start
    ├── GazctlError                 gazctl: what a command cannot do
    │   ├── RecordError             an input record `journals append` cannot frame
    │   └── GitOpsError             TreeError, OwnershipError, PruneRefused, StalePlan
    └── SparkPipelineError          pipelines: the Spark source, sink and pipeline definitions
        ├── GazetteOptionError      a source option (also ValueError)
        ├── SinkError               a sink option (also ValueError)
        ├── DataLossError           fragments gone from a journal read with failOnDataLoss (also RuntimeError)
        ├── SinkAppendError         a sink task's appends failed (also RuntimeError)
        ├── PipelineAuthError       a broker refused the token presented (also PermissionError)
        └── PipelineNotFound, PipelineDirError, PipelineRunError

A name begun with `_` is a module's own signal, never seen outside it.
"""

from __future__ import annotations


class GazetteError(Exception):
    """The root of every error the project raises on purpose; str() is the complete message."""


class ConfigError(GazetteError):
    """A setting (flag, environment variable, INI file, data source option) which cannot be used."""


class AuthError(GazetteError):
    """An authorization token that cannot be verified, or does not grant what a call requires;
    or auth keys that cannot be used."""


class BrokerError(GazetteError):
    """Base of the broker runtime's errors."""

    def __init__(self, message: str, journal: str = "", offset: int | None = None) -> None:
        super().__init__(message)
        self.journal = journal
        self.offset = offset


class GatewayError(GazetteError):
    """A request the HTTP gateway answers with an error (400, ...), or a route it cannot add."""


class AppendError(BrokerError):
    """An append failed without a protocol status: a gRPC-level error is returned to the client."""


class PipelineError(BrokerError):
    """The replication pipeline broke: a peer failed, disagreed, or closed its stream."""


class ReplicationError(BrokerError):
    """A Replicate stream received a message it cannot apply."""
