"""Sources cite Gazette's own files by path (`broker/append_fsm.go` in gazette/core) or the
project's docs: never a file outside this repository, nor a numbered section of a digest of them."""

from __future__ import annotations

import re
import subprocess

from tests.support.harness import ROOT

OUTSIDE = re.compile(
    r"\.\./shared\b"  # a path outside the repository
    r"|\b(?:protocol |consumer |broker )?digest(?:'s)? \(?\d"  # "digest 7", "consumer digest 8.1"
    r"|\breference \d+(?:\.\d+)*\b"  # "reference 6.3"
    r"|\bof the reference\b|\bthe reference's\b"
    r"|\b(?:broker|consumer)-protocol\.md\b",
    re.IGNORECASE,
)


def test_nothing_cites_outside_the_repository() -> None:
    listing = ["git", "ls-files", "--cached", "--others", "--exclude-standard"]
    files = subprocess.run(listing, cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in files:
        path = ROOT / name
        if name == "tests/test_citations.py" or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{name}:{number}: {line.strip()}")
    assert len(files) > 300  # The walk found the repository's files.
    assert not found, "cite Gazette's file (e.g. `broker/append_fsm.go`) or the project's docs:\n" + "\n".join(found)
