"""Streaming reads of the `gazette` source against a real broker (file:// store)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from broker.client import AppendService
from consumer.message import AckIntent, Publisher
from pipelines.source.planning import GazettePartition
from pipelines.source.read import read_partition
from pipelines.source.schema import ARROW_BASE, BASE_SCHEMA
from pipelines.source.stream import GazetteStreamReader
from tests.pipelines.source_helpers import NDJSON, Msg, Row, append_lines, make_journal, publish, to, unique
from tests.support.harness import BrokerProcess

pytestmark = pytest.mark.timeout(300)


def lines(tag: str, count: int, pad: int = 200) -> list[bytes]:
    return [json.dumps({"tag": tag, "i": i, "pad": "q" * (i * 7 % pad)}).encode() for i in range(count)]


def sink_rows(spark: SparkSession, path: Path) -> list[Row]:
    df = spark.read.parquet(str(path))
    return sorted((r.journal, r.offset, bytes(r.value)) for r in df.select("journal", "offset", "value").collect())


def wait_for(spark: SparkSession, path: Path, count: int, query: StreamingQuery, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert query.exception() is None, query.exception()
        try:
            if spark.read.parquet(str(path)).count() >= count:
                return
        except Exception:  # No batch written yet.
            pass
        assert time.monotonic() < deadline, f"the sink never reached {count} rows"
        time.sleep(0.5)


def start(spark: SparkSession, broker: BrokerProcess, selector: str, out: Path, checkpoint: Path) -> StreamingQuery:
    return (
        spark.readStream.format("gazette").option("broker", broker.url).option("selector", selector)
        .option("startingOffsets", "earliest").load()
        .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="500 milliseconds").start()
    )


def test_appends_new_journals_and_restart_from_checkpoint(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    test = unique()
    labels = {"test": test, "content-type": NDJSON}
    us1 = make_journal(broker, f"stream/{test}/us-1", {**labels, "region": "us"})
    eu1 = make_journal(broker, f"stream/{test}/eu-1", {**labels, "region": "eu"})
    want = append_lines(broker, us1, lines("before", 30))
    append_lines(broker, eu1, lines("eu", 10))
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    query = start(spark, broker, f"test={test},region=us", out, checkpoint)
    try:
        wait_for(spark, out, len(want), query)
        want += append_lines(broker, us1, lines("during", 20))  # Appended while the query runs.
        us2 = make_journal(broker, f"stream/{test}/us-2", {**labels, "region": "us"})  # Starts matching.
        want += append_lines(broker, us2, lines("new-journal", 15))
        wait_for(spark, out, len(want), query)
    finally:
        query.stop()

    want += append_lines(broker, us1, lines("stopped", 12))
    want += append_lines(broker, us2, lines("stopped", 5))
    query = start(spark, broker, f"test={test},region=us", out, checkpoint)
    try:
        wait_for(spark, out, len(want), query)
        want += append_lines(broker, us1, lines("restarted", 7))
        wait_for(spark, out, len(want), query)
    finally:
        query.stop()
    assert sink_rows(spark, out) == sorted(want)  # Every message exactly once, no eu rows.


def test_read_committed_batches_end_before_open_transactions(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    test = unique()
    journal = make_journal(broker, f"stream/{test}/txn", {"test": test, "content-type": NDJSON})
    state: dict[str, object] = {}

    def first(svc: AppendService) -> None:
        a, c = Publisher(svc), Publisher(svc)
        c.publish_committed(to(journal), Msg(Str="c-before"))
        a.publish_uncommitted(to(journal), Msg(Str="a-txn-1"))
        c.publish_committed(to(journal), Msg(Str="c-during"))
        a.publish_uncommitted(to(journal), Msg(Str="a-txn-2"))
        state["intents"] = a.build_ack_intents()  # "Persisted", not yet appended: the txn stays open.
        state["producer"] = a.producer_id

    def commit(svc: AppendService) -> None:
        intents = state["intents"]
        assert isinstance(intents, list) and all(isinstance(i, AckIntent) for i in intents)
        Publisher(svc, producer_id=state["producer"]).write_ack_intents(intents)  # type: ignore[arg-type]
        Publisher(svc).publish_committed(to(journal), Msg(Str="c-after"))

    publish(broker, first)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run_once() -> list[str]:
        q = (
            spark.readStream.format("gazette").option("broker", broker.url).option("selector", f"test={test}")
            .option("startingOffsets", "earliest").load()
            .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True).start()
        )
        q.awaitTermination(120)
        assert q.exception() is None
        return sorted(json.loads(bytes(r.value))["Str"] for r in spark.read.parquet(str(out)).collect())

    # The batch ends where the open transaction begins: "c-during", after it, waits too.
    assert run_once() == ["c-before"]
    publish(broker, commit)
    assert run_once() == sorted(["c-before", "a-txn-1", "c-during", "a-txn-2", "c-after"])


def test_offsets_max_bytes_and_both_latest_offset_signatures(broker: BrokerProcess) -> None:
    test = unique()
    labels = {"test": test, "content-type": NDJSON}
    j1 = make_journal(broker, f"stream/{test}/a", labels)
    big = [[json.dumps({"k": k, "i": i, "pad": "q" * 400}).encode() for i in range(3)] for k in range(12)]
    rows = [r for batch in big for r in append_lines(broker, j1, batch)]
    options = {"broker": broker.url, "selector": f"test={test}", "startingOffsets": "earliest",
               "maxBytesPerTrigger": "1500"}
    reader = GazetteStreamReader(options, BASE_SCHEMA)
    start = reader.initialOffset()
    assert start == {j1: 0}
    seen: list[Row] = []
    steps = 0
    while True:
        end = reader.latestOffset()
        if end == start:
            break
        steps += 1
        for p in reader.partitions(start, end):
            assert isinstance(p, GazettePartition)
            for batch in read_partition(p, reader.opts, ARROW_BASE, None):
                seen += zip(batch.column("journal").to_pylist(), batch.column("offset").to_pylist(),
                            batch.column("value").to_pylist(), strict=True)
        start = end
    assert sorted(seen) == sorted(rows)  # Cut at fragment boundaries: nothing split, lost or repeated.
    assert steps > 3

    # A restarted reader given `start` (newer Sparks) continues from it; a journal that starts
    # matching is read from its beginning.
    j2 = make_journal(broker, f"stream/{test}/b", labels)
    append_lines(broker, j2, lines("b", 2))
    again = GazetteStreamReader({**options, "maxBytesPerTrigger": "100000"}, BASE_SCHEMA)
    latest = again.latestOffset(start, None)
    assert latest[j1] == start[j1] and latest[j2] > 0
    assert [p.begin for p in again.partitions(start, latest)] == [0]
    # Without a start (Spark 4.0 after a restart) the heads are still followed.
    assert GazetteStreamReader(options, BASE_SCHEMA).latestOffset() == latest
