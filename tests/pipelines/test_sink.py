"""The `gazette` writer: local Spark appending to a real broker, read back with the client."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from broker.client.sync import read_all
from consumer.message.mapping import fnv1a32, rendezvous_mapping
from pipelines.sink.framing import frame_fixed, frame_lines
from pipelines.sink.options import SinkError
from pipelines.sink.task import Spool, _Budget
from tests.harness import BrokerProcess, apply_specs, journal_spec, wait_for_primary

NDJSON = "application/x-ndjson"
KEYED = [f"sink/keyed/part-{i:03d}" for i in range(4)]
UNKEYED = [f"sink/unkeyed/{i}" for i in range(3)]


@pytest.fixture(scope="module")
def journals(broker: BrokerProcess) -> Iterator[BrokerProcess]:
    """The module's journals, each with a primary."""
    specs = [journal_spec("sink/one", app="one", content_type=NDJSON), journal_spec("sink/raw", app="raw")]
    specs += [journal_spec(name, app="keyed", content_type=NDJSON) for name in KEYED]
    specs += [journal_spec(name, app="unkeyed", content_type=NDJSON) for name in UNKEYED]
    specs += [journal_spec("sink/stream", app="stream", content_type=NDJSON)]
    channel, stub = broker.stub()
    try:
        apply_specs(stub, *specs)
        for spec in specs:
            wait_for_primary(stub, spec.name)
    finally:
        channel.close()
    yield broker


def content(broker: BrokerProcess, journal: str, offset: int = 0) -> bytes:
    return read_all(broker.url, journal, offset, timeout=30)


def write(frame: DataFrame, broker: BrokerProcess, **options: str) -> None:
    frame.write.format("gazette").mode("append").option("broker", broker.url).options(**options).save()


# Without Spark: framing and batching.


def test_lines_framing_adds_one_newline_and_refuses_inner_ones() -> None:
    assert frame_lines(b'{"a":1}') == b'{"a":1}\n'
    assert frame_lines(b'{"a":1}\n') == b'{"a":1}\n'
    assert frame_lines(b"") == b"\n"
    with pytest.raises(SinkError, match="newline before its end"):
        frame_lines(b"a\nb")
    assert frame_fixed(b"foo") == bytes.fromhex("66339336030000") + b"\x00foo"


def test_spool_cuts_appends_at_records_and_spills_in_order() -> None:
    budget = _Budget(limit=10)  # Spills after 10 bytes: the rest goes to a temporary file.
    spool = Spool(budget, batch_bytes=8, spool_dir=None)
    records = [b"aaa\n", b"bbb\n", b"cc\n", b"a-record-larger-than-a-batch\n", b"d\n"]
    for r in records:
        spool.add(r)
    batches = spool.batches()
    assert [spool.read(b, e) for b, e, _ in batches] == [b"aaa\nbbb\n", b"cc\n", records[3], b"d\n"]
    assert [n for _, _, n in batches] == [2, 1, 1, 1]
    spool.close()
    assert budget.used == 0


# Batch writes.


def test_journal_column_appends_exact_bytes(spark: SparkSession, journals: BrokerProcess) -> None:
    values = [json.dumps({"id": i, "text": "é" * (i % 3)}, ensure_ascii=False) for i in range(50)]
    values[7] += "\n"  # Already framed: no second newline.
    frame = spark.createDataFrame([(v, "sink/one") for v in values], "value string, journal string").coalesce(1)
    write(frame, journals, batchBytes="200")
    assert content(journals, "sink/one") == "".join(v if v.endswith("\n") else v + "\n" for v in values).encode()


def test_binary_values_without_framing(spark: SparkSession, journals: BrokerProcess) -> None:
    values = [bytes([i, 0, 10, 255]) for i in range(20)]
    frame = spark.createDataFrame([(bytearray(v), "sink/raw") for v in values], "value binary, journal string")
    write(frame.coalesce(1), journals, framing="none")
    assert content(journals, "sink/raw") == b"".join(values)


