"""One public TCP port for both gRPC and HTTP/1.1.

A connection that opens with the HTTP/2 connection preface is relayed byte-for-byte to the
grpc.aio server listening on an internal unix socket. Any other connection is handed, with the
bytes already read from it, to the HTTP/1.1 handler.

With an ssl server context the port speaks TLS only: asyncio does the handshake (ALPN offers h2
and http/1.1, see cluster.server.tls), and the decrypted stream is routed the same way, gRPC relayed
through Python (`_Relay`: splice cannot decrypt) and HTTP/1.1 served on the TLS transport. A
client that fails the handshake (plain text, an untrusted or missing certificate) is dropped;
asyncio logs that only in its debug mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import socket
import ssl
import sys
import weakref
from collections.abc import Callable

from broker.errors import ConfigError

log = logging.getLogger(__name__)

HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
TLS_HANDSHAKE_RECORD = 0x16  # The content type of a TLS record that opens a handshake; no HTTP method starts so.

HttpHandler = Callable[[asyncio.Transport, bytes], object]
"""Takes over an HTTP/1.1 connection: it sets its own protocol on the transport and consumes
`initial`, the bytes the listener already read from it."""

RELAY_BUFFER_SIZE = 1 << 20
"""Bytes read per receive call of a relay. Large, so a 1 MiB gRPC message takes few syscalls."""
RELAY_HIGH_WATER = 4 << 20
"""Bytes a relay lets queue towards a slow receiver before it stops reading from the sender."""
UNIX_SOCKET_BUFFER = 4 << 20
"""SO_SNDBUF and SO_RCVBUF of the relay's unix socket; unix sockets do not autotune theirs."""

SPLICE = hasattr(os, "splice") and hasattr(os, "pipe2")
"""Whether gRPC connections are relayed with splice(2) (Linux) rather than through Python."""
PIPE_SIZE = 1 << 20
"""Capacity asked of a splice relay's pipes: a 1 MiB gRPC message passes in one round."""
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)
TLS_HANDSHAKE_TIMEOUT = 10.0
"""Seconds a client of a TLS port has to complete its handshake."""

# From Python 3.12 a transport queues what it could not send as views of the caller's buffer,
# where 3.11 copies it.
_WRITE_KEEPS_VIEWS = sys.version_info >= (3, 12)


class ListenError(ConfigError, OSError):
    """The port cannot be listened on (in use, or not an address of this host)."""

    def __str__(self) -> str:
        return str(self.strerror)


