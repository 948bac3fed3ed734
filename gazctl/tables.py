"""Tables as Gazette's gazctl prints them: github.com/olekukonko/tablewriter v1.1.0 (gazette/core's
go.mod), made with `tablewriter.NewWriter(os.Stdout)`, `Header(...)`, `Append(row)` and `Render()`
and no other configuration (`cmd/gazctl/gazctlcmd/journals_list.go`, `journals_fragments.go`,
`shards_list.go`).

Its defaults: light box-drawing borders and no lines between rows; one space of padding each side
of a cell; headers centred (an odd space goes right) and auto-formatted (split into words at case,
digit and punctuation changes, `_` and most `.` made spaces, upper-cased: `SHA1` is `SHA 1`); cells
left-aligned, trimmed of surrounding white space, a cell's line breaks making more lines of its row;
a column as wide as its widest header or cell in terminal cells. A table without rows is its
header between the top and bottom borders.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from rich.cells import cell_len


def render(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The table of `headers` and `rows` (each as many cells as there are headers)."""
    header_lines = _lines([header_text(h) for h in headers])
    row_lines = [_lines([cell.strip() for cell in row]) for row in rows]
    widths = [1] * len(headers)
    for line in header_lines + [line for lines in row_lines for line in lines]:
        for i, cell in enumerate(line):
            widths[i] = max(widths[i], width(cell.strip()))

    def border(left: str, middle: str, right: str) -> str:
        return left + middle.join("─" * (w + 2) for w in widths) + right + "\n"

    out = [border("┌", "┬", "┐")]
    out.extend(_line(line, widths, centred=True) for line in header_lines)
    if row_lines:
        out.append(border("├", "┼", "┤"))
    out.extend(_line(line, widths, centred=False) for lines in row_lines for line in lines)
    out.append(border("└", "┴", "┘"))
    return "".join(out)


def _lines(cells: list[str]) -> list[list[str]]:
    """The cells of one row as the lines of text it takes (a cell's line breaks add lines)."""
    split = [cell.split("\n") for cell in cells]
    height = max((len(lines) for lines in split), default=1)
    return [[lines[i] if i < len(lines) else "" for lines in split] for i in range(height)]


def _line(cells: list[str], widths: list[int], *, centred: bool) -> str:
    out = []
    for cell, w in zip(cells, widths, strict=True):
        gap = w - width(cell)
        if centred:
            left = gap // 2
            out.append(" " * (left + 1) + cell + " " * (gap - left + 1))
        else:
            out.append(" " + cell + " " * (gap + 1))
    return "│" + "│".join(out) + "│\n"


def width(text: str) -> int:
    """The terminal cells `text` takes (East Asian wide characters take two)."""
    return len(text) if text.isascii() else cell_len(text)


def header_text(header: str) -> str:
    """A header as tablewriter's default auto-format writes it: `Name` is `NAME`, `SHA1` is `SHA 1`,
    `app.gazette.dev/tag` is `APP . GAZETTE . DEV / TAG`."""
    words = " ".join(_words(header.strip()))
    chars = list(words)
    for i, char in enumerate(chars):
        if char == "_":
            chars[i] = " "
        elif char == "." and (
            (i != 0 and not _digit_or_space(chars[i - 1]))
            or (i != len(chars) - 1 and not _digit_or_space(chars[i + 1]))
        ):
            chars[i] = " "
    text = "".join(chars).strip()
    if not text and words:
        text = " "
    return text.upper()


def _digit_or_space(char: str) -> bool:
    return "0" <= char <= "9" or char == " "


def _class(char: str) -> int:
    category = unicodedata.category(char)
    if category == "Ll":
        return 1
    if category == "Lu":
        return 2
    if category == "Nd":
        return 3
    return 4


def _words(text: str) -> list[str]:
    """tablewriter's SplitCamelCase: runs of lower-case letters, upper-case letters, digits and other
    characters, an upper-case letter before lower-case ones starting their word; blank runs and
    `_` dropped."""
    runs: list[list[str]] = []
    last = 0
    for char in text:
        kind = _class(char)
        if runs and kind == last:
            runs[-1].append(char)
        else:
            runs.append([char])
        last = kind
    for i in range(len(runs) - 1):
        if runs[i] and runs[i + 1] and _class(runs[i][0]) == 2 and _class(runs[i + 1][0]) == 1:
            runs[i + 1].insert(0, runs[i].pop())
    words = ["".join(run) for run in runs]
    return [w for w in words if w.strip() and w != "_"]


__all__ = ["header_text", "render", "width"]