@pytest.mark.parametrize("mapping", ["modulo", "rendezvous"])
def test_keys_map_to_journals_as_gazette_does(spark: SparkSession, journals: BrokerProcess, mapping: str) -> None:
    before = {name: len(content(journals, name)) for name in KEYED}
    # 20 keys of 10 rows each, in two slices of whole keys: each key is written by one task.
    rows = [
        (f"key-{k}", json.dumps({"key": f"key-{k}", "seq": s, "pad": "x" * k})) for k in range(20) for s in range(10)
    ]
    frame = spark.createDataFrame(spark.sparkContext.parallelize(rows, 2), "key string, value string")
    write(frame, journals, selector="app=keyed", mapping=mapping, batchBytes="256")

    names = sorted(KEYED)
    pick = rendezvous_mapping(lambda k: k, names)
    seen: dict[str, list[int]] = {}
    for name in names:
        for line in content(journals, name, before[name]).splitlines():
            record = json.loads(line)  # Every record whole: a split one would not parse.
            key = record["key"]
            expected = names[fnv1a32(key.encode()) % 4] if mapping == "modulo" else pick(key)[0]
            assert name == expected, key
            seen.setdefault(key, []).append(record["seq"])
    assert seen == {f"key-{k}": list(range(10)) for k in range(20)}  # All rows, once, in order per key.


def test_unkeyed_rows_go_to_selected_journals(spark: SparkSession, journals: BrokerProcess) -> None:
    values = [json.dumps({"n": i}) for i in range(300)]
    frame = spark.createDataFrame([(v,) for v in values], "value string")
    write(frame, journals, selector="app=unkeyed", batchBytes="512")
    lines = [line for name in UNKEYED for line in content(journals, name).decode().splitlines()]
    assert sorted(lines) == sorted(values)


def test_round_trip_through_the_reader(spark: SparkSession, journals: BrokerProcess) -> None:
    if importlib.util.find_spec("pipelines.source.batch") is None:
        pytest.skip("the gazette reader (pipelines.source.batch) is not there yet")
    values = [json.dumps({"r": i}) for i in range(30)]
    frame = spark.createDataFrame([(v, f"key-{i}") for i, v in enumerate(values)], "value string, key string")
    write(frame, journals, selector="app=keyed")
    read = spark.read.format("gazette").option("broker", journals.url).option("selector", "app=keyed").load()
    got = {bytes(r.value).decode() for r in read.select("value").collect()}
    assert set(values) <= got


# Streaming.


