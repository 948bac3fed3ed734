"""Malformed requests of every RPC and gateway route get a clear error; the broker survives them."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator

import grpc
import pytest

from broker.protocol import pb, pb_grpc
from tests.support.harness import BrokerProcess, apply_specs, journal_spec, wait_for_primary


def _http(broker: BrokerProcess, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", broker.port, timeout=10)
    conn.request(method, path, body=body)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


@pytest.mark.parametrize(
    ("rpc", "request_", "message"),
    [
        ("Read", pb.ReadRequest(journal="bad//name"), "Journal: must be a clean path (bad//name)"),
        ("Read", pb.ReadRequest(journal="ok/journal", offset=-2), "invalid Offset"),
        ("ListFragments", pb.FragmentsRequest(journal="ok/journal", page_limit=20000), "PageLimit"),
        ("FragmentStoreHealth", pb.FragmentStoreHealthRequest(fragment_store="invalid"), "not absolute"),
        ("Apply", pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=pb.JournalSpec(name="x/y/z"))]),
         "Changes[0].Upsert"),
        ("List", pb.ListRequest(selector=pb.LabelSelector(
            include=pb.LabelSet(labels=[pb.Label(name="prefix", value="no-slash")]))), "expected trailing '/'"),
    ],
)
def test_invalid_rpc_requests(stub: pb_grpc.JournalStub, rpc: str, request_: object, message: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        result = getattr(stub, rpc)(request_)
        if rpc in ("Read", "List"):
            list(result)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (err.value.details() or "")


def _append_stream(*reqs: pb.AppendRequest) -> Iterator[pb.AppendRequest]:
    yield from reqs


def test_malformed_append_streams(stub: pb_grpc.JournalStub) -> None:
    assert apply_specs(stub, journal_spec("malformed/append")).status == pb.OK
    wait_for_primary(stub, "malformed/append")
    cases = [
        ([pb.AppendRequest(journal="malformed/append", content=b"x")], "unexpected Content"),
        ([pb.AppendRequest(journal="malformed/append"), pb.AppendRequest(journal="malformed/append")],
         "expected Content chunk"),
        ([pb.AppendRequest(journal="malformed/append"), pb.AppendRequest(content=b"x"), pb.AppendRequest(),
          pb.AppendRequest(content=b"y")], "expected EOF after empty Content chunk"),
        ([pb.AppendRequest(journal="malformed/append"), pb.AppendRequest(content=b"lost")], "unexpected EOF"),
        ([], "expected first AppendRequest"),
        ([pb.AppendRequest(content=b"no journal first")], "expected Journal"),
        ([pb.AppendRequest(journal="malformed/append"), pb.AppendRequest(content=b"x", offset=3)],
         "unexpected Offset"),
    ]
    for reqs, message in cases:
        with pytest.raises(grpc.RpcError) as err:
            stub.Append(_append_stream(*reqs))
        assert message in (err.value.details() or ""), err.value.details()
    # Nothing from the failed streams landed; the journal still takes appends.
    ok = stub.Append(_append_stream(pb.AppendRequest(journal="malformed/append"),
                                    pb.AppendRequest(content=b"fine"), pb.AppendRequest()))
    assert ok.status == pb.OK and (ok.commit.begin, ok.commit.end) == (0, 4)


def test_replicate_without_header(stub: pb_grpc.JournalStub) -> None:
    call = stub.Replicate(iter([pb.ReplicateRequest(content=b"x", content_delta=0)]))
    with pytest.raises(grpc.RpcError):
        list(call)


def test_gateway_rejects_bad_requests(broker: BrokerProcess) -> None:
    assert _http(broker, "GET", "/journal%2F%2Fname") == (400, b"Journal: must be a clean path (journal//name)\n")
    status, body = _http(broker, "GET", "/some/journal?extra=1")
    assert status == 400 and b'schema: invalid path "extra"' in body
    status, body = _http(broker, "GET", "/some/journal?offset=abc")
    assert status == 400 and b'schema: error converting value for "offset"' in body
    status, body = _http(broker, "PUT", "/some/journal?offset=1", b"x")
    assert status == 400
    status, body = _http(broker, "DELETE", "/some/journal")
    assert (status, body) == (400, b"unknown method: DELETE\n")
    assert _http(broker, "GET", "/missing/journal")[0] == 404
    assert _http(broker, "PUT", "/missing/journal", b"x")[0] == 500


def test_garbage_on_the_wire(broker: BrokerProcess) -> None:
    with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as sock:
        sock.sendall(b"\x00\x01garbage that is not HTTP\r\n\r\n")
        reply = sock.recv(1024)
    assert reply.startswith(b"HTTP/1.1 400")
    with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 64)
        sock.recv(1024)
    # The broker is still serving.
    assert _http(broker, "GET", "/debug/ready")[0] == 200
