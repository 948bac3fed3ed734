"""`gazctl journals fragments` and `prune`, run as a user runs them against a real broker with a file:// store."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time

import pytest
from google.protobuf import text_format

from broker.protocol import pb, pb_grpc
from tests.support.harness import (
    BrokerProcess,
    append,
    apply_specs,
    journal_spec,
    one_line_error,
    run_gazctl,
    table_rows,
    wait_for_primary,
)

CHUNKS = [b"a" * 43, b"b" * 1100, b"c" * 100]
"""Appends: the first is persisted at once (first-write rule), the second rolls at length 1024, the third
(under the length) stays local."""


def _spec(name: str, retention: int = 0) -> pb.JournalSpec:
    spec = journal_spec(name)
    spec.fragment.length = 1024
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.seconds = 1
    spec.fragment.retention.seconds = retention
    return spec


def _append(stub: pb_grpc.JournalStub, journal: str, data: bytes) -> None:
    resp = append(stub, journal, data)
    assert resp.status == pb.OK, resp


def _wait_persisted(
    stub: pb_grpc.JournalStub, journal: str, count: int, modified_before: float | None = None, timeout: float = 20.0
) -> None:
    """Block until the broker's listing holds `count` persisted fragments of `journal` (modified
    before `modified_before`, if given: a refresh of the listing shows a changed mod_time)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        resp = stub.ListFragments(pb.FragmentsRequest(journal=journal))
        persisted = [f for f in resp.fragments if f.spec.backing_store]
        if modified_before is not None:
            persisted = [f for f in persisted if f.spec.mod_time < modified_before]
        if len(persisted) == count:
            return
        time.sleep(0.1)
    older = f" modified before {modified_before}" if modified_before is not None else ""
    raise TimeoutError(f"{journal} has no {count} persisted fragments{older}: {resp}")


def _ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, done.stderr
    return done



@pytest.fixture(scope="module")
def listed(broker: BrokerProcess, stub: pb_grpc.JournalStub) -> str:
    """Journal `frags/a` with two persisted fragments and a local one; and an empty `frags/empty`."""
    assert apply_specs(stub, _spec("frags/a"), _spec("frags/empty")).status == pb.OK
    wait_for_primary(stub, "frags/a")
    for chunk in CHUNKS:
        _append(stub, "frags/a", chunk)
    _wait_persisted(stub, "frags/a", 2)
    return "frags/a"


def test_table(broker: BrokerProcess, listed: str) -> None:
    rows = table_rows(_ok(run_gazctl(broker, "journals", "fragments", "-l", "prefix=frags/")).stdout)
    assert rows[0] == ["JOURNAL", "OFFSET", "LENGTH", "PERSISTED", "SHA 1", "COMPRESSION"]
    body = rows[1:]
    assert [r[:3] for r in body] == [[listed, "0", "43 B"], [listed, "43", "1.1 KiB"], [listed, "1143", "100 B"]]
    for row, chunk in zip(body, CHUNKS, strict=True):
        assert row[4] == hashlib.sha1(chunk).hexdigest()[:12] + "..."
        assert row[5] == "NONE"
    assert all(r[3] == "now" or r[3].endswith("ago") for r in body[:2]), body
    assert body[2][3] == ""  # Not yet persisted.


def test_json_and_proto(broker: BrokerProcess, listed: str) -> None:
    lines = _ok(run_gazctl(broker, "journals", "fragments", "-l", f"name={listed}", "-o", "json")).stdout.splitlines()
    docs = [json.loads(line) for line in lines]
    # Go's encoding/json of the struct: empty fields (`omitempty`) are left out, as in Gazette.
    assert [list(d) for d in docs] == [["spec"]] * 3
    assert list(docs[0]["spec"]) == ["journal", "end", "sum", "compression_codec", "backing_store", "mod_time"]
    assert list(docs[2]["spec"]) == ["journal", "begin", "end", "sum", "compression_codec"]
    spans = [(d["spec"].get("begin"), d["spec"]["end"], d["spec"].get("backing_store")) for d in docs]
    assert spans == [(None, 43, "file:///"), (43, 1143, "file:///"), (1143, 1243, None)]
    assert docs[0]["spec"]["mod_time"] > 0

    text = _ok(run_gazctl(broker, "journals", "fragments", "-l", f"name={listed}", "-o", "proto")).stdout
    resp = text_format.Parse(text, pb.FragmentsResponse())
    assert [(f.spec.begin, f.spec.end) for f in resp.fragments] == [(0, 43), (43, 1143), (1143, 1243)]
    assert resp.header.process_id.suffix == broker.broker_id


