"""A shard whose recovery log is damaged FAILS, naming the log, offset and seq_no where its history
breaks, in a real `gazette consume` process: no store is built from what is left of the log."""

from __future__ import annotations

from pathlib import Path

from broker.client import AppendService, JournalClient
from broker.protocol import labels
from consumer.recoverylog import FSM, FSMHints, Recorder
from consumer.recoverylog.ops import decode_frames, encode_op
from tests.consumer.recoverylog.conftest import read_all
from tests.consumer.test_recovery_cli import Cluster, cluster  # noqa: F401  (a fixture)
from tests.support.harness import journal_spec
from tests.support.journals import create_journal, unique


async def test_a_log_missing_its_beginning_fails_the_shard(
    cluster: Cluster, client: JournalClient, appender: AppendService, tmp_path: Path  # noqa: F811
) -> None:
    # A history recorded elsewhere, written to the shard's log without its first three ops.
    scratch = unique("recovery-cli/scratch")
    await create_journal(client, journal_spec(scratch, content_type=labels.CONTENT_TYPE_RECOVERY_LOG))
    src = tmp_path / "scratch"
    src.mkdir()
    rec = await Recorder.open(scratch, FSM(FSMHints(log=scratch)), 4321, str(src), appender)
    for name in ("a", "b", "c"):
        (src / name).write_bytes(b"")
        rec.record_create(src / name)
    await rec.barrier()
    frames = decode_frames(await read_all(client, scratch), log=scratch)
    assert len(frames) == 3
    await appender.append(cluster.recovery_log, b"".join(encode_op(op)[0] for op, _, _ in frames[1:]))

    error = await cluster.fail_on_start("damaged-a")
    assert cluster.shard in error and "offset 0" in error and "seq_no 2" in error, error
    assert "does not continue the log's history" in error and "possible data loss" in error, error
    assert cluster.state("recovered") is None, "no store was built from the log"
