"""gRPC input no well-behaved client sends: each gets grpc-go's answer, and no traceback is logged.

Against a real broker: bytes that are no protobuf message, a signature TTL past Go's Duration,
request metadata that is not UTF-8 (raw HTTP/2 frames through `h2`, since grpcio refuses to send
it), and clients that vanish while a Read is streaming.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import pytest

from broker.protocol import pb, pb_grpc
from tests.support.harness import ROOT, BrokerProcess, append, apply_specs, journal_spec, wait_for_primary

JOURNAL = "hostile/grpc"


def _raw(data: bytes) -> bytes:
    return data


@pytest.fixture(scope="module")
def journal(stub: pb_grpc.JournalStub) -> str:
    assert apply_specs(stub, journal_spec(JOURNAL)).status == pb.OK
    wait_for_primary(stub, JOURNAL)
    return JOURNAL


def tracebacks(broker: BrokerProcess) -> int:
    return broker.logs().count("Traceback")


def raw_call(channel: grpc.Channel, method: str, kind: str) -> Callable[[bytes], Any]:
    """A call of `method` that sends `data` as its one request message, unparsed."""
    path = f"/protocol.Journal/{method}"
    if kind == "unary_unary":
        return lambda data: channel.unary_unary(path, _raw, _raw)(data, timeout=10)
    if kind == "unary_stream":
        return lambda data: list(channel.unary_stream(path, _raw, _raw)(data, timeout=10))
    if kind == "stream_unary":
        return lambda data: channel.stream_unary(path, _raw, _raw)(iter([data]), timeout=10)
    return lambda data: list(channel.stream_stream(path, _raw, _raw)(iter([data]), timeout=10))


@pytest.mark.parametrize(
    ("method", "kind"),
    [
        ("List", "unary_stream"),
        ("Apply", "unary_unary"),
        ("Read", "unary_stream"),
        ("Append", "stream_unary"),
        ("Replicate", "stream_stream"),
        ("ListFragments", "unary_unary"),
        ("FragmentStoreHealth", "unary_unary"),
    ],
)
@pytest.mark.parametrize("data", [b"\x0f", b"\x0a\xff\xff\xff\xff\x0f"], ids=["bad-tag", "bad-length"])
def test_undecodable_requests_are_internal_errors(
    broker: BrokerProcess, method: str, kind: str, data: bytes
) -> None:
    before = tracebacks(broker)
    channel = grpc.insecure_channel(broker.target)
    with channel, pytest.raises(grpc.RpcError) as info:
        raw_call(channel, method, kind)(data)
    err: Any = info.value
    assert err.code() == grpc.StatusCode.INTERNAL
    assert err.details().startswith("grpc: error unmarshalling request: ")
    assert tracebacks(broker) == before


def test_signature_ttl_past_go_durations_is_invalid(
    broker: BrokerProcess, stub: pb_grpc.JournalStub, journal: str
) -> None:
    before = tracebacks(broker)
    req = pb.FragmentsRequest(journal=journal)
    req.signatureTTL.seconds = 9223372036854775807
    with pytest.raises(grpc.RpcError) as info:
        stub.ListFragments(req, timeout=10)
    err: Any = info.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "invalid SignatureTTL (9223372036854775807s; must be <= 2562047h47m16.854775807s)" in err.details()
    assert tracebacks(broker) == before


def _h2_call(port: int, path: bytes, body: bytes, headers: list[tuple[bytes, bytes]]) -> list[Any]:
    """One gRPC call in raw HTTP/2 frames; the events of its response."""
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, validate_outbound_headers=False, normalize_outbound_headers=False)
    )
    events: list[Any] = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        conn.send_headers(1, [
            (b":method", b"POST"), (b":scheme", b"http"), (b":path", path), (b":authority", b"broker"),
            (b"content-type", b"application/grpc"), (b"te", b"trailers"), *headers,
        ])
        conn.send_data(1, b"\x00" + len(body).to_bytes(4, "big") + body, end_stream=True)
        sock.sendall(conn.data_to_send())
        while not any(isinstance(e, h2.events.StreamEnded | h2.events.StreamReset) for e in events):
            data = sock.recv(65536)
            assert data, "the broker closed the connection without ending the call"
            events.extend(conn.receive_data(data))
            sock.sendall(conn.data_to_send())
    return events


def test_metadata_that_is_not_utf8_is_ignored_quietly(broker: BrokerProcess, journal: str) -> None:
    before = tracebacks(broker)
    events = _h2_call(
        broker.port, b"/protocol.Journal/List", pb.ListRequest().SerializeToString(), [(b"x-custom", b"caf\xe9\xff")]
    )
    trailers = next(e for e in events if isinstance(e, h2.events.TrailersReceived))
    assert dict(trailers.headers)[b"grpc-status"] == b"0"
    body = b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))
    assert journal.encode() in body
    assert tracebacks(broker) == before


def _vanishing_readers(target: str, journal: str, count: int) -> Iterator[int]:
    """Clients that start a Read, take two responses and exit without closing anything."""
    code = (
        "import os, sys, grpc\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from broker.protocol import pb, pb_grpc\n"
        f"stub = pb_grpc.JournalStub(grpc.insecure_channel({target!r}))\n"
        f"it = stub.Read(pb.ReadRequest(journal={journal!r}, block=True))\n"
        "next(it); next(it)\n"
        "os._exit(0)\n"
    )
    for _ in range(count):
        yield subprocess.run([sys.executable, "-c", code], timeout=30).returncode


def test_clients_vanishing_mid_read_log_no_traceback(
    broker: BrokerProcess, stub: pb_grpc.JournalStub, journal: str
) -> None:
    for _ in range(8):
        assert append(stub, journal, os.urandom(1 << 20)).status == pb.OK
    before = tracebacks(broker)
    assert list(_vanishing_readers(broker.target, journal, 6)) == [0] * 6
    time.sleep(0.5)  # Let the broker notice each client's end.
    assert tracebacks(broker) == before
    # The broker still serves reads.
    assert stub.Read(pb.ReadRequest(journal=journal, offset=0, block=False), timeout=10).next().status == pb.OK
