"""Benchmark of the one-port listener's gRPC relay.

Streams 1 MiB messages over a grpc.aio client stream to a grpc.aio server: directly on its unix
socket (the baseline), directly on a TCP port of its own (for reference), and through
OnePortListener's TCP port. Prints throughput and the relayed/direct ratio. Client, server and
relay share one process and event loop, as in the broker.

    python -m tests.benchmarks.bench_listener [--mib 2048] [--size 1048576] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

import grpc

from cluster.server.listener import OnePortListener

METHOD = "/bench.Bench/Sink"


async def _sink(requests: object, context: grpc.aio.ServicerContext) -> bytes:
    total = 0
    async for chunk in requests:  # type: ignore[attr-defined]
        total += len(chunk)
    return str(total).encode()


def _handler() -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler("bench.Bench", {"Sink": grpc.stream_unary_rpc_method_handler(_sink)})


async def _stream(target: str, size: int, count: int) -> float:
    """Seconds to stream `count` messages of `size` bytes and get the reply."""
    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        await channel.channel_ready()
        sink = channel.stream_unary(METHOD)
        payload = os.urandom(size)
        started = time.perf_counter()
        call = sink()
        for _ in range(count):
            await call.write(payload)
        await call.done_writing()
        reply = await call
        elapsed = time.perf_counter() - started
        assert int(reply) == size * count, reply
        return elapsed


def _no_http(transport: asyncio.Transport, initial: bytes) -> None:
    transport.close()


async def main(total_mib: int, size: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "grpc.sock")
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
        server.add_generic_rpc_handlers([_handler()])
        server.add_insecure_port(f"unix:{path}")
        tcp_port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        listener = OnePortListener("127.0.0.1", 0, path, _no_http)
        await listener.start()

        count = max(1, (total_mib << 20) // size)
        targets = {
            "direct unix socket": f"unix:{path}",
            "direct TCP": f"127.0.0.1:{tcp_port}",
            "via OnePortListener": f"127.0.0.1:{listener.port}",
        }
        await _stream(targets["direct unix socket"], size, 8)  # Warm up.
        best: dict[str, float] = {}
        for _ in range(rounds):
            for name, target in targets.items():
                seconds = await _stream(target, size, count)
                best[name] = max(best.get(name, 0.0), size * count / seconds)

        print(f"grpc.aio client stream, {count} messages of {size} bytes, best of {rounds}:")
        for name, rate in best.items():
            print(f"  {name:22s} {rate / 1e9:6.2f} GB/s  {rate / size:9.0f} msg/s")
        ratio = best["via OnePortListener"] / best["direct unix socket"]
        print(f"  relayed / direct       {ratio:6.2f}")

        await listener.close()
        await server.stop(None)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=2048, help="MiB streamed per run")
    parser.add_argument("--size", type=int, default=1 << 20, help="bytes per message")
    parser.add_argument("--rounds", type=int, default=3, help="runs per target; the best is reported")
    args = parser.parse_args()
    asyncio.run(main(args.mib, args.size, args.rounds))
