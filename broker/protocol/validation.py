"""Validation of protocol messages, with Gazette's rules and error texts.

Every `validate_*` function returns None or raises ValidationError. An error raised by a nested
validator carries the field path to it, e.g. `Fragment.Stores[2]: not absolute (invalid)`.
Message fields that Go holds by pointer are checked with `HasField`; those Go holds by value
(gogoproto `nullable=false`) are validated whether or not they are present on the wire.
"""

from __future__ import annotations

import functools
import string
import unicodedata
from collections.abc import Sequence
from types import TracebackType
from typing import Self

from google.protobuf import text_format
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message

from broker.errors import GazetteError
from broker.protocol import labels as lbl
from broker.protocol import pb
from broker.protocol.paths import GoURL, URLError, go_clean, parse_url

TOKEN_SYMBOLS = "-_+/."
"""Symbols allowed in tokens besides letters and numbers. All ordinals exceed '#' (35), the
allocator's key separator."""
PATH_SYMBOLS = TOKEN_SYMBOLS + "=%"
"""Symbols allowed in path components and label values."""

_ASCII_ALNUM = frozenset(string.ascii_letters + string.digits)

MIN_LABEL_LEN, MAX_LABEL_LEN = 2, 64
MAX_LABEL_VALUE_LEN = 1024
MIN_JOURNAL_NAME_LEN, MAX_JOURNAL_NAME_LEN = 4, 512
MAX_JOURNAL_REPLICATION = 5
MIN_FRAGMENT_LEN, MAX_FRAGMENT_LEN = 1 << 10, 1 << 34
MIN_REFRESH_INTERVAL_NS, MAX_REFRESH_INTERVAL_NS = 10**9, 24 * 3600 * 10**9
MIN_FLUSH_INTERVAL_NS = 60 * 10**9
MAX_DURATION_NS = 2**63 - 1  # Go's time.Duration: a longer protobuf Duration does not convert.
MIN_ZONE_LEN, MAX_ZONE_LEN = 1, 32
MIN_SUFFIX_LEN, MAX_SUFFIX_LEN = 4, 128
MAX_BROKER_JOURNAL_LIMIT = 1 << 17
MAX_FRAGMENTS_PAGE_LIMIT = 10000


class ValidationError(GazetteError, ValueError):
    """A malformed value; str() is the dotted field context, `: `, then the message."""

    def __init__(self, message: str, context: Sequence[str] = ()) -> None:
        self.message = message
        self.context: tuple[str, ...] = tuple(context)
        super().__init__(message)

    def __str__(self) -> str:
        if self.context:
            return ".".join(self.context) + ": " + self.message
        return self.message

    def with_context(self, segment: str) -> Self:
        """Return a copy of this error with `segment` prepended to its context (Go ExtendContext)."""
        return type(self)(self.message, (segment, *self.context))


class in_context:
    """Prefix `segment` to the context of any ValidationError raised within the block.

    A class rather than a generator-based context manager: every request's validation enters
    several, and this costs a third as much."""

    __slots__ = ("segment",)

    def __init__(self, segment: str) -> None:
        self.segment = segment

    def __enter__(self) -> None:
        pass

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        if isinstance(err, ValidationError):
            raise err.with_context(self.segment).with_traceback(tb) from None


# Tokens, paths and names.


def validate_token(s: str, symbols: str, min_len: int, max_len: int) -> None:
    """Require `s` to be `min_len`..`max_len` UTF-8 bytes of letters, numbers and `symbols`."""
    length = _byte_len(s)
    if length < min_len or length > max_len:
        raise ValidationError(f"invalid length ({length}; expected {min_len} <= length <= {max_len})")
    for ch in s:
        if ch in _ASCII_ALNUM or ch in symbols:
            continue
        # Go's unicode.IsLetter / IsNumber are the L* and N* categories.
        if ch.isascii() or unicodedata.category(ch)[0] not in "LN":
            raise ValidationError(f"not a valid token ({s})")


def validate_path_component(s: str, min_len: int, max_len: int) -> None:
    """Require `s` to be a token over PATH_SYMBOLS that is a clean, relative path."""
    validate_token(s, PATH_SYMBOLS, min_len, max_len)
    if s and go_clean(s) != s:
        raise ValidationError(f"must be a clean path ({s})")
    if s.startswith("/"):
        raise ValidationError(f"cannot begin with '/' ({s})")


def split_meta(journal: str) -> tuple[str, str]:
    """Split `journal` into its name and its `;meta` suffix (including the `;`, or "")."""
    name, sep, meta = journal.partition(";")
    return name, sep + meta


