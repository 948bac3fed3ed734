"""InOrder: worker-thread calls that land in submission order and stop at the first failure."""

from __future__ import annotations

import asyncio
import time

import pytest

from broker.in_order import InOrder


async def test_calls_run_in_submission_order() -> None:
    chain = InOrder()
    ran: list[int] = []

    def work(i: int) -> int:
        time.sleep(0.001 * (i % 3))  # Uneven durations: order must not depend on them.
        ran.append(i)
        return i * i

    futures = [chain.submit(work, i) for i in range(50)]
    assert await asyncio.gather(*futures) == [i * i for i in range(50)]
    assert ran == list(range(50))


async def test_a_failure_fails_the_calls_behind_it_until_settled() -> None:
    chain = InOrder()
    ran: list[str] = []

    def fail() -> None:
        ran.append("fail")
        raise OSError("disk full")

    first = chain.submit(ran.append, "first")
    failing = chain.submit(fail)
    behind = chain.submit(ran.append, "behind")
    await first
    with pytest.raises(OSError, match="disk full"):
        await failing
    with pytest.raises(OSError, match="disk full"):
        await behind
    assert ran == ["first", "fail"]  # The call behind the failure never ran.

    await chain.settle()
    await chain.submit(ran.append, "after settle")
    assert ran[-1] == "after settle"
