"""The gazctl walkthrough: Gazette's broker tutorial ("Brokers: A Tutorial Introduction"), word for
word, through gazctl and curl.

One module-scoped broker with a `file://` store; the steps run in order, as a user types them,
and each checks what the tutorial shows. `gazctl` finds the broker through
`~/.config/gazette/gazctl.ini`, as in the tutorial (HOME is a temporary directory). This README's
own Quick start, Tutorial and gazctl example (a gazctl append then a blocking read from the
beginning) are replayed by `tests/test_readme.py`.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from ruamel.yaml import YAML

from tests.support.harness import BrokerProcess, LineReader, gazctl_env, run_gazctl, table_rows
from tests.support.journals import read_rpcs, wait_for_process_read

EXAMPLE_SPEC = """\
name: example/journal
replication: 1
labels:
- name: app.gazette.dev/message-type
  value: TestMessage
- name: app.gazette.dev/region
  value: local
- name: app.gazette.dev/tag
  value: demo
- name: content-type
  value: application/x-ndjson
fragment:
  length: 131072
  compression_codec: SNAPPY
  stores:
  - file:///
  refresh_interval: 1m0s
"""

FOOBAR_TREE = """\
name: foobar/
replication: 1
labels:
- name: content-type
  value: application/x-ndjson
- name: my-label
fragment:
  length: 4096
  compression_codec: GZIP
  stores:
  - file:///
  refresh_interval: 1m0s
  flush_interval: 1m0s
children:
  - name: foobar/part-000
  - name: foobar/part-001
  - name: foobar/part-002
"""


@pytest.fixture(scope="module")
def home(broker: BrokerProcess, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A HOME whose gazctl.ini names the broker, as the tutorial's `cat > ~/.config/gazette/gazctl.ini`."""
    home = tmp_path_factory.mktemp("home")
    (home / ".config" / "gazette").mkdir(parents=True)
    (home / ".config" / "gazette" / "gazctl.ini").write_text(f"[journals.Broker]\nAddress = {broker.url}\n")
    return home


def gazctl(home: Path, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """`gazctl ARGS` configured only by the INI file under `home` (no $BROKER_ADDRESS)."""
    return run_gazctl(None, *args, input=input, cwd=home)


def gazctl_process(home: Path, *args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    """`gazctl ARGS` left running, as `gazctl` would be in another terminal."""
    return subprocess.Popen(
        [sys.executable, "-m", "gazctl", *args], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=home, env=gazctl_env(cwd=home),
    )


def curl(method: str, url: str, data: bytes | None = None) -> bytes:
    """`curl -s [-X PUT --data-binary @-] URL`; http.client where curl is not installed."""
    if shutil.which("curl"):
        args = ["curl", "-sf", url] if method == "GET" else ["curl", "-sf", "-X", method, "--data-binary", "@-", url]
        return subprocess.run(args, input=data, capture_output=True, check=True, timeout=30).stdout
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=30)
    conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), body=data)
    resp = conn.getresponse()
    body = resp.read()
    assert resp.status == 200, (resp.status, body)
    return body


