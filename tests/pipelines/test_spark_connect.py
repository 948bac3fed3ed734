"""The `gazette` source and sink on a Spark Connect session, against a Connect server and a real broker.

One server per module (tests/pipelines/spark_connect.py). The client session is made with Spark
Connect's own builder, not `pyspark.sql.SparkSession.builder.remote(...)`: that one refuses to make a
Connect session in a process that already runs a classic SparkContext (the `spark` fixture of the
other modules). `SPARK_CONNECT_MODE_ENABLED` is set while this module runs, so that
`pyspark.sql.functions` build Connect columns, and removed after it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from broker.client.sync import read_all
from consumer.message import Flags, get_flags
from pipelines.datasource import register
from tests.pipelines.source_helpers import NDJSON, append_lines, committed_json, make_journal, unique
from tests.pipelines.spark_connect import ConnectServer, connect_jar
from tests.support.harness import BrokerProcess

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(connect_jar() is None, reason="the installed PySpark ships no Spark Connect server jar"),
]


@pytest.fixture(scope="module")
def connect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Spark Connect session of the module's Connect server, with format `gazette` registered."""
    pytest.importorskip("pyspark.sql.connect.session", reason="Spark Connect's client needs pyspark[connect]")
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    server = ConnectServer(tmp_path_factory.mktemp("connect")).wait_ready()
    before = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    session = None
    try:
        session = ConnectSession.builder.remote(server.url).getOrCreate()
        register(session)
        yield session
    finally:
        if session is not None:
            session.stop()
        if before is None:
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
        else:
            os.environ["SPARK_CONNECT_MODE_ENABLED"] = before
        server.stop()


def clicks(region: str, first: int, count: int) -> list[bytes]:
    return [json.dumps({"user": f"u{i % 3}", "seq": i, "region": region}).encode() for i in range(first, first + count)]


def test_batch_read_by_selector(connect: Any, broker: BrokerProcess) -> None:
    test = unique()
    labels = {"test": test, "content-type": NDJSON}
    us = make_journal(broker, f"connect/{test}/us", {**labels, "region": "us"})
    eu = make_journal(broker, f"connect/{test}/eu", {**labels, "region": "eu"})
    other = make_journal(broker, f"connect/{test}/other", {"test": f"{test}-not", "content-type": NDJSON})
    want = append_lines(broker, us, clicks("us", 0, 40)) + append_lines(broker, eu, clicks("eu", 0, 25))
    append_lines(broker, other, clicks("other", 0, 5))

    frame = connect.read.format("gazette").option("broker", broker.url).option("selector", f"test={test}").load()
    rows = frame.select("journal", "offset", "value").collect()
    assert sorted((r.journal, r.offset, bytes(r.value)) for r in rows) == sorted(want)

    # Columns parsed from the JSON values by a user schema; the aggregation runs on the server.
    typed = (connect.read.format("gazette").option("broker", broker.url).option("selector", f"test={test}")
             .schema("journal string, user string, seq long").load())
    by_journal = {r.journal: (r.n, r.last) for r in typed.groupBy("journal").agg(
        {"seq": "count", "user": "max"}).withColumnsRenamed({"count(seq)": "n", "max(user)": "last"}).collect()}
    assert by_journal == {us: (40, "u2"), eu: (25, "u2")}


def test_batch_write_is_transactional(connect: Any, broker: BrokerProcess) -> None:
    test = unique()
    out = make_journal(broker, f"connect/{test}/out", {"test": test, "content-type": NDJSON})
    frame = connect.createDataFrame([(json.dumps({"n": i}),) for i in range(50)], "value string").repartition(3)
    frame.write.format("gazette").mode("append").option("broker", broker.url).option("selector", f"test={test}").save()

    assert sorted(m["n"] for m in committed_json(broker, out)) == list(range(50))
    raw = read_all(broker.url, out, 0, timeout=30).splitlines()
    acks = [line for line in raw if get_flags(UUID(json.loads(line)["uuid"])) == Flags.ACK_TXN]
    assert len(raw) == 50 + len(acks) and 1 <= len(acks) <= 3  # One commit ACK per task that wrote.


def test_stream_journals_to_journals_available_now(connect: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    test = unique()
    source = {"test": test, "content-type": NDJSON, "role": "clicks"}
    us = make_journal(broker, f"connect/{test}/us", {**source, "region": "us"})
    eu = make_journal(broker, f"connect/{test}/eu", {**source, "region": "eu"})
    out = make_journal(broker, f"connect/{test}/out", {"test": test, "content-type": NDJSON, "role": "out"})
    append_lines(broker, us, clicks("us", 0, 30))
    append_lines(broker, eu, clicks("eu", 0, 20))

    def run_once() -> None:
        from pyspark.sql import functions as F

        stream = (
            connect.readStream.format("gazette").option("broker", broker.url)
            .option("selector", f"test={test},role=clicks").option("startingOffsets", "earliest")
            .schema("journal string, offset long, region string, seq long").load()
            .select(F.to_json(F.struct("region", "seq", "journal", "offset")).alias("value"))
        )
        query = (
            stream.writeStream.format("gazette").option("broker", broker.url)
            .option("selector", f"test={test},role=out").option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True).start()
        )
        query.awaitTermination(240)
        assert not query.isActive and query.exception() is None, query.exception()

    run_once()
    got = committed_json(broker, out)
    want = [("us", i) for i in range(30)] + [("eu", i) for i in range(20)]
    assert sorted((m["region"], m["seq"]) for m in got) == sorted(want)

    # Appended since: the same query from its checkpoint delivers exactly these, once.
    append_lines(broker, eu, clicks("eu", 20, 7))
    run_once()
    got = committed_json(broker, out)
    assert len(got) == 57 and len({(m["journal"], m["offset"]) for m in got}) == 57
    assert sorted(m["seq"] for m in got if m["region"] == "eu") == list(range(27))