def test_url_ttl(broker: BrokerProcess, listed: str) -> None:
    done = _ok(run_gazctl(broker, "journals", "fragments", "-l", f"name={listed}", "--url-ttl", "1h"))
    rows = table_rows(done.stdout)
    assert rows[0][-1] == "URL"
    urls = [r[-1] for r in rows[1:]]
    assert urls[0].startswith(f"file:///{listed}/0000000000000000-000000000000002b-")
    assert urls[1].startswith(f"file:///{listed}/000000000000002b-0000000000000477-")
    assert urls[2] == ""
    one_line_error(run_gazctl(broker, "journals", "fragments", "--url-ttl", "soon"), "--url-ttl")


def test_from_to(broker: BrokerProcess, listed: str) -> None:
    def begins(*args: str) -> list[str]:
        out = _ok(run_gazctl(broker, "journals", "fragments", "-l", f"name={listed}", *args)).stdout
        return [r[1] for r in table_rows(out)[1:]]

    future = str(int(time.time()) + 3600)
    assert begins("--to", future) == ["0", "43"]  # With --to, fragments not yet persisted are left out.
    assert begins("--from", future) == ["1143"]
    assert begins("--from", "1", "--to", "2") == []
    one_line_error(run_gazctl(broker, "journals", "fragments", "--from", "5", "--to", "2"), "--to 2 is before --from 5")


def test_prune(broker: BrokerProcess, stub: pb_grpc.JournalStub) -> None:
    journal = "prune/a"
    assert broker.file_root is not None
    assert apply_specs(stub, _spec(journal, retention=3600)).status == pb.OK
    wait_for_primary(stub, journal)
    for chunk in CHUNKS:
        _append(stub, journal, chunk)
    _append(stub, journal, b"d" * 1000)
    _append(stub, journal, b"e" * 10)  # Rolls and persists [1143, 2243).
    _wait_persisted(stub, journal, 3)
    directory = broker.file_root / journal
    before = sorted(p.name for p in directory.iterdir())
    assert len(before) == 3
    # The two oldest are made two hours old (the file store's mod_time is the file's), the third
    # stays younger than the hour of retention however slowly the rest of the test runs.
    aged = time.time() - 7200
    for name in before[:2]:
        os.utime(directory / name, (aged, aged))
    _wait_persisted(stub, journal, 2, modified_before=aged + 1)

    dry = _ok(run_gazctl(broker, "journals", "prune", "-l", f"name={journal}", "--dry-run", "--log.level", "info"))
    lines = [line.split("\t") for line in dry.stdout.splitlines()]
    assert [(line[0], line[1], line[2]) for line in lines] == [
        ("would prune", journal, before[0]), ("would prune", journal, before[1])]
    assert "fragmentsPruned=2" in dry.stderr and "fragmentsKept=2" in dry.stderr
    assert sorted(p.name for p in directory.iterdir()) == before

    one_line_error(run_gazctl(broker, "journals", "prune", "-l", f"name={journal}"), journal, "--file-root")
    assert sorted(p.name for p in directory.iterdir()) == before

    done = _ok(run_gazctl(broker, "journals", "prune", "-l", f"name={journal}", "--file-root", str(broker.file_root)))
    assert done.stderr == ""  # Logs are at info level.
    assert [line.split("\t")[:3] for line in done.stdout.splitlines()] == [
        ["pruned", journal, before[0]], ["pruned", journal, before[1]]]
    assert sorted(p.name for p in directory.iterdir()) == [before[2]]
    _wait_persisted(stub, journal, 1)  # The next refresh drops them from the index.

    # Without a retention a journal keeps everything (unlike Gazette's prune, which deletes it all).
    keep = "prune/keep"
    assert apply_specs(stub, _spec(keep, retention=0)).status == pb.OK
    wait_for_primary(stub, keep)
    _append(stub, keep, b"k" * 100)
    # The next append closes the journal's first fragment (so that it persists promptly). One append
    # alone may not: when the broker's first pulse of the journal came first, that pulse was the
    # journal's first append, and the next pulse is a minute away.
    _append(stub, keep, b"k" * 10)
    _wait_persisted(stub, keep, 1)
    kept = _ok(run_gazctl(broker, "journals", "prune", "-l", f"name={keep}", "--file-root", str(broker.file_root)))
    assert kept.stdout == "" and len(list((broker.file_root / keep).iterdir())) == 1

    one_line_error(run_gazctl(broker, "journals", "prune", "-l", "name=prune/none"), "no journals match")
    one_line_error(run_gazctl(broker, "journals", "prune"), "--selector")
