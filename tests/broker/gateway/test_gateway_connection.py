"""The gateway's HTTP connection reading a request body: whole pieces, or what has arrived."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from cluster.server.http.codec import Request
from cluster.server.http.connection import Connection

KiB = 1 << 10


class Reader:
    """Serves one loopback port whose requests each read their body with `read_body(size, at_least)`,
    recording the pieces; answers 204 once the body has been read."""

    def __init__(self, size: int, at_least: int | None) -> None:
        self.size = size
        self.at_least = at_least
        self.pieces: list[int] = []
        self.got_piece = asyncio.Event()

    async def handle(self, conn: Connection, _request: Request) -> None:
        while (piece := await conn.read_body(self.size, at_least=self.at_least)) is not None:
            self.pieces.append(len(piece))
            self.got_piece.set()
        await conn.respond(204, [], b"")


@pytest.fixture
async def serve() -> AsyncIterator[list[asyncio.Server]]:
    servers: list[asyncio.Server] = []
    yield servers
    for server in servers:
        server.close()


async def put_in_two_parts(
    reader: Reader, servers: list[asyncio.Server], first: int, second: int, patience: float
) -> bytes:
    """PUT `first` + `second` body bytes, the second part only once the handler took a piece (or `patience`
    seconds passed); returns the response's status line."""
    connections: set[Connection] = set()
    server = await asyncio.get_running_loop().create_server(
        lambda: Connection(reader.handle, connections), "127.0.0.1", 0
    )
    servers.append(server)
    port = server.sockets[0].getsockname()[1]
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"PUT /a/journal HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % (first + second) + b"a" * first)
    await w.drain()
    try:
        await asyncio.wait_for(reader.got_piece.wait(), patience)
    except TimeoutError:
        pass
    w.write(b"b" * second)
    await w.drain()
    status = await r.readline()
    w.close()
    return status


async def test_a_body_read_in_whole_pieces_waits_for_each(serve: list[asyncio.Server]) -> None:
    reader = Reader(1024 * KiB, None)
    # The handler waits for a whole MiB: no piece before the second part is sent, after `patience`.
    status = await put_in_two_parts(reader, serve, 300 * KiB, 900 * KiB, patience=0.3)
    assert status.startswith(b"HTTP/1.1 204")
    assert reader.pieces == [1024 * KiB, 176 * KiB]


async def test_a_body_read_at_least_some_takes_what_has_arrived(serve: list[asyncio.Server]) -> None:
    reader = Reader(1024 * KiB, 256 * KiB)
    # A piece is taken from the first part alone: the second is held back until then (however slow the host).
    status = await put_in_two_parts(reader, serve, 300 * KiB, 900 * KiB, patience=10)
    assert status.startswith(b"HTTP/1.1 204")
    # The first 300 KiB went on as soon as 256 KiB had arrived, without waiting for a whole MiB.
    assert 256 * KiB <= reader.pieces[0] <= 300 * KiB
    assert all(piece <= 1024 * KiB for piece in reader.pieces)
    assert sum(reader.pieces) == 1200 * KiB
