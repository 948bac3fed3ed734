"""The `gazette` source and sink against a broker that requires authorization (`--broker.auth-keys`).

Journals are created and written with an all-capabilities token; Spark reads them with option
`authToken` (a token of LIST and READ), and writes with one of LIST and APPEND. Without a token the
broker refuses, and the error says so in one line.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from pyspark.sql import DataFrame, SparkSession

from broker.protocol import pb, pb_grpc
from broker.protocol.auth import Capability, Claims, KeyedAuth, Signer
from broker.protocol.credentials import Credentials
from broker.protocol.selectors import parse_selector
from pipelines.auth import PipelineAuthError
from pipelines.definitions.model import JournalsSink, Pipeline, Source
from pipelines.definitions.run import first_line, reader_options, writer_options
from pipelines.sink.options import SinkConfig
from pipelines.source.options import GazetteOptionError, parse_options
from tests.pipelines.source_helpers import NDJSON, unique
from tests.support.harness import BrokerProcess, append, apply_specs, journal_spec, run_gazctl, serving_broker

pytestmark = pytest.mark.timeout(180)

KEYS = base64.b64encode(b"pipelines-auth-test-key-32-bytes").decode()


def token(cap: int, selector: str = "") -> str:
    return KeyedAuth(KEYS).sign(Claims(cap, parse_selector(selector) if selector else pb.LabelSelector()))


@pytest.fixture(scope="module")
def secured(etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with serving_broker(tmp_path_factory.mktemp("auth-broker"), etcd_endpoint, "--broker.auth-keys", KEYS) as proc:
        yield proc


@pytest.fixture(scope="module")
def admin(secured: BrokerProcess) -> Iterator[pb_grpc.JournalStub]:
    """A Journal stub of the broker presenting a token of every capability."""
    channel = grpc.insecure_channel(secured.target)
    try:
        yield Credentials.of(token=token(Capability.ALL)).authorize(pb_grpc.JournalStub(channel))
    finally:
        channel.close()


def make_journals(admin: pb_grpc.JournalStub, test: str, names: list[str]) -> None:
    specs = []
    for name in names:
        spec = journal_spec(name)
        spec.labels.labels.add(name="content-type", value=NDJSON)
        spec.labels.labels.add(name="test", value=test)
        specs.append(spec)
    assert apply_specs(admin, *specs).status == pb.OK
    sel = pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name="test", value=test)]))
    for _ in range(300):  # Wait for every primary.
        listed = [j for resp in admin.List(pb.ListRequest(selector=sel)) for j in resp.journals]
        if len(listed) == len(names) and all(j.route.primary >= 0 for j in listed):
            return
        time.sleep(0.05)
    raise TimeoutError(f"journals of test={test} have no primaries")


def content(admin: pb_grpc.JournalStub, journal: str) -> bytes:
    out = b""
    for resp in admin.Read(pb.ReadRequest(journal=journal, offset=0, block=False)):
        out += resp.content
    return out


def gazette_read(spark: SparkSession, broker: BrokerProcess, selector: str, **options: str) -> DataFrame:
    r = spark.read.format("gazette").option("broker", broker.url).option("selector", selector)
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


@pytest.fixture(scope="module")
def written(admin: pb_grpc.JournalStub) -> tuple[str, list[tuple[str, bytes]]]:
    """Two journals of `test=<id>`, with JSON lines appended under the admin token."""
    test = unique()
    names = [f"auth/{test}/a", f"auth/{test}/b"]
    make_journals(admin, test, names)
    rows = []
    for i, name in enumerate(names):
        lines = [json.dumps({"n": n, "j": i}).encode() for n in range(5)]
        resp = append(admin, name, b"".join(line + b"\n" for line in lines))
        assert resp.status == pb.OK
        rows += [(name, line) for line in lines]
    return test, sorted(rows)


def test_source_reads_with_auth_token(
    spark: SparkSession, secured: BrokerProcess, written: tuple[str, list[tuple[str, bytes]]]
) -> None:
    test, rows = written
    # The journals are not persisted: executors read them through the broker, presenting the token too.
    reading = token(Capability.LIST | Capability.READ, f"test={test}")
    df = gazette_read(spark, secured, f"test={test}", authToken=reading)
    got = sorted((r.journal, bytes(r.value)) for r in df.select("journal", "value").collect())
    assert got == rows
    # A token whose selector matches other journals sees none of these.
    other = gazette_read(spark, secured, f"test={test}", authToken=token(Capability.LIST | Capability.READ, "test=x"))
    assert other.count() == 0


def test_stream_reads_with_auth_token(
    spark: SparkSession, secured: BrokerProcess, written: tuple[str, list[tuple[str, bytes]]], tmp_path: Path
) -> None:
    test, rows = written
    name = f"auth_{test}"
    q = (
        spark.readStream.format("gazette").option("broker", secured.url).option("selector", f"test={test}")
        .option("startingOffsets", "earliest").option("authToken", token(Capability.LIST | Capability.READ)).load()
        .writeStream.format("memory").queryName(name).option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True).start()
    )
    q.awaitTermination(120)
    assert q.exception() is None
    got = sorted((r.journal, bytes(r.value)) for r in spark.sql(f"SELECT journal, value FROM {name}").collect())
    assert got == rows


def test_source_without_token_fails_naming_the_authorization(
    spark: SparkSession, secured: BrokerProcess, written: tuple[str, list[tuple[str, bytes]]]
) -> None:
    test, _ = written
    with pytest.raises(Exception) as missing:
        gazette_read(spark, secured, f"test={test}").collect()
    line = first_line(missing.value)
    assert "UNAUTHENTICATED: missing or empty Authorization token" in line, line
    assert f"reading journals of selector 'test={test}'" in line, line
    assert "; no token presented: set option authToken" in line, line
    assert "Traceback" not in line

    listing_only = token(Capability.LIST)
    with pytest.raises(Exception) as no_read:
        gazette_read(spark, secured, f"test={test}", authToken=listing_only).collect()
    line = first_line(no_read.value)
    assert "missing required READ capability" in line and "; presented the token of option authToken" in line, line
    assert listing_only not in str(no_read.value)  # The secret is in no message.


def test_sink_writes_with_auth_token(
    spark: SparkSession, secured: BrokerProcess, admin: pb_grpc.JournalStub
) -> None:
    test = unique()
    name = f"auth/{test}/out"
    make_journals(admin, test, [name])
    frame = spark.createDataFrame([(json.dumps({"n": n}),) for n in range(6)], "value string").coalesce(2)

    def write(**options: str) -> None:
        w = frame.write.format("gazette").mode("append").option("broker", secured.url)
        w = w.option("selector", f"test={test}")
        for key, value in options.items():
            w = w.option(key, value)
        w.save()

    with pytest.raises(Exception) as missing:
        write()
    line = first_line(missing.value)
    assert "UNAUTHENTICATED: missing or empty Authorization token" in line, line
    assert "; no token presented: set option authToken" in line, line
    assert content(admin, name) == b""

    write(authToken=token(Capability.LIST | Capability.APPEND, f"test={test}"))
    # Transactional (JSON lines): the driver's commit ACKs went through with the token as well.
    df = gazette_read(spark, secured, f"test={test}", authToken=token(Capability.LIST | Capability.READ))
    assert sorted(json.loads(bytes(r.value))["n"] for r in df.collect()) == list(range(6))


def test_gazctl_pipelines_run_passes_its_token(
    secured: BrokerProcess, admin: pb_grpc.JournalStub, written: tuple[str, list[tuple[str, bytes]]], tmp_path: Path
) -> None:
    test, rows = written
    copy = f"auth/{test}-copy/out"
    make_journals(admin, f"{test}-copy", [copy])
    (tmp_path / "copy.yaml").write_text(
        f"name: auth-copy\nsource:\n  selector: test={test}\nsink:\n  journals: {{journal: {copy}}}\n"
    )
    # Only the flag carries the token: neither gazctl's nor Spark's environment has one.
    done = run_gazctl(
        secured, "--broker.auth-token", token(Capability.ALL), "pipelines", "run", "auth-copy",
        "--dir", str(tmp_path), "--master", "local[1]", cwd=tmp_path, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert f"wrote {len(rows)} rows" in done.stdout, done.stdout
    lines = [json.loads(line) for line in content(admin, copy).splitlines()]
    copied = sorted((doc["j"], doc["n"]) for doc in lines if "n" in doc)  # Not the ACKs.
    assert copied == sorted((json.loads(value)["j"], json.loads(value)["n"]) for _, value in rows)


def test_token_is_kept_out_of_reprs_and_messages() -> None:
    secret = token(Capability.READ)
    opts = parse_options({"selector": "app=x", "broker": "http://127.0.0.1:1", "authtoken": f"Bearer {secret}"})
    assert opts.auth_token == secret and opts.credentials() is not None
    assert secret not in repr(opts)
    assert parse_options({"selector": "app=x", "authToken": ""}).credentials() is None  # The environment's.
    with pytest.raises(GazetteOptionError, match=r"^authToken: not a bearer token") as bad:
        parse_options({"selector": "app=x", "authToken": "abc def-secret"})
    assert "secret" not in str(bad.value)
    config = SinkConfig("http://x", "", "rendezvous", "", 1, 0, True, -1, -1, auth_token=secret)
    assert secret not in repr(config)
    assert Signer(token=secret).token == secret and Signer(keys=KEYS).token == ""
    assert issubclass(PipelineAuthError, PermissionError)


def test_pipeline_options_carry_the_token() -> None:
    sink = JournalsSink(selector="c=d")
    pipeline = Pipeline("p", Path("p.yaml"), Source(selector="a=b", options={"broker": "http://own"}), sink)
    assert reader_options(pipeline, "http://flag", "tok") == {"broker": "http://own", "selector": "a=b",
                                                             "authToken": "tok"}
    assert "authToken" not in reader_options(pipeline, "http://flag")
    assert writer_options(sink, "http://flag", "tok") == {"selector": "c=d", "broker": "http://flag",
                                                          "authToken": "tok"}
