"""README.md's Quick start, Tutorial and gazctl example, replayed word for word.

The commands are read from README.md itself: the `gazette serve` of the Quick start's ```sh block,
every ```sh block of the Tutorial section and the gazctl section's example block. Each command runs
in bash, as a user would type it, with only the broker's port substituted for 8080, in a working
directory that mirrors the repository root (so `examples/journals.yaml` resolves) and holds the
broker's `./gazette-data`. `gazctl`, `gazette` and `curl` are the ones on PATH (this environment's
console scripts first); `$BROKER_ADDRESS` names the broker, and HOME is a temporary directory, so no
user configuration leaks in. After each block the test checks what the README says it shows.

The broker uses the session's etcd (`$ETCD_ADDRESS`, under a keyspace root of its own) rather than
embedding one on port 2379; `tests/broker/test_serve.py` covers the embedded etcd.

Gazette's own broker tutorial, through gazctl, is `tests/gazctl/test_walkthrough.py`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from broker.protocol import pb, pb_grpc
from tests.support.harness import ROOT, free_port, table_rows

README = ROOT / "README.md"
README_PORT = "8080"
FRAGMENT_NAME = re.compile(r"[0-9a-f]{16}-[0-9a-f]{16}-[0-9a-f]{40}\.sz")
FIRST_FRAGMENT_DEADLINE = 30.0
"""Seconds within which the journal's first fragment is persisted after its first append. It is closed
within a second (the README says), then compressed and written to the store: the bound leaves a slow,
loaded host its time for that, and still tells the rule from the alternative, which is the hour of
examples/journals.yaml's flush_interval."""


def readme_sections(text: str) -> dict[str, str]:
    """README.md's `## ` sections by heading."""
    sections: dict[str, str] = {}
    heading = ""
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            heading = line[3:].strip()
            sections[heading] = ""
        elif heading:
            sections[heading] += line
    return sections


def sh_blocks(section: str) -> list[str]:
    """The bodies of a section's ```sh code blocks."""
    return re.findall(r"^```sh\n(.*?)^```\s*$", section, re.MULTILINE | re.DOTALL)


@dataclass
class Command:
    """One command line of a block, and the `# ...` lines that follow it (the output the README shows)."""

    text: str
    shown: list[str] = field(default_factory=list)


def commands(block: str) -> list[Command]:
    out: list[Command] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            assert out, f"a comment before any command in {block!r}"
            out[-1].shown.append(line.lstrip("#").strip())
        else:
            assert not line.endswith("\\"), f"continued lines are not replayed: {line!r}"
            out.append(Command(line))
    return out


@dataclass
class Ran:
    command: str
    returncode: int
    stdout: bytes
    stderr: str
    responses: list[tuple[int, dict[str, str]]]
    """Status and headers (lower-cased names) of each HTTP response curl received."""

    def ok(self) -> Ran:
        assert self.returncode == 0, f"{self.command!r} exited {self.returncode}: {self.stderr}"
        return self

    @property
    def text(self) -> str:
        return self.stdout.decode()

    @property
    def headers(self) -> dict[str, str]:
        assert len(self.responses) == 1, f"{self.command!r}: responses {self.responses!r}"
        return self.responses[0][1]


def parse_dumped_headers(dump: str) -> list[tuple[int, dict[str, str]]]:
    """curl's `--dump-header` file: one status line and headers per response."""
    responses: list[tuple[int, dict[str, str]]] = []
    for line in dump.splitlines():
        if line.startswith("HTTP/"):
            responses.append((int(line.split()[1]), {}))
        elif ":" in line and responses:
            name, value = line.split(":", 1)
            responses[-1][1][name.strip().lower()] = value.strip()
    return responses


