"""The engine of `gazctl journals append`: input framings, record-to-journal mappings, and appending.

Framings split the input into records, each appended whole (its delimiter kept):

- `none`: the whole input is one record, streamed into one atomic append.
- `lines`: a record runs through its `\\n`.
- `fixed`: a record is Gazette's fixed frame: `66 33 93 36`, a little-endian uint32 payload length,
  then the payload.

With `modulo` or `rendezvous` mapping each record is preceded by a partition key, and with
`direct` by a journal name, written in the same framing (a line without its line ending, or a
fixed frame's payload). Splitting is pure logic (`RecordParser`); `append_input` drives it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum

from broker.client import Appender, AppendService, ClientError, JournalClient, append, list_journals
from broker.protocol import pb
from consumer.message.framing import FIXED_FRAME_HEADER_LENGTH, FIXED_FRAME_WORD
from consumer.message.mapping import modulo_mapping, random_mapping, rendezvous_mapping
from gazctl.errors import GazctlError

log = logging.getLogger("gazctl")

READ_SIZE = 1 << 20
"""Bytes asked of the input per read; a read returns what is available, so a slow pipe is not waited on."""


class Framing(StrEnum):
    """Values of `--framing`."""

    none = "none"
    lines = "lines"
    fixed = "fixed"


class Mapping(StrEnum):
    """Values of `--mapping`."""

    random = "random"
    modulo = "modulo"
    rendezvous = "rendezvous"
    direct = "direct"


class RecordError(GazctlError):
    """Input which does not frame into whole records; the message names the input, record and offset."""


def check_options(framing: Framing, mapping: Mapping, base64_keys: bool) -> None:
    """Raise GazctlError for a combination of `--framing`, `--mapping` and `--base64` which cannot work."""
    if framing is Framing.none and mapping is not Mapping.random:
        raise GazctlError(f"--framing none appends the input as one record: it needs --mapping random (not {mapping})")
    if base64_keys and (framing is not Framing.lines or mapping is Mapping.random):
        raise GazctlError("--base64 needs --framing lines and a --mapping other than random (which reads no keys)")


@dataclass(frozen=True)
class Record:
    """One record of the input, as it is to be appended."""

    data: bytes
    """The record with its delimiter (line ending or fixed-frame header)."""
    number: int
    """1-based position of the record in the input."""
    offset: int
    """Input offset of the record's first byte."""
    key: bytes | None
    """The partition key (or journal name) read before the record; None when none is expected."""
    key_offset: int = 0
    """Input offset of the key's frame."""


