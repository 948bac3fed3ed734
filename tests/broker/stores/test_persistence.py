"""Fragments persist to file://, s3:// (moto), gs:// (fake-gcs-server) and azure:// (Azurite) stores,
and brokers serve them after restarts.

Every test runs real processes: the session's etcd, `gazette serve` brokers, and each store's
emulator (started once per module; each test has a bucket of its own). Each test is parametrized
over the store kinds; those about the broker rather than the store run over file:// only.
"""

from __future__ import annotations

import hashlib
import random
import re
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.fragment.codecs import decompressor
from broker.fragment.names import parse_fragment_from_relative_path
from broker.protocol import pb, pb_grpc
from tests.support.harness import BrokerProcess, apply_specs, journal_spec, wait_for_primary
from tests.support.store_emulators import EmulatorProcess

JOURNAL = "example/journal"
NAME_RE = re.compile(r"^[0-9a-f]{16}-[0-9a-f]{16}-[0-9a-f]{40}(\.raw|\.gz|\.sz|\.zst|)$")
CODECS = [pb.NONE, pb.GZIP, pb.SNAPPY, pb.ZSTANDARD, pb.GZIP_OFFLOAD_DECOMPRESSION]


@dataclass
class Store:
    """A fragment store under test: its URL for specs, and direct access to its objects."""

    kind: str
    url: str
    file_root: Path
    emulator: EmulatorProcess | None = None
    bucket: str = ""
    prefix: str = ""
    brokers: list[BrokerProcess] = field(default_factory=list)

    def objects(self, journal: str = JOURNAL) -> dict[str, bytes]:
        """Persisted objects of `journal`, by path relative to `<journal>/`."""
        if self.emulator is None:
            top = self.file_root / journal
            return {
                p.relative_to(top).as_posix(): p.read_bytes()
                for p in sorted(top.rglob("*")) if p.is_file() and not p.name.startswith(".partial-")
            }
        base = f"{self.prefix}{journal}/"
        return {k[len(base):]: v for k, v in self.emulator.snapshot(self.bucket).items() if k.startswith(base)}

    def fetch(self, url: str) -> bytes:
        """GET a fragment URL the broker handed out: `file://` is relative to the file root."""
        if url.startswith("file://"):
            return (self.file_root / url.removeprefix("file:///")).read_bytes()
        with urllib.request.urlopen(url, timeout=10) as resp:
            body: bytes = resp.read()
            return body


EMULATOR_FIXTURES = {"s3": "moto", "gs": "fake_gcs", "azure": "azurite"}


