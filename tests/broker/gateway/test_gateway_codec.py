"""The gateway's HTTP/1.1 codecs (`cluster.server.http.codec`), without I/O: PlainCodec parses what h11
parses and frames responses as h11 does, and hands every request that is not plain to h11 from its
first byte."""

from __future__ import annotations

import re

import h11
import pytest

from cluster.server.http.codec import H11Codec, Marker, PlainCodec, Request, State

PUT = b"PUT /a/journal HTTP/1.1\r\nHost: broker\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello"
GET = b"GET /a/journal?offset=3 HTTP/1.1\r\nHost: broker\r\nAccept: */*\r\n\r\n"


def events(codec: PlainCodec | H11Codec) -> list[object]:
    """The events `codec` gives until it needs more data (or is paused, or not plain)."""
    out: list[object] = []
    while True:
        event = codec.next_event()
        if isinstance(event, bytearray):
            event = bytes(event)
        out.append(event)
        if event in (Marker.NEED_DATA, Marker.PAUSED, Marker.NOT_PLAIN, Marker.CLOSED):
            return out


def as_tuple(req: object) -> object:
    if isinstance(req, Request):
        return (req.method, req.target, req.headers, req.http_version)
    return req


@pytest.mark.parametrize("data", [PUT, GET, b"HEAD /x HTTP/1.1\r\nhost: b\r\nX-Odd:  v\xe9 \r\n\r\n"])
def test_plain_requests_parse_as_h11_parses_them(data: bytes) -> None:
    plain, h = PlainCodec(), H11Codec()
    plain.receive_data(data)
    h.receive_data(data)
    assert [as_tuple(e) for e in events(plain)] == [as_tuple(e) for e in events(h)]
    assert plain.their_state is h.their_state is State.DONE
    assert plain.our_state is h.our_state is State.SEND_RESPONSE


def test_body_arriving_in_pieces_and_a_pipelined_request() -> None:
    codec = PlainCodec()
    codec.receive_data(PUT[:40])
    assert events(codec) == [Marker.NEED_DATA]
    codec.receive_data(PUT[40:-3])
    request, data, need = events(codec)
    assert isinstance(request, Request) and request.method == b"PUT"
    assert (data, need) == (b"he", Marker.NEED_DATA)
    assert codec.waiting_for_100_continue is False, "body bytes arrived: the client did not wait"
    codec.receive_data(PUT[-3:] + GET)
    assert events(codec) == [b"llo", Marker.END, Marker.PAUSED]
    assert codec.trailing_data == (GET, False)

    codec.send_response(204, b"No Content", [])
    codec.send_end()
    codec.start_next_cycle()
    [request, end, need] = events(codec)
    assert isinstance(request, Request) and request.target == b"/a/journal?offset=3"
    assert (end, need) == (Marker.END, Marker.NEED_DATA)


def test_body_pieces_after_the_head_are_given_out_as_received() -> None:
    codec = PlainCodec()
    head = PUT[: PUT.index(b"hello")]
    codec.receive_data(head)
    [request, need] = events(codec)
    assert isinstance(request, Request) and need is Marker.NEED_DATA
    piece = b"he"
    codec.receive_data(piece)
    codec.receive_data(b"l")
    assert codec.trailing_data == (b"hel", False)
    first, second, need = events(codec)
    assert first is piece, "not copied"
    assert (second, need) == (b"l", Marker.NEED_DATA)
    codec.receive_data(b"lo" + GET)  # The body's end and the next request: buffered.
    assert events(codec) == [b"lo", Marker.END, Marker.PAUSED]
    assert codec.trailing_data == (GET, False)


def test_100_continue_until_the_body_or_a_response() -> None:
    codec = PlainCodec()
    codec.receive_data(PUT[: PUT.index(b"hello")])
    events(codec)
    assert codec.waiting_for_100_continue
    assert codec.send_continue() == b"HTTP/1.1 100 \r\n\r\n"
    assert not codec.waiting_for_100_continue


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.0\r\nHost: b\r\n\r\n",  # HTTP/1.0
        b"PUT /a/j HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"PUT /a/j HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: b\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\n",
        b"CONNECT broker:443 HTTP/1.1\r\nHost: b\r\n\r\n",
        b"FOO / HTTP/1.1\r\nHost: b\r\n\r\n",  # A method outside llhttp's table.
        b"GET / HTTP/1.1\nHost: b\n\n",  # Bare line feeds.
        b"GET / HTTP/1.1\r\nHost: b\nX: y\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: b\rX: y\r\n\r\n",
        b"\r\nGET / HTTP/1.1\r\nHost: b\r\n\r\n",  # An empty line first.
        b"GET  / HTTP/1.1\r\nHost: b\r\n\r\n",
        b"GET /\xe9 HTTP/1.1\r\nHost: b\r\n\r\n",  # A target byte that is not visible ASCII.
        b"GET / HTTP/1.1\r\nHost: b\r\nX: a\r\n folded\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: b\r\nX: a\x7fb\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: b\r\nX : a\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: a\r\n\r\n",  # No Host.
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        b"PUT /a/j HTTP/1.1\r\nHost: b\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
        b"PUT /a/j HTTP/1.1\r\nHost: b\r\nContent-Length: +1\r\n\r\nx",
        b"PUT /a/j HTTP/1.1\r\nHost: b\r\nExpect: something\r\n\r\n",
    ],
)
def test_what_is_not_plain_goes_to_h11_from_its_first_byte(data: bytes) -> None:
    codec = PlainCodec()
    codec.receive_data(data)
    assert events(codec) == [Marker.NOT_PLAIN]
    assert codec.trailing_data == (data, False)
    h = codec.to_h11()
    assert h.trailing_data == (data, False)
    # The h11 codec then parses (or refuses) the request as h11 alone would.
    alone = H11Codec(data)
    try:
        expected = [as_tuple(e) for e in events(alone)]
    except h11.RemoteProtocolError as err:
        with pytest.raises(h11.RemoteProtocolError, match=re.escape(str(err))):
            events(h)
    else:
        assert [as_tuple(e) for e in events(h)] == expected


