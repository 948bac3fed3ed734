"""Batch reads of the `gazette` source against real brokers (file://, and s3://, gs:// and azure:// on
moto, fake-gcs-server and Azurite)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from broker.client import sync
from broker.fragment.names import content_path
from broker.protocol import pb
from tests.pipelines.source_helpers import (
    NDJSON,
    Row,
    append_lines,
    direct_only_rows,
    fragments,
    in_process,
    make_journal,
    transactional_history,
    unique,
    wait_persisted,
)
from tests.support.harness import BrokerProcess
from tests.support.store_emulators import EmulatorProcess, emulator_of

pytestmark = pytest.mark.timeout(300)


def rows_of(df: DataFrame) -> list[Row]:
    return sorted((r.journal, r.offset, bytes(r.value)) for r in df.select("journal", "offset", "value").collect())


def big(doc: dict[str, int]) -> bytes:
    """A message larger than a fragment's length: each append closes its own fragment."""
    return json.dumps({**doc, "pad": "x" * 1100}).encode()


def reader(spark: SparkSession, broker: BrokerProcess, selector: str, **options: str) -> DataFrame:
    r = spark.read.format("gazette").option("broker", broker.url).option("selector", selector)
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


@pytest.fixture(scope="module")
def regions(broker: BrokerProcess) -> tuple[str, dict[str, list[Row]]]:
    """Journals labelled region=us (two) and region=eu (one), of many small fragments; their rows."""
    test = unique()
    rows: dict[str, list[Row]] = {"us": [], "eu": []}
    names = [(f"src/{test}/us-1", "us"), (f"src/{test}/us-2", "us"), (f"src/{test}/eu-1", "eu")]
    for name, region in names:
        make_journal(broker, name, {"region": region, "test": test, "content-type": NDJSON}, length=1024)
    for i in range(24):
        for name, region in names:
            # Appends of 1-4 messages of varied sizes, so fragments end wherever appends do.
            lines = [json.dumps({"n": i, "k": k, "pad": "p" * ((i * 37 + k * 11) % 400)}).encode()
                     for k in range(1 + i % 4)]
            rows[region] += append_lines(broker, name, lines)
    for name, _ in names:
        wait_persisted(broker, name, 3)
    return test, rows


def test_selects_regions_and_returns_every_message_once(
    spark: SparkSession, broker: BrokerProcess, regions: tuple[str, dict[str, list[Row]]]
) -> None:
    test, rows = regions
    us = reader(spark, broker, f"test={test},region=us")
    assert rows_of(us) == sorted(rows["us"])
    eu = reader(spark, broker, f"test={test},region=eu", fileRoot=str(broker.file_root))
    got = eu.collect()
    assert sorted((r.journal, r.offset, bytes(r.value)) for r in got) == sorted(rows["eu"])
    assert {r.labels["region"][0] for r in got} == {"eu"}
    assert all(r.uuid is None and r.flags is None for r in got)  # Plain JSON: no UUIDs.
    persisted = [r for r in got if r.fragment_mod_time is not None]
    assert persisted, "some rows come from persisted fragments"


def test_one_partition_per_fragment_and_no_message_split(
    spark: SparkSession, broker: BrokerProcess, regions: tuple[str, dict[str, list[Row]]]
) -> None:
    test, rows = regions
    journal = rows["eu"][0][0]
    frags = fragments(broker, journal)
    df = reader(spark, broker, f"test={test},region=eu", fileRoot=str(broker.file_root))
    assert df.rdd.getNumPartitions() >= len({(f.begin, f.end) for f in frags}) - 1 > 3
    from pyspark.sql.functions import spark_partition_id

    per_partition = df.withColumn("p", spark_partition_id()).select("p", "offset", "value").collect()
    by_offset = {offset: value for _, offset, value in rows["eu"]}
    # Every value is a whole appended message, whichever partition (fragment) it came from.
    assert all(bytes(r.value) == by_offset[r.offset] for r in per_partition)
    assert len({r.p for r in per_partition}) > 3


def test_parse_json_columns_with_a_user_schema(
    spark: SparkSession, broker: BrokerProcess, regions: tuple[str, dict[str, list[Row]]]
) -> None:
    test, rows = regions
    df = (
        spark.read.format("gazette").schema("journal string, offset long, n long, k int, missing string")
        .option("broker", broker.url).option("selector", f"test={test},region=us").load()
    )
    got = sorted((r.journal, r.offset, r.n, r.k, r.missing) for r in df.collect())
    want = sorted((j, o, json.loads(v)["n"], json.loads(v)["k"], None) for j, o, v in rows["us"])
    assert got == want


