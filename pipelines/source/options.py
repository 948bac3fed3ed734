"""Options of the `gazette` source, validated on the driver before any Spark work.

Spark hands options over with lower-cased keys; every error is a `GazetteOptionError` whose
message starts with the option's name as users spell it (e.g. `startingOffsets`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from broker.client.config import dial_target, resolve_broker_address
from broker.errors import ConfigError
from broker.protocol.credentials import Credentials
from broker.protocol.selectors import parse_selector
from pipelines import auth
from pipelines.errors import SparkPipelineError

EARLIEST = -2
"""A journal offset meaning "the journal's first offset" (Kafka's -2)."""
LATEST = -1
"""A journal offset meaning "the journal's write head" (Kafka's -1)."""

FRAMINGS = ("json", "lines", "fixed", "csv")
"""Framings the `framing` option accepts; `proto` is an alias of `fixed`."""
ISOLATIONS = ("read_committed", "read_uncommitted")

KNOWN = (
    "broker", "selector", "startingOffsets", "endingOffsets", "startingTimestamp", "framing",
    "failOnDataLoss", "maxBytesPerTrigger", "isolation", "parse", "fileRoot", "signatureTTL", "transactionTimeout",
    "authToken",
)
"""Every option of the source, as documented (Spark compares option names case-insensitively)."""
_BY_LOWER = {name.lower(): name for name in KNOWN}
# Options of the writer and the generic ones Spark adds; the reader accepts and ignores them.
_IGNORED = frozenset({"path", "journal", "key", "mapping", "batchbytes"})


class GazetteOptionError(SparkPipelineError, ValueError):
    """An option of the `gazette` source that is missing or invalid; the message names it."""


Offsets = str | dict[str, int]
"""`earliest`, `latest`, or offsets by journal name (-1 latest, -2 earliest)."""


@dataclass(frozen=True)
class SourceOptions:
    """The validated options of one read (picklable: executors receive them with partitions)."""

    broker: str
    selector: str
    starting: Offsets = "earliest"
    ending: Offsets = "latest"
    starting_timestamp_ms: int | None = None
    framing: str | None = None
    fail_on_data_loss: bool = True
    max_bytes_per_trigger: int | None = None
    isolation: str = "read_committed"
    parse: str | None = None
    file_root: str | None = None
    signature_ttl: float = 3600.0
    transaction_timeout: float = 600.0
    """Streaming read-committed: seconds after its last message that an open transaction is abandoned."""
    auth_token: str = field(default="", repr=False)
    """Option `authToken` ("": each process's `$BROKER_AUTH_TOKEN`/`$BROKER_AUTH_KEYS`); a secret, kept out of repr."""

    @property
    def read_committed(self) -> bool:
        return self.isolation == "read_committed"

    def credentials(self) -> Credentials | None:
        """What clients of this read present to brokers (None: the environment's `BROKER_*` variables)."""
        return auth.credentials(self.auth_token)


def _offsets(name: str, text: str) -> Offsets:
    """Parse `earliest`, `latest` or a JSON object of journal -> offset."""
    value = text.strip()
    if value.lower() in ("earliest", "latest"):
        return value.lower()
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        raise GazetteOptionError(
            f"{name}: expected 'earliest', 'latest' or a JSON object of journal -> offset, got {text!r}"
        ) from None
    if not isinstance(parsed, dict):
        raise GazetteOptionError(f"{name}: expected a JSON object of journal -> offset, got {text!r}")
    out: dict[str, int] = {}
    for journal, offset in parsed.items():
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
            raise GazetteOptionError(
                f"{name}: offset of journal {journal!r} must be an integer >= 0, -1 (latest) or -2 (earliest), "
                f"got {offset!r}"
            )
        out[journal] = offset
    return out


def _bool(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise GazetteOptionError(f"{name}: expected true or false, got {text!r}")


def _positive_int(name: str, text: str, *, minimum: int = 1) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise GazetteOptionError(f"{name}: expected an integer, got {text!r}") from None
    if value < minimum:
        raise GazetteOptionError(f"{name}: must be >= {minimum}, got {value}")
    return value


def parse_options(options: Mapping[str, str], *, streaming: bool = False) -> SourceOptions:
    """Validate Spark's `options` (keys in any case); raise GazetteOptionError naming the bad option."""
    opts = {key.lower(): str(value) for key, value in options.items()}
    unknown = sorted(k for k in opts if k not in _BY_LOWER and k not in _IGNORED)
    if unknown:
        raise GazetteOptionError(f"{unknown[0]}: unknown option of the gazette source (known: {', '.join(KNOWN)})")

    selector = opts.get("selector", "").strip()
    if not selector:
        raise GazetteOptionError("selector: required (a label selector such as 'app.gazette.dev/message-type=X')")
    try:
        parse_selector(selector)
    except ValueError as exc:
        raise GazetteOptionError(f"selector: {exc}") from None

    try:
        broker = resolve_broker_address(opts.get("broker") or None)
        dial_target(broker)
    except (ValueError, ConfigError) as exc:
        raise GazetteOptionError(f"broker: {exc}") from None

    # Kafka's defaults: a batch reads everything; a stream starts at the write heads.
    starting = _offsets("startingOffsets", opts.get("startingoffsets", "latest" if streaming else "earliest"))
    ending: Offsets = "latest"
    if "endingoffsets" in opts:
        if streaming:
            raise GazetteOptionError("endingOffsets: not supported by streaming reads")
        ending = _offsets("endingOffsets", opts["endingoffsets"])
        if ending == "earliest":
            raise GazetteOptionError("endingOffsets: 'earliest' would read nothing; use 'latest' or offsets")
        if isinstance(ending, dict) and any(v == EARLIEST for v in ending.values()):
            raise GazetteOptionError("endingOffsets: -2 (earliest) is not a valid ending offset")
    if isinstance(starting, dict) and isinstance(ending, dict):
        for journal, begin in starting.items():
            end = ending.get(journal)
            if begin >= 0 and end is not None and end >= 0 and end < begin:
                raise GazetteOptionError(
                    f"endingOffsets: offset {end} of journal {journal!r} is before its starting offset {begin}"
                )

    starting_ts = None
    if "startingtimestamp" in opts:
        starting_ts = _positive_int("startingTimestamp", opts["startingtimestamp"], minimum=0)

    framing = None
    if "framing" in opts:
        framing = opts["framing"].strip().lower()
        framing = "fixed" if framing == "proto" else framing
        if framing not in FRAMINGS:
            raise GazetteOptionError(
                f"framing: expected one of {', '.join(FRAMINGS)} or proto, got {opts['framing']!r}"
            )

    max_bytes = None
    if "maxbytespertrigger" in opts:
        if not streaming:
            raise GazetteOptionError("maxBytesPerTrigger: only streaming reads take it")
        max_bytes = _positive_int("maxBytesPerTrigger", opts["maxbytespertrigger"])

    isolation = opts.get("isolation", "read_committed").strip().lower()
    if isolation not in ISOLATIONS:
        raise GazetteOptionError(f"isolation: expected read_committed or read_uncommitted, got {isolation!r}")

    parse = None
    if "parse" in opts:
        parse = opts["parse"].strip().lower()
        if parse not in ("json", "none"):
            raise GazetteOptionError(f"parse: expected json or none, got {opts['parse']!r}")

    file_root = opts.get("fileroot") or None
    ttl = 3600.0
    if "signaturettl" in opts:
        ttl = float(_positive_int("signatureTTL", opts["signaturettl"]))

    timeout = 600.0
    if "transactiontimeout" in opts:
        if not streaming:
            raise GazetteOptionError("transactionTimeout: only streaming reads take it")
        timeout = float(_positive_int("transactionTimeout", opts["transactiontimeout"]))

    try:
        token = auth.parse_token(opts.get("authtoken"))
    except ValueError as exc:
        raise GazetteOptionError(str(exc)) from None

    return SourceOptions(
        broker=broker, selector=selector, starting=starting, ending=ending, starting_timestamp_ms=starting_ts,
        framing=framing, fail_on_data_loss=_bool("failOnDataLoss", opts.get("failondataloss", "true")),
        max_bytes_per_trigger=max_bytes, isolation=isolation, parse=parse, file_root=file_root, signature_ttl=ttl,
        transaction_timeout=timeout, auth_token=token,
    )
