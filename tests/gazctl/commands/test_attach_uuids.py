"""`gazctl attach-uuids`, run as a user runs it; and its template parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumer.message.uuid import Flags, get_clock, get_flags, get_producer_id, parse_uuid
from gazctl.commands.attach_uuids import Field, parse_template
from gazctl.errors import GazctlError
from tests.support.harness import run_gazctl


def _split(stdout: str, sep: str = ",") -> list[tuple[str, str]]:
    out = []
    for row in stdout.splitlines():
        uuid, line = row.split(sep, 1)
        out.append((uuid, line))
    return out


def test_default_template_attaches_committed_v1_uuids(tmp_path: Path) -> None:
    done = run_gazctl(None, "attach-uuids", input="a,b\r\nc,d\n\nlast")
    assert done.returncode == 0, done.stderr
    rows = _split(done.stdout)
    assert [line for _, line in rows] == ["a,b", "c,d", "", "last"]
    uuids = [parse_uuid(u) for u, _ in rows]
    assert all(u.version == 1 and get_flags(u) == Flags.OUTSIDE_TXN for u in uuids)
    assert len({get_producer_id(u) for u in uuids}) == 1  # One producer per run.
    assert get_producer_id(uuids[0])[0] & 0x01  # Marked as not a real MAC address.
    clocks = [get_clock(u) for u in uuids]
    assert clocks == sorted(set(clocks))  # A tick per UUID.


def test_files_skip_header_and_template(tmp_path: Path) -> None:
    one, two = tmp_path / "one.csv", tmp_path / "two.csv"
    one.write_text("h,1\nx,1\ny,1\n")
    two.write_text("h,2\nx,2\n")
    done = run_gazctl(None, "attach-uuids", "--skip-header", "--template", "{{.Line}}\t{{ .UUID }}\n",
                      str(one), str(two))
    assert done.returncode == 0, done.stderr
    rows = [row.split("\t") for row in done.stdout.splitlines()]
    assert [line for line, _ in rows] == ["x,1", "y,1", "x,2"]
    assert all(parse_uuid(u).version == 1 for _, u in rows)

    wrapped = run_gazctl(None, "attach-uuids", str(two), "--template", '{"uuid": "{{.UUID}}", "record": "{{.Line}}"}\n')
    assert wrapped.returncode == 0, wrapped.stderr
    assert [r.split('"record": ')[1] for r in wrapped.stdout.splitlines()] == ['"h,2"}', '"x,2"}']


def test_errors(tmp_path: Path) -> None:
    path = tmp_path / "long.txt"
    path.write_text("short\n" + "x" * 11 + "\nshort\n")
    done = run_gazctl(None, "attach-uuids", "--max-length", "10", str(path))
    assert done.returncode != 0
    assert done.stderr.strip() == f"error: {path}: line 2 is longer than --max-length (10 bytes)"
    assert len(done.stdout.splitlines()) == 1  # Lines before it were written.

    done = run_gazctl(None, "attach-uuids", "--template", "{{.UUID}} {{.Other}}", input="x\n")
    assert done.returncode != 0 and done.stdout == ""
    assert "'{{.Other}}'" in done.stderr and len(done.stderr.strip().splitlines()) == 1

    done = run_gazctl(None, "attach-uuids", str(tmp_path / "missing"))
    assert done.returncode != 0 and "missing" in done.stderr


def test_template_is_taken_literally() -> None:
    """Go's text/template takes the flag's value as it is (`cmd/gazctl/gazctlcmd/attach_uuids.go`): a
    pipeline written for Gazette's gazctl gets the same bytes, a backslash and an `n` included."""
    done = run_gazctl(None, "attach-uuids", "--template", "{{.Line}}|{{.UUID}}\\n", input=b"a\nb\n")
    assert done.returncode == 0, done.stderr
    assert isinstance(done.stdout, bytes) and done.stdout.count(b"\n") == 0, done.stdout
    assert [part.split(b"|")[0] for part in done.stdout.split(b"\\n")] == [b"a", b"b", b""]
    assert parse_template("{{.UUID}},{{.Line}}\\n") == [Field.UUID, b",", Field.Line, b"\\n"]
    assert parse_template("{{.UUID}},{{.Line}}\n") == [Field.UUID, b",", Field.Line, b"\n"]  # The default.


def test_parse_template() -> None:
    assert parse_template("é{{ .Line }}\\t\\x41") == ["é".encode(), Field.Line, b"\\t\\x41"]
    for bad in ("{{.Line | printf}}", "{{if .Line}}", "{{.Line", "{{}}"):
        with pytest.raises(GazctlError, match="invalid --template"):
            parse_template(bad)