class Background:
    """A command left running, as in another terminal; its stdout collected by a thread."""

    def __init__(self, command: str, proc: subprocess.Popen[bytes], dump: Path) -> None:
        self.command, self.proc, self.dump = command, proc, dump
        self.out = b""
        self._cond = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        while chunk := self.proc.stdout.read1(65536):
            with self._cond:
                self.out += chunk
                self._cond.notify_all()

    def wait_for(self, done: Callable[[bytes], bool], timeout: float = 15.0) -> bytes:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not done(self.out):
                left = deadline - time.monotonic()
                assert left > 0, f"{self.command!r} printed only {self.out!r}"
                self._cond.wait(left)
            return self.out

    def responses(self) -> list[tuple[int, dict[str, str]]]:
        return parse_dumped_headers(self.dump.read_text()) if self.dump.exists() else []

    def stop(self) -> None:
        """Interrupt it, as Ctrl-C would: the whole process group."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


class Shell:
    """Runs README command lines in bash, in `cwd`, with 8080 replaced by `port`."""

    def __init__(self, cwd: Path, env: dict[str, str], port: int) -> None:
        self.cwd, self.env, self.port = cwd, env, port
        self._n = 0

    def _prepare(self, command: str, env: dict[str, str] | None = None) -> tuple[str, dict[str, str], Path]:
        """The command with the port substituted, and an environment whose curl config (`$CURL_HOME/.curlrc`)
        dumps response headers to a file of this run, so that the command itself stays word for word."""
        self._n += 1
        curl_home = self.cwd.parent / "curl" / str(self._n)
        curl_home.mkdir(parents=True)
        dump = curl_home / "headers"
        (curl_home / ".curlrc").write_text(f'dump-header = "{dump}"\n')
        env = {**self.env, **(env or {}), "CURL_HOME": str(curl_home)}
        return command.replace(README_PORT, str(self.port)), env, dump

    def run(self, command: str, timeout: float = 60.0) -> Ran:
        text, env, dump = self._prepare(command)
        done = subprocess.run(["bash", "-c", text], cwd=self.cwd, env=env, capture_output=True, timeout=timeout)
        responses = parse_dumped_headers(dump.read_text()) if dump.exists() else []
        return Ran(text, done.returncode, done.stdout, done.stderr.decode(errors="replace"), responses)

    def start(self, command: str, log: Path | None = None, env: dict[str, str] | None = None) -> Background:
        """`command` in the background, with `env` on top of the shell's environment and stderr to `log`."""
        text, env, dump = self._prepare(command, env)
        with open(log or os.devnull, "wb") as stderr:  # The child keeps its own descriptor.
            proc = subprocess.Popen(
                ["bash", "-c", text], cwd=self.cwd, env=env, start_new_session=True,
                stdout=subprocess.PIPE, stderr=stderr,
            )
        return Background(text, proc, dump)


def read_rpcs(port: int, journal: str = "example/journal") -> int:
    """The broker's count of Read RPCs of `journal` (its /debug/metrics)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found = re.search(rf'^gazette_read_requests_total{{journal="{re.escape(journal)}"}} (\S+)$', text, re.MULTILINE)
    return int(float(found.group(1))) if found else 0


def wait_until(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} within {timeout}s"
        time.sleep(0.1)


@dataclass
class Tutorial:
    shell: Shell
    workdir: Path
    quick_start: list[str]
    """The Quick start's command, split at `&&`."""
    blocks: list[list[Command]]
    """The Tutorial section's ```sh blocks."""
    gazctl_block: list[Command]
    """The gazctl section's example block."""


