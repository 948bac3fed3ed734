"""Pipelines on a Spark standalone cluster: `gazctl pipelines run NAME --master spark://...` against a
master and two 1-core workers in their own JVMs (tests/pipelines/spark_cluster.py), all on loopback.

The input journals are one on a `file://` store and one on moto's S3, each with persisted fragments
and an unpersisted tail: executors read the persisted fragments straight from the store (the file
root, presigned S3 URLs) and the tails through the broker. A worker SIGKILLed in the middle of a batch
write or a streaming micro-batch takes its executor with it; Spark retries the tasks on the other
executor, and read-committed readers of the journals sink's output see every row exactly once.

One cluster and one broker serve the whole module; each gazctl run starts its own driver (its
`SPARK_CONF_DIR` from `driver_conf`, whose REST API tells which executor runs a task).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.pipelines.source_helpers import NDJSON, append_lines, committed_json, fragments, make_journal, unique
from tests.pipelines.spark_cluster import ClusterUnavailable, SparkCluster, driver_conf, get_json, running_cluster
from tests.support.harness import BrokerProcess, free_port, gazctl_env, serving_broker
from tests.support.store_emulators import MotoServer

pytestmark = pytest.mark.timeout(900)

FRAGMENT = 16 * 1024
"""Input fragment length: a few KiB of lines each, so a journal is a dozen partitions."""
PER_APPEND = 150
"""Lines per append (~13 KiB): each append after the first rolls the fragment before it."""

Key = tuple[str, int]
"""(input journal, offset): one input message."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A master and two 1-core workers, shared by the module's tests (each test leaves both alive)."""
    try:
        with running_cluster(tmp_path_factory.mktemp("spark-cluster")) as started:
            yield started
    except ClusterUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def cbroker(moto: MotoServer, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with a `file://` store, started after moto so that it reaches `s3://` stores too."""
    with serving_broker(tmp_path_factory.mktemp("cluster-broker"), etcd_endpoint, file_root=True) as proc:
        yield proc


# --- Journals -------------------------------------------------------------------------------------


def lines(tag: str, first: int, count: int) -> list[bytes]:
    return [json.dumps({"tag": tag, "i": i, "pad": "z" * (i * 13 % 60)}).encode() for i in range(first, first + count)]


def fill(broker: BrokerProcess, journal: str, tag: str, first: int, count: int, per: int = PER_APPEND) -> set[Key]:
    """Append lines `first`.. in appends of `per` lines; the input keys they became."""
    keys: set[Key] = set()
    for at in range(first, first + count, per):
        rows = append_lines(broker, journal, lines(tag, at, min(per, first + count - at)))
        keys.update((j, offset) for j, offset, _ in rows)
    return keys


def input_journals(broker: BrokerProcess, moto: MotoServer, test: str, count: int) -> tuple[dict[str, str], set[Key]]:
    """Journals `in/<test>/file` (file:// store, region us) and `in/<test>/s3` (moto, region eu), labelled
    `in=<test>`, with `count` lines each: persisted fragments, then an unpersisted tail."""
    bucket = f"cluster-{test}"
    moto.create_bucket(bucket)
    stores = {"file": "file:///", "s3": moto.store_url(bucket)}
    regions = {"file": "us", "s3": "eu"}
    names: dict[str, str] = {}
    keys: set[Key] = set()
    for kind, store in stores.items():
        name = make_journal(broker, f"in/{test}/{kind}", {"in": test, "region": regions[kind], "content-type": NDJSON},
                            store=store, length=FRAGMENT)
        names[kind] = name
        keys |= fill(broker, name, kind, 0, count)
    for name in names.values():
        wait_tail(broker, name)
    return names, keys


def wait_tail(broker: BrokerProcess, journal: str, timeout: float = 60.0) -> int:
    """Wait until every fragment of `journal` but its last (the broker's spool) is persisted; the
    length of that unpersisted tail."""
    deadline = time.monotonic() + timeout
    while True:
        frags = sorted(fragments(broker, journal), key=lambda f: f.begin)
        if len(frags) >= 2 and all(f.backing_store for f in frags[:-1]) and not frags[-1].backing_store:
            return frags[-1].end - frags[-1].begin
        assert time.monotonic() < deadline, f"{journal}: not persisted but for a tail after {timeout}s: {frags}"
        time.sleep(0.2)


def output_journals(broker: BrokerProcess, test: str) -> list[str]:
    return [make_journal(broker, f"out/{test}/{i}", {"out": test, "content-type": NDJSON}, store=None, length=1 << 20)
            for i in range(2)]


def committed_keys(broker: BrokerProcess, journals: list[str]) -> list[Key]:
    """The input key of every committed output row, read as a consumer reads: Gazette's Sequencer."""
    return [(row["journal"], row["offset"]) for journal in journals for row in committed_json(broker, journal)]


def heads(broker: BrokerProcess, journals: list[str]) -> int:
    """The sum of `journals`' write heads: it grows with every append."""
    return sum(max((f.end for f in fragments(broker, journal)), default=0) for journal in journals)


def assert_exactly_once(got: list[Key], want: set[Key]) -> None:
    counts = Counter(got)
    duplicates = {k: n for k, n in counts.items() if n > 1}
    lost = want - set(counts)
    extra = set(counts) - want
    assert not duplicates and not lost and not extra, (
        f"{len(duplicates)} duplicated, {len(lost)} lost, {len(extra)} unexpected rows "
        f"(e.g. {list(duplicates)[:3]}, {sorted(lost)[:3]}, {sorted(extra)[:3]})"
    )


def read_bytes(broker: BrokerProcess, journal: str) -> int:
    """Content bytes of `journal` the broker served by Read RPCs (its /debug/metrics)."""
    with urllib.request.urlopen(f"{broker.url}/debug/metrics", timeout=10) as resp:
        text = resp.read().decode()
    pattern = r'^gazette_read_bytes_total\{journal="' + re.escape(journal) + r'"\} (\S+)$'
    found = re.search(pattern, text, re.M)
    return int(float(found.group(1))) if found else 0


def presigned_gets(moto: MotoServer, journal: str) -> int:
    """GETs of `journal`'s fragment objects through presigned URLs in moto's request log (the broker's own
    store reads are signed in headers, not in the URL)."""
    return sum(1 for line in moto.log_path.read_text(errors="replace").splitlines()
               if '"GET /' in line and f"/{journal}/" in line and "Signature=" in line)


# --- Pipelines and drivers ------------------------------------------------------------------------


def write_pipeline(directory: Path, name: str, body: str) -> None:
    (directory / f"{name}.yaml").write_text(f"name: {name}\n" + textwrap.dedent(body))


def to_journals(test: str, file_root: Path, mode: str) -> str:
    """A pipeline body: every input message, as {journal, offset, tag}, to the output journals by offset. An
    append per row (batchBytes 128): a write task of a few thousand rows runs for seconds."""
    return mode + "\n" + textwrap.dedent(f"""\
        source:
          selector: in={test}
          options: {{fileRoot: "{file_root}", startingOffsets: earliest}}
        transform:
          sql: |
            SELECT to_json(named_struct('journal', journal, 'offset', offset,
                                        'tag', get_json_object(CAST(value AS STRING), '$.tag'))) AS value,
                   CAST(offset AS STRING) AS k
            FROM source
        sink:
          journals: {{selector: out={test}, key: k, options: {{batchBytes: "128"}}}}
        """)


class Driver:
    """How the tests run gazctl against the cluster: environment, REST API of the driver."""

    def __init__(self, cluster: SparkCluster, broker: BrokerProcess, tmp: Path) -> None:
        self.cluster = cluster
        self.broker = broker
        self.tmp = tmp
        self.ui_port = free_port()
        self.runs = 0
        self.env = gazctl_env(broker, tmp)
        self.env.update({
            "SPARK_CONF_DIR": str(driver_conf(tmp, cluster, self.ui_port)),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
        })

    def args(self, name: str, *flags: str) -> list[str]:
        return [sys.executable, "-m", "gazctl", "pipelines", "run", name, "--dir", str(self.tmp),
                "--master", self.cluster.url, *flags]

    def run(self, name: str, *flags: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(self.args(name, *flags), capture_output=True, text=True, env=self.env, cwd=self.tmp,
                              timeout=timeout)
        assert done.returncode == 0, done.stderr[-6000:]
        return done

    def start(self, name: str, *flags: str) -> subprocess.Popen[str]:
        """gazctl in the background, its output to files (a pipe nobody reads would stall it): see `output`."""
        self.runs += 1
        out_path, err_path = (self.tmp / f"gazctl-{self.runs}.{kind}" for kind in ("out", "err"))
        with open(out_path, "w") as out, open(err_path, "w") as err:
            return subprocess.Popen(self.args(name, *flags), stdout=out, stderr=err, text=True, env=self.env,
                                    cwd=self.tmp)

    def output(self, proc: subprocess.Popen[str], timeout: float = 120) -> tuple[str, str]:
        """Wait for the last `start`ed gazctl to exit (killing it if it outlives `timeout`); its stdout and stderr."""
        try:
            proc.wait(timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return tuple(  # type: ignore[return-value]
            (self.tmp / f"gazctl-{self.runs}.{kind}").read_text() for kind in ("out", "err")
        )

    def stderr(self) -> str:
        return (self.tmp / f"gazctl-{self.runs}.err").read_text()[-4000:]

    def executors(self, everyone: bool = False) -> list[dict[str, Any]]:
        """The running application's live executors (`everyone`: removed ones too), not the driver, from the
        driver's REST API; [] before it is up."""
        base = f"http://127.0.0.1:{self.ui_port}/api/v1/applications"
        try:
            apps = get_json(base, timeout=5)
            if not apps:
                return []
            listing = "allexecutors" if everyone else "executors"
            return [e for e in get_json(f"{base}/{apps[0]['id']}/{listing}", timeout=5) if e["id"] != "driver"]
        except (OSError, ValueError):  # Not serving yet, or "Spark is starting up" (not JSON).
            return []

    def worker_of(self, executor: dict[str, Any]) -> int:
        """The index of the worker running `executor` (its log links point at the worker's web UI)."""
        link = executor["executorLogs"].get("stderr", "")
        for i, w in enumerate(self.cluster.workers):
            if f":{w.ui_port}/" in link:
                return i
        raise AssertionError(f"executor {executor['id']} is on no worker of the cluster: {link}")

    def running(self, proc: subprocess.Popen[str]) -> None:
        assert proc.poll() is None, f"gazctl exited with {proc.returncode}: {self.stderr()}"

    def wait_committed(self, proc: subprocess.Popen[str], outputs: list[str], count: int, timeout: float = 180) -> None:
        """Wait until `outputs` hold `count` committed rows, while gazctl runs."""
        deadline = time.monotonic() + timeout
        while (got := len(committed_keys(self.broker, outputs))) < count:
            self.running(proc)
            assert time.monotonic() < deadline, f"{got} committed rows, not {count}, after {timeout}s"
            time.sleep(0.5)

    def wait_executor(self, proc: subprocess.Popen[str], index: int, timeout: float = 120) -> None:
        """Wait until worker `index` runs an executor (of gazctl's application, the only one)."""
        deadline = time.monotonic() + timeout
        while not self.cluster.executors(index):
            self.running(proc)
            assert time.monotonic() < deadline, f"worker {index} got no executor after {timeout}s"
            time.sleep(0.2)

    def kill_worker_running_a_task(self, proc: subprocess.Popen[str], ready: Any, timeout: float = 240) -> int:
        """Once `ready()` holds, SIGKILL the worker of an executor the driver shows running a task; its index.
        Returns once the driver has removed the executor (Spark then runs its tasks elsewhere)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.running(proc)
            if ready():
                busy = [e for e in self.executors() if e["isActive"] and e["activeTasks"] > 0]
                if busy:
                    victim = self.worker_of(busy[0])
                    self.cluster.kill_worker(victim)
                    self.wait_failed(busy[0]["id"], deadline)
                    return victim
            time.sleep(0.05)
        raise AssertionError("no executor ran a task while the run was ready to be interrupted")

    def wait_failed(self, executor: str, deadline: float) -> None:
        """Wait until the driver has removed `executor`. (Its task may have ended just before the kill: the
        REST API's activeTasks lags, so a failed task on it is not asserted.)"""
        while time.monotonic() < deadline:
            lost = [e for e in self.executors(everyone=True) if e["id"] == executor]
            if lost and not lost[0]["isActive"]:
                return
            time.sleep(0.1)
        raise AssertionError(f"the driver never removed killed executor {executor}")


@pytest.fixture
def driver(cluster: SparkCluster, cbroker: BrokerProcess, tmp_path: Path) -> Iterator[Driver]:
    """A gazctl driver's set-up; after the test, every worker is alive again for the next."""
    yield Driver(cluster, cbroker, tmp_path)
    for i, w in enumerate(cluster.workers):
        if not w.alive:
            cluster.start_worker(i)
    cluster.wait_workers(len(cluster.workers))


def both_executors_ran(cluster: SparkCluster) -> None:
    """Each worker launched an executor of the last application (its work directory has the app's folder)."""
    apps = sorted(cluster.state()["completedapps"], key=lambda a: a["starttime"])
    assert apps, "the master saw no application"
    app = apps[-1]["id"]
    for w in cluster.workers:
        assert list(cluster.tmp.glob(f"{w.name}-work-*/{app}/*/stderr")), f"{w.name} ran no executor of {app}"


# --- Tests ----------------------------------------------------------------------------------------


def test_batch_pipeline_reads_stores_in_the_executors(
    driver: Driver, cbroker: BrokerProcess, moto: MotoServer, cluster: SparkCluster
) -> None:
    test = unique()
    names, keys = input_journals(cbroker, moto, test, 2000)
    tails = {name: wait_tail(cbroker, name) for name in names.values()}
    served = {name: read_bytes(cbroker, name) for name in names.values()}
    assert cbroker.file_root is not None
    write_pipeline(driver.tmp, "clicks-by-region", f"""\
        source:
          selector: in={test}
          view: clicks
          options: {{fileRoot: "{cbroker.file_root}"}}
        transform:
          sql: |
            SELECT labels['region'][0] AS region, count(*) AS clicks, count(DISTINCT journal, offset) AS messages
            FROM clicks GROUP BY labels['region'][0]
        sink:
          path: out/clicks-by-region
          format: json
          mode: overwrite
        """)
    done = driver.run("clicks-by-region")
    assert done.stdout.splitlines()[-1].startswith(
        "clicks-by-region: wrote 2 rows to json out/clicks-by-region (overwrite) in "), done.stdout
    rows = [json.loads(line) for path in (driver.tmp / "out" / "clicks-by-region").glob("part-*.json")
            for line in path.read_text().splitlines()]
    assert sorted((r["region"], r["clicks"], r["messages"]) for r in rows) == [("eu", 2000, 2000), ("us", 2000, 2000)]
    assert len(keys) == 4000
    both_executors_ran(cluster)
    # The persisted fragments were read by the executors straight from the stores: the broker served
    # each journal's unpersisted tail only, and moto answered presigned GETs of the S3 journal's fragments.
    for name in names.values():
        assert read_bytes(cbroker, name) - served[name] == tails[name], name
    assert presigned_gets(moto, names["s3"]) >= 2


def test_batch_write_survives_a_killed_worker(
    driver: Driver, cbroker: BrokerProcess, moto: MotoServer, cluster: SparkCluster
) -> None:
    """A worker SIGKILLed while its executor runs a write task: the job retries the task on the other
    executor, the failed attempt's appends are rolled back, and readers see each row once."""
    test = unique()
    _, keys = input_journals(cbroker, moto, test, 3000)
    outputs = output_journals(cbroker, test)
    write_pipeline(driver.tmp, "copy", to_journals(test, cbroker.file_root or Path(), "mode: batch"))
    proc = driver.start("copy")
    try:
        # Ready once the write is under way: some task appended rows (uncommitted until the job ends).
        victim = driver.kill_worker_running_a_task(proc, lambda: heads(cbroker, outputs) > 0)
    finally:
        out, err = driver.output(proc, timeout=300)
    assert proc.returncode == 0, err[-6000:]
    assert out.splitlines()[-1].startswith(f"copy: wrote {len(keys)} rows to journals out={test}"), out
    assert not cluster.workers[victim].alive
    assert_exactly_once(committed_keys(cbroker, outputs), keys)


def test_stream_available_now(
    driver: Driver, cbroker: BrokerProcess, moto: MotoServer, cluster: SparkCluster
) -> None:
    """A stream run with trigger availableNow (`--once`) into the journals sink: read-committed readers
    see every input row once."""
    test = unique()
    _, keys = input_journals(cbroker, moto, test, 1000)
    outputs = output_journals(cbroker, test)
    body = to_journals(test, cbroker.file_root or Path(), "mode: stream\ncheckpoint: checkpoints/s")
    write_pipeline(driver.tmp, "enrich", body)
    done = driver.run("enrich", "--once")
    assert re.search(rf"^enrich: \d+ micro-batches, {len(keys)} input rows, to journals out={test}", done.stdout, re.M)
    assert_exactly_once(committed_keys(cbroker, outputs), keys)
    both_executors_ran(cluster)


def test_stream_survives_a_killed_worker_and_resumes_from_its_checkpoint(
    driver: Driver, cbroker: BrokerProcess, moto: MotoServer, cluster: SparkCluster
) -> None:
    """A worker SIGKILLed during a micro-batch: the batch's tasks are retried on the other executor and the
    query goes on; stopped, then run again with `--once`, it reads on from its checkpoint only what came
    since. Every input row is committed exactly once."""
    test = unique()
    names, keys = input_journals(cbroker, moto, test, 300)
    outputs = output_journals(cbroker, test)
    body = to_journals(test, cbroker.file_root or Path(), "mode: stream\ntrigger: 1 second\ncheckpoint: checkpoints/k")
    write_pipeline(driver.tmp, "enrich", body)
    proc = driver.start("enrich")
    try:
        driver.wait_committed(proc, outputs, len(keys))
        # A large append to each journal: one partition each, whose write task reads 4,000 rows, then
        # appends them one by one. The micro-batch is the only work there is: kill a worker as soon as
        # one of its tasks runs.
        for kind, name in names.items():
            keys |= fill(cbroker, name, kind, 300, 4000, per=4000)
        victim = driver.kill_worker_running_a_task(proc, lambda: True)
        driver.wait_committed(proc, outputs, len(keys))
        cluster.start_worker(victim)  # Back while the query runs: the master gives the app an executor there.
        driver.wait_executor(proc, victim)
        keys |= fill(cbroker, names["s3"], "s3", 4300, 100)
        driver.wait_committed(proc, outputs, len(keys))
        proc.send_signal(signal.SIGINT)
    except BaseException:
        proc.kill()
        raise
    finally:
        out, err = driver.output(proc)
    assert proc.returncode == 130, err[-6000:]
    assert re.search(rf"^enrich: \d+ micro-batches, {len(keys)} input rows, .*\(interrupted\)$", out, re.M), out
    assert_exactly_once(committed_keys(cbroker, outputs), keys)

    keys |= fill(cbroker, names["file"], "file", 4300, 200)
    done = driver.run("enrich", "--once")
    # Only what was appended since the stop: the run resumed from the checkpoint.
    assert re.search(rf"^enrich: \d+ micro-batches, 200 input rows, to journals out={test}", done.stdout, re.M), (
        done.stdout)
    assert_exactly_once(committed_keys(cbroker, outputs), keys)
