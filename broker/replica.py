"""A broker's local replica of one journal: its fragment index, spool and replication pipeline."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.fragment import Fragment, Index, Spool
from broker.pipeline import routes_equivalent
from broker.protocol import pb

if TYPE_CHECKING:
    from broker.pipeline import Pipeline

log = logging.getLogger(__name__)

# Persister is the hook the fragment-store layer plugs into: it receives every
# completed (rolled) local fragment and must eventually persist it.
Persister = Callable[["Replica", Fragment], None]


class Replica:
    """Owns one journal's index and spool on this broker.

    The spool and the pipeline built over it are used by one append (or one
    Replicate stream) at a time: `lock` serializes them.
    """

    def __init__(
        self,
        journal: str,
        spec: pb.JournalSpec,
        spool_dir: str | None,
        persister: Persister | None = None,
    ) -> None:
        self.journal = journal
        self.spec = spec
        self.index = Index(journal, on_gap=self.request_refresh)
        self.lock = asyncio.Lock()
        self.pipeline: Pipeline | None = None
        self._persister = persister
        self.spool = Spool(journal, self, spool_dir)
        self.closed = False
        self.refresh_requested = asyncio.Event()
        """Set to list the journal's stores now rather than at the next refresh_interval."""
        self._tasks: list[asyncio.Task[None]] = []

    # SpoolObserver.
    def on_commit(self, f: Fragment) -> None:
        self.index.spool_commit(f)

    def on_complete(self, f: Fragment) -> None:
        if self._persister is not None:
            self._persister(self, f)

    def on_roll(self, offset: int) -> None:
        self.index.spool_rolled(offset)

    def start(self, refresh: Callable[[Replica], asyncio.Task[None]]) -> None:
        """Begin indexing: `refresh` lists the journal's stores now and every refresh_interval."""
        self._tasks.append(refresh(self))

    def update_spec(self, spec: pb.JournalSpec) -> None:
        if list(spec.fragment.stores) != list(self.spec.fragment.stores):
            self.request_refresh()
        self.spec = spec

    def request_refresh(self) -> None:
        """Ask the refresh loop to list the journal's stores now (e.g. after a persist)."""
        self.refresh_requested.set()

    async def flush(self) -> None:
        """Roll the spool so its content is handed to the persister, as a broker does on exit.

        The roll is local: the pipeline is torn down first, and peers roll their own spools.
        """
        async with self.lock:
            if self.pipeline is not None:
                pipeline, self.pipeline = self.pipeline, None
                await pipeline.close()
            spool = self.spool
            if spool.fragment.content_length == 0:
                return
            end = spool.fragment.end
            proposal = pb.Fragment(
                journal=self.journal, begin=end, end=end, sum=pb.SHA1Sum(),
                compression_codec=self.spec.fragment.compression_codec or pb.NONE,
            )
            spool.apply(pb.ReplicateRequest(proposal=proposal, registers=spool.registers, acknowledge=True))

    async def close_stale_pipeline(self, route: pb.Route) -> None:
        """Close the pipeline if it was built for another route than `route`, once the append
        using it (if any) is done: its Replicate streams would otherwise hold members that left
        the route, which wait for them to end before they exit."""
        async with self.lock:
            pipeline = self.pipeline
            if pipeline is not None and not routes_equivalent(pipeline.route, route):
                self.pipeline = None
                await pipeline.close()

    async def retire(self) -> None:
        """The journal is no longer assigned here: hand the spool's content to the persister (a
        broker's one cardinal duty), then close. Peers may not hold all of it: a replica added to
        the route holds only what was appended after it joined."""
        try:
            await self.flush()
        finally:
            await self.close()

    async def close(self) -> None:
        """Tear down the pipeline and stop background work; blocked reads wake and end."""
        self.closed = True
        for task in self._tasks:
            task.cancel()
        if self.pipeline is not None:
            pipeline, self.pipeline = self.pipeline, None
            await pipeline.close()
        self.index.close()


def maybe_roll_fragment(
    spool: Spool, roll_to_offset: int, spec: pb.JournalSpec.Fragment, now: float | None = None
) -> pb.Fragment:
    """The proposal that closes the spool's fragment if it should be rolled, else the fragment itself.

    Rolls when the spool is empty (a no-op unless the codec or offset changes), longer than the
    spec's target length, asked to move to `roll_to_offset`, or past a flush_interval boundary.
    """
    current = spool.fragment.spec
    length = current.end - current.begin
    flush = spec.flush_interval.seconds
    roll = (
        length == 0
        or length > spec.length
        or (roll_to_offset != 0 and roll_to_offset != current.begin)
    )
    if not roll and flush > 0 and spool.first_append_time is not None:
        now = time.time() if now is None else now
        roll = int(spool.first_append_time) // flush != int(now) // flush
    if not roll:
        return current
    offset = roll_to_offset or current.end
    return pb.Fragment(
        journal=current.journal or spool.journal,
        begin=offset,
        end=offset,
        compression_codec=spec.compression_codec or pb.NONE,
        sum=pb.SHA1Sum(),
    )
