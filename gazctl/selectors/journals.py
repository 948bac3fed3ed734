"""The -l/--selector of the `journals` commands (and `auth`): journal selectors as a journals
ListRequest takes them (a `prefix` value must end in '/')."""

from __future__ import annotations

from typing import Annotated

from broker.protocol import pb
from broker.protocol.validation import validate_list_request
from gazctl.selectors.checks import checked_selector, required_selector_text, selector_option

SelectorOption = Annotated[
    str,
    selector_option(
        "Label selector of journals, e.g. 'app.gazette.dev/message-type=Foo,prefix=a/b/' or 'name=a/b'",
    ),
]
RequiredSelectorOption = Annotated[
    str,
    selector_option(
        "Label selector of journals (required), e.g. 'prefix=a/b/' or 'name in (a/b, a/c)'",
        required=True,
    ),
]


def parse_list_selector(text: str, flag: str = "--selector") -> pb.LabelSelector:
    """Parse a selector as a journals ListRequest takes it (e.g. a `prefix` value must end in '/'); "" selects all."""
    return checked_selector(text, flag, lambda selector: validate_list_request(pb.ListRequest(selector=selector)))


def require_selector(text: str) -> pb.LabelSelector:
    """Parse a journal selector which must be given (commands that change or delete things)."""
    return parse_list_selector(required_selector_text(text, "-l name=example/journal or -l prefix=example/"))


__all__ = ["RequiredSelectorOption", "SelectorOption", "parse_list_selector", "require_selector"]