@functools.lru_cache(maxsize=4096)
def validate_journal(name: str) -> None:
    """Require a journal name: a 4..512 byte path component, with an optional `;meta` suffix.
    (Names that pass are remembered: every append and read checks its journal's.)"""
    base, meta = split_meta(name)
    validate_path_component(base, MIN_JOURNAL_NAME_LEN, MAX_JOURNAL_NAME_LEN)
    if meta:
        with in_context("metadata path segment"):
            validate_path_component(meta[1:], 1, MAX_JOURNAL_NAME_LEN)


# Labels and selectors.


def validate_label(label: pb.Label) -> None:
    """Require a 2..64 byte token name and a 0..1024 byte value over PATH_SYMBOLS."""
    with in_context("Name"):
        validate_token(label.name, TOKEN_SYMBOLS, MIN_LABEL_LEN, MAX_LABEL_LEN)
    with in_context("Value"):
        validate_token(label.value, PATH_SYMBOLS, 0, MAX_LABEL_VALUE_LEN)


def validate_label_set(ls: pb.LabelSet, allow_prefix: bool = False) -> None:
    """Require valid labels in unique (name, value) order, never mixing empty and non-empty values.

    `prefix` labels are allowed only when `allow_prefix` (within a LabelSelector).
    """
    items = ls.labels
    for i, label in enumerate(items):
        with in_context(f"Labels[{i}]"):
            validate_label(label)
            if label.prefix and not allow_prefix:
                raise ValidationError("Prefix may not be set outside of a LabelSelector")
        if i == 0:
            continue
        prev = items[i - 1]
        if prev.name < label.name:
            continue
        if prev.name > label.name:
            raise ValidationError(
                f"Labels not in unique, sorted order (index {i}; label name {label.name} <= {prev.name})"
            )
        if prev.value >= label.value:
            raise ValidationError(
                "Labels not in unique, sorted order "
                f"(index {i}; label {label.name} value {label.value} <= {prev.value})"
            )
        if prev.value == "":
            raise ValidationError(
                f"Label has empty & non-empty values (index {i}; label {label.name} value {label.value})"
            )


def validate_single_value_labels(ls: pb.LabelSet) -> None:
    """Require that labels of SINGLE_VALUE_LABELS have at most one value."""
    items = ls.labels
    for i in range(1, len(items)):
        label = items[i]
        if items[i - 1].name == label.name and label.name in lbl.SINGLE_VALUE_LABELS:
            raise ValidationError(
                "expected single-value Label has multiple values "
                f"(index {i}; label {label.name} value {label.value})"
            )


def validate_label_selector(sel: pb.LabelSelector) -> None:
    """Require valid include and exclude sets, where `prefix` labels are allowed."""
    with in_context("Include"):
        validate_label_set(sel.include, allow_prefix=True)
    with in_context("Exclude"):
        validate_label_set(sel.exclude, allow_prefix=True)


# Journal specs.


def validate_journal_spec(spec: pb.JournalSpec) -> None:
    """Require a well-formed JournalSpec, as Gazette's JournalSpec.Validate."""
    with in_context("Name"):
        validate_journal(spec.name)
    _, meta = split_meta(spec.name)
    if meta:
        raise ValidationError(f"Name cannot have a metadata path segment ({meta}; expected no segment)")
    if not 1 <= spec.replication <= MAX_JOURNAL_REPLICATION:
        raise ValidationError(
            f"invalid Replication ({spec.replication}; "
            f"expected 1 <= Replication <= {MAX_JOURNAL_REPLICATION})"
        )
    with in_context("Labels"):
        validate_label_set(spec.labels)
    for reserved in (lbl.META_NAME, lbl.META_PREFIX):
        if lbl.values_of(spec.labels, reserved):
            raise ValidationError(f'Labels cannot include label "{reserved}"')
    with in_context("Labels"):
        _validate_journal_label_constraints(spec.labels)
    with in_context("Fragment"):
        validate_journal_spec_fragment(spec.fragment)
    with in_context("Flags"):
        validate_journal_flags(spec.flags)
    if spec.max_append_rate < 0:
        raise ValidationError(f"invalid MaxAppendRate ({spec.max_append_rate}; expected >= 0)")
    if spec.HasField("suspend"):
        with in_context("Suspend"):
            _validate_journal_suspend(spec.suspend)


