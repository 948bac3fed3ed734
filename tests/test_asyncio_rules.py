"""asyncio rules the packages keep, checked on their source.

`asyncio.wait_for` is not used: on Python 3.11 (the oldest we support) it returns its awaitable's
result when the task running it is cancelled just as that awaitable completes, so the cancellation
is lost. A keyspace batch does exactly that (it wakes the waiters of a change, then its observers
close the shards waiting on it): a closed shard served on, and its process never exited.
`async with asyncio.timeout(...)` (what wait_for is built on from 3.12) keeps the cancellation, and
`asyncio.wait(..., timeout=...)` cancels nothing.
"""

from __future__ import annotations

import ast

import pytest

from tests.support.harness import ROOT

PACKAGES = ("broker", "cluster", "consumer", "gazctl", "pipelines", "examples")


def wait_for_calls(source: str) -> list[int]:
    """Lines of the `asyncio.wait_for(...)` calls in `source`."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "wait_for"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "asyncio"
    ]


def test_wait_for_calls_are_found() -> None:
    source = "import asyncio\nasync def f(x):\n    await asyncio.wait_for(x, 1)\n    await keyspace.wait_for(x)\n"
    assert wait_for_calls(source) == [3]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_asyncio_wait_for(package: str) -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for line in wait_for_calls(path.read_text())
    ]
    assert not found, f"asyncio.wait_for loses cancellations on Python 3.11; use asyncio.timeout: {found}"
