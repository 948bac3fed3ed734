"""Errors raised by the etcd keyspace: connection, mirror, announcement and allocation."""

from broker.errors import GazetteError


class KeySpaceError(GazetteError):
    """Base class of every error raised by `cluster.keyspace`."""


class EtcdAddressError(KeySpaceError):
    """An etcd address is malformed or uses an unsupported scheme."""


class EtcdUnavailableError(KeySpaceError):
    """etcd did not answer at an address within the allowed time."""


class EtcdStartError(KeySpaceError):
    """The embedded etcd process could not be started or never became ready."""


class KeyFormatError(KeySpaceError):
    """An etcd key does not have the layout expected under the root."""


class KeySpaceClosedError(KeySpaceError):
    """The KeySpace mirror was closed while a caller waited on it."""


class AnnounceError(KeySpaceError):
    """The member could not be announced, or its key is gone."""


class LeaseLostError(KeySpaceError):
    """The member's etcd lease expired or was revoked."""