@pytest.fixture(scope="module")
def tutorial(etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tutorial]:
    """README.md's commands, and a broker started as its Quick start says, in a working directory that
    links every top-level entry of the repository but its own `gazette-data`."""
    for tool in ("bash", "curl"):
        if not shutil.which(tool):
            pytest.skip(f"the README's commands need {tool}")
    sections = readme_sections(README.read_text())
    (quick_start, _tests) = sh_blocks(sections["Quick start"])
    tutorial_blocks = [commands(b) for b in sh_blocks(sections["Tutorial"])]
    (gazctl_block,) = [commands(b) for b in sh_blocks(sections["gazctl"])]
    (install_and_serve,) = commands(quick_start)

    tmp = tmp_path_factory.mktemp("readme")
    workdir, home = tmp / "repo", tmp / "home"
    workdir.mkdir()
    home.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in (".git", "gazette-data"):
            (workdir / entry.name).symlink_to(entry)
    scripts = Path(sys.executable).parent  # Where `pip install -e .` put this environment's gazctl and gazette.
    drop = ("BROKER_", "ETCD_", "LOG_", "XDG_", "CURL_HOME", "BASH_ENV", "ENV", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(
        HOME=str(home), PATH=os.pathsep.join([str(scripts), env.get("PATH", "")]),
        PYTHONPATH=str(ROOT),  # The console scripts run this checkout, whatever the editable install points at.
    )
    for tool in ("gazctl", "gazette"):
        assert shutil.which(tool, path=env["PATH"]), f"no {tool} on PATH: `pip install -e .` installs it"
    port = free_port()
    env["BROKER_ADDRESS"] = f"http://localhost:{port}"  # gazctl's default is http://localhost:8080.
    shell = Shell(workdir, env, port)

    # The Quick start: skip the install (this environment is installed), run the rest; `gazette serve` stays up.
    steps = [s.strip() for s in install_and_serve.text.split("&&")]
    assert steps[0].startswith("python3 -m pip install"), steps
    serve = steps[-1]
    assert serve.startswith("gazette serve "), steps
    for step in steps[1:-1]:
        shell.run(step).ok()
    log = tmp / "broker.log"
    # One broker process (the default is one per core): tests/broker/test_serve_processes.py runs several.
    etcd = {"ETCD_ADDRESS": etcd_endpoint, "ETCD_PREFIX": f"/test/{uuid.uuid4().hex}", "BROKER_PROCESSES": "1"}
    broker = shell.start(serve, log=log, env=etcd)
    try:
        def ready() -> bool:
            assert broker.proc.poll() is None, f"{serve!r} exited {broker.proc.returncode}:\n{log.read_text()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/ready", timeout=1) as resp:
                    return bool(resp.status == 200)
            except OSError:
                return False

        wait_until("the broker is ready", ready, 30.0)
        yield Tutorial(shell, workdir, steps, tutorial_blocks, gazctl_block)
    finally:
        if broker.proc.poll() is None:
            os.killpg(broker.proc.pid, signal.SIGTERM)
        rc = broker.proc.wait(30)
        assert rc == 0, f"the broker exited {rc}:\n{log.read_text()}"


