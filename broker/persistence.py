"""Wires fragment stores into the broker: persisting rolled spools, refreshing each replica's
index from its stores, reading and signing persisted fragments, and store health checks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from broker import metrics
from broker.fragment import CoverSet, Fragment
from broker.fragment.errors import FragmentError
from broker.fragment.names import content_path
from broker.fragment.persister import Persister, PersistJob
from broker.fragment.postfix import SpoolData, render_path_postfix
from broker.fragment.store_io import list_fragments, open_fragment
from broker.protocol import pb
from broker.replica import Replica
from broker.stores import StoreError, StoreRegistry
from broker.stores.health import check_delete
from cluster.keyspace import KeySpace

log = logging.getLogger(__name__)

DEFAULT_REFRESH_INTERVAL = 300.0
# A store that failed to list is retried sooner than a healthy one is re-listed.
MAX_ERROR_RETRY = 5.0
DELETE_PROBE_TIMEOUT = 60.0


class FragmentPersistence:
    """The broker's store layer, shared by every replica."""

    def __init__(
        self,
        registry: StoreRegistry,
        keyspace: KeySpace,
        replica_of: Callable[[str], Replica | None],
    ) -> None:
        self.registry = registry
        self._replica_of = replica_of
        self.persister = Persister(
            registry, self._on_persisted, journal_exists=lambda j: j in keyspace.journals
        )

    # --- Persisting -------------------------------------------------------------------------

    def on_complete(self, replica: Replica, fragment: Fragment) -> None:
        """Replica hook: queue a rolled spool fragment for persistence to the journal's stores."""
        spec = replica.spec
        f = pb.Fragment()
        f.CopyFrom(fragment.spec)
        template = spec.fragment.path_postfix_template
        if template:
            spool = replica.spool
            data = SpoolData(
                journal=f.journal,
                begin=f.begin,
                end=f.end,
                first_append_time=spool.first_append_time or time.time(),
                registers=spool.registers,
            )
            try:
                f.path_postfix = render_path_postfix(template, data, spec)
            except FragmentError as exc:
                log.error(
                    "path_postfix_template failed; persisting without a postfix",
                    extra={"journal": f.journal, "template": template, "error": str(exc)},
                )
        self.persister.submit(Fragment(f, fragment.file), list(spec.fragment.stores))

    def _on_persisted(self, job: PersistJob, url: str, uploaded: bool) -> None:
        spec = job.fragment.spec
        if uploaded:
            metrics.FRAGMENTS_PERSISTED.labels(spec.journal).inc()
            metrics.FRAGMENT_PERSISTED_BYTES.labels(spec.journal).inc(spec.end - spec.begin)
        log.debug(
            "fragment persisted",
            extra={"journal": spec.journal, "store": url, "path": content_path(spec), "uploaded": uploaded},
        )
        replica = self._replica_of(spec.journal)
        if replica is not None:
            replica.request_refresh()

    async def drain(self) -> None:
        """Wait until every queued fragment is persisted."""
        pending = self.persister.pending
        if pending:
            log.info("persisting spools before exit", extra={"fragments": len(pending)})
        await self.persister.wait_idle()

    # --- Index refresh ----------------------------------------------------------------------

    def start_refresh(self, replica: Replica) -> asyncio.Task[None]:
        """Replica hook: list the journal's stores now and every refresh_interval."""
        return asyncio.get_running_loop().create_task(self._refresh_loop(replica))

    async def _refresh_loop(self, replica: Replica) -> None:
        journal = replica.journal
        while not replica.closed:
            fragment_spec = replica.spec.fragment
            interval = fragment_spec.refresh_interval.ToTimedelta().total_seconds() or DEFAULT_REFRESH_INTERVAL
            replica.refresh_requested.clear()
            try:
                stores = [(url, self.registry.get(url)) for url in fragment_spec.stores]
                listing = await list_fragments(journal, stores) if stores else CoverSet()
            except (StoreError, OSError) as exc:
                log.warning("listing fragment stores failed", extra={"journal": journal, "error": str(exc)})
                interval = min(interval, MAX_ERROR_RETRY)
            else:
                if not replica.closed:
                    replica.index.replace_remote(listing)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await replica.refresh_requested.wait()

    # --- Reads, signed URLs and health ------------------------------------------------------

    async def open_remote(self, fragment: Fragment, offset: int) -> AsyncIterator[bytes]:
        """Decompressed content of a persisted fragment from `offset`."""
        store = self.registry.get(fragment.spec.backing_store)
        async for data in open_fragment(store, fragment.spec, offset):
            yield data

    async def sign_url(self, fragment: Fragment, ttl: float) -> str:
        """A GET URL of a persisted fragment, valid for `ttl` seconds."""
        store = self.registry.get(fragment.spec.backing_store)
        return await store.sign_get(content_path(fragment.spec), ttl)

    async def store_health(self, url: str, probe_delete: bool, delete_prefix: str) -> str:
        """The store's health error ("" when healthy), running the delete probe if asked."""
        try:
            error = await self.registry.health(url).result()
            if not error and probe_delete:
                async with asyncio.timeout(DELETE_PROBE_TIMEOUT):
                    await check_delete(self.registry.get(url), delete_prefix)
        except (StoreError, OSError) as exc:
            return str(exc)
        except TimeoutError:
            return f"{url}: delete probe timed out after {DELETE_PROBE_TIMEOUT:.0f}s"
        return error

    async def close(self) -> None:
        await self.persister.close()
        await self.registry.close()
