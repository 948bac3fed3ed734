"""What a serving process does, broker or consumer: its gRPC server's options, etcd credentials,
stop signals, a start that a signal may cut short, and a dump of its tasks (SIGUSR1)."""

from __future__ import annotations

import asyncio
import gc
import io
import logging
import signal
import types
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from broker.protocol.credentials import TLSFiles
from cluster.keyspace.etcd import is_tls

log = logging.getLogger(__name__)

STOP_GRACE = 2.0
"""Seconds RPCs in flight may take to finish once a stopping broker stops taking new ones."""
def grpc_server_options(max_recv_size: int) -> list[tuple[str, int]]:
    """Options of the broker's gRPC server: requests up to `max_recv_size`, responses up to 64 MiB."""
    return [
        ("grpc.max_receive_message_length", max_recv_size),
        ("grpc.max_send_message_length", 64 << 20),
        # Peers ping every 15 s (broker.peers): allow it, and ping back, so that a Replicate stream
        # from a primary that vanished without closing its connection releases the replica. Acks
        # may be late from a busy Python client: a missed one ends all its streams.
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def etcd_credentials(address: str | None, tls: TLSFiles) -> grpc.ChannelCredentials | None:
    """Channel credentials of an `https://` etcd address (None for any other)."""
    if address is None or not is_tls(address):
        return None
    return tls.channel_credentials()


def handle_stop_signals(on_stop: Callable[[], None]) -> None:
    """SIGTERM and SIGINT call `on_stop`; SIGUSR1 logs what every task waits on (`dump_tasks`)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_stop)
    loop.add_signal_handler(signal.SIGUSR1, dump_tasks)


async def start_unless_stopped(start: Awaitable[None], stop: asyncio.Event) -> bool:
    """Await a process's `start` unless `stop` is set first (by its signal handlers), which cancels
    it: whether it completed (its error is raised). A SIGTERM while a process waits (for etcd, or
    for a previous process's lease on its member key to expire) so ends the start cleanly, where
    it would kill the process mid-way."""
    task = asyncio.ensure_future(start)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    if task.cancelled():
        log.info("signalled while starting: exiting")
        return False
    task.result()
    return True


def dump_tasks() -> None:
    """Log the stack of every asyncio task (SIGUSR1), to see what a broker that seems stuck waits on."""
    tasks = asyncio.all_tasks()
    out = io.StringIO()
    for task in sorted(tasks, key=lambda t: t.get_name()):
        out.write(f"--- {task.get_name()} {task.get_coro()!r}\n")
        # The chain of awaits down from the task's coroutine (a suspended task's stack is its top
        # frame only); not task.print_stack(): frames of compiled coroutines have no line number.
        _write_awaits(out, task.get_coro())
    # gRPC's compiled handlers hide the awaits of the RPC methods they run: find those coroutines.
    for coro in gc.get_objects():
        if isinstance(coro, types.CoroutineType | types.AsyncGeneratorType):
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
            if frame is not None and frame.f_code.co_qualname.startswith("JournalService."):
                out.write(f"--- RPC {frame.f_code.co_qualname}\n")
                _write_awaits(out, coro)
    log.warning("asyncio tasks (SIGUSR1)", extra={"tasks": len(tasks), "stacks": out.getvalue()})


def _write_awaits(out: io.StringIO, awaited: Any) -> None:
    """The chain of awaits down from the coroutine (or async generator) `awaited`."""
    for _ in range(24):
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
        if frame is None:
            if awaited is not None:
                out.write(f"  awaiting {type(awaited).__qualname__}\n")
            return
        code = frame.f_code
        out.write(f"  {code.co_filename}:{frame.f_lineno or 0} in {code.co_qualname}\n")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
