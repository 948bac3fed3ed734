"""The Spark Declarative Pipelines example (examples/sdp-clicks) run by `spark-pipelines run` against a real broker.

A copy of the project runs as a user would run it: `spark-pipelines run` in its directory, with
`$BROKER_ADDRESS` naming the broker and `$PYSPARK_PYTHON` this interpreter; only its `storage`
(which SDP wants as an absolute URI) is pointed into the test's directory.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tests.pipelines.source_helpers import NDJSON, append_lines, committed_json, make_journal
from tests.pipelines.spark_connect import spark_env, spark_home
from tests.support.harness import ROOT, BrokerProcess, one_line_error, run_gazctl

needs_sdp = pytest.mark.skipif(
    not (spark_home() / "bin" / "spark-pipelines").is_file(),
    reason="the installed PySpark has no spark-pipelines (Spark Declarative Pipelines came with PySpark 4.1)",
)

EXAMPLE = ROOT / "examples" / "sdp-clicks"
CLICKS = {"sdp/clicks/us-1": "us", "sdp/clicks/us-2": "us", "sdp/clicks/eu-1": "eu", "sdp/clicks/ap-1": "ap"}
"""Click journals of the example's selector -> their region label."""
OUT = [f"sdp/by-region/{i}" for i in range(2)]
"""RegionClick journals: the example's sink maps each region to one of them."""


def click_lines(journal: str, first: int, count: int) -> list[bytes]:
    return [json.dumps({"user": f"u{i}", "seq": i, "at": journal}).encode() for i in range(first, first + count)]


def spark_pipelines_run(project: Path, broker: BrokerProcess) -> subprocess.CompletedProcess[str]:
    env = spark_env(BROKER_ADDRESS=broker.url, HOME=str(project))  # A HOME without a gazctl.ini.
    return subprocess.run(
        # A Hive metastore (Derby, in the project's directory) keeps the streaming table between runs,
        # as the example's README says; a static conf, so a spark-submit option rather than the spec's.
        [str(spark_home() / "bin" / "spark-pipelines"), "run", "--conf", "spark.sql.catalogImplementation=hive"],
        cwd=project, env=env, capture_output=True, text=True, timeout=540,
    )


@needs_sdp
@pytest.mark.timeout(600)
def test_sdp_example_streams_journals_to_journals(broker: BrokerProcess, tmp_path: Path) -> None:
    click = {"app.gazette.dev/message-type": "Click", "content-type": NDJSON}
    for name, region in CLICKS.items():
        make_journal(broker, name, {**click, "app.gazette.dev/region": region})
    for name in OUT:
        make_journal(broker, name, {"app.gazette.dev/message-type": "RegionClick", "content-type": NDJSON})
    counts = {"sdp/clicks/us-1": 6, "sdp/clicks/us-2": 4, "sdp/clicks/eu-1": 5, "sdp/clicks/ap-1": 3}
    for name, count in counts.items():
        append_lines(broker, name, click_lines(name, 0, count))

    project = tmp_path / "sdp-clicks"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__"))
    spec = project / "spark-pipeline.yml"
    storage = [line for line in spec.read_text().splitlines() if line.startswith("storage:")]
    assert len(storage) == 1, "the example's spec has one storage line"
    spec.write_text(spec.read_text().replace(storage[0], f"storage: {(tmp_path / 'storage').as_uri()}"))

    done = spark_pipelines_run(project, broker)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]

    def delivered() -> dict[str, list[dict[str, object]]]:
        return {name: committed_json(broker, name) for name in OUT}

    out = delivered()
    rows = [row for journal in out.values() for row in journal]
    assert Counter(row["region"] for row in rows) == {"us": 10, "eu": 5, "ap": 3}
    assert len({(row["journal"], row["offset"]) for row in rows}) == 18
    for row in rows:
        message = json.loads(str(row["click"]))
        assert message["at"] == row["journal"] and CLICKS[str(row["journal"])] == row["region"]
    # The key is the region: each region's clicks are all in one journal.
    assert all(len({name for name, journal in out.items() if any(r["region"] == region for r in journal)}) == 1
               for region in ("us", "eu", "ap"))

    # A second run continues the streaming table and the flow from their checkpoints: only the new clicks.
    append_lines(broker, "sdp/clicks/eu-1", click_lines("sdp/clicks/eu-1", 5, 4))
    done = spark_pipelines_run(project, broker)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
    rows = [row for journal in delivered().values() for row in journal]
    assert Counter(row["region"] for row in rows) == {"us": 10, "eu": 9, "ap": 3}
    assert len({(row["journal"], row["offset"]) for row in rows}) == 22


def test_gazctl_refuses_an_sdp_project_and_says_how_to_run_it(tmp_path: Path) -> None:
    spec = EXAMPLE / "spark-pipeline.yml"
    for target in (str(EXAMPLE), str(spec)):
        for command in ("run", "validate"):
            done = run_gazctl(None, "pipelines", command, target, "--dir", str(tmp_path))
            one_line_error(done, "is a Spark Declarative Pipelines project", f"spark-pipelines run --spec {spec}")
    done = run_gazctl(None, "pipelines", "list", "--dir", str(EXAMPLE))
    one_line_error(done, f"'{EXAMPLE}' is a Spark Declarative Pipelines project")

    # In a pipeline repository, an SDP project's spec is not a pipeline file: the others still load.
    shutil.copytree(EXAMPLE, tmp_path / "sdp-clicks", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "examples" / "pipelines" / "clicks-by-region.yaml", tmp_path)
    done = run_gazctl(None, "pipelines", "validate", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{tmp_path / 'clicks-by-region.yaml'}: pipeline 'clicks-by-region' is valid\n"
