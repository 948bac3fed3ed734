"""`python -m examples.stream_sum apply|chunk ...`: create the journals and shards, or run a chunker."""

from __future__ import annotations

import sys

from examples.stream_sum import chunker, specs

COMMANDS = {"apply": specs.main, "chunk": chunker.main}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in COMMANDS:
        print("usage: python -m examples.stream_sum {apply|chunk} [--help]", file=sys.stderr)
        return 2
    return COMMANDS[args[0]](args[1:])


if __name__ == "__main__":
    sys.exit(main())
