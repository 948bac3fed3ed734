"""`gazctl journals fragments --url-ttl` and `gazctl journals prune` with journals on object stores:
s3:// (moto), gs:// (fake-gcs-server) and azure:// (Azurite), one broker for all of them. gazctl signs
nothing itself (the broker does) but deletes from the store itself, with the credentials of its own
environment."""

from __future__ import annotations

import time
import urllib.request
import uuid

import pytest

from broker.fragment.codecs import decompressor
from broker.protocol import pb, pb_grpc
from tests.support.harness import (
    BrokerProcess,
    append,
    apply_specs,
    journal_spec,
    run_gazctl,
    table_rows,
    wait_for_primary,
)
from tests.support.store_emulators import EmulatorProcess, emulator_of

RETENTION = 2


def _persisted(stub: pb_grpc.JournalStub, journal: str) -> list[pb.Fragment]:
    resp = stub.ListFragments(pb.FragmentsRequest(journal=journal))
    return [f.spec for f in resp.fragments if f.spec.backing_store]


@pytest.mark.parametrize("scheme", ["s3", "gs", "azure"])
def test_signed_fragment_urls_and_prune(
    store_broker: BrokerProcess, emulators: dict[str, EmulatorProcess | str], scheme: str
) -> None:
    emulator = emulator_of(emulators, scheme)
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(bucket)
    journal = f"stores/{scheme}"
    spec = journal_spec(journal)
    spec.fragment.stores.append(emulator.store_url(bucket, "pre/"))
    spec.fragment.length = 1024
    spec.fragment.compression_codec = pb.SNAPPY
    spec.fragment.refresh_interval.seconds = 1
    spec.fragment.retention.seconds = RETENTION
    channel, stub = store_broker.stub()
    with channel:
        assert apply_specs(stub, spec).status == pb.OK
        wait_for_primary(stub, journal)
        chunks = [b"a" * 43, b"b" * 1100, b"c" * 1100, b"d" * 10]
        for chunk in chunks:
            assert append(stub, journal, chunk).status == pb.OK
        content = b"".join(chunks)
        deadline = time.monotonic() + 20
        while len(_persisted(stub, journal)) < 3:
            assert time.monotonic() < deadline, stub.ListFragments(pb.FragmentsRequest(journal=journal))
            time.sleep(0.1)
        persisted = _persisted(stub, journal)

        # Each persisted fragment's URL is the store's own, signed for an hour, and fetches its content.
        done = run_gazctl(store_broker, "journals", "fragments", "-l", f"name={journal}", "--url-ttl", "1h")
        assert done.returncode == 0, done.stderr
        rows = table_rows(done.stdout)
        assert rows[0][-1] == "URL"
        urls = [r[-1] for r in rows[1:4]]
        for spec_, url in zip(persisted, urls, strict=True):
            assert url.startswith(emulator.endpoint), url
            with urllib.request.urlopen(url, timeout=10) as resp:
                fetched = decompressor(spec_.compression_codec).decompress(resp.read())
            assert fetched == content[spec_.begin:spec_.end]

        # Once older than the retention, gazctl deletes them from the store.
        names = {k.rsplit("/", 1)[-1] for k in emulator.snapshot(bucket)}
        assert len(names) == 3
        time.sleep(max(0.0, max(f.mod_time for f in persisted) + RETENTION + 1 - time.time()))
        done = run_gazctl(store_broker, "journals", "prune", "-l", f"name={journal}")
        assert done.returncode == 0, done.stderr
        pruned = [line.split("\t") for line in done.stdout.splitlines()]
        assert {p[2] for p in pruned} == names and all(p[0] == "pruned" for p in pruned)
        assert emulator.snapshot(bucket) == {}
        deadline = time.monotonic() + 10
        while _persisted(stub, journal):  # The next refresh drops them from the index.
            assert time.monotonic() < deadline
            time.sleep(0.1)