class OnePortListener:
    """Accepts TCP connections on (host, port) and routes each to gRPC or to HTTP/1.1; with
    `ssl_context`, over TLS."""

    def __init__(
        self, host: str, port: int, grpc_unix_path: str, http_handler: HttpHandler,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.host = host
        self.ssl_context = ssl_context
        self.requested_port = port
        self.grpc_unix_path = grpc_unix_path
        self.http_handler = http_handler
        self._server: asyncio.Server | None = None
        self._port = 0
        self._relays: set[_Relay | _SpliceRelay] = set()
        # Every accepted connection, for close(). Weak: a closed one must not linger here.
        self._accepted: weakref.WeakSet[asyncio.Transport] = weakref.WeakSet()
        self._pending: set[asyncio.Task[None]] = set()
        self.accepting = True
        """False once stopping: a TLS connection whose handshake completes after that is dropped."""
        # The one buffer all relays receive into: each read is written on before the next one,
        # so connections cost no buffer memory of their own.
        self.read_buffer = memoryview(bytearray(RELAY_BUFFER_SIZE))

    @property
    def port(self) -> int:
        """The bound TCP port (the one picked by the OS when constructed with port 0)."""
        return self._port

    async def start(self, serve: bool = True) -> None:
        """Bind, and start accepting connections unless `serve` is False (then see `serve()`):
        until then connections wait in the backlog."""
        loop = asyncio.get_running_loop()
        tls, handshake_timeout = self.ssl_context, TLS_HANDSHAKE_TIMEOUT if self.ssl_context else None
        try:
            server = await loop.create_server(
                lambda: _Sniffer(self), self.host, self.requested_port, reuse_address=True, backlog=1024,
                start_serving=serve, ssl=tls, ssl_handshake_timeout=handshake_timeout,
            )
        except OSError as err:  # Taken (a second broker process of a host on its port + 1, say), or not ours.
            reason = os.strerror(err.errno) if err.errno else str(err)
            where = f"{self.host}:{self.requested_port}"
            raise ListenError(err.errno, f"cannot listen on {where}: {reason.lower()}") from None
        ports = {sock.getsockname()[1] for sock in server.sockets}
        if self.requested_port == 0 and len(ports) > 1:
            # The host resolved to several addresses and each got its own free port: rebind them
            # all on the first one's, so that the listener has one port.
            port = server.sockets[0].getsockname()[1]
            server.close()
            await server.wait_closed()
            server = await loop.create_server(
                lambda: _Sniffer(self), self.host, port, reuse_address=True, backlog=1024, start_serving=serve,
                ssl=tls, ssl_handshake_timeout=handshake_timeout,
            )
        self._server = server
        self._port = server.sockets[0].getsockname()[1]

    async def serve(self) -> None:
        """Start accepting connections on the socket `start(serve=False)` bound."""
        assert self._server is not None, "start() first"
        await self._server.start_serving()

    async def stop_accepting(self) -> None:
        """Accept no more connections, and drop those that have not yet said what they speak."""
        self.accepting = False
        if self._server is not None:
            self._server.close()
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)

    async def close(self, grace: float = 0.0) -> None:
        """Stop accepting; close HTTP connections now and gRPC relays after up to `grace` seconds.

        Run it concurrently with the grpc server's own `stop(grace)`: relays that the server ends
        within the grace period finish on their own; any left are then closed. (Shut the HTTP
        handler's connections down first for them to finish their requests.)
        """
        await self.stop_accepting()
        for transport in list(self._accepted):
            if transport.is_closing():
                continue  # Closed already; asyncio drops a closed TLS transport's protocol (get_protocol raises).
            if not isinstance(transport.get_protocol(), _Pipe):
                transport.close()  # An HTTP connection, or one that has not yet said what it speaks.

        if self._relays and grace > 0:
            await asyncio.wait([r.done for r in self._relays], timeout=grace)
        for relay in list(self._relays):
            relay.close()
        # Closing flushes what is buffered; a peer that stopped reading is cut off after a second.
        if self._relays:
            await asyncio.wait([r.done for r in self._relays], timeout=1.0)
        for relay in list(self._relays):
            relay.abort()
        for transport in list(self._accepted):
            transport.abort()
        await asyncio.sleep(0)  # Let the connection_lost callbacks of aborted transports run.
        if self._server is not None:
            await self._server.wait_closed()

    def _to_http(self, transport: asyncio.Transport, initial: bytes) -> None:
        try:
            self.http_handler(transport, initial)
        except Exception:
            log.exception("HTTP handler failed to take over a connection")
            transport.abort()

    def _to_grpc(self, transport: asyncio.Transport, initial: bytes) -> None:
        relay: _Relay | _SpliceRelay
        # A TLS connection's bytes are decrypted in Python: they cannot be spliced.
        if SPLICE and self.ssl_context is None:
            relay = _SpliceRelay(self, transport)
        else:
            relay = _Relay(self, transport)
        task = asyncio.get_running_loop().create_task(relay.connect(initial))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)