@pytest.fixture(params=["file", "s3", "gs", "azure"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    file_root = tmp_path / "fragments"
    file_root.mkdir()
    if request.param == "file":
        return Store("file", "file:///", file_root)
    emulator: EmulatorProcess = request.getfixturevalue(EMULATOR_FIXTURES[request.param])
    bucket, prefix = f"fragments-{uuid.uuid4().hex[:12]}", "a/prefix/"
    emulator.create_bucket(bucket)
    return Store(request.param, emulator.store_url(bucket, prefix), file_root, emulator, bucket, prefix)


@pytest.fixture
def start_broker(
    store: Store, etcd_endpoint: str, etcd_prefix: str, tmp_path: Path
) -> Iterator[Callable[..., BrokerProcess]]:
    """Start brokers sharing one keyspace and file root; each gets a state directory of its own."""
    started: list[BrokerProcess] = []

    def start(broker_id: str = "", clock_offset: float = 0.0) -> BrokerProcess:
        proc = BrokerProcess(
            tmp_path, etcd_endpoint, etcd_prefix, "--broker.file-root", str(store.file_root), broker_id=broker_id,
            clock_offset=clock_offset,
        )
        started.append(proc)
        return proc.wait_ready()

    yield start
    for proc in started:
        proc.stop()


def _spec(store: Store, codec: int = pb.NONE, length: int = 4096, **fragment: object) -> pb.JournalSpec:
    spec = journal_spec(JOURNAL)
    spec.fragment.stores.append(store.url)
    spec.fragment.compression_codec = codec  # type: ignore[assignment]
    spec.fragment.length = length
    spec.fragment.refresh_interval.seconds = 1
    for key, value in fragment.items():
        setattr(spec.fragment, key, value)
    return spec


def _apply(broker: BrokerProcess, spec: pb.JournalSpec) -> None:
    channel, stub = broker.stub()
    with channel:
        resp = apply_specs(stub, spec, revision=-1)
        assert resp.status == pb.OK, resp
        wait_for_primary(stub, spec.name)


def _append(stub: pb_grpc.JournalStub, data: bytes, journal: str = JOURNAL) -> pb.AppendResponse:
    resp = _try_append(stub, data, journal)
    assert resp.status == pb.OK, resp
    return resp


def _try_append(stub: pb_grpc.JournalStub, data: bytes, journal: str = JOURNAL) -> pb.AppendResponse:
    reqs = [pb.AppendRequest(journal=journal), pb.AppendRequest(content=data), pb.AppendRequest()]
    resp: pb.AppendResponse = stub.Append(iter(reqs), timeout=30)
    return resp


def _read(stub: pb_grpc.JournalStub, begin: int, end: int, journal: str = JOURNAL) -> bytes:
    out = bytearray()
    for resp in stub.Read(pb.ReadRequest(journal=journal, offset=begin, end_offset=end), timeout=30):
        assert resp.status == pb.OK, resp
        out += resp.content
    return bytes(out)


def _wait_until(what: str, cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting until {what}")
        time.sleep(0.1)


def _decode(path: str, raw: bytes) -> tuple[pb.Fragment, bytes]:
    spec = parse_fragment_from_relative_path(JOURNAL, path)
    return spec, decompressor(spec.compression_codec).decompress(raw)


def _covered(objects: dict[str, bytes]) -> int:
    """The end of the contiguous run of persisted fragments from offset 0 (0 if none)."""
    end = 0
    for spec in sorted((parse_fragment_from_relative_path(JOURNAL, p) for p in objects), key=lambda f: f.begin):
        if spec.begin <= end:
            end = max(end, spec.end)
    return end


def _check_objects(objects: dict[str, bytes], journal_bytes: bytes) -> list[pb.Fragment]:
    """Each object is named as documented, decodes to the journal's bytes and has their SHA-1;
    together they tile the journal from 0 without overlap. Returns their specs in order."""
    specs = []
    for path, raw in objects.items():
        assert NAME_RE.match(path.rsplit("/", 1)[-1]), path
        spec, content = _decode(path, raw)
        assert content == journal_bytes[spec.begin:spec.end], path
        assert hashlib.sha1(content).digest() == _sum_bytes(spec), path
        specs.append(spec)
    specs.sort(key=lambda f: f.begin)
    offset = 0
    for spec in specs:
        assert spec.begin == offset, f"gap or duplicate at {offset}: {[(f.begin, f.end) for f in specs]}"
        offset = spec.end
    return specs


def _sum_bytes(spec: pb.Fragment) -> bytes:
    s = spec.sum
    return s.part1.to_bytes(8, "big") + s.part2.to_bytes(8, "big") + s.part3.to_bytes(4, "big")


def _lines(rng: random.Random, n: int) -> bytes:
    """Semi-compressible JSON lines."""
    return b"".join(
        b'{"id":"%032x","seq":%d,"value":%d}\n' % (rng.getrandbits(128), i, rng.randrange(1000)) for i in range(n)
    )


def test_fragments_roll_and_persist_with_every_codec(store: Store, start_broker: Callable[..., BrokerProcess]) -> None:
    broker = start_broker()
    rng = random.Random(1)
    journal = bytearray()
    channel, stub = broker.stub()
    # Gazette refuses GZIP_OFFLOAD_DECOMPRESSION with file:// stores: it relies on HTTP decoding.
    codecs = CODECS[:-1] if store.kind == "file" else CODECS
    with channel:
        for codec in codecs:
            # The codec applies from the next roll: append past fragment.length under each one.
            _apply(broker, _spec(store, codec, length=2048))
            for _ in range(4):
                data = _lines(rng, 12)
                assert _append(stub, data).commit.begin == len(journal)
                journal += data
        # The spool holds at most fragment.length plus one append; everything before it rolled.
        rolled = len(journal) - 2048 - 1000
        _wait_until("rolled fragments are persisted", lambda: _covered(store.objects()) >= rolled)
        assert _read(stub, 0, len(journal)) == journal

    assert broker.stop() == 0  # SIGTERM persists the spool too.
    specs = _check_objects(store.objects(), bytes(journal))
    assert specs[-1].end == len(journal)
    assert {s.compression_codec for s in specs} == set(codecs)
    assert len(specs) > len(codecs)
    if store.kind == "file":
        assert (store.file_root / JOURNAL).is_dir()


def test_sigterm_restart_serves_every_byte_and_resumes(
    store: Store, start_broker: Callable[..., BrokerProcess]
) -> None:
    rng = random.Random(2)
    first = start_broker("restarting")
    _apply(first, _spec(store, pb.SNAPPY, length=16 * 1024))
    journal = bytearray()
    channel, stub = first.stub()
    with channel:
        for _ in range(30):
            data = _lines(rng, rng.randrange(1, 40))
            _append(stub, data)
            journal += data
    assert first.stop() == 0, first.logs()
    _check_objects(store.objects(), bytes(journal))

    # The same broker restarted (its spool directory is gone with the process), then a
    # different broker on an empty disk: both serve everything and append at the end.
    for broker_id in ("restarting", "fresh-disk"):
        broker = start_broker(broker_id)
        channel, stub = broker.stub()
        with channel:
            wait_for_primary(stub, JOURNAL)
            assert _read(stub, 0, len(journal)) == journal
            data = _lines(rng, 5)
            assert _append(stub, data).commit.begin == len(journal)
            journal += data
        assert broker.stop() == 0, broker.logs()
    _check_objects(store.objects(), bytes(journal))


def test_do_not_proxy_reads_and_signed_fragment_listing(
    store: Store, start_broker: Callable[..., BrokerProcess]
) -> None:
    broker = start_broker()
    _apply(broker, _spec(store, pb.GZIP, length=1024))
    rng = random.Random(3)
    journal = bytearray()
    channel, stub = broker.stub()
    with channel:
        for _ in range(8):
            data = _lines(rng, 10)
            _append(stub, data)
            journal += data
        rolled = len(journal) - 1024 - 1000

        def persisted() -> list[pb.FragmentsResponse._Fragment]:
            resp = stub.ListFragments(pb.FragmentsRequest(journal=JOURNAL))
            return [f for f in resp.fragments if f.spec.backing_store]

        _wait_until("the index lists persisted fragments", lambda: sum(
            f.spec.end - f.spec.begin for f in persisted()) >= rolled)

        # do_not_proxy: metadata with a fragment_url, then the stream ends; the URL opens directly.
        offset = 5
        responses = list(stub.Read(pb.ReadRequest(journal=JOURNAL, offset=offset, do_not_proxy=True)))
        assert len(responses) == 1, responses
        [resp] = responses
        assert resp.status == pb.OK and resp.fragment.backing_store == store.url and resp.fragment_url
        content = decompressor(resp.fragment.compression_codec).decompress(store.fetch(resp.fragment_url))
        assert content == journal[resp.fragment.begin:resp.fragment.end]
        assert resp.fragment.begin <= offset < resp.fragment.end

        # ListFragments pages through every fragment and signs each persisted one.
        pages, token, listed = 0, 0, []
        while True:
            req = pb.FragmentsRequest(journal=JOURNAL, page_limit=2, next_page_token=token)
            req.signatureTTL.seconds = 60
            page = stub.ListFragments(req)
            assert page.status == pb.OK and len(page.fragments) <= 2
            listed += list(page.fragments)
            pages += 1
            token = page.next_page_token
            if token == 0:
                break
        assert pages >= 2
        assert [f.spec.begin for f in listed] == sorted(f.spec.begin for f in listed)
        assert listed[-1].spec.end == len(journal)
        for f in listed:
            if not f.spec.backing_store:
                assert not f.signed_url
                continue
            content = decompressor(f.spec.compression_codec).decompress(store.fetch(f.signed_url))
            assert content == journal[f.spec.begin:f.spec.end]


def test_store_health(store: Store, start_broker: Callable[..., BrokerProcess]) -> None:
    broker = start_broker()
    channel, stub = broker.stub()
    with channel:
        resp = stub.FragmentStoreHealth(
            pb.FragmentStoreHealthRequest(fragment_store=store.url, check_delete=True, check_delete_prefix="probe/")
        )
        assert resp.status == pb.OK, resp.store_health_error
        # A store whose bucket (or directory) does not exist.
        missing = "file:///missing/" if store.emulator is None else store.emulator.store_url("missing-bucket", "p/")
        bad = stub.FragmentStoreHealth(pb.FragmentStoreHealthRequest(fragment_store=missing))
        assert bad.status == pb.FRAGMENT_STORE_UNHEALTHY
        assert missing in bad.store_health_error


def test_persist_waits_out_a_store_outage(store: Store, start_broker: Callable[..., BrokerProcess]) -> None:
    if store.emulator is None:
        pytest.skip("the outage is simulated by stopping the store's server")
    emulator = store.emulator
    broker = start_broker()
    _apply(broker, _spec(store, pb.ZSTANDARD, length=1024))
    rng = random.Random(4)
    journal = bytearray()
    channel, stub = broker.stub()
    with channel:
        for _ in range(3):
            data = _lines(rng, 10)
            _append(stub, data)
            journal += data
        _wait_until("the first fragments persist", lambda: _covered(store.objects()) > 0)
        saved = emulator.snapshot(store.bucket)
        emulator.stop()

        # The store is down: appends are acknowledged until the broker knows it (the persist of a
        # rolled fragment fails); then, as Gazette's, an append answers FRAGMENT_STORE_UNHEALTHY, why
        # in its store_health_error, after a few failed health checks.
        outage_begin = len(journal)
        refused: pb.AppendResponse | None = None
        deadline = time.monotonic() + 60
        while refused is None and time.monotonic() < deadline:
            data = _lines(rng, 10)
            resp = _try_append(stub, data)
            if resp.status != pb.OK:
                refused = resp
            else:
                journal += data
                time.sleep(0.2)  # While the persist of a rolled fragment fails.
        assert refused is not None, "every append was acknowledged while the only store was down"
        assert refused.status == pb.FRAGMENT_STORE_UNHEALTHY, refused
        assert refused.store_health_error.startswith(f"fragment store {store.url} unhealthy: "), refused
        outage_end = len(journal)
        health = stub.FragmentStoreHealth(pb.FragmentStoreHealthRequest(fragment_store=store.url))
        assert health.status == pb.FRAGMENT_STORE_UNHEALTHY and health.store_health_error
        # Bytes still in the spool are served; persisted ones would need the store.
        assert _read(stub, outage_begin, outage_end) == journal[outage_begin:]

        emulator.start()
        emulator.restore(store.bucket, saved)
        # Appends are taken again once a check of the store passes; what was acknowledged persists.
        for _ in range(4):
            data = _lines(rng, 10)
            _append(stub, data)
            journal += data
        _wait_until("fragments acknowledged during the outage persist", lambda: _covered(store.objects()) >= outage_end)
    assert broker.stop() == 0, broker.logs()
    _check_objects(store.objects(), bytes(journal))

    fresh = start_broker()
    channel, stub = fresh.stub()
    with channel:
        wait_for_primary(stub, JOURNAL)
        assert _read(stub, 0, len(journal)) == journal


def test_idle_fragment_rolls_at_flush_interval(store: Store, start_broker: Callable[..., BrokerProcess]) -> None:
    if store.kind != "file":
        pytest.skip("store-independent: the flush is the broker's")
    # Flush windows are aligned to the epoch minute of the broker's wall clock: shifted to read
    # second 48 of a minute at its start, so that a boundary comes within seconds, not a minute.
    offset = (48 - time.time()) % 60
    broker = start_broker(clock_offset=offset)
    spec = _spec(store, pb.NONE, length=1 << 30)
    spec.fragment.flush_interval.seconds = 60  # The minimum.
    _apply(broker, spec)
    channel, stub = broker.stub()
    with channel:
        first, second = b"first append\n", b"second append, just before a flush boundary\n"
        _append(stub, first)
        # Append shortly before the broker's next minute boundary.
        while not 52 <= (time.time() + offset) % 60 < 57:
            time.sleep(0.2)
        _append(stub, second)  # Also rolls the journal's first fragment (the first-write rule).
        _wait_until("the first fragment persists", lambda: _covered(store.objects()) == len(first), 10)
        if (time.time() + offset) % 60 >= 52:  # The window hasn't ended: nothing rolls it yet.
            assert _covered(store.objects()) == len(first), "the idle fragment rolled before its window ended"
        # No more appends: the primary's pulse rolls the fragment once its window ends.
        _wait_until("the idle fragment persists", lambda: _covered(store.objects()) == len(first + second), 20)


def test_a_new_replica_reads_what_its_peer_persisted_without_waiting_for_a_refresh(
    store: Store, start_broker: Callable[..., BrokerProcess]
) -> None:
    """A broker that joins a journal's route holds none of the content before its spool; what the
    primary held then, it persists once the route changes. A blocking read of that range on the
    new replica finds a gap in its index, which only a store listing fills: the replica lists its
    stores at once rather than at its refresh_interval (10 minutes here)."""
    if store.kind != "file":
        pytest.skip("store-independent: the listing is the broker's")
    first = start_broker()
    spec = _spec(store, pb.NONE, length=1 << 30)
    spec.fragment.refresh_interval.seconds = 600
    _apply(first, spec)
    persisted, held = b"the journal's first fragment, persisted at once\n", b"held in the first broker's spool\n"
    channel, stub = first.stub()
    with channel:
        _append(stub, persisted)
        _wait_until("the first fragment persists", lambda: _covered(store.objects()) == len(persisted))
        _append(stub, held)
    time.sleep(0.5)
    assert _covered(store.objects()) == len(persisted)

    second = start_broker()
    spec.replication = 2
    _apply(first, spec)
    channel, stub = second.stub()
    with channel:

        def members() -> int:
            [journal] = next(iter(stub.List(pb.ListRequest(selector=pb.LabelSelector())))).journals
            return len(journal.route.members)

        _wait_until("both brokers serve the journal", lambda: members() == 2)
        total = len(persisted + held)
        _wait_until("the first broker persists its spool", lambda: _covered(store.objects()) == total)
        req = pb.ReadRequest(journal=JOURNAL, offset=len(persisted), end_offset=total, block=True)
        resps = list(stub.Read(req, timeout=20))
    assert resps[0].header.process_id.suffix == second.broker_id  # A replica serves reads itself.
    assert b"".join(r.content for r in resps) == held


def test_path_postfix_template(store: Store, start_broker: Callable[..., BrokerProcess]) -> None:
    if store.kind != "file":
        pytest.skip("store-independent: the postfix is the broker's")
    broker = start_broker()
    spec = _spec(store, pb.SNAPPY)
    spec.fragment.path_postfix_template = 'date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}'
    _apply(broker, spec)
    channel, stub = broker.stub()
    data = b"".join(b"line %d\n" % i for i in range(100))
    with channel:
        _append(stub, data)
    assert broker.stop() == 0
    [path] = store.objects()
    assert re.match(r"^date=\d{4}-\d{2}-\d{2}/[0-9a-f]{16}-", path), path
    assert path.startswith(time.strftime("date=%Y-%m-%d/", time.gmtime()))

    fresh = start_broker()
    channel, stub = fresh.stub()
    with channel:
        wait_for_primary(stub, JOURNAL)
        assert _read(stub, 0, len(data)) == data
        [listed] = stub.ListFragments(pb.FragmentsRequest(journal=JOURNAL)).fragments
        assert listed.spec.path_postfix == path.split("/")[0]


def test_journal_without_stores_is_a_pure_stream(store: Store, start_broker: Callable[..., BrokerProcess]) -> None:
    if store.kind != "file":
        pytest.skip("no store involved")
    broker = start_broker()
    spec = journal_spec(f"stream/{uuid.uuid4().hex}")
    _apply(broker, spec)
    channel, stub = broker.stub()
    with channel:
        _append(stub, b"a" * 10, spec.name)
        _append(stub, b"b" * 10, spec.name)
        assert _read(stub, 0, 20, spec.name) == b"a" * 10 + b"b" * 10
    assert broker.stop() == 0
    assert not (store.file_root / "stream").exists()
