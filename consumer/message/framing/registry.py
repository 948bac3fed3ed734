"""The framings by content type: `framing_for` a content type, LabelSet or JournalSpec."""

from __future__ import annotations

from collections.abc import Mapping

from broker.protocol import labels as lbl
from broker.protocol import pb
from consumer.message.errors import UnknownContentTypeError
from consumer.message.framing.base import Framing
from consumer.message.framing.csv_framing import CSVFraming
from consumer.message.framing.json_lines import JSONFraming
from consumer.message.framing.proto_fixed import ProtoFixedFraming

_registry: dict[str, Framing] = {}


def register_framing(framing: Framing) -> None:
    """Register `framing` under its content type, replacing any framing registered before."""
    _registry[framing.content_type] = framing


def supported_content_types() -> list[str]:
    """The registered content types, sorted."""
    return sorted(_registry)


def framing_for(source: str | pb.LabelSet | pb.JournalSpec | Mapping[str, str]) -> Framing:
    """The framing for a content type, or for the `content-type` label of a LabelSet or JournalSpec.

    Raises UnknownContentTypeError, naming the content type (empty if the label is absent) and
    the supported ones.
    """
    if isinstance(source, str):
        content_type = source
    elif isinstance(source, pb.JournalSpec):
        content_type = lbl.value_of(source.labels, lbl.CONTENT_TYPE) or ""
    elif isinstance(source, pb.LabelSet):
        content_type = lbl.value_of(source, lbl.CONTENT_TYPE) or ""
    else:
        content_type = source.get(lbl.CONTENT_TYPE, "")
    framing = _registry.get(content_type)
    if framing is None:
        raise UnknownContentTypeError(content_type, supported_content_types())
    return framing


JSON_FRAMING = JSONFraming()
PROTO_FIXED_FRAMING = ProtoFixedFraming()
CSV_FRAMING = CSVFraming()
for _framing in (JSON_FRAMING, PROTO_FIXED_FRAMING, CSV_FRAMING):
    register_framing(_framing)