class _Splitter:
    """Incremental splitting of fed bytes into frames; `next_frame` returns None until one is whole."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.offset = 0
        """Input offset of the first byte not yet returned in a frame."""

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next_frame(self) -> bytes | None:
        raise NotImplementedError

    @property
    def rest(self) -> bytes:
        """Bytes fed but not yet returned in a frame."""
        return bytes(self._buf)

    def _take(self, size: int) -> bytes:
        frame = bytes(self._buf[:size])
        del self._buf[:size]
        self.offset += size
        return frame


class _LineSplitter(_Splitter):
    def __init__(self) -> None:
        super().__init__()
        self._scanned = 0  # Bytes already known to hold no newline: a long line is scanned once.

    def next_frame(self) -> bytes | None:
        end = self._buf.find(b"\n", self._scanned)
        if end < 0:
            self._scanned = len(self._buf)
            return None
        self._scanned = 0
        return self._take(end + 1)


class _FixedSplitter(_Splitter):
    def next_frame(self) -> bytes | None:
        if self._buf == b"\n":
            return None  # Perhaps the clean end Gazette allows (see RecordParser.finish): wait and see.
        word = bytes(self._buf[:4])
        if word != FIXED_FRAME_WORD[: len(word)]:
            # Checked on a partial word too: garbage fails at once, not after buffering a bogus length.
            raise _FrameError(f"bad fixed-frame magic word {word.hex(' ')} (expected {FIXED_FRAME_WORD.hex(' ')})")
        if len(self._buf) < FIXED_FRAME_HEADER_LENGTH:
            return None
        size = FIXED_FRAME_HEADER_LENGTH + int.from_bytes(self._buf[4:8], "little")
        if len(self._buf) < size:
            return None
        return self._take(size)


class _FrameError(Exception):
    """A framing failure, before the record number and offset are added."""


class RecordParser:
    """Splits fed input into Records: a key frame first (when `keyed`), then the record frame.

    Pure logic: `feed` bytes as they arrive and take the whole records, then call `finish` at the
    end of the input, which raises for a trailing partial frame or a key without its record.
    Errors are RecordErrors naming `source`, the record number and its input offset.
    """

    def __init__(self, framing: Framing, *, keyed: bool, base64_keys: bool = False, source: str = "input") -> None:
        if framing is Framing.none:
            raise ValueError("framing none has no records to parse")
        self.framing = framing
        self.keyed = keyed
        self.base64_keys = base64_keys
        self.source = source
        self.records = 0
        """Records returned so far."""
        self._splitter: _Splitter = _LineSplitter() if framing is Framing.lines else _FixedSplitter()
        self._key: bytes | None = None
        self._key_offset = 0

    def feed(self, data: bytes) -> Iterator[Record]:
        """Add input; yield the records now whole, in input order. Consume it fully before feeding more.

        An error is raised after yielding the records before it, so that they may still be appended.
        """
        self._splitter.feed(data)
        while True:
            offset = self._splitter.offset
            try:
                frame = self._splitter.next_frame()
            except _FrameError as err:
                raise self.error(str(err), offset) from None
            if frame is None:
                return
            if self.keyed and self._key is None:
                self._key, self._key_offset = self._decode_key(frame, offset), offset
                continue
            self.records += 1
            yield Record(frame, self.records, offset, self._key, self._key_offset)
            self._key = None

    def finish(self) -> None:
        """Check the input ended on a record boundary."""
        offset = self._splitter.offset
        rest = self._splitter.rest
        pending = len(rest)
        if self.framing is Framing.fixed and rest == b"\n":
            pending = 0  # Gazette reads a lone trailing newline after fixed frames as a clean end (a Hadoop legacy).
        if pending:
            what = "line has no trailing newline" if self.framing is Framing.lines else "fixed frame is truncated"
            kind = "key of record" if self.keyed and self._key is None else "record"
            raise self.error(f"input ends mid-frame: the {kind}'s {what} ({pending} bytes)", offset)
        if self._key is not None:
            raise self.error("input ends after a partition key, without its record", self._key_offset)

    def _decode_key(self, frame: bytes, offset: int) -> bytes:
        if self.framing is Framing.fixed:
            return frame[FIXED_FRAME_HEADER_LENGTH:]
        key = frame.rstrip(b"\r\n")
        if self.base64_keys:
            try:
                key = base64.b64decode(key, validate=True)
            except (binascii.Error, ValueError) as err:
                raise self.error(f"partition key {_show(key)} is not valid base64: {err}", offset) from None
        return key

    def error(self, reason: str, offset: int, number: int | None = None) -> RecordError:
        """A RecordError of record `number` (default: the next one) at input `offset`."""
        number = self.records + 1 if number is None else number
        return RecordError(f"{self.source}: record {number} at input offset {offset}: {reason}")


def _show(data: bytes, limit: int = 64) -> str:
    """`data` quoted for an error message, shortened."""
    text = repr(data[:limit].decode("utf-8", errors="backslashreplace"))
    return text + "..." if len(data) > limit else text


class _InputReader:
    """Reads a binary stream on a daemon thread, one read at a time.

    Not asyncio's default executor: a read blocked on a quiet pipe would keep the process from
    exiting (e.g. on Ctrl-C), and a daemon thread does not.
    """

    def __init__(self, stream: io.BufferedIOBase) -> None:
        self._stream = stream
        self._requests: list[asyncio.Future[bytes]] = []
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None

    async def read(self) -> bytes:
        """The next bytes available (b"" at the end of the input)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        with self._ready:
            self._requests.append(future)
            self._ready.notify()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, args=(loop,), name="gazctl-input", daemon=True)
            self._thread.start()
        return await future

    def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            with self._ready:
                while not self._requests:
                    self._ready.wait()
                future = self._requests.pop(0)
            try:
                data: bytes | BaseException = self._stream.read1(READ_SIZE)
            except Exception as exc:
                data = exc
            try:
                loop.call_soon_threadsafe(_resolve, future, data)
            except RuntimeError:
                return  # The loop closed: nobody waits any longer.
            if data == b"" or isinstance(data, BaseException):
                return


def _resolve(future: asyncio.Future[bytes], data: bytes | BaseException) -> None:
    if future.done():
        return
    if isinstance(data, BaseException):
        future.set_exception(data)
    else:
        future.set_result(data)


@dataclass
class Totals:
    """What was appended to one journal."""

    records: int = 0
    bytes: int = 0


async def append_input(
    client: JournalClient,
    selector: pb.LabelSelector,
    stream: io.BufferedIOBase,
    *,
    framing: Framing,
    mapping: Mapping,
    base64_keys: bool = False,
    selector_text: str = "",
    source: str = "input",
) -> dict[str, Totals]:
    """Append `stream` to the journals of `selector` as `framing` and `mapping` say; return totals per journal.

    Every append is committed on return. On an input error the records before it are committed
    (none partially) and a RecordError is raised; an append failure raises its ClientError.
    """
    check_options(framing, mapping, base64_keys)
    listed = await list_journals(client, selector)
    specs = sorted((j.spec for j in listed.journals), key=lambda s: s.name)
    if not specs:
        raise GazctlError(f"no journal matches --selector {selector_text!r}")
    reader = _InputReader(stream)
    if framing is Framing.none:
        return await _append_whole(client, specs, reader, source)
    return await _append_records(client, specs, reader, framing, mapping, base64_keys, selector_text, source)


