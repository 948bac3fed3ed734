"""Child processes run as one unit, cattle-style (`gazette serve --broker.processes N`).

The supervisor starts every child, and stops them all when it is asked to stop (a signal) or
when any one exits on its own: a host's processes live and die together, and an orchestrator
restarts the whole unit. Each child is in a session of its own, so a terminal's Ctrl-C reaches the
supervisor alone, which passes one SIGTERM on (a child signalled twice would skip persisting); and
each is tied to the supervisor with PR_SET_PDEATHSIG (Linux), so a SIGKILLed supervisor leaves no
child behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from broker.errors import GazetteError
from cluster.keyspace.etcd import parent_death_hook

log = logging.getLogger(__name__)

POLL_INTERVAL = 0.1
"""Seconds between two looks at whether a child exited."""

DEATH_SIGNAL = signal.SIGKILL
"""What a child gets when its supervisor dies. A supervisor is killed, not stopped, when it dies
without stopping its children first: its children go the same way, as the processes of one
container do. (SIGTERM would have each hand its journals off, with nobody left to stop a child
whose shutdown waits on a store that is down.)"""


@dataclass(frozen=True)
class Child:
    """One process to run: how errors name it, where its log is, its command line and environment."""

    name: str
    log: str
    argv: tuple[str, ...]
    env: Mapping[str, str]


def describe_status(returncode: int) -> str:
    """`status 3` or `signal SIGKILL`, as a Popen return code says how a process ended."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"status {returncode}"


class ChildExitedError(GazetteError):
    """A supervised child exited on its own (a crash, a kill, a lost lease), or with an error
    status once stopped; the supervisor stopped the others."""

    def __init__(self, child: Child, pid: int, returncode: int, *, stopping: bool) -> None:
        when = "with" if stopping else "on its own with"
        super().__init__(f"{child.name}, pid {pid}, exited {when} {describe_status(returncode)}; "
                         f"its log: {child.log}" + ("" if stopping else "; stopped the others"))
        self.child, self.pid, self.returncode = child, pid, returncode


class Supervisor:
    """Runs `children` until asked to stop or until one exits; see the module's doc."""

    def __init__(self, children: Sequence[Child]) -> None:
        self.children = tuple(children)
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        """Start every child, from the calling thread (the death signal follows the forking
        thread: call from the main one). Their stdout and stderr are the supervisor's."""
        tie = parent_death_hook(DEATH_SIGNAL)
        for child in self.children:
            proc = subprocess.Popen(
                list(child.argv), env=dict(child.env), stdin=subprocess.DEVNULL, preexec_fn=tie,
                start_new_session=True,
            )
            self.procs.append(proc)
            log.info("started %s", child.name, extra={"pid": proc.pid})

    def signal(self, sig: int) -> None:
        """Send `sig` to every child still running."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(sig)

    async def run(self, stop: asyncio.Event) -> None:
        """Start the children and wait until `stop` is set or one exits; then SIGTERM the others
        and wait for them all. ChildExitedError names the first that exited on its own, else the
        first that exited with an error status once stopped."""
        self.start()
        failed: ChildExitedError | None = None
        try:
            while not stop.is_set() and (failed := self._exited_on_its_own()) is None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(POLL_INTERVAL):
                        await stop.wait()
        finally:
            self.signal(signal.SIGTERM)
        await self._wait_all(failed)

    def _exited_on_its_own(self) -> ChildExitedError | None:
        for child, proc in zip(self.children, self.procs, strict=True):
            if proc.poll() is not None:
                log.error("%s exited on its own: stopping the others", child.name,
                          extra={"pid": proc.pid, "exit": describe_status(proc.returncode)})
                return ChildExitedError(child, proc.pid, proc.returncode, stopping=False)
        return None

    async def _wait_all(self, failed: ChildExitedError | None) -> None:
        """Wait for every child to exit (a further signal to the supervisor is the caller's to pass on)."""
        try:
            while any(proc.poll() is None for proc in self.procs):
                await asyncio.sleep(POLL_INTERVAL)
        finally:
            for proc in self.procs:  # Cancelled while waiting: the children go with the supervisor.
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        if failed is not None:
            raise failed
        for child, proc in zip(self.children, self.procs, strict=True):
            if proc.returncode != 0:
                raise ChildExitedError(child, proc.pid, proc.returncode, stopping=True)
        log.info("every process stopped")