# Enum values as sets: `values()` builds a list on every call, and specs are validated by the thousand.
_CODECS = frozenset(pb.CompressionCodec.values())
_FLAGS = frozenset(pb.JournalSpec.Flag.values())
_SUSPEND_LEVELS = frozenset(pb.JournalSpec.Suspend.Level.values())


def validate_journal_spec_fragment(frag: pb.JournalSpec.Fragment) -> None:
    """Require a well-formed JournalSpec.Fragment: length, codec, stores and intervals."""
    if not MIN_FRAGMENT_LEN <= frag.length <= MAX_FRAGMENT_LEN:
        raise ValidationError(
            f"invalid Length ({frag.length}; expected {MIN_FRAGMENT_LEN} <= length <= {MAX_FRAGMENT_LEN})"
        )
    with in_context("CompressionCodec"):
        validate_compression_codec(frag.compression_codec)
    for i, store in enumerate(frag.stores):
        with in_context(f"Stores[{i}]"):
            scheme = _valid_store_scheme(store)
        # Offloaded decompression relies on a store serving Content-Encoding; files can't.
        if i == 0 and scheme == "file" and frag.compression_codec == pb.GZIP_OFFLOAD_DECOMPRESSION:
            raise ValidationError(f"GZIP_OFFLOAD_DECOMPRESSION is incompatible with file:// stores ({store})")

    refresh = duration_ns(frag.refresh_interval)
    if not MIN_REFRESH_INTERVAL_NS <= refresh <= MAX_REFRESH_INTERVAL_NS:
        raise ValidationError(
            f"invalid RefreshInterval ({go_duration(refresh)}; expected "
            f"{go_duration(MIN_REFRESH_INTERVAL_NS)} <= interval <= {go_duration(MAX_REFRESH_INTERVAL_NS)})"
        )
    flush = duration_ns(frag.flush_interval)
    if flush != 0 and flush < MIN_FLUSH_INTERVAL_NS:
        raise ValidationError(
            f"invalid FlushInterval ({go_duration(flush)}; expected >= {go_duration(MIN_FLUSH_INTERVAL_NS)})"
        )
    with in_context("PathPostfixTemplate"):
        _check_template_delimiters(frag.path_postfix_template)
    # Retention requires no validation: every value is allowed.


def validate_compression_codec(codec: int) -> None:
    """Require a defined CompressionCodec other than INVALID."""
    if codec not in _CODECS or codec == pb.INVALID:
        # Go prints an undefined enum value as its number.
        name = "INVALID" if codec == pb.INVALID else str(codec)
        raise ValidationError(f"invalid value ({name})")


def validate_journal_flags(flags: int) -> None:
    """Require exactly one JournalSpec.Flag value (they are bits, but combinations are invalid)."""
    if flags not in _FLAGS:
        raise ValidationError(f"invalid combination ({flags})")


def _validate_journal_suspend(suspend: pb.JournalSpec.Suspend) -> None:
    if suspend.level not in _SUSPEND_LEVELS:
        raise ValidationError(f"invalid Level ({suspend.level})")
    if suspend.offset < 0:
        raise ValidationError(f"invalid Offset ({suspend.offset}; expected >= 0)")


def _validate_journal_label_constraints(ls: pb.LabelSet) -> None:
    """Single-value labels; content-type parses as a media type; message types need their parents."""
    validate_single_value_labels(ls)
    content_type = lbl.values_of(ls, lbl.CONTENT_TYPE)
    if content_type:
        error = _media_type_error(content_type[0])
        if error:
            raise ValidationError(f"parsing {lbl.CONTENT_TYPE}: {error}")
    if lbl.values_of(ls, lbl.MESSAGE_TYPE):
        if not content_type:
            raise ValidationError(f"expected {lbl.CONTENT_TYPE} label alongside {lbl.MESSAGE_TYPE}")
    elif lbl.values_of(ls, lbl.MESSAGE_SUB_TYPE):
        raise ValidationError(f"expected {lbl.MESSAGE_TYPE} label alongside {lbl.MESSAGE_SUB_TYPE}")


_TSPECIALS = frozenset('()<>@,;:\\"/[]?=')


def _media_type_error(value: str) -> str | None:
    """Return Go `mime.ParseMediaType`'s error for the media type of `value`, or None.

    Only the type/subtype is checked: label values cannot hold `;`, spaces or quotes, so a
    valid label never carries media-type parameters.
    """
    base = value.partition(";")[0].lower().strip()
    typ, rest = _consume_mime_token(base)
    if not typ:
        return "mime: no media type"
    if not rest:
        return None
    if not rest.startswith("/"):
        return "mime: expected slash after first token"
    subtype, rest = _consume_mime_token(rest[1:])
    if not subtype:
        return "mime: expected token after slash"
    if rest:
        return "mime: unexpected content after media subtype"
    return None


