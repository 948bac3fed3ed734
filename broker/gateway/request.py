"""What a journal request names: the journal of its path, the gRPC metadata it passes on, and
gorilla/schema's MultiError text for a route's parameters (`multi_error`).

The target's path and query are decoded by `cluster.server.http.request`.
"""

from __future__ import annotations

from broker.protocol.validation import ValidationError, in_context, validate_journal

Metadata = tuple[tuple[str, str], ...] | None
"""gRPC metadata to pass on to the broker: the request's `Authorization`, if it has one."""


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


def multi_error(errors: list[str]) -> str:
    """gorilla/schema's MultiError text; Go picks the shown error at random, we the first."""
    if len(errors) == 1:
        return errors[0]
    if len(errors) == 2:
        return f"{errors[0]} (and 1 other error)"
    return f"{errors[0]} (and {len(errors) - 1} other errors)"