def names(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert done.returncode == 0, done.stderr
    return [row[0] for row in table_rows(done.stdout)[1:]]


@pytest.fixture(scope="module")
def example(broker: BrokerProcess, home: Path) -> Iterator[str]:
    applied = gazctl(home, "journals", "apply", input=EXAMPLE_SPEC)
    assert applied.returncode == 0, applied.stderr
    yield f"{broker.url}/example/journal"


def test_01_first_appends_and_reads(example: str) -> None:
    curl("PUT", example, b'{"Msg": "Hello, Gazette!"}\n{"Msg": "See you later alligator"}\n')
    assert curl("GET", example) == b'{"Msg": "Hello, Gazette!"}\n{"Msg": "See you later alligator"}\n'
    assert curl("GET", f"{example}?offset=16") == b'Gazette!"}\n{"Msg": "See you later alligator"}\n'


def test_02_concurrent_appends_land_whole(example: str) -> None:
    threads = [
        threading.Thread(target=curl, args=("PUT", example, f'{{"Msg": "Race!", "N": {i}}}\n'.encode()))
        for i in range(1, 21)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    docs = [json.loads(line) for line in curl("GET", example).splitlines()]
    assert sorted(d["N"] for d in docs if d["Msg"] == "Race!") == list(range(1, 21))


def test_03_streamed_lines_followed_by_a_tailing_debug_read(example: str, home: Path, broker: BrokerProcess) -> None:
    head = len(curl("GET", example))
    reads = read_rpcs(broker, "example/journal")
    writer = gazctl_process(
        home, "journals", "append", "-l", "name=example/journal", "--framing=lines", stdin=subprocess.PIPE
    )
    reader = gazctl_process(home, "journals", "read", "-l", "name=example/journal", "--tail", "--block",
                            "--log.level=debug")
    try:
        assert writer.stdin is not None
        out, logs = LineReader(reader.stdout), LineReader(reader.stderr)
        logs.wait_for(r"read started")
        # --tail reads from the write head as of when the Read RPC reaches the broker: lines are written
        # only once it did (a slow host's gazctl takes its time to get there).
        wait_for_process_read(broker, "example/journal", reads + 1, reader, logs.lines)
        for n in range(3):
            time.sleep(0.3)
            writer.stdin.write(f'{{"Msg": "tick {n}"}}\n')
            writer.stdin.flush()
            out.wait_for(rf'"tick {n}"')
        # --tail started at the write head: nothing appended before it is printed.
        assert not any("Hello" in line or "Race" in line for line in out.lines)
        ready = logs.wait_for(r"read is ready")
        resolved = int(re.search(r"\boffset=(\d+)", ready).group(1))  # type: ignore[union-attr]
        assert resolved >= head  # -1 resolved to an explicit offset at the write head.
        assert re.search(r"fragment\.begin=\d+", ready) and re.search(r"fragment\.end=\d+", ready)
    finally:
        assert writer.stdin is not None
        writer.stdin.close()
        assert writer.wait(20) == 0, writer.stderr.read() if writer.stderr else ""
        reader.terminate()
        reader.wait(10)


def test_04_fragments_table(example: str, home: Path, broker: BrokerProcess) -> None:
    assert broker.file_root is not None
    # The journal's first fragment closed after its first append and was persisted.
    deadline = time.monotonic() + 30
    while not list(broker.file_root.glob("example/journal/*.sz")):
        assert time.monotonic() < deadline, "no fragment persisted"
        time.sleep(0.2)
    listed = gazctl(home, "journals", "fragments", "-l", "name=example/journal")
    assert listed.returncode == 0, listed.stderr
    rows = table_rows(listed.stdout)
    assert rows[0] == ["JOURNAL", "OFFSET", "LENGTH", "PERSISTED", "SHA 1", "COMPRESSION"]
    assert rows[1][:2] == ["example/journal", "0"] and rows[1][3] != ""  # Persisted: an age.
    assert all(re.fullmatch(r"[0-9a-f]{12}\.\.\.", r[4]) and r[5] == "SNAPPY" for r in rows[1:])
    offsets = [int(r[1]) for r in rows[1:]]
    assert offsets == sorted(offsets)


def test_05_list_primary(example: str, home: Path, broker: BrokerProcess) -> None:
    listed = gazctl(home, "journals", "list", "--primary")
    assert listed.returncode == 0, listed.stderr
    assert table_rows(listed.stdout) == [["NAME", "PRIMARY"], ["example/journal", broker.broker_id]]


def test_06_list_yaml_then_apply_a_modified_spec(example: str, home: Path) -> None:
    listed = gazctl(home, "journals", "list", "--format", "yaml")
    assert listed.returncode == 0, listed.stderr
    doc = YAML(typ="safe").load(listed.stdout)
    revision = doc.pop("revision")
    assert revision > 0
    assert doc == YAML(typ="safe").load(EXAMPLE_SPEC)

    modified = listed.stdout.replace("length: 131072", "length: 131073").replace("SNAPPY", "GZIP")
    applied = gazctl(home, "journals", "apply", "--log.level=info", input=modified)
    assert applied.returncode == 0, applied.stderr
    assert "successfully applied" in applied.stderr
    relisted = YAML(typ="safe").load(gazctl(home, "journals", "list", "--format", "yaml").stdout)
    assert relisted["fragment"]["compression_codec"] == "GZIP" and relisted["revision"] > revision

    stale = gazctl(home, "journals", "apply", input=modified)
    assert stale.returncode == 1 and stale.stderr.count("\n") == 1
    assert "ETCD_TRANSACTION_FAILED" in stale.stderr


def test_07_apply_foobar_tree(example: str, home: Path, broker: BrokerProcess) -> None:
    applied = gazctl(home, "journals", "apply", input=FOOBAR_TREE)
    assert applied.returncode == 0, applied.stderr
    deadline = time.monotonic() + 20
    while True:
        rows = table_rows(gazctl(home, "journals", "list", "--primary").stdout)
        if all(row[1] != "<none>" for row in rows[1:]) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert rows == [
        ["NAME", "PRIMARY"],
        ["example/journal", broker.broker_id],
        ["foobar/part-000", broker.broker_id],
        ["foobar/part-001", broker.broker_id],
        ["foobar/part-002", broker.broker_id],
    ]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("prefix=example/", ["example/journal"]),
        ("prefix=foobar/", ["foobar/part-000", "foobar/part-001", "foobar/part-002"]),
        ("app.gazette.dev/message-type=TestMessage", ["example/journal"]),
        ("my-label", ["foobar/part-000", "foobar/part-001", "foobar/part-002"]),
        ("name in (example/journal, foobar/part-001)", ["example/journal", "foobar/part-001"]),
        ("prefix=foobar/, name not in (foobar/part-001)", ["foobar/part-000", "foobar/part-002"]),
    ],
)
def test_08_label_selectors(example: str, home: Path, selector: str, expected: list[str]) -> None:
    assert names(gazctl(home, "journals", "list", "-l", selector)) == expected
