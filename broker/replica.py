"""A broker's local replica of one journal: its fragment index, spool and replication pipeline."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker.fragment import Fragment, Index, Spool
from broker.pipeline import routes_equivalent, same_id
from broker.protocol import pb

if TYPE_CHECKING:
    from broker.pipeline import Pipeline

log = logging.getLogger(__name__)

# Persister is the hook the fragment-store layer plugs into: it receives every
# completed (rolled) local fragment and must eventually persist it.
Persister = Callable[["Replica", Fragment], None]


@dataclass
class ReplicateHold:
    """A Replicate stream holding a replica's spool: the route it was opened for and the task serving
    it, which `end` cancels (the stream then ends with `ended`, the reason)."""

    route: pb.Route
    task: asyncio.Task[Any]
    ended: str = ""

    def end(self, reason: str) -> None:
        if not self.ended:
            self.ended = reason
            self.task.cancel()


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
        self.voided = False
        """Set when the broker's etcd lease is lost (`void`)."""
        self.replicating: ReplicateHold | None = None
        """The Replicate stream holding the spool."""

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

    def void(self) -> None:
        """The broker's etcd lease is lost, so its assignments are void: end the Replicate stream
        holding the spool and break the pipeline (appends waiting on it fail), and from now on
        `flush` persists only what the peer set is known to hold."""
        self.voided = True
        if self.replicating is not None:
            self.replicating.end("this broker's etcd lease is lost")
        if self.pipeline is not None:
            self.pipeline.break_off("this broker's etcd lease is lost")

    def preempt_stale_stream(self, route: pb.Route, is_member: Callable[[pb.ProcessSpec.ID], bool]) -> None:
        """End the Replicate stream holding the spool if `route` names another primary than the
        stream's and that primary is no longer a member (`is_member`: its lease expired). Cut off
        by a partition, it would never close its stream, and the new primary's stream waits for the
        spool. A primary handing off (still a member) finishes its append in flight."""
        hold = self.replicating
        old = replaced_primary(hold.route, route) if hold is not None else None
        if old is not None and not is_member(old):
            self._end_replaced_stream()

    async def acquire(self, route: pb.Route, patience: float, *, stream: bool = False) -> None:
        """Take `lock` for an append or (`stream`) a Replicate stream of `route`. Held by the stream
        of a primary that `route` replaced, the spool is taken from it after `patience` seconds: a
        primary handing off finishes its append in flight by then, one cut off by a partition
        never would. A new stream of the same primary takes it at once: a primary runs one pipeline
        per journal, so it has given up the old stream (which a partition may have kept from
        ending here)."""
        hold = self.replicating
        if hold is not None and stream and replaced_primary(hold.route, route) is None:
            if hold.route.primary >= 0:
                log.warning("ending a Replicate stream its primary gave up", extra={"journal": self.journal})
                hold.end("superseded by a new stream of its primary")
            await self.lock.acquire()
            return
        if hold is None or replaced_primary(hold.route, route) is None:
            await self.lock.acquire()
            return
        try:
            async with asyncio.timeout(patience):
                await self.lock.acquire()
            return
        except TimeoutError:
            if self.replicating is hold:
                self._end_replaced_stream()
        await self.lock.acquire()

    def _end_replaced_stream(self) -> None:
        if self.replicating is not None:
            log.warning("ending the Replicate stream of a replaced primary", extra={"journal": self.journal})
            self.replicating.end("the journal's route changed: its primary was replaced")

    async def flush(self) -> None:
        """Roll the spool so its content is handed to the persister, as a broker does on exit.

        The roll is local: the pipeline is torn down first, and peers roll their own spools. Once
        `void`, only the acknowledged prefix is persisted: the rest may be content the journal's
        other brokers never took, at offsets they go on to write.
        """
        async with self.lock:
            if self.pipeline is not None:
                pipeline, self.pipeline = self.pipeline, None
                await pipeline.close()
            spool = self.spool
            if self.voided:
                acknowledged = spool.acknowledged_fragment()
                if acknowledged is not None and self._persister is not None:
                    self._persister(self, acknowledged)
                if spool.fragment.end != spool.acknowledged.end:
                    log.warning(
                        "lease lost: not persisting content its peers may not hold",
                        extra={"journal": self.journal, "from": spool.acknowledged.end, "to": spool.fragment.end},
                    )
                self.closed = True
                return
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


def replaced_primary(old: pb.Route, new: pb.Route) -> pb.ProcessSpec.ID | None:
    """`old`'s primary, if `new` names another primary (or none); else None."""
    if not 0 <= old.primary < len(old.members):
        return None
    primary = old.members[old.primary]
    if 0 <= new.primary < len(new.members) and same_id(new.members[new.primary], primary):
        return None
    return primary


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
