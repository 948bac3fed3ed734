"""Pulses: zero-byte appends the primary makes to its journals so that idle fragments roll.

Without client traffic nothing would close a fragment at its flush_interval boundary, so the
primary appends nothing every minute, and just after each boundary of a journal holding
unpersisted content; the append FSM then rolls the spool as it would for a client append.
A journal's very first fragment is pulsed as soon as it holds content: Gazette's first-write
rule closes it only at the next append, and a new journal's first append would otherwise
wait up to a minute to reach its store. A journal is also pulsed as soon as its route changes
(or this broker becomes its primary), as Gazette does: the pulse builds the pipeline of the
new route and syncs its members, so that a member that left is released at once and one that
joined holds the journal's head before the next client append.

With `--broker.auto-suspend`, a journal whose route held still for STABLE_PULSES_TO_SUSPEND
periodic pulses is pulsed with SUSPEND_IF_FLUSHED, as Gazette's `broker/replica.go` does: the
append FSM then suspends it (FULL with no fragments at all, PARTIAL once every fragment is
persisted) and the allocator frees its replicas; the next client append resumes it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from broker.append import Append
from broker.pipeline import routes_equivalent, same_id
from broker.protocol import pb
from broker.state import BrokerState

log = logging.getLogger(__name__)

PULSE_INTERVAL = 60.0
BOUNDARY_SLACK = 0.05  # Seconds past a flush boundary, so the FSM sees the new window.
# How often spools are looked at: a fragment that starts after a look is noticed by the next.
SCAN_INTERVAL = 1.0
STABLE_PULSES_TO_SUSPEND = 15
"""Periodic pulses since a journal's route last changed before auto-suspend asks to suspend it: its
clients have had time to resume it, and this broker to learn of every persisted fragment."""


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover - makes this an async generator


async def pulse(
    state: BrokerState, journal: str, suspend: pb.AppendRequest.Suspend.ValueType = pb.AppendRequest.SUSPEND_NO_RESUME
) -> int:
    """Append zero bytes to `journal` through the append FSM; return the response status.

    NO_RESUME by default: a pulse must not resume a journal suspended since its last look (an
    append's default, SUSPEND_RESUME, would: a race that undid `gazctl journals suspend`).
    """
    req = pb.AppendRequest(journal=journal, do_not_proxy=True, suspend=suspend)
    append = Append(state, req)
    await append.prepare()
    if append.response is not None:
        return append.response.status
    if append.proxy is not None:
        return pb.NOT_JOURNAL_PRIMARY_BROKER
    return (await append.stream(_nothing())).status


def _next_boundary(first_append_time: float, flush: int) -> float:
    return (int(first_append_time) // flush + 1) * flush + BOUNDARY_SLACK


async def run_pulses(
    state: BrokerState, stop: asyncio.Event, *, auto_suspend: bool = False, interval: float = PULSE_INTERVAL
) -> None:
    """Pulse every journal this broker is primary of, at least every `interval` seconds, until `stop`
    is set; with `auto_suspend`, ask to suspend journals whose route held still (module docstring)."""
    last_pulse: dict[str, float] = {}
    stable: dict[str, int] = {}  # Periodic pulses of each journal since its route last changed.
    pulsed_boundary: dict[str, float] = {}  # Pulse each boundary once, even if no roll follows.
    pulsed_route: dict[str, pb.Route] = {}  # The route of each journal's last pulse.
    running: dict[str, asyncio.Task[int]] = {}
    while not stop.is_set():
        now = time.time()
        wake = now + min(SCAN_INTERVAL, interval)
        for name, replica in list(state.resolver.replicas.items()):
            route = state.keyspace.route(name)
            if route.primary < 0 or not same_id(route.members[route.primary], state.resolver.local_id):
                continue
            spool = replica.spool
            flush = replica.spec.fragment.flush_interval.seconds
            boundary = None
            if spool.fragment.content_length and spool.fragment.begin == replica.index.summary()[0]:
                boundary = 0.0  # The journal's first fragment: the FSM's first-write rule rolls it now.
            elif flush > 0 and spool.first_append_time is not None and spool.fragment.content_length:
                boundary = _next_boundary(spool.first_append_time, flush)
            at_boundary = boundary is not None and boundary <= now and pulsed_boundary.get(name) != boundary
            last_route = pulsed_route.get(name)
            new_route = last_route is None or not routes_equivalent(last_route, route)
            periodic = now - last_pulse.get(name, 0.0) >= interval
            if (at_boundary or new_route or periodic) and name not in running:
                last_pulse[name] = now
                pulsed_route[name] = route
                if at_boundary and boundary is not None:
                    pulsed_boundary[name] = boundary
                stable[name] = 0 if new_route else stable.get(name, 0) + int(periodic)
                suspend = pb.AppendRequest.SUSPEND_NO_RESUME
                if auto_suspend and stable[name] >= STABLE_PULSES_TO_SUSPEND:
                    suspend = pb.AppendRequest.SUSPEND_IF_FLUSHED
                task = asyncio.get_running_loop().create_task(pulse(state, name, suspend))
                running[name] = task
                task.add_done_callback(
                    lambda t, n=name: _pulse_done(running, pulsed_route, n, t)  # type: ignore[misc]
                )
            elif boundary is not None and boundary > now:
                wake = min(wake, boundary)
        for name in list(last_pulse):
            if name not in state.resolver.replicas:
                del last_pulse[name]
                pulsed_boundary.pop(name, None)
                pulsed_route.pop(name, None)
                stable.pop(name, None)
        await _until_change(state, stop, max(0.05, wake - time.time()))
    for task in list(running.values()):
        task.cancel()
    await asyncio.gather(*running.values(), return_exceptions=True)


async def _until_change(state: BrokerState, stop: asyncio.Event, timeout: float) -> None:
    """Wait at most `timeout` seconds, less if `stop` is set or the keyspace changes (a route may have)."""
    stopped = asyncio.ensure_future(stop.wait())
    changed = asyncio.ensure_future(state.keyspace.wait_for_change())
    try:
        await asyncio.wait({stopped, changed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in (stopped, changed):
            waiter.cancel()
        await asyncio.gather(stopped, changed, return_exceptions=True)


def _pulse_done(
    running: dict[str, asyncio.Task[int]], pulsed_route: dict[str, pb.Route], name: str, task: asyncio.Task[int]
) -> None:
    running.pop(name, None)
    if task.cancelled():
        return
    exc = task.exception()
    if exc is None and task.result() == pb.OK:
        return
    # The route's members may not all hold the journal's head: pulse again at the next scan
    # (a replica that joined and missed it would otherwise wait for a client append, and its
    # spool stays behind the stores' index if the primary dies first: INDEX_HAS_GREATER_OFFSET).
    pulsed_route.pop(name, None)
    error = str(exc) if exc is not None else pb.Status.Name(task.result())  # type: ignore[arg-type]
    log.debug("pulse failed; will pulse again", extra={"journal": name, "error": error})
