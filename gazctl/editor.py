"""The edit loop of `gazctl journals edit` and `shards edit`: open a document in an editor until it applies.

As `kubectl edit`: the editor is `$GAZ_EDITOR`, else `$EDITOR`, else `vi` (a command line,
split as a shell would). After a failed apply the editor reopens the user's own text (their
comments kept), with the error in a comment block at the top, which is removed again before
the next apply.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from broker.errors import GazetteError
from gazctl.errors import GazctlError

T = TypeVar("T")

ERROR_HEADER = (
    "# The edit failed to apply (line numbers count from the first line after this block)."
    " Fix it and save, or save no change to cancel.\n"
)
_ERROR_MARK = "# error: "


def editor_command(env: Mapping[str, str] | None = None) -> list[str]:
    """The editor's command line: $GAZ_EDITOR, else $EDITOR, else vi."""
    env = os.environ if env is None else env
    line = env.get("GAZ_EDITOR") or env.get("EDITOR") or "vi"
    try:
        argv = shlex.split(line)
    except ValueError as err:
        raise GazctlError(f"cannot parse the editor command {line!r}: {err}") from None
    if not argv:
        raise GazctlError("the editor command ($GAZ_EDITOR or $EDITOR) is empty")
    return argv


def run_editor(path: Path) -> None:
    """Open `path` in the editor and wait for it to exit."""
    argv = editor_command()
    try:
        done = subprocess.run([*argv, str(path)], check=False)
    except OSError as err:
        raise GazctlError(f"cannot run the editor {argv[0]!r}: {err} (set $GAZ_EDITOR or $EDITOR)") from None
    if done.returncode != 0:
        raise GazctlError(f"the editor {argv[0]!r} exited with status {done.returncode}; nothing was applied")


def strip_error_block(text: str) -> str:
    """Remove the leading comment block this module adds after a failed apply."""
    lines = text.splitlines(keepends=True)
    skip = 0
    if lines and lines[0] == ERROR_HEADER:
        skip = 1
        while skip < len(lines) and lines[skip].startswith(_ERROR_MARK):
            skip += 1
    return "".join(lines[skip:])


def with_error_block(text: str, error: str) -> str:
    """`text` with a leading comment block stating `error` (one comment line per line of it)."""
    body = "".join(f"{_ERROR_MARK}{line}\n" for line in error.splitlines() or [""])
    return ERROR_HEADER + body + strip_error_block(text)


def edit_until_applied(
    initial: str, apply: Callable[[str], T], suffix: str = ".yaml", name: str = "journals"
) -> T | None:
    """Edit `initial` until `apply(edited text)` succeeds, returning its result; None if the user cancels.

    The user cancels by saving the text unchanged (from what they were last shown) or empty.
    An error of `apply` (any GazetteError) reopens the editor with the error shown.
    """
    with tempfile.TemporaryDirectory(prefix="gazctl-edit-") as tmp:
        path = Path(tmp) / f"{name}{suffix}"
        shown = initial
        while True:
            path.write_text(shown, encoding="utf-8")
            run_editor(path)
            edited = path.read_text(encoding="utf-8")
            if edited == shown or not strip_error_block(edited).strip():
                return None
            try:
                return apply(strip_error_block(edited))
            except GazetteError as err:
                shown = with_error_block(edited, str(err))
