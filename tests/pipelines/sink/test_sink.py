"""The `gazette` writer: local Spark appending to a real broker, read back with the client."""

from __future__ import annotations

import importlib.util
import itertools
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from broker.client.sync import read_all
from broker.fragment.codecs import decompressor
from broker.fragment.names import parse_fragment_from_relative_path
from broker.protocol import pb
from consumer.message import Flags, get_clock, get_flags, get_producer_id
from consumer.message.mapping import fnv1a32, rendezvous_mapping
from pipelines.sink import writer as sink_writer
from pipelines.sink.framing import frame_fixed, frame_lines
from pipelines.sink.options import SinkError
from pipelines.sink.task import Spool, _Budget
from pipelines.sink.txn import producer_for, stamp_json
from tests.pipelines.source_helpers import committed_json, direct_only_rows, make_journal, unique, wait_persisted
from tests.support.harness import BrokerProcess, apply_specs, journal_spec, wait_for_primary
from tests.support.store_emulators import EmulatorProcess, emulator_of

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
    specs += [journal_spec(name, app=name.split("/")[1], content_type=NDJSON) for name in ("sink/txn", "sink/retry")]
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


def messages(data: bytes) -> list[dict[str, Any]]:
    """Every row of raw JSON lines content, committed or not, ACKs dropped; each row's `uuid` is checked and popped."""
    out = []
    for line in data.splitlines():
        doc = json.loads(line)
        flags = get_flags(UUID(doc.pop("uuid")))
        if flags == Flags.ACK_TXN:
            assert doc == {}, line  # An ACK is {"uuid": ...} alone.
            continue
        assert flags == Flags.CONTINUE_TXN, line
        out.append(doc)
    return out


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
    write(frame, journals, batchBytes="200", transactional="false")  # At-least-once, as the lines framing.
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
        for record in messages(content(journals, name, before[name])):  # Every record whole, with its uuid.
            key = record["key"]
            expected = names[fnv1a32(key.encode()) % 4] if mapping == "modulo" else pick(key)[0]
            assert name == expected, key
            seen.setdefault(key, []).append(record["seq"])
    assert seen == {f"key-{k}": list(range(10)) for k in range(20)}  # All rows, once, in order per key.


def test_unkeyed_rows_go_to_selected_journals(spark: SparkSession, journals: BrokerProcess) -> None:
    values = [json.dumps({"n": i}) for i in range(300)]
    frame = spark.createDataFrame([(v,) for v in values], "value string")
    write(frame, journals, selector="app=unkeyed", batchBytes="512")
    rows = [r for name in UNKEYED for r in messages(content(journals, name))]
    assert sorted(r["n"] for r in rows) == list(range(300))
    assert sorted(r["n"] for name in UNKEYED for r in committed_json(journals, name)) == list(range(300))


def test_round_trip_through_the_reader(spark: SparkSession, journals: BrokerProcess) -> None:
    """A transactional write reads back exactly once through the gazette reader (read-committed by default)."""
    if importlib.util.find_spec("pipelines.source.batch") is None:
        pytest.skip("the gazette reader (pipelines.source.batch) is not there yet")
    values = [json.dumps({"round": "trip", "r": i}) for i in range(30)]
    rows = [(v, f"key-{i}") for i, v in enumerate(values)]
    frame = spark.createDataFrame(spark.sparkContext.parallelize(rows, 3), "value string, key string")
    write(frame, journals, selector="app=keyed")
    read = spark.read.format("gazette").option("broker", journals.url).option("selector", "app=keyed").load()
    got = [r for r in read.select("value", "uuid", "producer", "flags").collect()
           if json.loads(bytes(r.value)).get("round") == "trip"]
    docs = [json.loads(bytes(r.value)) for r in got]
    assert Counter(d["r"] for d in docs) == Counter(range(30))  # Every row, exactly once.
    assert all(d["uuid"] == r.uuid and r.flags == Flags.CONTINUE_TXN for d, r in zip(docs, got, strict=True))
    producers = {r.producer for r in got}
    assert len(producers) == 3  # One producer per task (partition), each a multicast node ID.
    assert all(int(p[:2], 16) & 1 for p in producers)