def test_streaming_appends_each_trigger(spark: SparkSession, journals: BrokerProcess, tmp_path: Path) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()

    def run_once() -> None:
        frame = spark.readStream.format("text").load(str(source)).withColumn("journal", F.lit("sink/stream"))
        query = (frame.writeStream.format("gazette").option("broker", journals.url).option("selector", "app=stream")
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        query.awaitTermination(60)
        assert query.exception() is None

    first = [json.dumps({"batch": 1, "n": i}) for i in range(10)]
    (source / "1.json").write_text("\n".join(first) + "\n")
    run_once()
    assert content(journals, "sink/stream").decode().splitlines() == first

    second = [json.dumps({"batch": 2, "n": i}) for i in range(5)]
    (source / "2.json").write_text("\n".join(second) + "\n")
    run_once()  # Resumes from the checkpoint: only the new file is appended.
    assert content(journals, "sink/stream").decode().splitlines() == first + second


# Errors: each raised before anything is appended.


def test_missing_journal_fails_the_task_before_any_append(spark: SparkSession, journals: BrokerProcess) -> None:
    before = content(journals, "sink/one")
    rows = [(json.dumps({"ok": i}), "sink/one") for i in range(5)] + [("{}", "sink/missing")]
    frame = spark.createDataFrame(rows, "value string, journal string").coalesce(1)
    with pytest.raises(Exception, match="journal 'sink/missing' \\(column 'journal'\\) does not exist"):
        write(frame, journals)
    assert content(journals, "sink/one") == before


@pytest.mark.xfail(
    strict=True,
    reason="PySpark 4.0 ends the writer's input iterator cleanly when the JVM side of the task fails, so "
    "write() cannot tell a failed input from a finished one; the task fails only after its appends",
)
def test_failing_transform_leaves_no_partial_append(spark: SparkSession, journals: BrokerProcess) -> None:
    before = content(journals, "sink/one")
    # Row 19000 fails in the JVM. Spark streams rows to the writer in Arrow batches (100 rows here), so
    # thousands of good rows reach the task first (measured: ~4,400), enough for many 1 KiB appends:
    # a task which appended as it went would leave them behind.
    n = F.col("id")
    value = F.when(n == 19000, F.raise_error(F.lit("transform failed on row 19000"))).otherwise(
        F.to_json(F.struct(n.alias("n")))
    )
    frame = spark.range(20000, numPartitions=1).select(value.alias("value"), F.lit("sink/one").alias("journal"))
    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        with pytest.raises(Exception, match="transform failed on row 19000"):
            write(frame, journals, batchBytes="1024")
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous or "10000")
    assert content(journals, "sink/one") == before


def test_journal_outside_the_selector_is_refused(spark: SparkSession, journals: BrokerProcess) -> None:
    before = content(journals, "sink/one")
    frame = spark.createDataFrame([("{}", "sink/one")], "value string, journal string")
    with pytest.raises(Exception, match="does not match option selector 'app=keyed'"):
        write(frame, journals, selector="app=keyed")
    assert content(journals, "sink/one") == before


def test_inner_newline_fails_before_any_append(spark: SparkSession, journals: BrokerProcess) -> None:
    before = content(journals, "sink/one")
    frame = spark.createDataFrame([("{}", "sink/one"), ("a\nb", "sink/one")], "value string, journal string")
    with pytest.raises(Exception, match="newline before its end"):
        write(frame.coalesce(1), journals)
    assert content(journals, "sink/one") == before


@pytest.mark.parametrize(
    ("schema", "options", "message"),
    [
        ("journal string", {}, "no column 'value'"),
        ("value int, journal string", {}, "column 'value' has type int"),
        ("value string, key string", {"selector": "app=keyed", "mapping": "hash"}, "option mapping 'hash'"),
        ("value string, key string", {"selector": "app=nothing"}, "no journal matches option selector 'app=nothing'"),
        ("value string, key string", {}, "column 'key' is mapped over the journals of option selector"),
        ("value string", {}, "set option selector, or give each row a column 'journal'"),
        ("value string", {"selector": "app in ("}, "option selector 'app in \\('"),
        ("value string", {"selector": "app=keyed", "batchBytes": "0"}, "option batchBytes 0"),
        ("value string", {"selector": "app=keyed", "framing": "csv"}, "option framing 'csv'"),
        ("value string", {"selector": "app=keyed", "partitions": "3"}, "unknown option 'partitions'"),
        ("value string, topic string", {"selector": "app=keyed"}, "unexpected column 'topic'"),
    ],
)
def test_bad_options_and_columns_fail_on_the_driver(
    spark: SparkSession, journals: BrokerProcess, schema: str, options: dict[str, str], message: str
) -> None:
    frame = spark.createDataFrame([], schema)
    with pytest.raises(Exception, match=message):
        write(frame, journals, **options)


def test_overwrite_is_refused(spark: SparkSession, journals: BrokerProcess) -> None:
    frame = spark.createDataFrame([("{}", "sink/one")], "value string, journal string")
    with pytest.raises(Exception, match="journals are append-only"):
        frame.write.format("gazette").mode("overwrite").option("broker", journals.url).save()