class _Sniffer(asyncio.Protocol):
    """Reads a new connection's first bytes until it is known whether they are the HTTP/2 preface."""

    def __init__(self, listener: OnePortListener) -> None:
        self._listener = listener
        self._transport: asyncio.Transport | None = None
        self._head = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if not self._listener.accepting:
            transport.abort()  # A TLS handshake that was under way when the listener stopped.
            return
        self._transport = transport
        self._listener._accepted.add(transport)
        _set_nodelay(transport)

    def data_received(self, data: bytes) -> None:
        if self._transport is None:
            return  # Dropped in connection_made.
        head = self._head + data
        n = min(len(head), len(HTTP2_PREFACE))
        if head[0] == TLS_HANDSHAKE_RECORD and self._listener.ssl_context is None:
            # A TLS client of a plain listener: close at once, as Gazette's (no protocol matches), so that
            # the client fails its handshake now rather than wait for an answer that never comes.
            log.debug("closing a TLS handshake sent to a plain listener", extra={"peer": self._peer()})
            self._transport.abort()
        elif head[:n] != HTTP2_PREFACE[:n]:
            self._head = b""
            self._listener._to_http(self._transport, head)
        elif len(head) >= len(HTTP2_PREFACE):
            self._head = b""
            self._listener._to_grpc(self._transport, head)
        else:
            self._head = head

    def _peer(self) -> str:
        peer = self._transport.get_extra_info("peername") if self._transport is not None else None
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    def eof_received(self) -> bool:
        return False  # Closed before it said what it speaks: nothing to serve.

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


class _Relay:
    """Relays one client TCP connection to and from its own connection to the grpc server."""

    def __init__(self, listener: OnePortListener, client: asyncio.Transport) -> None:
        self._listener = listener
        self.front = _Pipe(self, listener)
        self.back = _Pipe(self, listener)
        self.front.peer, self.back.peer = self.back, self.front
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # No reads until the server side exists to take them.
        client.pause_reading()
        client.set_protocol(self.front)
        self.front.connection_made(client)
        listener._relays.add(self)

    async def connect(self, initial: bytes) -> None:
        """Connect to the grpc server, forward `initial`, then relay both ways."""
        loop = asyncio.get_running_loop()
        sock: socket.socket | None = None
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNIX_SOCKET_BUFFER)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UNIX_SOCKET_BUFFER)
            sock.setblocking(False)
            await loop.sock_connect(sock, self._listener.grpc_unix_path)
            await loop.create_unix_connection(lambda: self.back, sock=sock)
        except BaseException as exc:
            if sock is not None:
                sock.close()
            if self.front.transport is not None:
                self.front.transport.abort()  # Without a server side, the client is dropped.
            if not isinstance(exc, OSError):
                raise
            log.warning("cannot reach the grpc server at %s: %s", self._listener.grpc_unix_path, exc)
            return
        front, back = self.front.transport, self.back.transport
        assert front is not None and back is not None
        if self.front.closed:
            back.close()
            return
        back.write(initial)
        front.resume_reading()

    def close(self) -> None:
        """Close both connections once what each has buffered is sent."""
        for pipe in (self.front, self.back):
            if pipe.transport is not None:
                pipe.transport.close()
        self._check_done()

    def abort(self) -> None:
        """Close both connections now, dropping what they have buffered."""
        for pipe in (self.front, self.back):
            if pipe.transport is not None:
                pipe.transport.abort()
        self._check_done()

    def _check_done(self) -> None:
        if self.front.closed and (self.back.closed or self.back.transport is None):
            self._listener._relays.discard(self)
            if not self.done.done():
                self.done.set_result(None)


