"""The persister: uploads every completed spool fragment to a store, retrying until it lands.

A broker's cardinal duty is to persist what it replicated, so a failed upload is never dropped:
it is retried with capped exponential backoff for as long as the journal exists, while appends
carry on against the spool.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from broker.fragment.errors import FragmentError
from broker.fragment.fragment import Fragment
from broker.fragment.store_io import persist
from broker.stores import StoreError, StoreRegistry

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 32
BACKOFF_BASE = 0.1
BACKOFF_MAX = 10.0


@dataclass(eq=False)
class PersistJob:
    """A completed fragment (its path_postfix set) and the store URLs it may go to, in order."""

    fragment: Fragment
    stores: Sequence[str]
    attempts: int = 0
    last_error: str = field(default="", repr=False)


# Called after a fragment landed: (job, the store URL it is in, whether it was uploaded now).
OnPersisted = Callable[[PersistJob, str, bool], None]
# Whether a journal still exists (fragments of deleted journals are dropped).
JournalExists = Callable[[str], bool]


class Persister:
    """Persists submitted fragments concurrently (at most MAX_IN_FLIGHT uploads at a time)."""

    def __init__(
        self,
        registry: StoreRegistry,
        on_persisted: OnPersisted,
        journal_exists: JournalExists = lambda _journal: True,
    ) -> None:
        self._registry = registry
        self._on_persisted = on_persisted
        self._journal_exists = journal_exists
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._jobs: dict[PersistJob, asyncio.Task[None]] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def pending(self) -> list[PersistJob]:
        """Jobs not yet persisted."""
        return list(self._jobs)

    def submit(self, fragment: Fragment, stores: Sequence[str]) -> None:
        """Persist `fragment` to the first healthy of `stores` (a no-op without stores)."""
        if not stores:
            return
        job = PersistJob(fragment, list(stores))
        self._idle.clear()
        task = asyncio.get_running_loop().create_task(self._run(job))
        self._jobs[job] = task
        task.add_done_callback(lambda _t: self._done(job))

    def _done(self, job: PersistJob) -> None:
        self._jobs.pop(job, None)
        if not self._jobs:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Wait until every submitted fragment is persisted (or dropped)."""
        await self._idle.wait()

    async def close(self) -> None:
        """Abandon pending jobs; callers wanting them persisted wait_idle() first."""
        tasks = list(self._jobs.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _choose_store(self, job: PersistJob) -> str:
        # The first store not known to be unhealthy; the first one if all are.
        for url in job.stores:
            if self._registry.is_healthy(url) is not False:
                return url
        return job.stores[0]

    def _mark_unhealthy(self, url: str, error: str) -> None:
        try:
            self._registry.health(url).mark_failed(error)
        except StoreError:
            pass  # A store URL we cannot even build (e.g. an unsupported scheme) has no health checker.

    async def _run(self, job: PersistJob) -> None:
        journal = job.fragment.spec.journal
        while True:
            if not self._journal_exists(journal):
                log.info("dropping fragment of deleted journal", extra={"journal": journal})
                return
            url = self._choose_store(job)
            try:
                async with self._slots:
                    store = self._registry.get(url)
                    uploaded = await persist(job.fragment, store)
            except (StoreError, OSError) as exc:
                job.attempts += 1
                job.last_error = str(exc)
                if job.attempts == 1 or job.attempts % 10 == 0:
                    log.warning(
                        "persisting fragment failed; retrying",
                        extra={"fragment": repr(job.fragment), "store": url, "attempt": job.attempts,
                               "error": str(exc)},
                    )
                self._mark_unhealthy(url, str(exc))
                backoff = min(BACKOFF_MAX, BACKOFF_BASE * 2 ** (job.attempts - 1))
                await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
                continue
            except FragmentError as exc:
                # The spool file itself is unreadable: no retry can recover it.
                log.error("cannot persist fragment: its spool is unreadable",
                          extra={"fragment": repr(job.fragment), "error": str(exc)})
                return
            self._on_persisted(job, url, uploaded)
            return
