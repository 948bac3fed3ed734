"""Health checks of a fragment store: write, read back, list and (over HTTP) fetch a probe object."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import random
import urllib.request

from broker.stores.base import FragmentStore, StoreError

log = logging.getLogger(__name__)

PROBE_PATH = ".test/health-check"
PROBE_CONTENT = b"health-check\n"
DELETE_PROBE_NAME = ".gazette-delete-probe"
DELETE_PROBE_CONTENT = b"gazette-delete-probe\n"
SIGN_TTL = 300.0
RECHECK_AFTER_SUCCESS = 30 * 60.0
# Delay before the next check after the n-th consecutive failure; the last repeats.
RETRY_AFTER_FAILURE = (0.0, 0.1, 1.0, 1.0, 10.0, 10.0, 100.0)
JITTER = 0.2
REQUESTED_CHECK_INTERVAL = 1.0
"""Least time between two checks that waiting appends ask for (`request_check`), so that a store
that is down is not hammered by its journals' appends."""


async def check_store(store: FragmentStore) -> None:
    """Raise StoreError unless `store` can write, read, list and sign a probe object."""
    await store.put(PROBE_PATH, io.BytesIO(PROBE_CONTENT))
    content = b"".join([chunk async for chunk in store.open(PROBE_PATH)])
    if content != PROBE_CONTENT:
        raise StoreError(f"read back {content[:64]!r}, expected {PROBE_CONTENT!r}", store.url, PROBE_PATH)
    listed = {obj.path for obj in await store.list(".test/")}
    if "health-check" not in listed:
        raise StoreError(f"listing .test/ gave {sorted(listed)}, expected health-check", store.url, ".test/")
    url = await store.sign_get(PROBE_PATH, SIGN_TTL)
    if url.startswith(("http://", "https://")):
        fetched = await asyncio.to_thread(_http_get, url)
        if fetched != PROBE_CONTENT:
            raise StoreError(f"signed URL returned {fetched[:64]!r}", store.url, PROBE_PATH)


async def check_delete(store: FragmentStore, prefix: str) -> None:
    """Raise StoreError unless `store` lets us create and then delete `<prefix>.gazette-delete-probe`."""
    path = prefix + DELETE_PROBE_NAME
    await store.put(path, io.BytesIO(DELETE_PROBE_CONTENT))
    await store.remove(path)


def _http_get(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            body: bytes = resp.read()
            return body
    except OSError as exc:
        raise StoreError(f"fetching signed URL: {exc}") from exc


class StoreHealth:
    """Checks one store now and then: every 30 minutes while healthy, backing off while not.

    `error` is None before the first check completes, "" after a passing one, and the failure
    text otherwise.
    """

    def __init__(self, store: FragmentStore) -> None:
        self.store = store
        self.error: str | None = None
        self._checked = asyncio.Event()
        self._recheck = asyncio.Event()
        self._next: asyncio.Future[str] | None = None  # Resolved by the next check to complete.
        self._last_check = 0.0  # Loop time the last check began.
        self._requested = False  # A check was asked for by `request_check`.
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def result(self) -> str:
        """The latest check's error ("" when healthy), waiting for the first check if need be."""
        await self._checked.wait()
        assert self.error is not None
        return self.error

    async def next_check(self) -> str:
        """The error ("" when healthy) of the next check to complete (Gazette's HealthStatus channel)."""
        if self._next is None or self._next.done():
            self._next = asyncio.get_running_loop().create_future()
        return await asyncio.shield(self._next)

    def request_check(self) -> None:
        """Check again now, or REQUESTED_CHECK_INTERVAL after the last check began if that is later."""
        self._requested = True
        self._recheck.set()

    def mark_failed(self, error: str) -> None:
        """Record a failure seen by a store user, so the store is re-checked soon."""
        self.error = error
        self._checked.set()
        self._recheck.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        failures = 0
        while True:
            self._last_check = asyncio.get_running_loop().time()
            try:
                await check_store(self.store)
            except (StoreError, OSError) as exc:
                if self.error != str(exc):
                    log.warning("fragment store unhealthy", extra={"store": self.store.url, "error": str(exc)})
                self.error = str(exc)
                delay = RETRY_AFTER_FAILURE[min(failures, len(RETRY_AFTER_FAILURE) - 1)]
                failures += 1
            else:
                if self.error:
                    log.info("fragment store healthy again", extra={"store": self.store.url})
                self.error, failures, delay = "", 0, RECHECK_AFTER_SUCCESS
            self._checked.set()
            if not self._requested:  # One asked for during this check is still due.
                self._recheck.clear()
            if self._next is not None and not self._next.done():
                self._next.set_result(self.error)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay * random.uniform(1 - JITTER, 1 + JITTER)):
                    await self._recheck.wait()
            if self._requested:
                self._requested = False
                loop = asyncio.get_running_loop()
                await asyncio.sleep(max(0.0, self._last_check + REQUESTED_CHECK_INTERVAL - loop.time()))
