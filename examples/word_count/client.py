"""`python -m examples.word_count publish|query`: the NGram API's command-line client.

Either command talks to any consumer process of the application (`--consumer.address`, default
`http://localhost:8081`): Publish is served by the process asked, Query is proxied to the shard's
primary when it is another process.

    python -m examples.word_count publish "How much wood would a wood chuck chuck"
    python -m examples.word_count publish --file book.txt
    python -m examples.word_count query "wood chuck"             # the shard is inferred
    python -m examples.word_count query wood --shard word-count-part-001

`query` prints one `<count>\\t<n-gram>` line per n-gram.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import grpc

from broker.client.config import dial_target
from examples.word_count import word_count_pb2 as wpb
from examples.word_count import word_count_pb2_grpc as wpb_grpc

DEFAULT_ADDRESS = "http://localhost:8081"


def channel(address: str) -> grpc.aio.Channel:
    target = dial_target(address)
    if target.tls:
        return grpc.aio.secure_channel(target.target, grpc.ssl_channel_credentials())
    return grpc.aio.insecure_channel(target.target)


async def publish(address: str, text: str, timeout: float = 60.0) -> None:
    async with channel(address) as ch:
        await wpb_grpc.NGramStub(ch).Publish(wpb.PublishRequest(text=text), timeout=timeout)


async def query(address: str, prefix: str, shard: str = "", timeout: float = 60.0) -> list[tuple[str, int]]:
    async with channel(address) as ch:
        response: wpb.QueryResponse = await wpb_grpc.NGramStub(ch).Query(
            wpb.QueryRequest(prefix=prefix, shard=shard), timeout=timeout
        )
    return [(g.n_gram, g.count) for g in response.grams]


def _parser(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m examples.word_count {command}")
    parser.add_argument("--consumer.address", dest="address", default=DEFAULT_ADDRESS,
                        help="a consumer process of the application (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=60.0)
    return parser


def _run(coro: object) -> int:
    try:
        asyncio.run(coro)  # type: ignore[arg-type]
    except grpc.aio.AioRpcError as exc:
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    return 0


def publish_main(argv: list[str] | None = None) -> int:
    parser = _parser("publish")
    parser.add_argument("text", nargs="*", help="the text (default: --file, or standard input)")
    parser.add_argument("--file", help="read the text from this file")
    args = parser.parse_args(argv)
    if args.text:
        text = " ".join(args.text)
    elif args.file:
        with open(args.file, encoding="utf-8") as f:
            text = f.read()
    else:
        text = sys.stdin.read()
    return _run(publish(args.address, text, args.timeout))


def query_main(argv: list[str] | None = None) -> int:
    parser = _parser("query")
    parser.add_argument("prefix", nargs="?", default="", help="an n-gram, or a prefix of n-grams")
    parser.add_argument("--shard", default="", help="the shard to ask (default: the one the prefix maps to)")
    args = parser.parse_args(argv)

    async def run() -> None:
        for n_gram, count in await query(args.address, args.prefix, args.shard, args.timeout):
            print(f"{count}\t{n_gram}")

    return _run(run())


__all__ = ["channel", "publish", "publish_main", "query", "query_main"]
