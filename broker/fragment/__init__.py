"""Journal fragments: the Fragment model and its content-addressed file names, the spool a
replica writes, and the index (a CoverSet of local and persisted fragments) that reads query.

Everything here runs on one asyncio event loop and needs no locks.
"""

from broker.fragment.cover_set import CoverSet, cover_set_difference
from broker.fragment.errors import (
    ContentDeltaError,
    FragmentError,
    FragmentNameError,
    SpoolIOError,
    UnknownCodecError,
)
from broker.fragment.fragment import Fragment, SpoolFile, spec_equal
from broker.fragment.index import OFFSET_JUMP_AGE, Index, QueryResult
from broker.fragment.names import (
    CODEC_EXTENSIONS,
    EXTENSION_CODECS,
    codec_extension,
    codec_from_extension,
    content_name,
    content_path,
    parse_fragment_from_relative_path,
)
from broker.fragment.spool import Spool, SpoolObserver
from broker.fragment.sums import EMPTY_SHA1, ZERO_SUM, digest_of, sha1sum_from_digest, sha1sum_hex

__all__ = [
    "CODEC_EXTENSIONS",
    "EMPTY_SHA1",
    "EXTENSION_CODECS",
    "OFFSET_JUMP_AGE",
    "ZERO_SUM",
    "ContentDeltaError",
    "CoverSet",
    "Fragment",
    "FragmentError",
    "FragmentNameError",
    "Index",
    "QueryResult",
    "Spool",
    "SpoolFile",
    "SpoolIOError",
    "SpoolObserver",
    "UnknownCodecError",
    "codec_extension",
    "codec_from_extension",
    "content_name",
    "content_path",
    "cover_set_difference",
    "digest_of",
    "parse_fragment_from_relative_path",
    "sha1sum_from_digest",
    "sha1sum_hex",
    "spec_equal",
]
