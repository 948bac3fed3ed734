"""The -l/--selector of the `shards` commands: shard selectors as a consumer's ListRequest takes
them (the meta-label `id` is the shard's ID)."""

from __future__ import annotations

from typing import Annotated

from broker.protocol import pb as bpb
from consumer.protocol import pb
from consumer.protocol.validation import validate_list_request
from gazctl.selectors.checks import checked_selector, required_selector_text, selector_option

ShardSelectorOption = Annotated[
    str,
    selector_option(
        "Label selector of shards (the meta-label `id` is the shard's ID), e.g. 'app=counter' or 'id=shard-000'",
    ),
]
RequiredShardSelectorOption = Annotated[
    str,
    selector_option(
        "Label selector of shards (required), e.g. 'app=counter' or 'id in (shard-000, shard-001)'",
        required=True,
    ),
]


def parse_shard_selector(text: str, flag: str = "--selector") -> bpb.LabelSelector:
    """Parse a shard selector as a ListRequest takes it; "" selects every shard."""
    return checked_selector(text, flag, lambda selector: validate_list_request(pb.ListRequest(selector=selector)))


def require_shard_selector(text: str) -> bpb.LabelSelector:
    """Parse a shard selector which must be given (commands that change things)."""
    return parse_shard_selector(required_selector_text(text, "-l id=shard-000 or -l app=counter"))


__all__ = ["RequiredShardSelectorOption", "ShardSelectorOption", "parse_shard_selector", "require_shard_selector"]