def _consume_mime_token(s: str) -> tuple[str, str]:
    for i, ch in enumerate(s):
        if not (0x20 < ord(ch) < 0x7F) or ch in _TSPECIALS:
            return s[:i], s[i:]
    return s, ""


def _check_template_delimiters(template: str) -> None:
    """Require every `{{` action of a Go text/template to be closed.

    A full Go template parse is out of scope here; an unclosed action is the error users hit.
    """
    pos = 0
    while (start := template.find("{{", pos)) != -1:
        end = _action_end(template, start + 2)
        if end == -1:
            # Go reports the error where lexing stopped: the end of the text.
            line = template.count("\n") + 1
            raise ValidationError(f"template: postfix:{line}: unclosed action")
        pos = end + 2


def _action_end(template: str, pos: int) -> int:
    """Index of the `}}` closing the action at `pos`, skipping quoted strings; -1 if none."""
    i = pos
    while i < len(template):
        ch = template[i]
        if template.startswith("}}", i):
            return i
        if ch in "\"'`":
            close = template.find(ch, i + 1)
            while ch != "`" and close != -1 and template[close - 1] == "\\":
                close = template.find(ch, close + 1)
            if close == -1:
                return -1
            i = close + 1
            continue
        i += 1
    return -1


def validate_fragment_store(url: str) -> None:
    """Require a fragment store URL: absolute, a known scheme, and a path ending in `/`."""
    _valid_store_scheme(url)


@functools.lru_cache(maxsize=4096)
def _valid_store_scheme(url: str) -> str:
    """The scheme of a valid fragment store URL (remembered: the specs of a tree share a few stores)."""
    parsed = _parse_url(url)
    if not parsed.is_abs():
        raise ValidationError(f"not absolute ({url})")
    scheme = parsed.scheme
    if scheme in ("s3", "gs", "azure"):
        if not parsed.host:
            raise ValidationError(f"missing bucket ({url})")
    elif scheme == "azure-ad":
        parts = parsed.path[1:].split("/")
        if not parsed.host:
            raise ValidationError(f"missing tenant ID ({url})")
        if parts[0] == "":
            raise ValidationError(f"missing storage account ({url})")
        if len(parts) < 2 or parts[1] == "":
            raise ValidationError(f"missing storage container ({url})")
    elif scheme == "file":
        if parsed.host:
            raise ValidationError(f"file scheme cannot have host ({url})")
    else:
        raise ValidationError(f"invalid scheme ({scheme})")
    if not parsed.path.endswith("/"):
        raise ValidationError(f"path component doesn't end in '/' ({parsed.path})")
    return scheme


# Brokers, routes and headers.


def validate_process_id(process_id: pb.ProcessSpec.ID) -> None:
    """Require a 1..32 byte zone token and a 4..128 byte suffix token."""
    with in_context("Zone"):
        validate_token(process_id.zone, TOKEN_SYMBOLS, MIN_ZONE_LEN, MAX_ZONE_LEN)
    with in_context("Suffix"):
        validate_token(process_id.suffix, TOKEN_SYMBOLS, MIN_SUFFIX_LEN, MAX_SUFFIX_LEN)


def validate_process_spec(spec: pb.ProcessSpec) -> None:
    """Require a valid ID and endpoint."""
    with in_context("Id"):
        validate_process_id(spec.id)
    with in_context("Endpoint"):
        validate_endpoint(spec.endpoint)


def validate_broker_spec(spec: pb.BrokerSpec) -> None:
    """Require a valid process spec (no added context, as Go embeds it) and journal limit."""
    validate_process_spec(spec.process_spec)
    if spec.journal_limit > MAX_BROKER_JOURNAL_LIMIT:
        raise ValidationError(
            f"invalid JournalLimit ({spec.journal_limit}; "
            f"expected 0 <= JournalLimit <= {MAX_BROKER_JOURNAL_LIMIT})"
        )


def validate_endpoint(url: str) -> None:
    """Require an absolute URL with a host, such as `http://host:port/path`."""
    parsed = _parse_url(url)
    if not parsed.is_abs():
        raise ValidationError(f"not absolute: {url}")
    if not parsed.host:
        raise ValidationError(f"missing host: {url}")