def test_a_request_after_a_plain_one_that_is_not_plain_waits_for_the_next_cycle() -> None:
    codec = PlainCodec()
    odd = b"GET / HTTP/1.0\r\n\r\n"
    codec.receive_data(GET + odd)
    request, end, paused = events(codec)
    assert isinstance(request, Request) and (end, paused) == (Marker.END, Marker.PAUSED)
    codec.send_response(200, b"OK", [(b"Content-Length", b"0")])
    codec.send_end()
    codec.start_next_cycle()
    assert events(codec) == [Marker.NOT_PLAIN]
    assert codec.to_h11().trailing_data == (odd, False)


@pytest.mark.parametrize("eof_after", [b"", b"GET / HT"])
def test_the_client_closing_between_requests(eof_after: bytes) -> None:
    codec = PlainCodec()
    codec.receive_data(eof_after)
    codec.receive_data(b"")
    if eof_after:
        assert events(codec) == [Marker.NOT_PLAIN], "a head cut short is h11's to refuse"
    else:
        assert events(codec) == [Marker.CLOSED]
        assert codec.their_state is State.CLOSED


def test_a_body_cut_short() -> None:
    codec = PlainCodec()
    codec.receive_data(PUT[:-2])
    codec.receive_data(b"")
    with pytest.raises(h11.RemoteProtocolError, match=r"^unexpected EOF$"):
        events(codec)
    assert codec.their_state is State.ERROR


def test_a_head_too_large_or_still_open_with_bare_line_feeds() -> None:
    codec = PlainCodec()
    codec.receive_data(b"GET / HTTP/1.1\r\nHost: b\r\nX: " + b"x" * (1 << 20))
    assert events(codec) == [Marker.NOT_PLAIN]
    codec = PlainCodec()
    codec.receive_data(b"GET / HTTP/1.1\r\nHost: b\r\nX: " + b"x" * (1 << 20) + b"\r\n\r\n")
    assert events(codec) == [Marker.NOT_PLAIN], "a whole head, but too large"
    codec = PlainCodec()
    codec.receive_data(b"GET / HTTP/1.1\nHost: b\n\n")
    assert events(codec) == [Marker.NOT_PLAIN]


# -- responses ---------------------------------------------------------------------------------------


def respond(
    codec: PlainCodec | H11Codec, request: bytes, status: int, headers: list[tuple[bytes, bytes]],
    body: list[bytes], trailers: list[tuple[bytes, bytes]] | None = None,
) -> bytes:
    codec.receive_data(request)
    events(codec)
    out = codec.send_response(status, b"Reason", headers)
    for data in body:
        out += codec.send_data(data)
    return out + codec.send_end(trailers or [])


def read_back(method: bytes, data: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes, list[tuple[bytes, bytes]]]:
    """Status, headers, body and trailers of a response, as an h11 client reads it."""
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method=method, target="/", headers=[("Host", "b")]))
    client.send(h11.EndOfMessage())
    client.receive_data(data)
    response = client.next_event()
    assert isinstance(response, h11.Response)
    body, trailers = b"", []
    while True:
        event = client.next_event()
        if isinstance(event, h11.Data):
            body += event.data
        else:
            assert isinstance(event, h11.EndOfMessage), event
            trailers = list(event.headers)
            break
    return response.status_code, list(response.headers), body, trailers


@pytest.mark.parametrize(
    ("method", "status", "headers", "body", "trailers"),
    [
        (b"GET", 200, [(b"Content-Length", b"5")], [b"he", b"llo"], None),
        (b"GET", 206, [(b"X-A", b"1")], [b"chunk one", b"", b"two"], [(b"X-Close-Error", b"nope")]),
        (b"HEAD", 206, [(b"X-A", b"1")], [], None),
        (b"HEAD", 200, [(b"Content-Length", b"5")], [], None),
        (b"PUT", 204, [(b"X-Commit-End", b"9")], [], None),
        (b"GET", 400, [(b"Content-Length", b"3"), (b"Connection", b"close")], [b"bad"], None),
    ],
)
def test_responses_are_framed_as_h11_frames_them(
    method: bytes, status: int, headers: list[tuple[bytes, bytes]], body: list[bytes],
    trailers: list[tuple[bytes, bytes]] | None,
) -> None:
    request = method + b" / HTTP/1.1\r\nHost: b\r\n\r\n"
    plain, h = PlainCodec(), H11Codec()
    ours = respond(plain, request, status, headers, body, trailers)
    theirs = respond(h, request, status, headers, body, trailers)
    assert read_back(method, ours) == read_back(method, theirs)
    assert (plain.our_state, plain.their_state) == (h.our_state, h.their_state)


def test_a_response_must_keep_to_its_length() -> None:
    codec = PlainCodec()
    codec.receive_data(GET)
    events(codec)
    codec.send_response(200, b"OK", [(b"Content-Length", b"2")])
    with pytest.raises(h11.LocalProtocolError, match="Too much data"):
        codec.send_data(b"abc")
    codec.send_data(b"a")
    with pytest.raises(h11.LocalProtocolError, match="Too little data"):
        codec.send_end()
