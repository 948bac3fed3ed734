"""`python -m examples.word_count apply|publish|query ...`: create the journals and shards, publish
text, or query n-gram counts."""

from __future__ import annotations

import sys

from examples.word_count import client, specs

COMMANDS = {"apply": specs.main, "publish": client.publish_main, "query": client.query_main}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in COMMANDS:
        print("usage: python -m examples.word_count {apply|publish|query} [--help]", file=sys.stderr)
        return 2
    return COMMANDS[args[0]](args[1:])


if __name__ == "__main__":
    sys.exit(main())