class _Pipe(asyncio.BufferedProtocol):
    """One end of a relay: what its transport receives is written to the peer end's transport."""

    peer: _Pipe

    def __init__(self, relay: _Relay, listener: OnePortListener) -> None:
        self._relay = relay
        self._listener = listener
        self.transport: asyncio.Transport | None = None
        self.tls = False  # The transport is TLS: it has no half-close, and must not be handed views.
        self.eof = False
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.tls = transport.get_extra_info("ssl_object") is not None
        _set_nodelay(transport)
        transport.set_write_buffer_limits(high=RELAY_HIGH_WATER)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._listener.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        out = self.peer.transport
        if out is None or self.peer.closed:
            return
        if self.peer.tls:
            # An SSL transport may keep what it could not yet encrypt as the caller's buffer.
            out.write(bytes(self._listener.read_buffer[:nbytes]))
            return
        out.write(self._listener.read_buffer[:nbytes])
        if _WRITE_KEEPS_VIEWS and out.get_write_buffer_size():
            # The transport queued a view of the shared buffer: the next read needs another.
            self._listener.read_buffer = memoryview(bytearray(RELAY_BUFFER_SIZE))

    def eof_received(self) -> bool:
        self.eof = True
        out = self.peer.transport
        if out is None or self.peer.closed:
            return False
        if self.peer.eof or self.peer.tls:
            # Both directions are finished, or the peer is TLS, which has no half-close: close
            # it once what is queued is sent.
            out.close()
            return False
        if self.tls:
            # TLS has no half-close either (asyncio closes an SSL transport at EOF whatever this
            # returns): the server side is closed once it has what was sent to it.
            out.close()
            return False
        # Half-close: the other direction goes on until the peer also ends it. write_eof sends
        # what is still queued before it shuts the socket down.
        out.write_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        out = self.peer.transport
        if out is not None and not self.peer.closed:
            if exc is None:
                out.close()
            else:
                out.abort()
        self._relay._check_done()

    def pause_writing(self) -> None:
        # Our transport is backed up: stop reading what would be written to it.
        if self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer.transport is not None:
            self.peer.transport.resume_reading()


class _SpliceRelay:
    """Relays one client TCP connection to its own unix connection to the grpc server with
    splice(2): bytes go from socket to pipe to socket inside the kernel, never through Python.

    Measured: `_Relay` copies every byte into and out of the process and costs the event loop
    about 0.5 ms per MiB relayed.
    """

    def __init__(self, listener: OnePortListener, client: asyncio.Transport) -> None:
        self._listener = listener
        self._loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = self._loop.create_future()
        # Take the client's socket from its transport: a duplicate descriptor keeps the connection
        # open once the transport, which is closed here, closes its own.
        raw = client.get_extra_info("socket")
        self._client = socket.socket(fileno=os.dup(raw.fileno()))
        self._client.setblocking(False)
        client.pause_reading()
        client.abort()
        self._server: socket.socket | None = None
        self._directions: list[_Splice] = []
        self._closed = False
        listener._relays.add(self)

    async def connect(self, initial: bytes) -> None:
        """Connect to the grpc server, forward `initial`, then relay both ways."""
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNIX_SOCKET_BUFFER)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UNIX_SOCKET_BUFFER)
            server.setblocking(False)
            await self._loop.sock_connect(server, self._listener.grpc_unix_path)
            await self._loop.sock_sendall(server, initial)
            if self._closed:
                raise ConnectionAbortedError("the listener closed")
            self._server = server
            for source, sink in ((self._client, server), (server, self._client)):
                self._directions.append(_Splice(self, source, sink))  # Listed at once: abort() frees it.
        except BaseException as exc:
            if self._server is None:
                server.close()
            self.abort()  # Without a server side, the client is dropped.
            if not isinstance(exc, OSError):
                raise
            log.warning("cannot reach the grpc server at %s: %s", self._listener.grpc_unix_path, exc)
            return
        for direction in self._directions:
            direction.start()

    def close(self) -> None:
        """Stop reading; close both connections once what is in flight has been sent."""
        self._closed = True
        if not self._directions:
            self.abort()
            return
        for direction in self._directions:
            direction.stop_reading()
        self.check_done()

    def abort(self) -> None:
        """Close both connections now, dropping what is in flight."""
        self._closed = True
        for direction in self._directions:
            direction.release()
        self._directions = []
        self._client.close()
        if self._server is not None:
            self._server.close()
        self._finish()

    def check_done(self) -> None:
        """Close everything once neither direction has anything more to carry."""
        if self._directions and all(d.finished for d in self._directions):
            self.abort()

    def _finish(self) -> None:
        self._listener._relays.discard(self)
        if not self.done.done():
            self.done.set_result(None)


