"""CSV records parsed as Go's encoding/csv reads them (RFC 4180, with its defaults).

`parse_csv_record` parses one record given through its ending `\\n`: NeedMore says a quoted field
runs on past it (the record spans more lines), CSVSyntaxError that it is malformed.
"""

from __future__ import annotations

import re

from consumer.message.errors import FramingError


class NeedMore(FramingError):
    """The record continues past the bytes given (an open quoted field): a signal, caught by the framing."""

    def __init__(self, reason: str = "the record continues past the bytes given") -> None:
        super().__init__(reason)


class CSVSyntaxError(FramingError):
    """The record is malformed."""


_UNQUOTED_END = re.compile("[,\n]")


def parse_csv_record(text: str) -> list[str]:
    """Fields of one CSV record that ends with `\\n`, parsed as Go's encoding/csv does.

    Raises NeedMore if a quoted field is still open at the end of `text`.
    """
    text = text.replace("\r\n", "\n")  # Go reads lines, normalizing CRLF, even inside quotes.
    if '"' not in text:
        return text[:-1].split(",")  # The common case.

    fields: list[str] = []
    i, n = 0, len(text)
    while True:
        if text.startswith('"', i):
            i += 1
            parts: list[str] = []
            while True:
                q = text.find('"', i)
                if q == -1:
                    raise NeedMore
                parts.append(text[i:q])
                after = text[q + 1 : q + 2]
                if after == '"':
                    parts.append('"')
                    i = q + 2
                elif after == ",":
                    fields.append("".join(parts))
                    i = q + 2
                    break
                elif after == "\n":
                    fields.append("".join(parts))
                    return fields
                else:
                    raise CSVSyntaxError('extraneous or missing " in quoted-field')
        else:
            match = _UNQUOTED_END.search(text, i)
            end = match.start() if match else n
            field = text[i:end]
            if '"' in field:
                raise CSVSyntaxError('bare " in non-quoted field')
            fields.append(field)
            if match is None or match.group() == "\n":
                return fields
            i = end + 1
