"""The broker's HTTP gateway calls its Journal service in-process (broker.gateway.local): a real
`gazette serve`, driven over raw sockets where a client misbehaves."""

from __future__ import annotations

import http.client
import socket
import time
import uuid

from broker.protocol import pb, pb_grpc
from tests.support.harness import BrokerProcess, journal_spec


def create(stub: pb_grpc.JournalStub, name: str) -> None:
    change = pb.ApplyRequest.Change(upsert=journal_spec(name), expect_mod_revision=0)
    assert stub.Apply(pb.ApplyRequest(changes=[change])).status == pb.OK


def put(broker: BrokerProcess, name: str, body: bytes) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", broker.port, timeout=10)
    conn.request("PUT", f"/{name}", body=body)
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp


def put_until_committed(broker: BrokerProcess, name: str, body: bytes) -> http.client.HTTPResponse:
    deadline = time.monotonic() + 10
    while True:  # The journal's first assignment may take a moment.
        resp = put(broker, name, body)
        if resp.status == 204 or time.monotonic() > deadline:
            return resp
        time.sleep(0.05)


def test_a_put_cut_off_mid_body_appends_nothing(broker: BrokerProcess, stub: pb_grpc.JournalStub) -> None:
    name = f"gateway-local/{uuid.uuid4().hex[:8]}"
    create(stub, name)
    first = put_until_committed(broker, name, b"whole\n")
    assert first.status == 204 and first.getheader("X-Commit-End") == "6"

    with socket.create_connection(("127.0.0.1", broker.port)) as sock:
        sock.sendall(f"PUT /{name} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n".encode() + b"partial")
        time.sleep(0.2)  # The append has begun, holding the journal's pipeline.
    after = put(broker, name, b"next\n")
    assert after.status == 204
    assert (after.getheader("X-Commit-Begin"), after.getheader("X-Commit-End")) == ("6", "11")
    conn = http.client.HTTPConnection("127.0.0.1", broker.port, timeout=10)
    conn.request("GET", f"/{name}?offset=0")
    assert conn.getresponse().read() == b"whole\nnext\n"
    conn.close()


def test_a_blocking_read_whose_client_leaves_ends_quietly(broker: BrokerProcess, stub: pb_grpc.JournalStub) -> None:
    name = f"gateway-local/{uuid.uuid4().hex[:8]}"
    create(stub, name)
    assert put_until_committed(broker, name, b"one\n").status == 204
    before = broker.logs().count("\n")
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", broker.port)) as sock:
            sock.sendall(f"GET /{name}?offset=0&block=true HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            sock.settimeout(10)
            assert sock.recv(4096).startswith(b"HTTP/1.1 206")
    assert put(broker, name, b"two\n").status == 204  # The reads' ends left the journal as it was.
    added = broker.logs().splitlines()[before:]
    assert not [line for line in added if "Traceback" in line or "in-process" in line], added


def test_a_put_the_broker_refuses_before_reading_its_body_is_answered(
    broker: BrokerProcess, stub: pb_grpc.JournalStub
) -> None:
    """An Append the broker answers with a status before it read the whole request (here
    INSUFFICIENT_JOURNAL_BROKERS: replication 2, one broker) is answered to the PUT with that
    status, whatever the body: an empty one (a client's write barrier) included. (The relay's
    half-close, racing the Append's end, dropped the connection with no answer: the client could
    not know whether the append committed, and a recovering shard's player failed its barrier.)"""
    name = f"gateway-local/{uuid.uuid4().hex[:8]}"
    change = pb.ApplyRequest.Change(upsert=journal_spec(name, replication=2), expect_mod_revision=0)
    assert stub.Apply(pb.ApplyRequest(changes=[change])).status == pb.OK
    before = broker.logs().count("\n")
    for body in [b"", b"", b"content\n", b""] * 5:
        conn = http.client.HTTPConnection("127.0.0.1", broker.port, timeout=10)
        conn.request("PUT", f"/{name}", body=body)
        resp = conn.getresponse()
        text = resp.read()
        conn.close()
        assert (resp.status, text) == (500, b"INSUFFICIENT_JOURNAL_BROKERS\n"), (resp.status, text)
    added = broker.logs().splitlines()[before:]
    assert not [line for line in added if "Traceback" in line or "connection failed" in line], added
