"""Driver-side planning: the journals a selector matches, their fragments, and one partition per fragment.

Fragments hold whole appends, so a partition that starts and ends at fragment boundaries (or at a
write head, or at an offset the user gave) never splits a message. Overlapping fragments (the
index keeps overlapping chains) are clipped so that every byte belongs to exactly one partition.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pyspark.sql.datasource import InputPartition

from broker.client import (
    JournalClient,
    OffsetJump,
    OffsetNotYetAvailable,
    Reader,
    TransportError,
    iter_fragments,
    list_journals,
)
from broker.client.listing import fragments_request
from broker.protocol import labels as lbl
from broker.protocol import pb
from broker.protocol.selectors import parse_selector
from pipelines import auth
from pipelines.errors import SparkPipelineError
from pipelines.source.options import EARLIEST, LATEST, Offsets, SourceOptions

log = logging.getLogger(__name__)

T = TypeVar("T")

_FRAMING_BY_CONTENT_TYPE = {
    lbl.CONTENT_TYPE_JSON_LINES: "json",
    lbl.CONTENT_TYPE_CSV: "csv",
    lbl.CONTENT_TYPE_PROTO_FIXED: "fixed",
}


class DataLossError(SparkPipelineError, RuntimeError):
    """A requested range of a journal is no longer in its fragments (and `failOnDataLoss` is true)."""


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on a private event loop (planning runs in Spark's synchronous Python workers)."""
    return asyncio.run(coro)


@asynccontextmanager
async def broker_client(opts: SourceOptions) -> AsyncIterator[JournalClient]:
    """A client of `opts.broker` presenting option `authToken` (else the environment's credentials).

    A call the broker refuses for its authorization raises `PipelineAuthError`: one line naming
    the selector, the broker's reason and where the token came from (never the token).
    """
    async with JournalClient(opts.broker, credentials=opts.credentials()) as client:
        try:
            yield client
        except TransportError as err:
            if auth.is_auth_error(err):
                raise auth.auth_error(err, opts.auth_token, f"reading journals of selector {opts.selector!r}") from None
            raise


@dataclass(frozen=True)
class JournalInfo:
    """What rows need of a journal: its name, labels (name -> values) and framing."""

    name: str
    labels: dict[str, list[str]]
    framing: str


@dataclass
class GazettePartition(InputPartition):
    """Bytes [begin, end) of one journal, within one fragment (or the tail read through the broker).

    `url` is the fragment's signed URL when it is persisted (file:// or presigned http(s)), else "".
    `read_limit` bounds reading past `end` to settle open transactions (0: the write head at read time).
    """

    journal: JournalInfo
    begin: int
    end: int
    fragment_begin: int = 0
    fragment_end: int = 0
    codec: int = pb.NONE
    url: str = ""
    mod_time: int = 0
    read_limit: int = 0
    direct: bool = field(default=False)

    def __post_init__(self) -> None:
        InputPartition.__init__(self, None)  # Spark's base keeps a `value`; ours is the fields.


def framing_of(spec: pb.JournalSpec, opts: SourceOptions) -> str:
    """The framing to read `spec` with: the `framing` option, else its content-type (default lines)."""
    if opts.framing is not None:
        return opts.framing
    content_type = lbl.value_of(spec.labels, lbl.CONTENT_TYPE) or ""
    return _FRAMING_BY_CONTENT_TYPE.get(content_type, "lines")


def journal_info(spec: pb.JournalSpec, opts: SourceOptions) -> JournalInfo:
    labels: dict[str, list[str]] = {}
    for label in spec.labels.labels:
        labels.setdefault(label.name, []).append(label.value)
    return JournalInfo(spec.name, labels, framing_of(spec, opts))


async def matching_journals(client: JournalClient, opts: SourceOptions) -> list[pb.JournalSpec]:
    """Specs of the journals `opts.selector` matches, in name order."""
    resp = await list_journals(client, parse_selector(opts.selector))
    return sorted((j.spec for j in resp.journals), key=lambda s: s.name)


async def fragments_of(
    client: JournalClient, journal: str, opts: SourceOptions
) -> list[pb.FragmentsResponse._Fragment]:
    """Every fragment of `journal` (persisted and local), with signed URLs of persisted ones."""
    req = fragments_request(journal, signature_ttl=opts.signature_ttl)
    return [f async for f in iter_fragments(client, req)]


async def write_head(client: JournalClient, journal: str) -> int:
    """The journal's write head, from a non-blocking metadata-only read at offset -1."""
    reader = Reader(client, journal, offset=-1, block=False, metadata_only=True)
    try:
        try:
            while await reader.read():
                pass
        except (OffsetJump, OffsetNotYetAvailable):
            pass  # Both replies carry the write head.
        return reader.write_head
    finally:
        await reader.close()


