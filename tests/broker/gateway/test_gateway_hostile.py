"""HTTP input no well-behaved client sends, over raw sockets against a real broker: each gets the
status Gazette's gateway gives (or a clear 4xx), the connection is answered rather than dropped,
and the broker logs no traceback.

One test per input a tester found mishandled (a dropped connection and a traceback, or the wrong
status); tests/broker/test_gateway_fuzz.py generates the rest.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from broker.gateway.routes import MAX_AUTHORIZATION_BYTES
from broker.protocol import pb, pb_grpc
from tests.fuzz.fuzz_http import NORMAL, RAW, Exchange, Item, Wire, exchange, ready
from tests.support.harness import BrokerProcess, append, apply_specs, journal_spec, wait_for_primary

JOURNAL = "hostile/http"
TEXT = b"text/plain; charset=utf-8"


@pytest.fixture(scope="module")
def journal(stub: pb_grpc.JournalStub) -> str:
    """A journal holding `0123456789`."""
    assert apply_specs(stub, journal_spec(JOURNAL)).status == pb.OK
    wait_for_primary(stub, JOURNAL)
    assert append(stub, JOURNAL, b"0123456789").status == pb.OK
    return JOURNAL


@pytest.fixture(autouse=True)
def no_traceback(broker: BrokerProcess) -> Iterator[int]:
    """After each test the broker still answers, and its log gained no traceback. The value is
    where the log stood when the test began, for `assert_no_traceback`."""
    start = len(broker.logs())
    yield start
    assert_no_traceback(broker, start)


def assert_no_traceback(broker: BrokerProcess, start: int) -> None:
    assert ready(broker.port), "the broker does not answer /debug/ready"
    logs = broker.logs()[start:]
    assert "Traceback" not in logs, logs[max(0, logs.index("Traceback") - 200) :][:3000]


def ask(broker: BrokerProcess, *items: tuple[str | None, bytes]) -> Exchange:
    """Send the requests `items` ((method, bytes); method None for bytes that are no request) on one
    connection, and read their answers."""
    wire = Wire([Item(data, RAW if method is None else NORMAL, method) for method, data in items])
    return exchange(broker.port, wire, timeout=10.0)


def request(method: str, target: str | bytes, *headers: bytes, body: bytes | None = None) -> tuple[str, bytes]:
    target = target.encode() if isinstance(target, str) else target
    head = [b"Host: broker", *headers]
    if body is not None:
        head.append(b"Content-Length: %d" % len(body))
    data = method.encode() + b" " + target + b" HTTP/1.1\r\n" + b"".join(h + b"\r\n" for h in head) + b"\r\n"
    return method, data + (body or b"")


def only_answer(ex: Exchange) -> tuple[int, bytes]:
    assert ex.malformed is None, ex.malformed
    assert len(ex.responses) == 1, ex
    resp = ex.responses[0]
    if resp.status >= 400:
        assert resp.header(b"content-type") == TEXT
    return resp.status, resp.body


@pytest.mark.parametrize("method", ["GET", "HEAD", "PUT"])
def test_percent_escape_of_a_byte_that_is_not_utf8(broker: BrokerProcess, method: str) -> None:
    # Go's url.PathUnescape gives the byte 0x92; the name fails validation as not a token.
    body = None if method != "PUT" else b"x"
    status, text = only_answer(ask(broker, request(method, "/hostile/%92http", body=body)))
    assert status == 400
    if method != "HEAD":
        assert text == b"Journal: not a valid token (hostile/\x92http)\n"
    # Too short a name fails on its length first; the absolute form decodes the same way.
    assert only_answer(ask(broker, request(method, "/%92", body=body)))[0] == 400
    assert only_answer(ask(broker, request(method, "http://broker/%92abcd", body=body)))[0] == 400


def test_offset_with_more_digits_than_python_converts(broker: BrokerProcess, journal: str) -> None:
    huge = "9" * 5000
    status, text = only_answer(ask(broker, request("GET", f"/{journal}?offset={huge}")))
    assert (status, text) == (400, b'schema: error converting value for "offset"\n')
    # Leading zeros are no limit to Go's strconv.ParseInt: this is offset 5.
    ex = ask(broker, request("GET", f"/{journal}?offset={'0' * 5000}5"))
    assert ex.responses[0].status == 206
    assert ex.responses[0].header(b"content-range").startswith(b"bytes 5-")
    assert ex.responses[0].body == b"56789"


def test_error_for_bytes_pipelined_after_a_head_has_its_body(broker: BrokerProcess) -> None:
    ex = ask(broker, request("HEAD", "/j"), (None, b"X\r\n\r\n"))
    assert ex.malformed is None, ex.malformed
    head, garbage = ex.responses
    # The HEAD's answer has no body; the malformed request's does, and ends the connection.
    assert (head.status, head.body, head.header(b"content-length")) == (400, b"", b"57")
    assert (garbage.status, garbage.body) == (400, b"400 Bad Request")
    assert garbage.closes


@pytest.mark.parametrize("target", ["/debug/ready", "/hostile/http", "broker:443"])
def test_connect_is_an_unknown_method(broker: BrokerProcess, target: str) -> None:
    ex = ask(broker, request("CONNECT", target), request("GET", "/debug/ready"))
    assert ex.malformed is None, ex.malformed
    connect, after = ex.responses
    assert (connect.status, connect.body) == (400, b"unknown method: CONNECT\n")
    # No tunnel was opened: the connection serves on.
    assert (after.status, after.body) == (200, b"ok")


def test_clients_that_reset_right_after_a_501(broker: BrokerProcess, no_traceback: int) -> None:
    # The client reads the start of the answer, then resets the connection: the broker closes its side
    # of a connection that is gone already. (A race: about a third of the connections hit it.)
    clients = 400
    start = threading.Barrier(clients)
    heads: list[bytes] = []

    def client() -> None:
        with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
            start.wait()
            sock.sendall(b"PUT /a/j HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n")
            head = b""
            while len(head) < 12 and (data := sock.recv(12 - len(head))):
                head += data
            heads.append(head)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert heads == [b"HTTP/1.1 501"] * clients
    assert_no_traceback(broker, no_traceback)  # The connections closed quietly.


@pytest.mark.parametrize(
    ("value", "status", "text"),
    [
        (b"Bearer " + b"t" * 20_000, 431, b"Authorization header too large (20007 bytes; expected at most 7168)\n"),
        (b"t" * (MAX_AUTHORIZATION_BYTES + 1), 431, None),
        (b"caf\xc3\xa9", 400, b"invalid Authorization header (expected printable ASCII)\n"),
        (b"a\tb", 400, None),
    ],
)
def test_authorization_the_broker_cannot_take(
    broker: BrokerProcess, journal: str, value: bytes, status: int, text: bytes | None
) -> None:
    for method, body in (("GET", None), ("PUT", b"x")):
        answer = only_answer(ask(broker, request(method, f"/{journal}", b"Authorization: " + value, body=body)))
        assert answer[0] == status
        if text is not None:
            assert answer[1] == text


def test_largest_authorization_is_passed_on(broker: BrokerProcess, journal: str) -> None:
    value = b"t" * MAX_AUTHORIZATION_BYTES
    # gRPC's limit is soft below 16 KiB (a random share of calls fails): every call must pass.
    for _ in range(20):
        ex = ask(broker, request("GET", f"/{journal}?offset=8", b"Authorization: " + value))
        assert (ex.responses[0].status, ex.responses[0].body) == (206, b"89")