async def _append_whole(
    client: JournalClient, specs: list[pb.JournalSpec], reader: _InputReader, source: str
) -> dict[str, Totals]:
    journal = random_mapping(specs)(None)[0]
    log.debug("mapped input to journal", extra={"journal": journal})
    try:
        first = await reader.read()
        second = await reader.read() if first else b""
    except OSError as err:
        raise GazctlError(f"{source}: reading failed: {err} (nothing was appended to {journal})") from None
    if not second:
        # All of the input in one read: one append (an HTTP PUT, the cheapest round trip).
        resp = await append(client, journal, first)
        log.debug("append response", extra={"journal": journal, "commit": f"{resp.commit.begin}-{resp.commit.end}"})
        return {journal: Totals(1, len(first))}
    app = Appender(client, journal)
    try:
        await app.write(first)
        await app.write(second)
        while data := await reader.read():
            await app.write(data)
    except OSError as err:
        await app.abort()
        raise GazctlError(f"{source}: reading failed: {err} (nothing was appended to {journal})") from None
    except BaseException:
        await app.abort()  # Rolls back: none of the input becomes visible.
        raise
    resp = await app.commit()
    log.debug("append response", extra={"journal": journal, "commit": f"{resp.commit.begin}-{resp.commit.end}"})
    return {journal: Totals(1, app.written)}


async def _append_records(
    client: JournalClient,
    specs: list[pb.JournalSpec],
    reader: _InputReader,
    framing: Framing,
    mapping: Mapping,
    base64_keys: bool,
    selector_text: str,
    source: str,
) -> dict[str, Totals]:
    parser = RecordParser(framing, keyed=mapping is not Mapping.random, base64_keys=base64_keys, source=source)
    choose = _mapper(specs, mapping)
    totals: dict[str, Totals] = {}
    last: dict[str, asyncio.Future[pb.AppendResponse]] = {}
    batches: list[asyncio.Future[pb.AppendResponse]] = []
    debug = log.isEnabledFor(logging.DEBUG)
    service = AppendService(client)
    try:
        while data := await reader.read():
            for record in parser.feed(data):
                journal = choose(record.key)
                if journal is None:
                    raise await _unknown_journal(client, parser, record, selector_text)
                if debug:
                    log.debug("mapped record to journal", extra={
                        "journal": journal, "record": record.number, "key": _show(record.key or b"")})
                future = service.append(journal, record.data).future
                if last.get(journal) is not future:
                    # A new batch of this journal: stop early if an earlier one failed.
                    _raise_failed(batches)
                    last[journal] = future
                    batches.append(future)
                totals.setdefault(journal, Totals()).records += 1
                totals[journal].bytes += len(record.data)
        parser.finish()
    except (RecordError, OSError) as err:
        # Whole records read before the error are still appended: wait for them, then report.
        await service.close()
        _raise_failed(batches)
        done = sum(t.records for t in totals.values())
        if isinstance(err, OSError):
            err = RecordError(f"{source}: reading failed: {err}")
        raise RecordError(f"{err} ({done} earlier records were appended)") from None
    except BaseException:
        await service.close(cancel=True)
        raise
    await service.close()
    _raise_failed(batches)
    return totals


def _raise_failed(batches: list[asyncio.Future[pb.AppendResponse]]) -> None:
    """Raise the error of the first failed batch, if any has failed yet."""
    for future in batches:
        if future.done() and not future.cancelled() and (exc := future.exception()) is not None:
            if isinstance(exc, ClientError):
                raise exc
            raise GazctlError(f"append failed: {exc}") from exc


def _mapper(specs: list[pb.JournalSpec], mapping: Mapping) -> Callable[[bytes | None], str | None]:
    """A function from a record's key to its journal (None: a direct name which is not one of `specs`)."""
    if mapping is Mapping.random:
        pick = random_mapping(specs)
        return lambda key: pick(None)[0]
    if mapping is Mapping.direct:
        names = {s.name for s in specs}

        def direct(key: bytes | None) -> str | None:
            name = (key or b"").decode("utf-8", errors="replace")
            return name if name in names else None

        return direct
    make = modulo_mapping if mapping is Mapping.modulo else rendezvous_mapping
    keyed = make(lambda key: key, specs)
    return lambda key: keyed(key)[0]


async def _unknown_journal(
    client: JournalClient, parser: RecordParser, record: Record, selector_text: str
) -> RecordError:
    """The error of a direct journal name which is not a journal of the selector: it may not exist at all."""
    name = (record.key or b"").decode("utf-8", errors="backslashreplace")
    exists = False
    if name:
        by_name = pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name="name", value=name)]))
        try:
            exists = bool((await list_journals(client, by_name)).journals)
        except ClientError:
            pass  # E.g. not a valid journal name: then it certainly does not exist.
    why = f"does not match --selector {selector_text!r}" if exists else "does not exist"
    return parser.error(f"journal {name!r} {why}", record.key_offset, record.number)