def head_of(fragments: Sequence[pb.FragmentsResponse._Fragment]) -> int:
    return max((f.spec.end for f in fragments), default=0)


def resolve_offset(
    journal: str, spec: Offsets, fragments: Sequence[pb.FragmentsResponse._Fragment], *, default: int, head: int
) -> int:
    """A concrete offset from `earliest` / `latest` / a per-journal offset (-1, -2, or absent: `default`)."""
    if isinstance(spec, str):
        value = EARLIEST if spec == "earliest" else LATEST
    else:
        value = spec.get(journal, default)
    if value == LATEST:
        return head
    if value == EARLIEST:
        return min((f.spec.begin for f in fragments), default=0)
    return min(value, head)


def plan_range(
    info: JournalInfo,
    fragments: Sequence[pb.FragmentsResponse._Fragment],
    begin: int,
    end: int,
    opts: SourceOptions,
    *,
    read_limit: int = 0,
    from_beginning: bool = False,
) -> list[GazettePartition]:
    """One partition per fragment overlapping [begin, end), clipped; gaps are data loss.

    With `from_beginning`, content removed before the first fragment is not a loss (the read
    starts at "the beginning", wherever that now is); fragments older than `startingTimestamp`
    are skipped likewise.
    """
    parts: list[GazettePartition] = []
    cursor = begin
    skipped = False  # Whether fragments were just skipped for startingTimestamp.
    ts = opts.starting_timestamp_ms
    ordered = sorted(fragments, key=lambda f: (f.spec.begin, f.spec.end))
    for listed in ordered:
        frag = listed.spec
        if frag.end <= cursor:
            continue
        if frag.begin >= end or cursor >= end:
            break
        if ts is not None and frag.mod_time != 0 and frag.mod_time * 1000 < ts:
            skipped = True  # On purpose: older than startingTimestamp. Newer fragments may overlap it.
            continue
        if frag.begin > cursor:
            if not (skipped or (from_beginning and not parts)):
                lost(info.name, cursor, frag.begin, opts)
            cursor = frag.begin
        skipped = False
        stop = min(frag.end, end)
        url = listed.signed_url
        # file:// URLs are relative to the brokers' file root: readable here only with fileRoot.
        scheme = urlsplit(url).scheme.lower() if url else ""
        readable = scheme in ("http", "https") or (scheme == "file" and bool(opts.file_root))
        direct = bool(frag.backing_store) and readable
        parts.append(
            GazettePartition(
                info, cursor, stop, frag.begin, frag.end, frag.compression_codec, url if direct else "",
                frag.mod_time, read_limit, direct,
            )
        )
        cursor = stop
    cursor = max([cursor] + [f.spec.end for f in ordered])  # Past fragments skipped for startingTimestamp.
    if cursor < end:
        # Appended after the listing: read through the broker (bounded by `end`, which a head made).
        parts.append(GazettePartition(info, cursor, end, read_limit=read_limit))
    return parts


def lost(journal: str, begin: int, end: int, opts: SourceOptions) -> None:
    """Report bytes [begin, end) of `journal` as lost: raise, or log with failOnDataLoss=false."""
    message = f"journal {journal}: offsets [{begin}, {end}) are no longer in any fragment (removed by retention?)"
    if opts.fail_on_data_loss:
        raise DataLossError(message + "; set failOnDataLoss=false to skip them")
    log.warning("%s; skipping them (failOnDataLoss=false)", message)


async def plan_batch(opts: SourceOptions) -> list[GazettePartition]:
    """Partitions of a batch read: every matching journal from startingOffsets to endingOffsets."""
    async with broker_client(opts) as client:
        specs = await matching_journals(client, opts)
        listings = await asyncio.gather(*(fragments_of(client, s.name, opts) for s in specs))
    parts: list[GazettePartition] = []
    for spec, fragments in zip(specs, listings, strict=True):
        head = head_of(fragments)
        begin = resolve_offset(spec.name, opts.starting, fragments, default=EARLIEST, head=head)
        end = resolve_offset(spec.name, opts.ending, fragments, default=LATEST, head=head)
        earliest = isinstance(opts.starting, str) and opts.starting == "earliest"
        if isinstance(opts.starting, dict):
            earliest = opts.starting.get(spec.name, EARLIEST) == EARLIEST
        if end > begin:
            parts.extend(plan_range(journal_info(spec, opts), fragments, begin, end, opts, read_limit=head,
                                    from_beginning=earliest))
    return parts