def validate_route(route: pb.Route) -> None:
    """Require valid members in strictly ascending (zone, suffix) order, a primary index, endpoints."""
    members = route.members
    for i, member in enumerate(members):
        with in_context(f"Members[{i}]"):
            validate_process_id(member)
        if i != 0 and (members[i - 1].zone, members[i - 1].suffix) >= (member.zone, member.suffix):
            raise ValidationError(
                "Members not in unique, sorted order "
                f"(index {i}; {_id_str(members[i - 1])} <= {_id_str(member)})"
            )
    if not -1 <= route.primary < len(members):
        raise ValidationError(f"invalid Primary ({route.primary}; expected -1 <= Primary < {len(members)})")
    if route.endpoints and len(route.endpoints) != len(members):
        raise ValidationError(
            f"len(Endpoints) != 0, and != len(Members) ({len(route.endpoints)} vs {len(members)})"
        )
    for i, endpoint in enumerate(route.endpoints):
        if endpoint:
            with in_context(f"Endpoints[{i}]"):
                validate_endpoint(endpoint)


def validate_header(header: pb.Header) -> None:
    """Require a valid process ID (if set), route and etcd header."""
    if header.process_id.zone or header.process_id.suffix:
        with in_context("ProcessId"):
            validate_process_id(header.process_id)
    with in_context("Route"):
        validate_route(header.route)
    with in_context("Etcd"):
        etcd = header.etcd
        if etcd.cluster_id == 0:
            raise ValidationError("invalid ClusterId (expected != 0)")
        if etcd.member_id == 0:
            raise ValidationError("invalid MemberId (expected != 0)")
        if etcd.revision <= 0:
            raise ValidationError(f"invalid Revision ({etcd.revision}; expected 0 < revision)")
        if etcd.raft_term == 0:
            raise ValidationError("invalid RaftTerm (expected != 0)")


def validate_fragment(frag: pb.Fragment) -> None:
    """Require a valid journal (meta allowed), begin <= end, a valid codec and path postfix."""
    with in_context("Journal"):
        validate_journal(frag.journal)
    if frag.begin > frag.end:
        raise ValidationError(f"expected Begin <= End (have {frag.begin}, {frag.end})")
    with in_context("CompressionCodec"):
        validate_compression_codec(frag.compression_codec)
    with in_context("PathPostfix"):
        validate_path_component(frag.path_postfix, 0, MAX_JOURNAL_NAME_LEN)


_STATUSES = frozenset(pb.Status.values())


def validate_status(status: int) -> None:
    """Require a defined Status value."""
    if status not in _STATUSES:
        raise ValidationError(f"invalid status ({status})")


# RPC requests.


def validate_read_request(req: pb.ReadRequest) -> None:
    """Require a valid journal, -1 <= offset, and end_offset 0 or >= offset."""
    if req.HasField("header"):
        with in_context("Header"):
            validate_header(req.header)
    with in_context("Journal"):
        validate_journal(req.journal)
    if req.offset < -1:
        raise ValidationError(f"invalid Offset ({req.offset}; expected -1 <= Offset <= MaxInt64)")
    if req.end_offset < 0 or (req.end_offset != 0 and req.end_offset < req.offset):
        raise ValidationError(f"invalid EndOffset ({req.end_offset}; expected 0 or Offset <= EndOffset)")


_APPEND_SUSPENDS = frozenset(pb.AppendRequest.Suspend.values())


def validate_append_request(req: pb.AppendRequest) -> None:
    """Validate a first Append message (journal set) or a content / commit message (journal empty)."""
    if req.journal:
        if req.HasField("header"):
            with in_context("Header"):
                validate_header(req.header)
        with in_context("Journal"):
            validate_journal(req.journal)
        if req.offset < 0:
            raise ValidationError(f"invalid Offset ({req.offset}; expected >= 0)")
        if req.content:
            raise ValidationError("unexpected Content")
        if req.HasField("check_registers"):
            with in_context("CheckRegisters"):
                validate_label_selector(req.check_registers)
        if req.HasField("union_registers"):
            with in_context("UnionRegisters"):
                validate_label_set(req.union_registers)
        if req.HasField("subtract_registers"):
            with in_context("SubtractRegisters"):
                validate_label_set(req.subtract_registers)
        if req.suspend not in _APPEND_SUSPENDS:
            raise ValidationError(f"invalid Suspend ({req.suspend})")
        return

    if req.HasField("header"):
        raise ValidationError("unexpected Header")
    if req.do_not_proxy:
        raise ValidationError("unexpected DoNotProxy")
    if req.offset != 0:
        raise ValidationError("unexpected Offset")
    if req.HasField("check_registers"):
        raise ValidationError("unexpected CheckRegisters")
    if req.HasField("union_registers"):
        raise ValidationError("unexpected UnionRegisters")
    if req.HasField("subtract_registers"):
        raise ValidationError("unexpected SubtractRegisters")
    if req.suspend != pb.AppendRequest.SUSPEND_RESUME:
        raise ValidationError("unexpected Suspend")


