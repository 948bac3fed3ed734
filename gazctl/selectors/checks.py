"""Parsing a -l/--selector value as gazctl does: "" selects all, a text that does not parse or that
a List request refuses is a one-line GazctlError naming the flag, and commands that change or
delete things require one. (The grammar is broker.protocol's, as in Gazette.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from broker.protocol import pb
from broker.protocol.selectors import parse_selector
from gazctl.errors import GazctlError


def checked_selector(text: str, flag: str, validate: Callable[[pb.LabelSelector], object]) -> pb.LabelSelector:
    """Parse selector `text` ("" selects all) and check it with `validate` (a protocol's List
    request check, which raises ValueError); either failure is a GazctlError naming `flag`."""
    try:
        selector = parse_selector(text) if text else pb.LabelSelector()
        validate(selector)
    except ValueError as err:  # SelectorError and ValidationError.
        raise GazctlError(f"invalid {flag} {text!r}: {err}") from None
    return selector


def required_selector_text(text: str, example: str) -> str:
    """`text`, which must be given (commands that change or delete things); `example` shows a selector."""
    if not text.strip():
        raise GazctlError(f"--selector (-l) is required, e.g. {example}")
    return text


def selector_option(help_text: str, *, required: bool = False) -> Any:
    """The -l/--selector option of a command; a required one shows no default."""
    return typer.Option("--selector", "-l", help=help_text, show_default=not required)


__all__ = ["checked_selector", "required_selector_text", "selector_option"]
