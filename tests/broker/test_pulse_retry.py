"""A pulse that did not succeed is retried at the next scan: `run_pulses` forgets the route it
pulsed, so a member that joined the route and missed the pulse is synced before the primary
could die with it behind (pure logic of the pulse bookkeeping, no I/O)."""

from __future__ import annotations

import asyncio

import pytest

from broker.protocol import pb
from broker.pulse import _pulse_done


async def finished(result: int | BaseException) -> asyncio.Task[int]:
    async def run() -> int:
        if isinstance(result, BaseException):
            raise result
        return result

    task = asyncio.ensure_future(run())
    await asyncio.gather(task, return_exceptions=True)
    return task


@pytest.mark.parametrize(
    ("result", "pulsed_again"),
    [
        (pb.OK, False),
        (pb.INSUFFICIENT_JOURNAL_BROKERS, True),
        (pb.NOT_JOURNAL_PRIMARY_BROKER, True),
        (RuntimeError("replica stream broke"), True),
    ],
)
async def test_only_a_successful_pulse_counts_for_its_route(result: int | BaseException, pulsed_again: bool) -> None:
    task = await finished(result)
    running = {"a/journal": task}
    pulsed_route = {"a/journal": pb.Route(primary=0, members=[pb.ProcessSpec.ID(zone="a", suffix="b1")])}
    _pulse_done(running, pulsed_route, "a/journal", task)
    assert running == {}
    assert ("a/journal" not in pulsed_route) == pulsed_again
