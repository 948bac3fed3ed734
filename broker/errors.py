"""The project's one error tree, and the broker runtime's own errors.

Every error the project raises on purpose is a `GazetteError`; its str() is the whole message a
user sees (gazctl prints it as one line and exits 1). Each package hangs its errors from the
root and carries the journal, offset, spec or file that failed:

    GazetteError
    ├── ConfigError                 a flag, environment variable, INI file or option that cannot be used
    ├── AuthError                   broker.protocol.auth: a token that does not verify or grant, keys that do not decode
    ├── ValidationError             broker.protocol: a value that breaks Gazette's rules (also ValueError)
    │   └── SelectorError           broker.protocol: a label selector that does not parse
    ├── URLError                    broker.protocol: a URL Go's net/url rejects (also ValueError)
    ├── SpecError                   broker.specs: a spec document, at file:line:column and field (also ValueError)
    ├── FragmentError               broker.fragment: names, codecs, spools
    │   ├── FragmentNameError, UnknownCodecError, CodecError, ContentDeltaError
    │   └── SpoolIOError, PostfixTemplateError
    ├── StoreError                  broker.stores: a store operation failed (store URL, path)
    │   └── StoreConfigError        a store URL or its arguments are invalid
    ├── KeySpaceError               broker.keyspace: etcd, the mirror, announcements
    │   └── EtcdAddressError, EtcdUnavailableError, EtcdStartError, KeyFormatError,
    │       KeySpaceClosedError, AnnounceError, LeaseLostError
    ├── BrokerError                 broker: the service (journal, offset)
    │   └── AppendError, PipelineError, ReplicationError
    ├── ClientError                 broker.client (journal, offset)
    │   ├── ProtocolError, OffsetJump, UnexpectedEOF, FragmentReadError, SeekRequiresNewReader,
    │   │   DependencyFailed, ServiceClosed
    │   ├── TransportError          a failed gRPC call (its status code)
    │   │   └── AppendOutcomeUnknown
    │   └── StatusError             a non-OK pb.Status, one subclass per status (JournalNotFound, ...)
    ├── MessageError                consumer.message (journal, offset, content type)
    │   ├── UUIDError, UnknownContentTypeError, MappingError (EmptyPartitionsError)
    │   ├── FramingError            TruncatedFrameError, DesyncError, FrameTooLargeError, DecodeError, EncodeError
    │   └── SequencerError          ReplayError, SequencerStateError
    ├── GazctlError                 gazctl: what a command cannot do
    │   ├── RecordError             an input record `journals append` cannot frame
    │   └── GitOpsError             TreeError, OwnershipError, PruneRefused, StalePlan
    └── SparkPipelineError          pipelines: the Spark source, sink and pipeline definitions
        ├── GazetteOptionError      a source option (also ValueError)
        ├── SinkError               a sink option (also ValueError)
        ├── DataLossError           fragments gone from a journal read with failOnDataLoss
        ├── SinkAppendError         a sink task's appends failed
        └── PipelineNotFound, PipelineDirError, PipelineRunError
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


class AppendError(BrokerError):
    """An append failed without a protocol status: a gRPC-level error is returned to the client."""


class PipelineError(BrokerError):
    """The replication pipeline broke: a peer failed, disagreed, or closed its stream."""


class ReplicationError(BrokerError):
    """A Replicate stream received a message it cannot apply."""
