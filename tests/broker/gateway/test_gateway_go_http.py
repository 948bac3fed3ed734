"""What Go's net/http does around Gazette's gateway handler, over raw sockets against a real broker:
a GET's 206 is typed by sniffing its first content (`DetectContentType`), a path that is not clean
is redirected (307) by the ServeMux, and a PUT body that is malformed or cut short is answered 500
with the error Go's body reader gives (`broker/http_gateway/http_gateway.go` writes `err.Error()`).
"""

from __future__ import annotations

import socket

import pytest

from broker.protocol import pb, pb_grpc
from cluster.server.http.sniff import detect_content_type
from tests.fuzz.fuzz_http import NORMAL, RAW, Exchange, Item, Wire, exchange
from tests.support.harness import BrokerProcess, append, apply_specs, journal_spec, wait_for_primary

TEXT = b"text/plain; charset=utf-8"


@pytest.fixture(scope="module")
def journals(stub: pb_grpc.JournalStub) -> dict[str, int]:
    """Journals by their content kind, each holding one append; values are their write heads."""
    contents = {
        "go-http/text": b'{"a": 1}\n{"a": 2}\n',
        "go-http/binary": b"\x08\x96\x01\x12\x00\x00",
        "go-http/gzip": b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03",
        "go-http/html": b"  <html><body>hi</body></html>",
    }
    assert apply_specs(stub, *(journal_spec(name) for name in contents)).status == pb.OK
    for name, content in contents.items():
        wait_for_primary(stub, name)
        assert append(stub, name, content).status == pb.OK
    return {name: len(content) for name, content in contents.items()}


def ask(broker: BrokerProcess, *items: Item, half_close: bool = False) -> Exchange:
    ex = exchange(broker.port, Wire(list(items), half_close=half_close), timeout=10.0)
    assert ex.malformed is None, ex.malformed
    return ex


def request(method: str, target: str, *headers: bytes, body: bytes = b"", kind: str = NORMAL) -> Item:
    head = [b"Host: broker", *headers]
    data = f"{method} {target} HTTP/1.1\r\n".encode() + b"".join(h + b"\r\n" for h in head) + b"\r\n"
    return Item(data + body, kind, method)


# -- a GET's Content-Type ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("journal", "content_type"),
    [
        ("go-http/text", TEXT),
        ("go-http/binary", b"application/octet-stream"),
        ("go-http/gzip", b"application/x-gzip"),
        ("go-http/html", b"text/html; charset=utf-8"),
    ],
)
def test_get_is_typed_by_its_first_content(
    broker: BrokerProcess, journals: dict[str, int], journal: str, content_type: bytes
) -> None:
    [resp] = ask(broker, request("GET", f"/{journal}")).responses
    assert resp.status == 206
    assert resp.headers[b"content-type"] == [content_type]


def test_blocking_get_has_its_head_with_its_first_content(broker: BrokerProcess, stub: pb_grpc.JournalStub) -> None:
    """As from Go's net/http, nothing of a 206 is sent before its first content, which types it."""
    assert apply_specs(stub, journal_spec("go-http/later")).status == pb.OK
    wait_for_primary(stub, "go-http/later")
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        sock.sendall(b"GET /go-http/later?block=true HTTP/1.1\r\nHost: broker\r\n\r\n")
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(1024)
        assert append(stub, "go-http/later", b"\x00\x01\x02").status == pb.OK
        sock.settimeout(10)
        received = b""
        while b"\r\n\r\n" not in received:
            received += sock.recv(4096)
    head = received.split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 206 partial content\r\n"), head
    assert b"\r\ncontent-type: application/octet-stream\r\n" in head + b"\r\n", head


def test_head_has_no_type(broker: BrokerProcess, journals: dict[str, int]) -> None:
    [metadata] = ask(broker, request("HEAD", "/go-http/text")).responses
    assert metadata.status == 206 and b"content-type" not in metadata.headers, metadata.headers


