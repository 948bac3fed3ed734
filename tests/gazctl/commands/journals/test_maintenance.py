"""`gazctl journals reset-head`, `suspend` and `store-health`, run as a user runs them against a real broker."""

from __future__ import annotations

import hashlib
import subprocess
import time

from broker.protocol import pb, pb_grpc
from tests.support.harness import (
    BrokerProcess,
    append,
    apply_specs,
    journal_spec,
    one_line_error,
    run_gazctl,
    wait_for_primary,
)

UNREACHABLE_S3 = "s3://nobucket/?endpoint=http%3A%2F%2F127.0.0.1%3A1"


def _spec(name: str) -> pb.JournalSpec:
    spec = journal_spec(name)
    spec.fragment.stores.append("file:///")
    spec.fragment.refresh_interval.seconds = 1
    return spec


def _suspend_level(stub: pb_grpc.JournalStub, journal: str) -> int:
    sel = pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name="name", value=journal)]))
    for resp in stub.List(pb.ListRequest(selector=sel)):
        for j in resp.journals:
            return int(j.spec.suspend.level)
    raise AssertionError(f"{journal} not listed")


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stderr



def _gazctl(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return run_gazctl(broker, "journals", *args, "--log.level", "info")


def test_reset_head_healthy_journal_is_a_no_op(broker: BrokerProcess, stub: pb_grpc.JournalStub) -> None:
    assert apply_specs(stub, _spec("maint/healthy")).status == pb.OK
    wait_for_primary(stub, "maint/healthy")
    assert append(stub, "maint/healthy", b"0123456789").status == pb.OK
    stderr = _ok(_gazctl(broker, "reset-head", "-l", "name=maint/healthy"))
    assert "reset write head to 10 journal=maint/healthy" in stderr, stderr
    assert append(stub, "maint/healthy", b"more").commit.begin == 10
    one_line_error(run_gazctl(broker, "journals", "reset-head"), "--selector")


def test_reset_head_clears_index_has_greater_offset(broker: BrokerProcess, stub: pb_grpc.JournalStub) -> None:
    # A fragment in the store beyond what any replica wrote, as after losing every broker of a journal.
    assert broker.file_root is not None
    content = b"x" * 1000
    name = f"{0:016x}-{len(content):016x}-{hashlib.sha1(content).hexdigest()}.raw"
    (broker.file_root / "maint" / "lost").mkdir(parents=True)
    (broker.file_root / "maint" / "lost" / name).write_bytes(content)
    assert apply_specs(stub, _spec("maint/lost")).status == pb.OK
    wait_for_primary(stub, "maint/lost")
    assert append(stub, "maint/lost", b"refused").status == pb.INDEX_HAS_GREATER_OFFSET

    stderr = _ok(_gazctl(broker, "reset-head", "-l", "name=maint/lost"))
    assert "reset write head to 1000 journal=maint/lost" in stderr, stderr
    resp = append(stub, "maint/lost", b"accepted")
    assert resp.status == pb.OK and resp.commit.begin == 1000


def test_suspend(broker: BrokerProcess, stub: pb_grpc.JournalStub) -> None:
    # maint/busy has no store, so its fragment can never be persisted (flushed) while the test runs.
    assert apply_specs(stub, journal_spec("maint/busy"), _spec("maint/idle")).status == pb.OK
    for journal in ("maint/busy", "maint/idle"):
        wait_for_primary(stub, journal)
    assert append(stub, "maint/busy", b"not yet persisted").status == pb.OK

    # Without --force, a journal with a fragment not yet persisted stays; an empty one suspends fully.
    stderr = _ok(_gazctl(broker, "suspend", "-l", "name in (maint/busy, maint/idle)"))
    assert "not suspended" in stderr and "journal=maint/busy" in stderr, stderr
    assert "suspended (FULL, resume offset 0) journal=maint/idle" in stderr, stderr
    assert _suspend_level(stub, "maint/busy") == pb.JournalSpec.Suspend.NONE
    assert _suspend_level(stub, "maint/idle") == pb.JournalSpec.Suspend.FULL

    stderr = _ok(_gazctl(broker, "suspend", "-l", "name in (maint/busy, maint/idle)", "--force"))
    assert "suspended (PARTIAL, resume offset 17) journal=maint/busy" in stderr, stderr
    assert "skipped: fully suspended journal=maint/idle" in stderr, stderr
    listed = run_gazctl(broker, "journals", "list", "-l", "name=maint/busy", "--primary")
    assert " <S>" in listed.stdout, listed.stdout

    stderr = _ok(_gazctl(broker, "suspend", "-l", "name=maint/busy"))
    assert "already suspended (PARTIAL, resume offset 17) journal=maint/busy" in stderr, stderr

    # A fully suspended journal has no fragments to list: it is skipped, not an error.
    done = run_gazctl(broker, "journals", "fragments", "-l", "name=maint/idle")
    assert done.returncode == 0 and "maint/idle" not in done.stdout, done.stderr
    one_line_error(run_gazctl(broker, "journals", "suspend"), "--selector")


def test_store_health(broker: BrokerProcess) -> None:
    done = run_gazctl(broker, "journals", "store-health", "file:///")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Fragment store file:/// is healthy\n"
    done = run_gazctl(broker, "journals", "store-health", "file:///", "--check-delete-prefix", "")
    assert done.stdout == "Fragment store file:/// is healthy\n", done.stderr

    started = time.monotonic()
    one_line_error(run_gazctl(broker, "journals", "store-health", UNREACHABLE_S3), UNREACHABLE_S3, "is unhealthy")
    assert time.monotonic() - started < 30
    missing = "file:///no/such/dir/"
    one_line_error(run_gazctl(broker, "journals", "store-health", missing), missing, "unhealthy")
    one_line_error(run_gazctl(broker, "journals", "store-health", "file:///", "--check-delete-prefix", "no-slash"),
                   "invalid fragment store", "trailing '/'")
    one_line_error(run_gazctl(None, "journals", "store-health", "not a url"), "not a url")
