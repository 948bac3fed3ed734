"""The example pipelines, run end to end: local Spark against a real broker.

One run goes through `gazctl pipelines run` as a subprocess (the CLI starts its own Spark); the
others call the run API on the session's Spark for speed.
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from broker.protocol import pb, pb_grpc
from pipelines.definitions import PipelineRunError, find, load_text
from pipelines.definitions.run import BatchProgress, run
from tests.support.harness import ROOT, BrokerProcess, append, apply_specs, journal_spec, run_gazctl, wait_for_primary

EXAMPLES = ROOT / "examples" / "pipelines"
DERIVED = "examples/clicks-enriched"
NDJSON = "application/x-ndjson"

CLICKS = {"clicks/us/1": ("us", 3), "clicks/us/2": ("us", 2), "clicks/eu/1": ("eu", 4)}
"""Journal -> (its region label, clicks appended before the first run)."""


def spec(name: str, message_type: str, **labels: str) -> pb.JournalSpec:
    return journal_spec(
        name, **{"app.gazette.dev/message_type": message_type, "content_type": NDJSON, **labels}
    )


def append_ok(stub: pb_grpc.JournalStub, journal: str, data: bytes) -> None:
    resp = append(stub, journal, data)
    assert resp.status == pb.OK, resp


def clicks(journal: str, first: int, count: int) -> bytes:
    return b"".join(
        json.dumps({"user": f"u{i}", "button": "buy", "seq": i, "from": journal}).encode() + b"\n"
        for i in range(first, first + count)
    )


def read_lines(spark: SparkSession, broker: BrokerProcess, journal: str) -> list[dict[str, Any]]:
    """The committed messages of `journal`, read as a consumer would: read-committed, through the gazette source."""
    rows = (spark.read.format("gazette").option("broker", broker.url).option("selector", f"name={journal}")
            .load().select("value").collect())
    return [json.loads(row["value"]) for row in rows]


@pytest.fixture(scope="module")
def journals(broker: BrokerProcess) -> Iterator[pb_grpc.JournalStub]:
    """Click journals in two regions, a journal of another message type, and the derived journal."""
    channel, stub = broker.stub()
    with channel:
        specs = [spec(name, "Click", **{"app.gazette.dev/region": region}) for name, (region, _) in CLICKS.items()]
        specs.append(spec("views/us/1", "View", **{"app.gazette.dev/region": "us"}))
        specs.append(spec(DERIVED, "EnrichedClick"))
        resp = apply_specs(stub, *specs)
        assert resp.status == pb.OK, resp
        for s in specs:
            wait_for_primary(stub, s.name)
        for name, (_, count) in CLICKS.items():
            append_ok(stub, name, clicks(name, 0, count))
        append_ok(stub, "views/us/1", clicks("views/us/1", 0, 7))  # Never selected: another message type.
        yield stub


def test_batch_example_through_gazctl(
    broker: BrokerProcess, journals: pb_grpc.JournalStub, spark: SparkSession, tmp_path: Path
) -> None:
    out = run_gazctl(
        broker, "pipelines", "run", "clicks-by-region", "--dir", str(EXAMPLES), "--master", "local[2]",
        cwd=tmp_path, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    # Not a terminal: no progress, only the summary line.
    assert out.stdout.splitlines()[-1].startswith(
        "clicks-by-region: wrote 2 rows to parquet out/clicks-by-region (overwrite) in "
    ), out.stdout
    rows = spark.read.parquet(str(tmp_path / "out" / "clicks-by-region")).collect()
    assert {r["region"]: r["clicks"] for r in rows} == {"us": 5, "eu": 4}


def test_stream_example_into_derived_journal(
    broker: BrokerProcess, journals: pb_grpc.JournalStub, spark: SparkSession, tmp_path: Path
) -> None:
    pipeline = find(EXAMPLES, "clicks-enriched")
    seen: list[BatchProgress] = []
    result = run(spark, pipeline, broker=broker.url, workdir=tmp_path, on_batch=seen.append)
    assert (tmp_path / "checkpoints" / "clicks-enriched").is_dir()
    assert result.rows == 9 and result.batches >= 1 and not result.interrupted
    assert sum(p.input_rows for p in seen) == 9

    derived = read_lines(spark, broker, DERIVED)
    assert Counter(d["region"] for d in derived) == {"us": 5, "eu": 4}
    assert len({(d["journal"], d["offset"]) for d in derived}) == 9
    for d in derived:
        click = json.loads(d["click"])
        assert click["from"] == d["journal"] and d["journal"] in CLICKS

    # New clicks, then the same pipeline again: it continues from its checkpoint, nothing repeated.
    append_ok(journals, "clicks/eu/1", clicks("clicks/eu/1", 4, 2))
    again = run(spark, pipeline, broker=broker.url, workdir=tmp_path, once=True)
    assert again.rows == 2
    derived = read_lines(spark, broker, DERIVED)
    assert Counter(d["region"] for d in derived) == {"us": 5, "eu": 6}
    assert len({(d["journal"], d["offset"]) for d in derived}) == 11


def test_python_transform_and_sql_errors(
    broker: BrokerProcess, journals: pb_grpc.JournalStub, spark: SparkSession, tmp_path: Path
) -> None:
    (tmp_path / "eu_only.py").write_text(
        textwrap.dedent("""\
        from pyspark.sql import DataFrame, functions as F


        def keep(df: DataFrame) -> DataFrame:
            region = F.col("labels").getItem("app.gazette.dev/region").getItem(0)
            return df.where(region == "eu").select("journal", "offset", region.alias("region"))
        """)
    )
    text = textwrap.dedent("""\
        name: eu-clicks
        source:
          selector: app.gazette.dev/message-type=Click
        transform:
          python: eu_only:keep
        sink:
          path: out/eu
          format: json
        """)
    pipeline = load_text(text, tmp_path / "eu.yaml")
    result = run(spark, pipeline, broker=broker.url, workdir=tmp_path)
    rows = spark.read.json(str(tmp_path / "out" / "eu")).collect()
    assert result.rows == len(rows) >= 4
    assert {r["region"] for r in rows} == {"eu"} and {r["journal"] for r in rows} == {"clicks/eu/1"}

    broken = load_text(
        text.replace("  python: eu_only:keep\n", "  sql: SELECT no_such_column FROM source\n"), tmp_path / "bad.yaml"
    )
    expected = r"bad\.yaml:5:8: transform\.sql: pipeline 'eu-clicks': .*no_such_column"
    with pytest.raises(PipelineRunError, match=expected):
        run(spark, broken, broker=broker.url, workdir=tmp_path)
