"""What a request asks: its target's path and query, decoded as Go's net/http and net/url do.

Go's server rejects a malformed target before any handler runs (BadTarget); a bad query is the
route's 400 (BadRequest), with `url.ParseQuery`'s error text. Decoding a route's parameters
from the query follows gorilla/schema, whose MultiError text `multi_error` reproduces.
"""

from __future__ import annotations

from broker.protocol.paths import URLError, parse_url, path_unescape, query_unescape
from broker.protocol.validation import ValidationError, in_context, validate_journal

Metadata = tuple[tuple[str, str], ...] | None
"""gRPC metadata to pass on to the broker: the request's `Authorization`, if it has one."""


class BadRequest(Exception):
    """A request the gateway answers with 400 and this error text."""


class BadTarget(Exception):
    """A request target that Go's net/http rejects before any handler runs."""


def split_target(target: str) -> tuple[str, str]:
    """Split a request target into its percent-decoded path and its raw query."""
    if target.startswith("/"):
        raw_path, _, query = target.partition("?")
        try:
            return path_unescape(raw_path), query
        except URLError:
            raise BadTarget(target) from None
    try:
        url = parse_url(target)  # The absolute form, as sent to proxies.
    except URLError:
        raise BadTarget(target) from None
    if not url.scheme or not url.host:
        raise BadTarget(target)
    return url.path or "/", url.raw_query


def journal_of(path: str) -> str:
    """The journal a request path names: the path without its leading `/`.

    A name that is not UTF-8 (a percent-escaped byte such as `%92`, kept as a surrogate escape)
    cannot go into a protobuf string; it is never a valid journal, and is refused here with the
    ValidationError a request naming it would get (`Journal: not a valid token (...)`).
    """
    name = path[1:]
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        with in_context("Journal"):
            validate_journal(name)
            raise ValidationError(f"not a valid token ({name})") from None
    return name


def parse_query(raw: str) -> dict[str, list[str]]:
    """Values by key of a raw query, as Go's `url.ParseQuery` (raising its first error)."""
    values: dict[str, list[str]] = {}
    error: str | None = None
    for part in raw.split("&"):
        if ";" in part:
            error = "invalid semicolon separator in query"
            continue
        if not part:
            continue
        raw_key, _, raw_value = part.partition("=")
        try:
            key = query_unescape(raw_key)
            value = query_unescape(raw_value)
        except URLError as err:
            error = error or str(err)
            continue
        values.setdefault(key, []).append(value)
    if error is not None:
        raise BadRequest(error)
    return values


def multi_error(errors: list[str]) -> str:
    """gorilla/schema's MultiError text; Go picks the shown error at random, we the first."""
    if len(errors) == 1:
        return errors[0]
    if len(errors) == 2:
        return f"{errors[0]} (and 1 other error)"
    return f"{errors[0]} (and {len(errors) - 1} other errors)"