def test_detect_content_type_as_go() -> None:
    assert detect_content_type(b"") == "text/plain; charset=utf-8"
    assert detect_content_type(b"\xef\xbb\xbfhi!") == "text/plain; charset=utf-8"
    assert detect_content_type(b"\x00\x01") == "application/octet-stream"
    assert detect_content_type(b"\n <?xml version") == "text/xml; charset=utf-8"
    assert detect_content_type(b"<pre>x") == "text/plain; charset=utf-8"  # `<p` needs a space or `>`.
    assert detect_content_type(b"<p>x") == detect_content_type(b"<P x") == "text/html; charset=utf-8"
    assert detect_content_type(b"%PDF-1.7") == "application/pdf"
    assert detect_content_type(b"\x89PNG\r\n\x1a\n....") == "image/png"
    assert detect_content_type(b"PK\x03\x04rest") == "application/zip"
    assert detect_content_type(b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp41isom") == "video/mp4"
    assert detect_content_type(b"x" * 512 + b"\x00") == "text/plain; charset=utf-8"  # Only 512 bytes count.


# -- paths that are not clean ----------------------------------------------------------------------


def test_unclean_get_is_redirected_to_the_clean_path(broker: BrokerProcess) -> None:
    [resp] = ask(broker, request("GET", "/go-http//text/./x/..?offset=0&block=false")).responses
    location = b"/go-http/text?offset=0&block=false"
    assert (resp.status, resp.headers[b"location"]) == (307, [location])
    assert resp.headers[b"content-type"] == [b"text/html; charset=utf-8"]
    assert resp.body == b'<a href="/go-http/text?offset=0&amp;block=false">Temporary Redirect</a>.\n\n'
    assert resp.header(b"content-length") == str(len(resp.body)).encode()


def test_unclean_put_and_head_are_redirected_without_a_body(broker: BrokerProcess, journals: dict[str, int]) -> None:
    put, head, after = ask(
        broker,
        request("PUT", "//go-http/text", b"Content-Length: 3", body=b"abc"),
        request("HEAD", "/go-http/../go-http/text"),
        request("GET", "/debug/ready"),
    ).responses
    assert (put.status, put.headers[b"location"], put.body) == (307, [b"/go-http/text"], b"")
    assert b"content-type" not in put.headers and put.header(b"content-length") == b"0"
    assert (head.status, head.headers[b"location"], head.body) == (307, [b"/go-http/text"], b"")
    assert head.headers[b"content-type"] == [b"text/html; charset=utf-8"]
    assert (after.status, after.body) == (200, b"ok"), "the connection serves on"
    # Nothing was appended by the redirected PUT.
    [read] = ask(broker, request("HEAD", "/go-http/text")).responses
    assert read.header(b"x-write-head") == str(journals["go-http/text"]).encode()


def test_clean_paths_are_not_redirected(broker: BrokerProcess) -> None:
    # A trailing slash stays, and an escaped dot is no dot to the mux (it cleans the escaped path).
    for target in ("/go-http/", "/go-http/%2E%2E/x"):
        [resp] = ask(broker, request("GET", target)).responses
        assert resp.status == 400, (target, resp)


# -- PUT bodies that cannot be read ------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (b"zz\r\nabc\r\n0\r\n\r\n", b"invalid byte in chunk length\n"),
        (b"\r\n", b"empty hex number for chunk length\n"),
        (b"3\r\nabcXY0\r\n\r\n", b"malformed chunked encoding\n"),
        (b"3\nabc\r\n0\r\n\r\n", b"chunked line ends with bare LF\n"),
    ],
)
def test_malformed_chunked_put_is_gos_error(
    broker: BrokerProcess, journals: dict[str, int], body: bytes, text: bytes
) -> None:
    ex = ask(broker, request("PUT", "/go-http/text", b"Transfer-Encoding: chunked", body=body, kind=RAW))
    [resp] = ex.responses
    assert (resp.status, resp.body) == (500, text)
    assert resp.headers[b"content-type"] == [TEXT] and resp.closes
    [read] = ask(broker, request("HEAD", "/go-http/text")).responses
    assert read.header(b"x-write-head") == str(journals["go-http/text"]).encode(), "the append was aborted"


@pytest.mark.parametrize("framing", [b"Content-Length: 10", b"Transfer-Encoding: chunked"])
def test_put_cut_short_is_unexpected_eof(broker: BrokerProcess, journals: dict[str, int], framing: bytes) -> None:
    body = b"abcd" if framing.startswith(b"Content") else b"a\r\nabcd"
    ex = ask(broker, request("PUT", "/go-http/text", framing, body=body, kind=RAW), half_close=True)
    [resp] = ex.responses
    assert (resp.status, resp.body) == (500, b"unexpected EOF\n")
    [read] = ask(broker, request("HEAD", "/go-http/text")).responses
    assert read.header(b"x-write-head") == str(journals["go-http/text"]).encode(), "the append was aborted"