def test_readme_tutorial(tutorial: Tutorial) -> None:
    shell = tutorial.shell
    assert [len(block) for block in tutorial.blocks] == [2, 1, 2, 1, 1], "the Tutorial's blocks changed shape"
    apply_and_list, (put,), (get_all, get_from_16), (follow,), (ls,) = tutorial.blocks

    # The Quick start made the fragment store the broker serves from.
    assert "mkdir -p gazette-data" in tutorial.quick_start
    assert (tutorial.workdir / "gazette-data").is_dir()

    # Apply the example journalspace, then list it: one journal, example/journal.
    assert apply_and_list[0].text.startswith("gazctl journals apply ")
    shell.run(apply_and_list[0].text).ok()
    listed = shell.run(apply_and_list[1].text).ok()
    rows = table_rows(listed.text)
    assert rows and rows[0][0] == "NAME", listed.text
    assert [row[0] for row in rows[1:]] == ["example/journal"], listed.text
    # Applied specs expect to create their journals: applying the same file again is refused.
    again = shell.run(apply_and_list[0].text)
    assert again.returncode == 1 and "ETCD_TRANSACTION_FAILED" in again.stderr, (again.returncode, again.stderr)

    # One atomic append of two lines over HTTP PUT: 204, with the commit's headers.
    content = shell.run(put.text.split(" | ")[0]).ok().stdout  # What the PUT pipes into curl.
    assert content.splitlines() == [b"Hello, Gazette!", b"Second line."]
    appended = shell.run(put.text).ok()
    status, headers = appended.responses[-1]
    assert status == 204 and appended.stdout == b"", (status, appended.stdout)
    assert headers["x-commit-begin"] == "0"
    assert headers["x-commit-end"] == str(len(content)) == headers["x-write-head"]
    assert headers["x-commit-sha1-sum"] == hashlib.sha1(content).hexdigest()
    # "The journal's first fragment is closed after its first append" and persisted under the file root.
    fragments = tutorial.workdir / "gazette-data" / "example" / "journal"
    wait_until("the first fragment is persisted", lambda: bool(list(fragments.glob("*.sz"))), FIRST_FRAGMENT_DEADLINE)

    # Read it all back, or from byte offset 16.
    whole = shell.run(get_all.text).ok()
    assert whole.stdout == content
    tail = shell.run(get_from_16.text).ok()
    assert tail.stdout == b"Second line.\n"
    for read in (whole, tail):
        status, headers = read.responses[-1]
        assert status == 206, status
        assert {"content-range", "x-write-head", "x-fragment-name"} <= headers.keys(), headers
        assert headers["x-write-head"] == str(len(content))
    assert tail.headers["content-range"].startswith("bytes 16-")
    # The same journal over gRPC, on the same port.
    with grpc.insecure_channel(f"127.0.0.1:{shell.port}") as channel:
        stub = pb_grpc.JournalStub(channel)
        for offset in (0, 16):
            read = b"".join(r.content for r in stub.Read(pb.ReadRequest(journal="example/journal", offset=offset)))
            assert read == content[offset:]

    # Follow the journal: nothing until an append commits, then each append as it commits.
    reads = read_rpcs(shell.port)
    follower = shell.start(follow.text)
    try:
        # A blocking read at the write head answers nothing before content: wait until it reaches the broker.
        wait_until("the follow request reaches the broker", lambda: read_rpcs(shell.port) > reads, 15.0)
        time.sleep(0.2)
        assert follower.out == b""
        for n in (1, 2):
            again = shell.run(put.text).ok()  # The README's PUT, once more.
            assert again.responses[-1][1]["x-commit-begin"] == str(n * len(content))
            follower.wait_for(lambda out, n=n: len(out) >= n * len(content))  # type: ignore[misc]
        time.sleep(0.2)
        assert follower.out == content * 2  # Only what was appended after it started, at the write head.
        assert follower.proc.poll() is None  # It keeps following.
        status, headers = follower.responses()[-1]
        assert status == 206 and headers["content-range"].startswith(f"bytes {len(content)}-"), (status, headers)
    finally:
        follower.stop()

    # The first fragment's file: <begin>-<end>-<sha1>.sz, covering the first append.
    assert len(ls.shown) == 1, ls.shown
    shown = ls.shown[0]
    assert shown.endswith(" ..."), shown
    expected = re.escape(shown.removesuffix(" ...")).replace(re.escape("<sha1>"), "(?P<sha1>[0-9a-f]{40})")
    listing = shell.run(ls.text).ok().text.split()
    assert listing and all(FRAGMENT_NAME.fullmatch(name) for name in listing), listing
    first = re.fullmatch(expected, listing[0])
    assert first, (expected, listing)
    assert first["sha1"] == hashlib.sha1(content).hexdigest()
    assert int(listing[0][17:33], 16) == len(content)

    # The gazctl section's example.
    append, read, fragments_cmd, list_primary = tutorial.gazctl_block
    shell.run(append.text).ok()
    reader = shell.start(read.text)
    try:
        line = b'{"Msg": "Hello, Gazctl!"}\n'
        out = reader.wait_for(lambda out: out.endswith(line))
        assert out == content * 3 + line  # From the beginning of the journal.
        time.sleep(0.2)
        assert reader.proc.poll() is None  # --block: it waits at the write head for more.
    finally:
        reader.stop()
    rows = table_rows(shell.run(fragments_cmd.text).ok().text)
    assert rows[0] == ["JOURNAL", "OFFSET", "LENGTH", "PERSISTED", "SHA 1", "COMPRESSION"], rows
    sha1 = hashlib.sha1(content).hexdigest()
    assert rows[1] == ["example/journal", "0", f"{len(content)} B", rows[1][3], f"{sha1[:12]}...", "SNAPPY"], rows
    assert rows[1][3].endswith(" ago"), rows  # The first fragment is persisted: PERSISTED is its age.
    rows = table_rows(shell.run(list_primary.text).ok().text)
    assert rows[0] == ["NAME", "PRIMARY"] and len(rows) == 2, rows
    assert rows[1][0] == "example/journal" and rows[1][1] not in ("", "<none>"), rows
