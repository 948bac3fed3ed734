"""The writer's options and input schema, validated on the driver before Spark starts any task.

`resolve` turns the options Spark passes (keys in any case) and the DataFrame's schema into a
`SinkConfig`: a plain, picklable value that Spark ships to every task. Every mistake raises
one `SinkError` naming the option, column or journal at fault.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import secrets
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pyspark.sql.types import BinaryType, DataType, StringType, StructType

from broker.client.config import resolve_broker_address
from broker.client.dial import JournalClient
from broker.client.errors import ClientError, TransportError
from broker.client.listing import list_journals
from broker.protocol import labels as lbl
from broker.protocol import pb
from broker.protocol.credentials import Credentials
from broker.protocol.selectors import SelectorError, parse_selector
from consumer.message.clock import clock_at
from pipelines import auth
from pipelines.errors import SparkPipelineError

T = TypeVar("T")

MAPPINGS = ("modulo", "rendezvous")
DEFAULT_MAPPING = "rendezvous"
FRAMINGS = ("lines", "none", "fixed")
DEFAULT_BATCH_BYTES = 4 << 20
MAX_BATCH_BYTES = 1 << 30
OPTIONS = ("broker", "selector", "mapping", "framing", "batchbytes", "transactional", "authtoken")
IGNORED_OPTIONS = ("path", "checkpointlocation", "queryname")
"""Spark's own options which reach the writer (`save(path)`, `writeStream`): they mean nothing here."""

LINE_CONTENT_TYPES = frozenset({lbl.CONTENT_TYPE_JSON_LINES, lbl.CONTENT_TYPE_CSV, "text/plain", ""})
"""Content types whose records are newline-delimited ("" is a journal without the label)."""

COLUMNS = ("value", "journal", "key")

TXN_CONTENT_TYPES = frozenset({lbl.CONTENT_TYPE_JSON_LINES})
"""Content types whose messages the writer stamps with Gazette UUIDs (see `pipelines.sink.txn`)."""


class SinkError(SparkPipelineError, ValueError):
    """A write the sink refuses: bad option, column or target journal (the message names it)."""


@dataclass(frozen=True)
class SinkConfig:
    """What every task of one write needs: where, how to route and frame, how big an append may be."""

    broker: str
    selector: str
    """The `selector` option as given ("" if none), for messages."""
    mapping: str
    framing: str
    """`lines`, `none`, `fixed`, or "" to follow each journal's content type."""
    batch_bytes: int
    value_index: int
    value_is_string: bool
    journal_index: int
    """Column positions in each row; -1 when the DataFrame has no such column."""
    key_index: int
    journals: dict[str, str] = field(default_factory=dict)
    """Journals the selector matched on the driver, name -> content type, in name order."""
    transactional: bool | None = None
    """Option `transactional`; None: transactional where the journal's framing carries UUIDs."""
    write_id: str = ""
    """Random id of the write, drawn on the driver: with a partition, it names a task's producer."""
    base_clock: int = 0
    """Batch writes: the clock every task's clocks start after (drawn on the driver); 0 in streaming."""
    auth_token: str = field(default="", repr=False)
    """Option `authToken` ("": each process's `$BROKER_AUTH_TOKEN`/`$BROKER_AUTH_KEYS`); a secret, kept out of repr."""

    def credentials(self) -> Credentials | None:
        """What the write's clients present to brokers (None: the environment's `BROKER_*` variables)."""
        return auth.credentials(self.auth_token)

    @property
    def label_selector(self) -> pb.LabelSelector | None:
        return parse_selector(self.selector) if self.selector else None


def framing_of(config: SinkConfig, journal: str, content_type: str) -> str:
    """The framing of records appended to `journal`: the option, else from its content type."""
    if config.framing:
        return config.framing
    if content_type in LINE_CONTENT_TYPES:
        return "lines"
    if content_type == lbl.CONTENT_TYPE_PROTO_FIXED:
        return "fixed"
    raise SinkError(
        f"journal {journal} has content-type {content_type!r}, which has no record framing the writer knows: "
        f"set option framing to one of {', '.join(FRAMINGS)}"
    )


def is_transactional(config: SinkConfig, journal: str, content_type: str) -> bool:
    """Whether rows to `journal` are stamped with UUIDs and committed by ACKs (raise if asked and impossible)."""
    if config.transactional is False:
        return False
    if not config.framing and content_type in TXN_CONTENT_TYPES:
        return True
    if config.transactional:
        why = f"option framing is {config.framing!r}" if config.framing else f"it has content-type {content_type!r}"
        raise SinkError(
            f"option transactional=true, but the records of journal {journal} carry no message UUIDs ({why}): "
            f"transactions need JSON lines journals ({lbl.CONTENT_TYPE_JSON_LINES}) without option framing"
        )
    return False


