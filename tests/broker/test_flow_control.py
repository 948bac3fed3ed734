"""Append flow control against a real broker (max_append_rate throttles, slow clients are cut off), and
MinRateGuard's deadline on its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from broker.flow_control import MinRateError, MinRateGuard
from broker.protocol import pb, pb_grpc
from tests.support.harness import apply_specs, journal_spec, wait_for_primary


def _write_head(stub: pb_grpc.JournalStub, journal: str) -> int:
    [resp] = stub.Read(pb.ReadRequest(journal=journal, offset=-1, metadata_only=True))
    return int(resp.write_head)


def test_max_append_rate_delays_chunks(stub: pb_grpc.JournalStub) -> None:
    spec = journal_spec("flow/limited")
    spec.max_append_rate = 200_000
    assert apply_specs(stub, spec).status == pb.OK
    wait_for_primary(stub, spec.name)
    chunks = [bytes([65 + i]) * 50_000 for i in range(10)]
    reqs = [pb.AppendRequest(journal=spec.name), *(pb.AppendRequest(content=c) for c in chunks), pb.AppendRequest()]
    started = time.monotonic()
    resp = stub.Append(iter(reqs), timeout=30)
    elapsed = time.monotonic() - started
    assert resp.status == pb.OK
    assert resp.total_chunks == 10 and resp.delayed_chunks > 0
    # One second of burst covers 200 kB; the other 300 kB wait for credit at 200 kB/s.
    assert elapsed >= 1.2
    assert resp.commit.end - resp.commit.begin == 500_000


def test_client_below_the_minimum_rate_is_cut_off(stub: pb_grpc.JournalStub) -> None:
    spec = journal_spec("flow/slow-client")
    assert apply_specs(stub, spec).status == pb.OK
    wait_for_primary(stub, spec.name)
    head = _write_head(stub, spec.name)

    def stalling() -> Iterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=spec.name)
        yield pb.AppendRequest(content=b"x" * 1000)
        time.sleep(4)  # Well under 64 KiB/s for a whole window after the grace second.
        yield pb.AppendRequest(content=b"y" * 1000)
        yield pb.AppendRequest()

    with pytest.raises(grpc.RpcError) as err:
        stub.Append(stalling(), timeout=30)
    assert err.value.code() == grpc.StatusCode.ABORTED
    assert "didn't sustain the minimum append data rate" in str(err.value.details())
    assert _write_head(stub, spec.name) == head  # Rolled back: nothing of it is visible.

    resp = stub.Append(iter([pb.AppendRequest(journal=spec.name), pb.AppendRequest(content=b"ok"),
                             pb.AppendRequest()]), timeout=30)
    assert resp.status == pb.OK and resp.commit.begin == head


async def test_min_rate_guard_passes_on_the_receives_own_timeout() -> None:
    # The guard's deadline is its own: a receive that fails with TimeoutError is not a slow client.
    async def times_out() -> bytes:
        raise TimeoutError("the receive's own")

    guard = MinRateGuard(1024)
    with pytest.raises(TimeoutError, match="the receive's own"):
        await guard.receive(times_out())


async def test_min_rate_guard_cuts_off_a_silent_client() -> None:
    never = asyncio.get_running_loop().create_future()
    guard = MinRateGuard(1024, grace=0.05)
    with pytest.raises(MinRateError):
        await guard.receive(never)


async def test_min_rate_guard_takes_a_message_already_there_without_a_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    timers: list[float] = []  # Each timer's delay.
    call_at = loop.call_at

    def counted(when: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        timers.append(when - loop.time())
        return call_at(when, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", counted)  # Where every timer of the loop is made.

    async def there() -> bytes:
        return b"message"

    guard = MinRateGuard(1024)
    assert await guard.receive(there()) == b"message"
    assert timers == []

    # One that has to wait is awaited under the deadline: the end of the window after the grace
    # second (which requires nothing, so is satisfied already).
    arriving = loop.create_future()
    loop.call_soon(arriving.set_result, b"later")
    assert await guard.receive(arriving) == b"later"
    assert len(timers) == 1 and 1.9 < timers[0] <= 2.0


async def test_min_rate_guard_deadline_is_disarmed_once_the_message_arrives() -> None:
    guard = MinRateGuard(1024, grace=0.05)
    arriving = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.01, arriving.set_result, b"in time")
    assert await guard.receive(arriving) == b"in time"
    await asyncio.sleep(0.1)  # Past the deadline: nothing cancels this task.
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_min_rate_guard_passes_on_a_cancellation_to_the_receive() -> None:
    cleaned_up = asyncio.Event()

    async def waits() -> bytes:
        try:
            await asyncio.sleep(60)
        finally:
            cleaned_up.set()
        return b"never"

    guard = MinRateGuard(1024)
    receiving = asyncio.ensure_future(guard.receive(waits()))
    await asyncio.sleep(0.01)
    receiving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await receiving
    assert cleaned_up.is_set(), "the receive saw the cancellation"


async def test_min_rate_guard_cut_off_leaves_the_task_uncancelled() -> None:
    guard = MinRateGuard(1024, grace=0.02)
    with pytest.raises(MinRateError):
        await guard.receive(asyncio.get_running_loop().create_future())
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0)  # Not cancelled: the task goes on.
