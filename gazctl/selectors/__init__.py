"""What is gazctl's own about label selectors: the -l/--selector options of the journal and
shard commands, their checks (a List request's rules), and their error texts. The selector
grammar itself is `broker.protocol.selectors`, as Gazette keeps it in its protocol package."""

from gazctl.selectors.checks import checked_selector, required_selector_text
from gazctl.selectors.journals import RequiredSelectorOption, SelectorOption, parse_list_selector, require_selector
from gazctl.selectors.shards import (
    RequiredShardSelectorOption,
    ShardSelectorOption,
    parse_shard_selector,
    require_shard_selector,
)

__all__ = [
    "RequiredSelectorOption",
    "RequiredShardSelectorOption",
    "SelectorOption",
    "ShardSelectorOption",
    "checked_selector",
    "parse_list_selector",
    "parse_shard_selector",
    "require_selector",
    "require_shard_selector",
    "required_selector_text",
]