def test_user_schema_declares_labels_in_ddl(
    spark: SparkSession, broker: BrokerProcess, regions: tuple[str, dict[str, list[Row]]]
) -> None:
    # DDL's map<string, array<string>> has nullable elements, unlike the base schema's `labels`.
    test, rows = regions
    df = (
        spark.read.format("gazette").schema("journal string, labels map<string, array<string>>")
        .option("broker", broker.url).option("selector", f"test={test},region=eu").load()
    )
    got = {(r.journal, r.labels["region"][0], r.labels["test"][0]) for r in df.collect()}
    assert got == {(journal, "eu", test) for journal, _, _ in rows["eu"]}
    with pytest.raises(Exception, match="schema: column 'labels' must be map<string,array<string>>"):
        spark.read.format("gazette").schema("labels map<string, string>").option("selector", "aa=bb").load().collect()


def test_starting_and_ending_offsets(
    spark: SparkSession, broker: BrokerProcess, regions: tuple[str, dict[str, list[Row]]]
) -> None:
    test, rows = regions
    us1 = sorted(r for r in rows["us"] if r[0].endswith("us-1"))
    us2 = sorted(r for r in rows["us"] if r[0].endswith("us-2"))
    begin, end = us1[10][1], us1[-10][1]
    df = reader(
        spark, broker, f"test={test},region=us",
        startingOffsets=json.dumps({us1[0][0]: begin, us2[0][0]: -1}), endingOffsets=json.dumps({us1[0][0]: end}),
    )
    assert rows_of(df) == [r for r in us1 if begin <= r[1] < end]
    latest = reader(spark, broker, f"test={test},region=us", startingOffsets="latest")
    assert latest.count() == 0


def test_starting_timestamp_skips_older_fragments(spark: SparkSession, broker: BrokerProcess) -> None:
    test = unique()
    journal = make_journal(broker, f"src/{test}/ts", {"test": test, "content-type": NDJSON}, length=1024)
    old = [r for i in range(4) for r in append_lines(broker, journal, [big({"old": i})])]
    wait_persisted(broker, journal, 3)
    cut = math.ceil(time.time()) + 1
    time.sleep(cut - time.time())
    new = [r for i in range(4) for r in append_lines(broker, journal, [big({"new": i})])]
    got = rows_of(reader(spark, broker, f"test={test}", startingTimestamp=str(cut * 1000)))
    assert set(new) <= set(got)
    assert old[0] not in got
    kept = [f for f in fragments(broker, journal) if f.mod_time == 0 or f.mod_time >= cut]
    assert all(any(f.begin <= o < f.end for f in kept) for _, o, _ in got)
    assert rows_of(reader(spark, broker, f"test={test}", startingTimestamp="0")) == sorted(old + new)


def test_fail_on_data_loss(spark: SparkSession, broker: BrokerProcess) -> None:
    test = unique()
    journal = make_journal(broker, f"src/{test}/loss", {"test": test, "content-type": NDJSON}, length=1024)
    rows = [r for i in range(6) for r in append_lines(broker, journal, [big({"i": i})])]
    frags = sorted((f for f in wait_persisted(broker, journal, 4) if f.backing_store), key=lambda f: f.begin)
    victim = frags[1]
    assert broker.file_root is not None
    os.remove(Path(broker.file_root) / content_path(victim))
    deadline = time.monotonic() + 15
    while any(f.begin == victim.begin for f in fragments(broker, journal)):
        assert time.monotonic() < deadline, "the index never dropped the removed fragment"
        time.sleep(0.2)
    with pytest.raises(Exception, match="failOnDataLoss"):
        reader(spark, broker, f"test={test}").collect()
    kept = rows_of(reader(spark, broker, f"test={test}", failOnDataLoss="false"))
    assert kept == [r for r in rows if not victim.begin <= r[1] < victim.end]


def test_read_committed_skips_rolled_back_and_open_transactions(spark: SparkSession, broker: BrokerProcess) -> None:
    test = unique()
    journal = make_journal(broker, f"src/{test}/txn", {"test": test, "content-type": NDJSON}, length=1024)
    committed, uncommitted = transactional_history(broker, journal)
    df = reader(spark, broker, f"test={test}")
    assert df.rdd.getNumPartitions() > 2  # Transactions span partitions.
    got = df.collect()
    strs = [json.loads(bytes(r.value))["Str"] for r in got]
    assert sorted(strs) == sorted(committed)
    assert all(r.uuid is not None and r.flags in (0, 1) and r.clock > 0 and len(r.producer) == 12 for r in got)
    raw = reader(spark, broker, f"test={test}", isolation="read_uncommitted").collect()
    all_strs = [json.loads(bytes(r.value))["Str"] for r in raw]
    assert sorted(all_strs) == sorted(committed | uncommitted)  # ACKs are never rows.