class _Splice:
    """One direction of a `_SpliceRelay`: `source` -> pipe -> `sink`, driven by the event loop."""

    def __init__(self, relay: _SpliceRelay, source: socket.socket, sink: socket.socket) -> None:
        self._relay = relay
        self._loop = asyncio.get_running_loop()
        self._source = source.fileno()
        self._sink = sink
        self._pipe_out, self._pipe_in = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(OSError):  # A smaller pipe only means more rounds.
            fcntl.fcntl(self._pipe_in, F_SETPIPE_SZ, PIPE_SIZE)
        self._in_pipe = 0  # Bytes read from the source not yet written to the sink.
        self._reading = False
        self._writing = False
        self._eof = False
        self.finished = False  # The source ended (or reading stopped) and the pipe is empty.

    def start(self) -> None:
        self._resume_reading()

    def stop_reading(self) -> None:
        self._eof = True
        self._pause_reading()
        self._maybe_finish()

    def release(self) -> None:
        """Unregister from the event loop and close the pipe (the relay closes the sockets)."""
        self._pause_reading()
        if self._writing:
            self._loop.remove_writer(self._sink.fileno())
            self._writing = False
        for fd in (self._pipe_out, self._pipe_in):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._pipe_out = self._pipe_in = -1

    def _resume_reading(self) -> None:
        if not self._reading and not self._eof:
            self._loop.add_reader(self._source, self._readable)
            self._reading = True

    def _pause_reading(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._source)
            self._reading = False

    def _readable(self) -> None:
        try:
            n = os.splice(self._source, self._pipe_in, PIPE_SIZE, flags=SPLICE_FLAGS)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._broken()  # The source was reset: it sent all it will (a unix socket's data comes first).
            return
        if n == 0:
            self._eof = True
            self._pause_reading()
        self._in_pipe += n
        self._flush()

    def _flush(self) -> None:
        while self._in_pipe:
            try:
                n = os.splice(self._pipe_out, self._sink.fileno(), self._in_pipe, flags=SPLICE_FLAGS)
            except (BlockingIOError, InterruptedError):
                # The sink is backed up: read no more until it drains.
                self._pause_reading()
                if not self._writing:
                    self._loop.add_writer(self._sink.fileno(), self._flush)
                    self._writing = True
                return
            except OSError:
                self._broken()  # The sink is gone: what the pipe holds cannot be delivered.
                return
            self._in_pipe -= n
        if self._writing:
            self._loop.remove_writer(self._sink.fileno())
            self._writing = False
        self._resume_reading()
        self._maybe_finish()

    def _broken(self) -> None:
        """This direction failed (its source reset, or its sink closed): it carries nothing more,
        and the other one goes on until it ends. Aborting both would drop what the other still
        holds: a grpc server that answers and closes while the client is still sending makes the
        write to it fail just as its last reply (a committed append's response) is to be read."""
        self._eof = True
        self._pause_reading()
        if self._writing:
            self._loop.remove_writer(self._sink.fileno())
            self._writing = False
        self._in_pipe = 0
        if not self.finished:
            self.finished = True
            with contextlib.suppress(OSError):
                self._sink.shutdown(socket.SHUT_WR)
        self._relay.check_done()

    def _maybe_finish(self) -> None:
        if self._eof and not self._in_pipe and not self.finished:
            self.finished = True
            with contextlib.suppress(OSError):
                self._sink.shutdown(socket.SHUT_WR)  # Half-close: the other direction goes on.
            self._relay.check_done()


def _set_nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