def resolve(options: Mapping[str, str], schema: StructType, overwrite: bool, *, list_now: bool = True) -> SinkConfig:
    """Validate `options` and `schema` (and with `list_now`, the selector's journals); raise SinkError."""
    if overwrite:
        raise SinkError("journals are append-only: write with mode 'append' (overwrite and complete modes are refused)")
    opts = {k.lower(): v for k, v in options.items()}
    # Spark adds options of its own (`__`-prefixed, or `spark.` settings): only plain typos are refused.
    unknown = sorted(k for k in set(opts) - set(OPTIONS) - set(IGNORED_OPTIONS) if not k.startswith(("__", "spark.")))
    if unknown:
        raise SinkError(f"unknown option {unknown[0]!r} (the gazette writer takes broker, selector, mapping, "
                        "framing, batchBytes, transactional, authToken)")

    columns = {f.name.lower(): (i, f.dataType) for i, f in enumerate(schema.fields)}
    extra = sorted(set(columns) - set(COLUMNS))
    if extra:
        raise SinkError(f"unexpected column {extra[0]!r}: the gazette writer takes columns value, journal and key "
                        "(select or drop the others)")
    if "value" not in columns:
        raise SinkError("the DataFrame has no column 'value' (binary or string): it is what each row appends")
    value_index, value_type = columns["value"]
    _check_type("value", value_type, (BinaryType, StringType))
    journal_index, journal_type = columns.get("journal", (-1, StringType()))
    _check_type("journal", journal_type, (StringType,))
    key_index, key_type = columns.get("key", (-1, StringType()))
    _check_type("key", key_type, (BinaryType, StringType))

    selector = opts.get("selector", "").strip()
    if selector:
        try:
            parse_selector(selector)
        except SelectorError as err:
            raise SinkError(f"option selector {selector!r}: {err}") from None
    elif key_index >= 0:
        raise SinkError("column 'key' is mapped over the journals of option selector, which is not set")
    elif journal_index < 0:
        raise SinkError("set option selector, or give each row a column 'journal' naming the journal to append to")

    mapping = opts.get("mapping", "").strip().lower()
    if mapping and mapping not in MAPPINGS:
        raise SinkError(f"option mapping {opts['mapping']!r}: expected one of {', '.join(MAPPINGS)}")
    framing = opts.get("framing", "").strip().lower()
    if framing and framing not in FRAMINGS:
        raise SinkError(f"option framing {opts['framing']!r}: expected one of {', '.join(FRAMINGS)}")
    batch_bytes = _batch_bytes(opts.get("batchbytes"))
    transactional = _bool_option("transactional", opts.get("transactional"))
    try:
        token = auth.parse_token(opts.get("authtoken"))
    except ValueError as err:
        raise SinkError(f"option {err}") from None

    try:
        broker = resolve_broker_address(opts.get("broker") or None)
        JournalClient(broker, credentials=auth.credentials(token))  # Checks the address's form (dials nothing).
    except ClientError as err:
        raise SinkError(f"option broker: {err}") from None

    config = SinkConfig(
        broker=broker, selector=selector, mapping=mapping or DEFAULT_MAPPING, framing=framing,
        batch_bytes=batch_bytes, value_index=value_index, value_is_string=isinstance(value_type, StringType),
        journal_index=journal_index, key_index=key_index, transactional=transactional,
        write_id=secrets.token_hex(16), base_clock=clock_at(time.time_ns()), auth_token=token,
    )
    if selector and list_now:
        config.journals.update(list_selected(config))
    return config


def list_selected(config: SinkConfig) -> dict[str, str]:
    """The journals `config.selector` matches now (name -> content type); raise SinkError if none."""
    journals = run_sync(_list(config))
    if not journals:
        raise SinkError(f"no journal matches option selector {config.selector!r}")
    if not config.framing:
        for name, content_type in journals.items():
            framing_of(config, name, content_type)  # Refuse now, not in a task, a journal we could not frame.
    for name, content_type in journals.items():
        is_transactional(config, name, content_type)
    return journals


async def list_named(client: JournalClient, names: list[str]) -> dict[str, pb.JournalSpec]:
    """The specs of those of `names` which exist (one List RPC)."""
    include = pb.LabelSet(labels=[pb.Label(name="name", value=n) for n in sorted(set(names))])
    resp = await list_journals(client, pb.LabelSelector(include=include))
    return {j.spec.name: j.spec for j in resp.journals}


async def _list(config: SinkConfig) -> dict[str, str]:
    broker = config.broker
    try:
        async with JournalClient(broker, credentials=config.credentials()) as client:
            resp = await list_journals(client, config.label_selector)
    except ClientError as err:
        if isinstance(err, TransportError) and auth.is_auth_error(err):
            raise auth.auth_error(err, config.auth_token, f"listing the journals of option selector "
                                  f"{config.selector!r}") from None
        raise SinkError(f"listing the journals of option selector at broker {broker}: {err}") from None
    return {j.spec.name: content_type(j.spec) for j in sorted(resp.journals, key=lambda j: j.spec.name)}


def content_type(spec: pb.JournalSpec) -> str:
    return lbl.value_of(spec.labels, lbl.CONTENT_TYPE) or ""


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to completion from synchronous code, even where an event loop runs (e.g. a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # asyncio.run refuses to nest: give the coroutine a loop of its own on another thread.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _check_type(column: str, actual: DataType, allowed: tuple[type[DataType], ...]) -> None:
    if not isinstance(actual, allowed):
        names = " or ".join(t.typeName() for t in allowed)
        raise SinkError(f"column {column!r} has type {actual.simpleString()}: expected {names}")


def _bool_option(name: str, text: str | None) -> bool | None:
    if text is None or not text.strip():
        return None
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise SinkError(f"option {name} {text!r}: expected true or false")
    return value == "true"


def _batch_bytes(text: str | None) -> int:
    if text is None or not text.strip():
        return DEFAULT_BATCH_BYTES
    try:
        n = int(text.strip())
    except ValueError:
        raise SinkError(f"option batchBytes {text!r}: expected a whole number of bytes") from None
    if not 0 < n <= MAX_BATCH_BYTES:
        raise SinkError(f"option batchBytes {n}: expected 1 to {MAX_BATCH_BYTES} bytes")
    return n