def validate_replicate_request(req: pb.ReplicateRequest) -> None:
    """Validate a proposal message (proposal set) or a content message."""
    if req.HasField("proposal"):
        # The header rides on the first message of the stream, which must be a proposal.
        if req.HasField("header"):
            with in_context("Header"):
                validate_header(req.header)
            if not req.acknowledge:
                raise ValidationError("expected Acknowledge with Header")
        with in_context("Proposal"):
            validate_fragment(req.proposal)
        # Absent registers are an empty set: Gazette's v0.82 => v0.83 migration stub.
        with in_context("Registers"):
            validate_label_set(req.registers)
        if req.content:
            raise ValidationError(f"unexpected Content with Proposal (len {len(req.content)})")
        if req.content_delta != 0:
            raise ValidationError(f"unexpected ContentDelta with Proposal ({req.content_delta})")
        if req.deprecated_journal and req.deprecated_journal != req.proposal.journal:
            raise ValidationError(
                "DeprecatedJournal and Proposal.Journal mismatch "
                f"({req.deprecated_journal} vs {req.proposal.journal})"
            )
        return

    # Go tells a content message by non-nil Content; Go never sends empty content on the wire.
    if not req.content:
        raise ValidationError("expected Content or Proposal")
    if req.content_delta < 0:
        raise ValidationError(f"invalid ContentDelta ({req.content_delta}; expected >= 0)")
    if req.HasField("header"):
        raise ValidationError(f"unexpected Header with Content ({message_str(req.header)})")
    if req.HasField("registers"):
        raise ValidationError(f"unexpected Registers with Content ({message_str(req.registers)})")
    if req.acknowledge:
        raise ValidationError("unexpected Acknowledge with Content")
    if req.deprecated_journal:
        raise ValidationError("unexpected DeprecatedJournal with Content")


def validate_list_request(req: pb.ListRequest) -> None:
    """Require a valid selector whose `prefix` meta-label values end in `/`."""
    with in_context("Selector"):
        validate_label_selector(req.selector)
    for name, ls in (("Include", req.selector.include), ("Exclude", req.selector.exclude)):
        for value in lbl.values_of(ls, lbl.META_PREFIX):
            if not value.endswith("/"):
                raise ValidationError(f"Selector.{name}.Labels[\"prefix\"]: expected trailing '/' ({value})")


def validate_apply_request(req: pb.ApplyRequest) -> None:
    """Require every change to be a valid upsert or delete."""
    for i, change in enumerate(req.changes):
        with in_context(f"Changes[{i}]"):
            _validate_apply_change(change)


def _validate_apply_change(change: pb.ApplyRequest.Change) -> None:
    if change.HasField("upsert"):
        if change.delete:
            raise ValidationError("both Upsert and Delete are set (expected exactly one)")
        with in_context("Upsert"):
            validate_journal_spec(change.upsert)
        if change.expect_mod_revision < 0 and change.expect_mod_revision != -1:
            raise ValidationError(
                f"invalid ExpectModRevision ({change.expect_mod_revision}; expected >= 0 or -1)"
            )
    elif change.delete:
        with in_context("Delete"):
            validate_journal(change.delete)
        if change.expect_mod_revision <= 0 and change.expect_mod_revision != -1:
            raise ValidationError(
                f"invalid ExpectModRevision ({change.expect_mod_revision}; expected > 0 or -1)"
            )
    else:
        raise ValidationError("neither Upsert nor Delete are set (expected exactly one)")