@pytest.mark.parametrize("scheme", ["gs", "azure"])
def test_writes_persist_to_object_stores_and_read_back_from_them(
    spark: SparkSession, store_broker: BrokerProcess, emulators: dict[str, EmulatorProcess | str], scheme: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A transactional write to journals whose fragments persist on gs:// or azure://: the objects in the
    store are the journals' bytes, and the reader returns every row once, the persisted ones read
    straight from the store through the URLs the broker signed."""
    emulator = emulator_of(emulators, scheme)
    test = unique()
    bucket = f"sink-{test}"
    emulator.create_bucket(bucket)
    names = [f"sink/{scheme}/{test}/part-{i}" for i in range(2)]
    for name in names:
        make_journal(store_broker, name, {"app": f"store-{test}", "content-type": NDJSON},
                     store=emulator.store_url(bucket), length=1024, codec=pb.GZIP)
    values = [json.dumps({"n": i, "pad": "p" * (i * 31 % 200)}) for i in range(120)]
    rows = [(f"key-{i % 13}", v) for i, v in enumerate(values)]
    frame = spark.createDataFrame(spark.sparkContext.parallelize(rows, 2), "key string, value string")
    write(frame, store_broker, selector=f"app=store-{test}", batchBytes="512")

    for name in names:
        wait_persisted(store_broker, name, 3)
    objects = emulator.snapshot(bucket)
    for name in names:
        journal = content(store_broker, name)
        spans = []
        for key, raw in objects.items():
            if key.startswith(f"{name}/"):
                spec = parse_fragment_from_relative_path(name, key[len(name) + 1:])
                assert decompressor(spec.compression_codec).decompress(raw) == journal[spec.begin:spec.end], key
                spans.append((spec.begin, spec.end))
        spans.sort()
        assert len(spans) >= 3 and spans[0][0] == 0, spans
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), f"gap or overlap: {spans}"

    read = spark.read.format("gazette").option("broker", store_broker.url).option("selector", f"app=store-{test}")
    docs = [json.loads(bytes(r.value)) for r in read.load().select("value").collect()]
    assert sorted(d["n"] for d in docs) == list(range(120))  # Every row, exactly once.
    # The persisted partitions' rows come from the store (read committed would read on through the
    # broker past a partition's end, to settle the transactions it leaves open: read them uncommitted).
    options = {"broker": store_broker.url, "selector": f"app=store-{test}", "isolation": "read_uncommitted"}
    count, direct = direct_only_rows(options, monkeypatch)
    assert count >= 6 and direct, (count, direct)
    written = {name: content(store_broker, name) for name in names}
    assert all(written[journal][offset:offset + len(value)] == value for journal, offset, value in direct)


# Streaming.


def test_streaming_appends_each_trigger(spark: SparkSession, journals: BrokerProcess, tmp_path: Path) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()

    def run_once() -> str:
        frame = spark.readStream.format("text").load(str(source)).withColumn("journal", F.lit("sink/stream"))
        query = (frame.writeStream.format("gazette").option("broker", journals.url).option("selector", "app=stream")
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        query.awaitTermination(60)
        assert query.exception() is None
        return str(query.id)

    first = [json.dumps({"batch": 1, "n": i}) for i in range(10)]
    (source / "1.json").write_text("\n".join(first) + "\n")
    query_id = run_once()
    assert messages(content(journals, "sink/stream")) == [json.loads(v) for v in first]

    second = [json.dumps({"batch": 2, "n": i}) for i in range(5)]
    (source / "2.json").write_text("\n".join(second) + "\n")
    assert run_once() == query_id  # Resumes from the checkpoint: only the new file is appended.
    assert messages(content(journals, "sink/stream")) == [json.loads(v) for v in first + second]
    assert committed_json(journals, "sink/stream") == [json.loads(v) for v in first + second]
    # Each micro-batch is a transaction of its own producers, named by the query's id (kept in its
    # checkpoint) and the batch id, so a batch replayed after a restart is the same producers.
    raw = content(journals, "sink/stream").splitlines()
    producers = [get_producer_id(UUID(json.loads(line)["uuid"])) for line in raw]
    assert set(producers) == {producer_for(f"{query_id}/{batch}", 0) for batch in (0, 1)}


# Errors: each raised before anything is appended.


def test_missing_journal_fails_the_task_before_any_append(spark: SparkSession, journals: BrokerProcess) -> None:
    before = content(journals, "sink/one")
    rows = [(json.dumps({"ok": i}), "sink/one") for i in range(5)] + [("{}", "sink/missing")]
    frame = spark.createDataFrame(rows, "value string, journal string").coalesce(1)
    with pytest.raises(Exception, match="journal 'sink/missing' \\(column 'journal'\\) does not exist"):
        write(frame, journals)
    assert content(journals, "sink/one") == before


def test_failing_transform_leaves_nothing_committed(spark: SparkSession, journals: BrokerProcess) -> None:
    """PySpark ends the writer's input cleanly when the JVM side of the task fails, so the task appends
    the rows it got; the transaction is what keeps them from readers: no commit ACK, and abort rolls back."""
    before = content(journals, "sink/txn")
    # Row 19000 fails in the JVM. Spark streams rows to the writer in Arrow batches (100 rows here), so
    # thousands of good rows reach the task first (measured: ~4,400), enough for many 1 KiB appends.
    n = F.col("id")
    value = F.when(n == 19000, F.raise_error(F.lit("transform failed on row 19000"))).otherwise(
        F.to_json(F.struct(n.alias("n")))
    )
    frame = spark.range(20000, numPartitions=1).select(value.alias("value"), F.lit("sink/txn").alias("journal"))
    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        with pytest.raises(Exception, match="transform failed on row 19000"):
            # With a selector, the driver knows every journal a failed task may have written, and rolls it back.
            write(frame, journals, batchBytes="1024", selector="app=txn")
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous or "10000")

    # The known gap: the task appends the partial input it got, and (measured) goes on appending after
    # Spark failed it and the driver aborted: let it finish.
    raw = content(journals, "sink/txn", len(before))
    for _ in range(40):
        time.sleep(0.5)
        if len(again := content(journals, "sink/txn", len(before))) == len(raw):
            break
        raw = again
    assert len(messages(raw)) > 1000
    lines = [UUID(json.loads(line)["uuid"]) for line in raw.splitlines()]
    rows = [u for u in lines if get_flags(u) == Flags.CONTINUE_TXN]
    acks = [u for u in lines if get_flags(u) == Flags.ACK_TXN]
    assert len(acks) == 1  # The driver's abort rolled the task's producer back; no commit ACK was appended.
    assert {get_producer_id(u) for u in rows} == {get_producer_id(acks[0])}
    assert get_clock(acks[0]) < min(get_clock(u) for u in rows)
    assert committed_json(journals, "sink/txn") == []  # ...so read-committed readers see none of it.
    if importlib.util.find_spec("pipelines.source.batch") is not None:
        read = spark.read.format("gazette").option("broker", journals.url).option("selector", "app=txn").load()
        assert read.count() == 0
        uncommitted = read_with(spark, journals, "app=txn", isolation="read_uncommitted")
        assert uncommitted.filter("flags = 1").count() == len(rows)


def read_with(spark: SparkSession, broker: BrokerProcess, selector: str, **options: str) -> DataFrame:
    return (spark.read.format("gazette").option("broker", broker.url).option("selector", selector)
            .options(**options).load())


def test_task_retry_leaves_one_copy(journals: BrokerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed attempt's appends are rolled back by the retry of its partition, which is the same producer.

    The session's `local[2]` master allows no task retries, so the writer's task and driver sides are
    driven here as Spark drives them: attempt 0 appends half its rows and dies (no commit message);
    attempt 1 appends them all; the driver commits attempt 1's message.
    """
    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType([StructField("value", StringType()), StructField("key", StringType())])
    writer = sink_writer.GazetteBatchWriter({"broker": journals.url, "selector": "app=retry"}, schema, False)
    rows = [(json.dumps({"retry": i}), f"k{i}") for i in range(40)]

    monkeypatch.setattr(sink_writer, "_task", lambda: (5, 0, None, None))
    writer.write(iter(rows[:20]))  # Appended, never committed: the attempt failed.
    monkeypatch.setattr(sink_writer, "_task", lambda: (5, 1, None, None))
    message = writer.write(iter(rows))
    assert message.producer == producer_for(writer.config.write_id, 5)
    raw = messages(content(journals, "sink/retry"))
    assert Counter(r["retry"] for r in raw) == Counter(list(range(20)) + list(range(40)))
    assert committed_json(journals, "sink/retry") == []  # Nothing is visible before the driver's commit.
    writer.commit([message])
    assert committed_json(journals, "sink/retry") == [json.loads(v) for v, _ in rows]
    # A failed job's abort rolls back every partition's producer: an ACK per producer, none visible.
    writer.abort([None, None])
    assert committed_json(journals, "sink/retry") == [json.loads(v) for v, _ in rows]


def test_replayed_micro_batch_rolls_back_the_crashed_run(
    journals: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A micro-batch replayed after a driver crash is the same producers (query id, batch id): its
    first append rolls back what the crashed run appended but never committed, so readers see one copy.
    A crash after the commit ACKs but before Spark's checkpoint commit is the at-least-once window."""
    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType([StructField("value", StringType()), StructField("journal", StringType())])
    options = {"broker": journals.url, "selector": "app=stream"}
    before = len(committed_json(journals, "sink/stream"))
    rows = [(json.dumps({"replay": i}), "sink/stream") for i in range(10)]
    monkeypatch.setattr(sink_writer, "_task", lambda: (0, 0, "query-r", "7"))
    crashed = sink_writer.GazetteStreamWriter(options, schema, False)
    crashed.write(iter(rows[:6]))  # The driver dies before its commit: no ACK.
    restarted = sink_writer.GazetteStreamWriter(options, schema, False)  # A new writer, as after a restart.
    message = restarted.write(iter(rows))
    restarted.commit([message], 7)
    replayed = [r for r in committed_json(journals, "sink/stream")[before:] if "replay" in r]
    assert replayed == [json.loads(v) for v, _ in rows]


def test_json_values_get_a_uuid() -> None:
    text = "00000001-0000-1000-8001-010203040506"
    assert stamp_json(b'{"a": 1}', text, 0, "j") == b'{"uuid":"%s","a": 1}' % text.encode()
    assert stamp_json(b" {} ", text, 0, "j") == b'{"uuid":"%s"}' % text.encode()
    assert json.loads(stamp_json(b'{"UUID":"x","a":1}', text, 0, "j")) == {"UUID": text, "a": 1}
    assert json.loads(stamp_json(b'{"_meta":{"uuid":"x"}}', text, 0, "j")) == {"_meta": {"uuid": text}}
    assert json.loads(stamp_json(b'{"_meta":{},"b":[1]}', text, 0, "j")) == {"uuid": text, "_meta": {}, "b": [1]}
    with pytest.raises(SinkError, match="row 7 \\(to journal j\\) has a value which is not a JSON object"):
        stamp_json(b"[1, 2]", text, 7, "j")
    producer = producer_for("w", 3)
    assert producer == producer_for("w", 3) != producer_for("w", 4)
    assert len(producer) == 6 and producer[0] & 1


def test_non_json_journals_are_not_transactional(spark: SparkSession, journals: BrokerProcess) -> None:
    frame = spark.createDataFrame([("x", "sink/raw")], "value string, journal string")
    with pytest.raises(Exception, match="option transactional=true, but the records of journal sink/raw carry no"):
        write(frame, journals, transactional="true")
    with pytest.raises(Exception, match="option transactional 'yes': expected true or false"):
        write(frame, journals, transactional="yes")


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
