"""`gazctl journals read` end to end: a real broker, gazctl as a child process, appends over gRPC."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from broker.protocol import pb, pb_grpc
from tests.support.harness import (
    BrokerProcess,
    LineReader,
    append,
    apply_specs,
    gazctl_env,
    journal_spec,
    run_gazctl,
    wait_for_primary,
)
from tests.support.journals import read_rpcs, wait_for_process_read

AS = pb.AppendRequest



def create(stub: pb_grpc.JournalStub, *names: str, stores: bool = False, **labels: str) -> None:
    """Create journals `names` (with a file:// store and 1 KiB fragments if `stores`) and wait for primaries."""
    specs = []
    for name in names:
        spec = journal_spec(name, **labels)
        if stores:
            spec.fragment.length = 1024  # The minimum: a few appends roll and persist a fragment.
            spec.fragment.stores.append("file:///")
        specs.append(spec)
    assert apply_specs(stub, *specs, revision=-1).status == pb.OK  # -1: parametrized tests create again.
    for name in names:
        wait_for_primary(stub, name)


def record(journal: str, n: int, lines: int = 3) -> bytes:
    """One append: `lines` lines tagged with its journal and number, between begin and end lines."""
    body = "".join(f"{journal} {n} line {i}\n" for i in range(lines))
    return f"{journal} {n} begin\n{body}{journal} {n} end\n".encode()


def appends_of(output: bytes) -> list[tuple[str, int]]:
    """The (journal, number) of each append in `output`, asserting that each one is whole and uninterrupted."""
    found: list[tuple[str, int]] = []
    current: tuple[str, int] | None = None
    for line in output.decode().splitlines():
        journal, n, rest = line.split(" ", 2)
        tag = (journal, int(n))
        if rest == "begin":
            assert current is None, f"append {tag} began inside {current}"
            current = tag
        else:
            assert current == tag, f"line {line!r} outside its append (in {current})"
            if rest == "end":
                found.append(tag)
                current = None
    assert current is None, f"append {current} was cut short"
    return found


def read(broker: BrokerProcess, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    """`gazctl journals read ARGS`, with bytes output."""
    return run_gazctl(broker, "journals", "read", *args, input=b"", cwd=cwd)  # type: ignore[return-value]


def pty_read(broker: BrokerProcess, *args: str) -> tuple[subprocess.CompletedProcess[bytes], str]:
    """`gazctl journals read ARGS` with stderr on a pseudo-terminal; also return what the terminal got."""
    primary, secondary = pty.openpty()
    got = bytearray()

    def drain() -> None:
        while True:
            try:
                data = os.read(primary, 65536)
            except OSError:  # The terminal closed.
                return
            if not data:
                return
            got.extend(data)

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    env = {**gazctl_env(broker), "TERM": "xterm", "COLUMNS": "100"}
    env.pop("NO_COLOR", None)
    done = subprocess.run(
        [sys.executable, "-m", "gazctl", "journals", "read", *args], stdout=subprocess.PIPE, stderr=secondary,
        env=env, timeout=60,
    )
    os.close(secondary)
    thread.join(5)
    os.close(primary)
    return done, got.decode(errors="replace")


def start_reading(broker: BrokerProcess, *args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    """`gazctl journals read ARGS` left running in the background."""
    return subprocess.Popen(
        [sys.executable, "-m", "gazctl", "journals", "read", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=gazctl_env(broker, cwd), cwd=cwd,
    )


def test_read_one_journal(broker: BrokerProcess, stub: pb_grpc.JournalStub) -> None:
    create(stub, "read/one/j")
    content = record("read/one/j", 0) + record("read/one/j", 1)
    assert append(stub, "read/one/j", record("read/one/j", 0)).status == pb.OK
    assert append(stub, "read/one/j", record("read/one/j", 1)).status == pb.OK
    done = read(broker, "-l", "name=read/one/j")
    assert done.returncode == 0, done.stderr
    assert done.stdout == content
    assert done.stderr == b""  # Logs are at warn by default: nothing to say.


def test_many_journals_are_read_whole_and_never_interleaved(broker: BrokerProcess, stub: pb_grpc.JournalStub) -> None:
    names = [f"read/many/j{i}" for i in range(4)]
    create(stub, *names, topic="many")
    # Appends land concurrently, some spanning fragments of their own; one is bigger than gazctl buffers
    # (4 MiB), so that journal streams it straight out while the others wait for it to end.
    def write(name: str) -> None:
        for n in range(20):
            lines = 200_000 if (name, n) == (names[0], 10) else 2000 if n % 5 == 0 else 3
            assert append(stub, name, record(name, n, lines=lines)).status == pb.OK

    threads = [threading.Thread(target=write, args=(name,)) for name in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done = read(broker, "-l", "topic=many", "--log.level=info")
    assert done.returncode == 0, done.stderr
    found = appends_of(done.stdout)
    for name in names:
        assert [n for j, n in found if j == name] == list(range(20))  # Complete, and in order.
    assert done.stderr.decode().count("read started") == 4

    # On a terminal, stderr shows a progress bar of the journals read; stdout has the data alone.
    shown, bar = pty_read(broker, "-l", "topic=many")
    assert shown.returncode == 0 and sorted(appends_of(shown.stdout)) == sorted(found)
    assert "reading journals" in bar and "/4" in bar, bar


def test_tail_block_streams_new_appends_and_logs_the_resolved_offset(
    broker: BrokerProcess, stub: pb_grpc.JournalStub, tmp_path: Path
) -> None:
    create(stub, "read/tail/j")
    old = append(stub, "read/tail/j", b"old\n")
    head = old.commit.end
    offsets = tmp_path / "offsets.json"
    reads = read_rpcs(broker, "read/tail/j")
    reader = start_reading(
        broker, "-l", "name=read/tail/j", "--tail", "--block", "--log.level=debug", "--offsets-out", str(offsets)
    )
    try:
        out, logs = LineReader(reader.stdout), LineReader(reader.stderr)
        logs.wait_for(r"read started .*journal=read/tail/j offset=-1")
        # The broker resolves -1 to the write head when the Read RPC reaches it (and sends nothing until
        # content comes): append only once it did, or the ticks could land before the head it resolves.
        wait_for_process_read(broker, "read/tail/j", reads + 1, reader, logs.lines)
        for n in range(3):
            assert append(stub, "read/tail/j", f"tick {n}\n".encode()).status == pb.OK
            out.wait_for(rf"^tick {n}$")
        ready = logs.wait_for(r"read is ready")
        assert f"offset={head}" in ready and "journal=read/tail/j" in ready  # -1 resolved to the write head.
        assert re.search(r"fragment\.begin=\d+ fragment\.end=\d+ fragment\.url=", ready)
        assert "old\n" not in out.lines
        assert reader.poll() is None  # --block keeps reading at the write head.
    finally:
        reader.send_signal(signal.SIGTERM)
        rc = reader.wait(15)
    # SIGTERM ends the read cleanly, and saves where it stopped.
    assert rc == 0, logs.lines
    assert json.loads(offsets.read_text()) == {"read/tail/j": head + 3 * len(b"tick 0\n")}


def test_block_follows_journals_created_after_it_started(broker: BrokerProcess, stub: pb_grpc.JournalStub) -> None:
    create(stub, "read/late/a", topic="late")
    append(stub, "read/late/a", b"a before\n")
    reader = start_reading(broker, "-l", "topic=late", "--block", "--tail", "--log.level=info")
    try:
        out, logs = LineReader(reader.stdout), LineReader(reader.stderr)
        logs.wait_for(r"read started .*journal=read/late/a")
        create(stub, "read/late/b", topic="late")
        # Appended before the watch may have seen the journal: --tail still reads a new journal whole.
        assert append(stub, "read/late/b", b"b first\n").status == pb.OK
        logs.wait_for(r"read started .*journal=read/late/b offset=0")
        out.wait_for(r"^b first$")
        assert append(stub, "read/late/a", b"a after\n").status == pb.OK
        out.wait_for(r"^a after$")
        assert "a before\n" not in out.lines  # --tail: the journal existing at the start began at its head.
    finally:
        reader.send_signal(signal.SIGINT)
        assert reader.wait(15) == 0


def test_offsets_out_then_offsets_resume_exactly(
    broker: BrokerProcess, stub: pb_grpc.JournalStub, tmp_path: Path
) -> None:
    create(stub, "read/resume/a", "read/resume/b", topic="resume")
    append(stub, "read/resume/a", b"a1\n")
    append(stub, "read/resume/b", b"b1\nb2\n")
    offsets = tmp_path / "offsets.json"
    first = read(broker, "-l", "topic=resume", "--offsets-out", str(offsets))
    assert first.returncode == 0, first.stderr
    assert sorted(first.stdout.splitlines()) == [b"a1", b"b1", b"b2"]
    saved = json.loads(offsets.read_text())
    assert saved == {"read/resume/a": 3, "read/resume/b": 6}

    append(stub, "read/resume/a", b"a2\n")
    append(stub, "read/resume/b", b"b3\n")
    second = read(broker, "-l", "topic=resume", "--offsets", str(offsets), "--offsets-out", str(offsets))
    assert second.returncode == 0, second.stderr
    assert sorted(second.stdout.splitlines()) == [b"a2", b"b3"]  # No repeat, no gap.
    assert json.loads((tmp_path / "offsets.json.previous").read_text()) == saved
    assert offsets.read_text() == '{"read/resume/a":6,"read/resume/b":9}\n'  # Go's json.Encoder of a map.

    # Nothing new: nothing read, offsets unchanged; an -o file gets the (empty) output.
    third = read(broker, "-l", "name=read/resume/a", "--offsets", str(offsets), "-o", str(tmp_path / "out"),
                 "--offsets-out", str(tmp_path / "third.json"))
    assert third.returncode == 0, third.stderr
    assert third.stdout == b"" and (tmp_path / "out").read_bytes() == b""
    # Offsets of --offsets which were not read are carried through.
    assert json.loads((tmp_path / "third.json").read_text()) == {"read/resume/a": 6, "read/resume/b": 9}


def test_file_root_reads_persisted_fragments_directly(broker: BrokerProcess, stub: pb_grpc.JournalStub) -> None:
    assert broker.file_root is not None
    create(stub, "read/direct/j", stores=True)
    appends = [record("read/direct/j", n, lines=12) for n in range(8)]  # ~300 bytes each: fragments roll.
    for content in appends:
        assert append(stub, "read/direct/j", content).status == pb.OK
    deadline = time.monotonic() + 30
    while len(list((broker.file_root / "read/direct/j").glob("*"))) < 2:
        assert time.monotonic() < deadline, "no fragments were persisted"
        time.sleep(0.1)
    done = read(broker, "-l", "name=read/direct/j", "--file-root", str(broker.file_root), "--log.level=debug")
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"".join(appends)
    # Persisted fragments came by URL from the store, not through the broker.
    assert re.search(rb"read is ready .*fragment\.url=file:///read/direct/j/", done.stderr), done.stderr

    # --from skips fragments persisted before it: all of them, here.
    later = read(broker, "-l", "name=read/direct/j", "--from", str(int(time.time()) + 3600))
    assert later.returncode == 0, later.stderr
    assert b"".join(appends).endswith(later.stdout) and len(later.stdout) < len(done.stdout)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, r"cannot read --offsets .*offsets\.json"),
        ("{not json", r"--offsets .*offsets\.json is not JSON"),
        ("[1, 2]", r"--offsets .*offsets\.json must be a JSON object"),
        ('{"read/bad/j": -5}', r"journal 'read/bad/j' has offset -5; expected a non-negative integer"),
        ('{"read/bad/j": "7"}', r"journal 'read/bad/j' has offset \"7\""),
        ('{"read/bad/missing": 0}', r"--offsets .*offsets\.json names journal read/bad/missing which does not exist"),
    ],
)
def test_bad_offsets_fail_in_one_line(
    broker: BrokerProcess, stub: pb_grpc.JournalStub, tmp_path: Path, content: str | None, message: str
) -> None:
    create(stub, "read/bad/j")
    offsets = tmp_path / "offsets.json"
    if content is not None:
        offsets.write_text(content)
    done = read(broker, "-l", "name=read/bad/j", "--offsets", str(offsets), "--offsets-out", str(offsets))
    assert done.returncode == 1
    err = done.stderr.decode()
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert re.search(message, err), err
    if content is not None:
        assert offsets.read_text() == content  # A failed run leaves --offsets in place.


def test_fully_suspended_journals_are_skipped(broker: BrokerProcess, stub: pb_grpc.JournalStub) -> None:
    create(stub, "read/suspended/empty", "read/suspended/live", topic="suspended")
    # An empty journal suspends fully (FULL): it then has no replicas to read from.
    assert append(stub, "read/suspended/empty", suspend=AS.SUSPEND_IF_FLUSHED).status == pb.SUSPENDED
    append(stub, "read/suspended/live", b"live\n")
    done = read(broker, "-l", "topic=suspended", "--log.level=info")
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"live\n"
    assert b"journal=read/suspended/empty" not in done.stderr  # Not even started.


def test_selector_is_required(broker: BrokerProcess) -> None:
    done = read(broker)
    assert done.returncode == 1 and b"--selector (-l) is required" in done.stderr