def validate_fragments_request(req: pb.FragmentsRequest) -> None:
    """Require a valid journal, mod-time range, page token and limit, and signature TTL."""
    if req.HasField("header"):
        with in_context("Header"):
            validate_header(req.header)
    with in_context("Journal"):
        validate_journal(req.journal)
    if req.end_mod_time != 0 and req.end_mod_time < req.begin_mod_time:
        raise ValidationError(f"invalid EndModTime ({req.end_mod_time} must be after {req.begin_mod_time})")
    if req.next_page_token < 0:
        raise ValidationError(f"invalid NextPageToken ({req.next_page_token}; must be >= 0)")
    if not 0 <= req.page_limit <= MAX_FRAGMENTS_PAGE_LIMIT:
        raise ValidationError(
            f"invalid PageLimit ({req.page_limit}; must be >= 0 and <= {MAX_FRAGMENTS_PAGE_LIMIT})"
        )
    if req.HasField("signatureTTL"):
        ttl = duration_ns(req.signatureTTL)
        if ttl <= 0:
            raise ValidationError(f"invalid SignatureTTL ({go_duration(ttl)}; must be > 0s)")
        if ttl > MAX_DURATION_NS:
            raise ValidationError(
                f"invalid SignatureTTL ({req.signatureTTL.seconds}s; must be <= {go_duration(MAX_DURATION_NS)})"
            )


def validate_fragment_store_health_request(req: pb.FragmentStoreHealthRequest) -> None:
    """Require a valid store, and a clean relative `check_delete_prefix` only with `check_delete`."""
    with in_context("FragmentStore"):
        validate_fragment_store(req.fragment_store)
    prefix = req.check_delete_prefix
    if not prefix:
        return
    if not req.check_delete:
        raise ValidationError("expected CheckDelete with CheckDeletePrefix")
    with in_context("CheckDeletePrefix"):
        if not prefix.endswith("/"):
            raise ValidationError(f"expected trailing '/' ({prefix})")
        trimmed = prefix[:-1]
        # A probe object must stay beneath the store root.
        if trimmed == ".." or trimmed.startswith("../"):
            raise ValidationError(f"cannot begin with '..' ({prefix})")
        validate_path_component(trimmed, 1, MAX_JOURNAL_NAME_LEN)


# RPC responses.


def validate_read_response(resp: pb.ReadResponse) -> None:
    """Validate a content chunk (content set) or a metadata response."""
    with in_context("Status"):
        validate_status(resp.status)

    if resp.content:
        if resp.status != pb.OK:
            raise ValidationError(f"unexpected Status with Content ({pb.Status.Name(resp.status)})")
        if resp.HasField("header"):
            raise ValidationError(f"unexpected Header with Content ({message_str(resp.header)})")
        if resp.write_head != 0:
            raise ValidationError(f"unexpected WriteHead with Content ({resp.write_head})")
        if resp.HasField("fragment"):
            raise ValidationError(f"unexpected Fragment with Content ({message_str(resp.fragment)})")
        if resp.fragment_url:
            raise ValidationError(f"unexpected FragmentUrl with Content ({resp.fragment_url})")
        return

    if resp.HasField("header"):
        with in_context("Header"):
            validate_header(resp.header)
    if resp.write_head < 0:
        raise ValidationError(f"invalid WriteHead ({resp.write_head}; expected >= 0)")

    if resp.HasField("fragment"):
        frag = resp.fragment
        with in_context("Fragment"):
            validate_fragment(frag)
        if not frag.begin <= resp.offset < frag.end:
            raise ValidationError(
                f"invalid Offset ({resp.offset}; expected {frag.begin} <= offset < {frag.end})"
            )
        if resp.write_head < frag.end:
            raise ValidationError(f"invalid WriteHead ({resp.write_head}; expected >= {frag.end})")
        if resp.fragment_url:
            with in_context("FragmentUrl"):
                _parse_url(resp.fragment_url)
    elif resp.status == pb.OK and resp.offset != 0:
        raise ValidationError(f"unexpected Offset without Fragment or Content ({resp.offset})")
    elif resp.fragment_url:
        raise ValidationError(f"unexpected FragmentUrl without Fragment ({resp.fragment_url})")


def validate_append_response(resp: pb.AppendResponse) -> None:
    """Require a valid header; OK needs a commit, and OK and REGISTER_MISMATCH need registers."""
    with in_context("Status"):
        validate_status(resp.status)
    with in_context("Header"):
        validate_header(resp.header)
    if resp.status == pb.OK and not resp.HasField("commit"):
        raise ValidationError("expected Commit")
    if resp.status in (pb.OK, pb.REGISTER_MISMATCH) and not resp.HasField("registers"):
        raise ValidationError("expected Registers")
    if resp.HasField("commit"):
        with in_context("Commit"):
            validate_fragment(resp.commit)
    if resp.HasField("registers"):
        with in_context("Registers"):
            validate_label_set(resp.registers)