def test_invalid_options_fail_before_spark_work(spark: SparkSession, broker: BrokerProcess) -> None:
    sc = spark.sparkContext
    sc.setJobGroup("invalid-options", "options are validated before any job")
    cases = [
        ({}, "selector"),
        ({"selector": "aa in (b"}, "selector"),
        ({"selector": "aa=bb", "startingOffsets": "{bad"}, "startingOffsets"),
        ({"selector": "aa=bb", "endingOffsets": '{"j": "x"}'}, "endingOffsets"),
        ({"selector": "aa=bb", "framing": "xml"}, "framing"),
        ({"selector": "aa=bb", "isolation": "dirty"}, "isolation"),
        ({"selector": "aa=bb", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"selector": "aa=bb", "startingTimestamp": "yesterday"}, "startingTimestamp"),
        ({"selector": "aa=bb", "maxBytesPerTrigger": "10"}, "maxBytesPerTrigger"),
        ({"selector": "aa=bb", "colour": "red"}, "colour"),
    ]
    for options, name in cases:
        r = spark.read.format("gazette").option("broker", broker.url)
        for key, value in options.items():
            r = r.option(key, value)
        with pytest.raises(Exception, match=name):
            r.load()
    with pytest.raises(Exception, match="schema: column 'offset'"):
        spark.read.format("gazette").schema("offset string").option("selector", "aa=bb").load().collect()
    assert sc.statusTracker().getJobIdsForGroup("invalid-options") == []
    sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]


@pytest.mark.parametrize("scheme", ["s3", "gs", "azure"])
def test_object_store_snappy_fragments_read_from_signed_urls(
    spark: SparkSession, store_broker: BrokerProcess, emulators: dict[str, EmulatorProcess | str], scheme: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Executors read the persisted fragments straight from the store, through the URLs the broker signed."""
    emulator = emulator_of(emulators, scheme)
    test = unique()
    bucket = f"src-{test}"
    emulator.create_bucket(bucket)
    names = [f"src/{test}/us", f"src/{test}/eu"]
    rows: dict[str, list[Row]] = {}
    for name in names:
        make_journal(store_broker, name, {"test": test, "region": name[-2:], "content-type": NDJSON},
                     store=emulator.store_url(bucket), length=1024, codec=pb.SNAPPY)
        docs = [json.dumps({"i": i, "p": "s" * (i * 53 % 400)}).encode() for i in range(20)]
        rows[name] = [r for doc in docs for r in append_lines(store_broker, name, [doc])]
        wait_persisted(store_broker, name, 3)
    got = rows_of(reader(spark, store_broker, f"test={test},region=us"))
    assert got == sorted(rows[names[0]])
    assert rows_of(reader(spark, store_broker, f"test={test}")) == sorted(rows[names[0]] + rows[names[1]])
    count, direct = direct_only_rows({"broker": store_broker.url, "selector": f"test={test}"}, monkeypatch)
    assert count >= 6 and direct and set(direct) <= set(rows[names[0]] + rows[names[1]])


def test_csv_and_fixed_framings(broker: BrokerProcess) -> None:
    from consumer.message import Flags, build_uuid, encode_fixed_frame, new_producer_id

    test = unique()
    csv_j = make_journal(broker, f"src/{test}/csv", {"test": test, "content-type": "text/csv"})
    fixed_j = make_journal(broker, f"src/{test}/fixed", {"test": test, "content-type": "application/x-protobuf-fixed"})
    producer = new_producer_id()
    uuids = [build_uuid(producer, (1 << 50) + i, Flags.OUTSIDE_TXN) for i in range(5)]
    append_lines(broker, csv_j, [f'{u},"a, quoted",{i}'.encode() for i, u in enumerate(uuids)])
    payloads = [bytes([i]) * (i * 40) for i in range(1, 6)]
    sync.append(broker.url, fixed_j, b"".join(encode_fixed_frame(p) for p in payloads), timeout=30)
    _, rows = in_process({"broker": broker.url, "selector": f"test={test}"})
    csv_rows = sorted((r for r in rows if r["journal"] == csv_j), key=lambda r: r["offset"])  # type: ignore[arg-type,return-value]
    assert [r["value"] for r in csv_rows] == [f'{u},"a, quoted",{i}'.encode() for i, u in enumerate(uuids)]
    assert [r["uuid"] for r in csv_rows] == [str(u) for u in uuids]
    assert {r["producer"] for r in csv_rows} == {producer.hex()}
    fixed_rows = sorted((r for r in rows if r["journal"] == fixed_j), key=lambda r: r["offset"])  # type: ignore[arg-type,return-value]
    assert [r["value"] for r in fixed_rows] == payloads and all(r["uuid"] is None for r in fixed_rows)


def test_persisted_fragments_are_read_from_the_store(
    broker: BrokerProcess, regions: tuple[str, dict[str, list[Row]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    test, rows = regions
    count, got = direct_only_rows(
        {"broker": broker.url, "selector": f"test={test},region=eu", "fileRoot": str(broker.file_root)}, monkeypatch
    )
    assert count >= 3 and got and set(got) <= set(rows["eu"])
