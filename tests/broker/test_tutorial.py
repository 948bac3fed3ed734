"""The broker part of the README tutorial, over HTTP and gRPC, against a real broker."""

from __future__ import annotations

import http.client
import threading
import time
import urllib.request

from broker.protocol import pb, pb_grpc
from tests.harness import BrokerProcess, apply_specs, journal_spec, wait_for_primary

JOURNAL = "example/journal"


def _put(broker: BrokerProcess, journal: str, body: bytes) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", broker.port, timeout=10)
    conn.request("PUT", f"/{journal}", body=body)
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp


def _get(broker: BrokerProcess, path: str) -> tuple[int, bytes, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", broker.port, timeout=10)
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, body, resp


def _grpc_read(stub: pb_grpc.JournalStub, journal: str, offset: int) -> bytes:
    out = b""
    for resp in stub.Read(pb.ReadRequest(journal=journal, offset=offset)):
        out += resp.content
    return out


def test_tutorial(broker: BrokerProcess, stub: pb_grpc.JournalStub) -> None:
    resp = apply_specs(stub, journal_spec(JOURNAL, message_type="Example"))
    assert resp.status == pb.OK
    wait_for_primary(stub, JOURNAL)

    put = _put(broker, JOURNAL, b"Hello, Gazette!\nSecond line.\n")
    assert put.status == 204
    assert put.headers["X-Commit-Begin"] == "0"
    assert put.headers["X-Commit-End"] == "29"
    assert put.headers["X-Write-Head"] == "29"

    status, body, _ = _get(broker, f"/{JOURNAL}")
    assert status == 206
    assert body == b"Hello, Gazette!\nSecond line.\n"
    status, body, resp2 = _get(broker, f"/{JOURNAL}?offset=16")
    assert status == 206
    assert body == b"Second line.\n"
    assert resp2.headers["Content-Range"].startswith("bytes 16-")
    assert _grpc_read(stub, JOURNAL, 0) == b"Hello, Gazette!\nSecond line.\n"
    assert _grpc_read(stub, JOURNAL, 16) == b"Second line.\n"


def test_concurrent_puts_land_whole(broker: BrokerProcess, stub: pb_grpc.JournalStub) -> None:
    journal = "example/concurrent"
    assert apply_specs(stub, journal_spec(journal)).status == pb.OK
    wait_for_primary(stub, journal)
    records = [f"record {i:02d} ".encode() + bytes([65 + i]) * (1000 + 37 * i) + b"\n" for i in range(20)]
    statuses: list[int] = []

    def put(body: bytes) -> None:
        statuses.append(_put(broker, journal, body).status)

    threads = [threading.Thread(target=put, args=(r,)) for r in records]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [204] * 20
    content = _grpc_read(stub, journal, 0)
    assert len(content) == sum(len(r) for r in records)
    lines = content.splitlines(keepends=True)
    assert sorted(lines) == sorted(records)  # Every append intact and never interleaved.


def test_blocking_read_streams_appends_as_they_commit(broker: BrokerProcess, stub: pb_grpc.JournalStub) -> None:
    journal = "example/blocking"
    assert apply_specs(stub, journal_spec(journal)).status == pb.OK
    wait_for_primary(stub, journal)
    assert _put(broker, journal, b"before\n").status == 204

    # A blocking read at the write head answers once the first new append commits.
    got: list[bytes] = []
    headers: dict[str, str] = {}

    def follow() -> None:
        with urllib.request.urlopen(f"{broker.url}/{journal}?block=true&offset=-1", timeout=20) as stream:
            headers.update(stream.headers.items())
            for _ in range(3):
                got.append(stream.readline())

    reader = threading.Thread(target=follow)
    reader.start()
    time.sleep(0.5)
    for i in range(3):
        assert _put(broker, journal, f"live {i}\n".encode()).status == 204
        time.sleep(0.2)
    reader.join(20)
    assert got == [b"live 0\n", b"live 1\n", b"live 2\n"]
    assert headers["Content-Range"].startswith("bytes 7-")