def validate_replicate_response(resp: pb.ReplicateResponse) -> None:
    """Require a header exactly on WRONG_ROUTE, and fragment and registers exactly on PROPOSAL_MISMATCH."""
    with in_context("Status"):
        validate_status(resp.status)

    if resp.status == pb.WRONG_ROUTE:
        if not resp.HasField("header"):
            raise ValidationError("expected Header")
        with in_context("Header"):
            validate_header(resp.header)
    elif resp.HasField("header"):
        raise ValidationError(f"unexpected Header ({message_str(resp.header)})")

    if resp.status == pb.PROPOSAL_MISMATCH:
        if not resp.HasField("fragment"):
            raise ValidationError("expected Fragment")
        with in_context("Fragment"):
            validate_fragment(resp.fragment)
        if not resp.HasField("registers"):
            raise ValidationError("expected Registers")
        with in_context("Registers"):
            validate_label_set(resp.registers)
    elif resp.HasField("fragment"):
        raise ValidationError(f"unexpected Fragment ({message_str(resp.fragment)})")
    elif resp.HasField("registers"):
        raise ValidationError(f"unexpected Registers ({message_str(resp.registers)})")


def validate_list_response(resp: pb.ListResponse) -> None:
    """Require a valid status, header, and journals with positive mod revisions."""
    with in_context("Status"):
        validate_status(resp.status)
    with in_context("Header"):
        validate_header(resp.header)
    for i, journal in enumerate(resp.journals):
        with in_context(f"Journals[{i}]"):
            with in_context("Spec"):
                validate_journal_spec(journal.spec)
            if journal.mod_revision <= 0:
                raise ValidationError(f"invalid ModRevision ({journal.mod_revision}; expected > 0)")
            with in_context("Route"):
                validate_route(journal.route)


def validate_apply_response(resp: pb.ApplyResponse) -> None:
    """Require a valid status and header."""
    with in_context("Status"):
        validate_status(resp.status)
    with in_context("Header"):
        validate_header(resp.header)


def validate_fragments_response(resp: pb.FragmentsResponse) -> None:
    """Require a valid status, header, and fragments with parseable signed URLs."""
    with in_context("Status"):
        validate_status(resp.status)
    with in_context("Header"):
        validate_header(resp.header)
    for i, frag in enumerate(resp.fragments):
        with in_context(f"Fragments[{i}]"):
            with in_context("Spec"):
                validate_fragment(frag.spec)
            with in_context("SignedUrl"):
                _parse_url(frag.signed_url)


# Formatting helpers shared by the messages above.


def duration_ns(duration: Duration) -> int:
    """Return a protobuf Duration in nanoseconds."""
    return duration.seconds * 10**9 + duration.nanos


def go_duration(ns: int) -> str:
    """Format nanoseconds as Go's `time.Duration.String()` does, e.g. `1m0s`, `1.5ms`, `0s`."""
    sign = "-" if ns < 0 else ""
    u = abs(ns)
    if u == 0:
        return "0s"
    if u < 10**9:
        if u < 10**3:
            return f"{sign}{u}ns"
        if u < 10**6:
            return f"{sign}{_frac(u, 3)}µs"
        return f"{sign}{_frac(u, 6)}ms"
    seconds = _frac(u % (60 * 10**9), 9) + "s"
    minutes = u // (60 * 10**9)
    if minutes == 0:
        return sign + seconds
    hours = minutes // 60
    if hours == 0:
        return f"{sign}{minutes}m{seconds}"
    return f"{sign}{hours}h{minutes % 60}m{seconds}"


def _frac(value: int, precision: int) -> str:
    """`value / 10**precision` with trailing fractional zeros (and a bare `.`) dropped."""
    whole, frac = divmod(value, 10**precision)
    digits = f"{frac:0{precision}d}".rstrip("0") if precision else ""
    return f"{whole}.{digits}" if digits else str(whole)


def message_str(msg: Message) -> str:
    """One-line text form of a message for error texts (Go prints its own compact text form)."""
    return text_format.MessageToString(msg, as_one_line=True)


def _id_str(process_id: pb.ProcessSpec.ID) -> str:
    # Go prints the ID struct with %+v.
    return f"{{Zone:{process_id.zone} Suffix:{process_id.suffix}}}"


def _parse_url(url: str) -> GoURL:
    try:
        return parse_url(url)
    except URLError as err:
        raise ValidationError(str(err)) from None


def _byte_len(s: str) -> int:
    # Go's len() counts UTF-8 bytes; surrogatepass keeps stray surrogates countable.
    return len(s.encode("utf-8", "surrogatepass"))
