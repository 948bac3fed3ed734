"""A small synchronous facade for scripts: each call runs its own event loop and client.

`address` None means the shared configuration (`$BROKER_ADDRESS`, `gazctl.ini`, then
`http://localhost:8080`). `timeout` (seconds) bounds a whole call. These functions cannot be
called from a running event loop: use the asyncio API there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from broker.client import listing
from broker.client.appender import append as _append
from broker.client.dial import JournalClient
from broker.client.reader import RetryReader
from broker.protocol import pb

T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        coro.close()
        raise RuntimeError("broker.client.sync cannot run inside an event loop; use the asyncio API")

    async def bounded() -> T:
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


def read_all(
    address: str | None,
    journal: str,
    offset: int = 0,
    *,
    end_offset: int = 0,
    do_not_proxy: bool = False,
    file_root: str | None = None,
    timeout: float | None = None,
) -> bytes:
    """The content of `journal` from `offset` up to its write head (or `end_offset`).

    Content removed from the journal is skipped (an offset jump). With `do_not_proxy`,
    persisted fragments are read from their store (`file://` ones under `file_root`).
    """

    async def run() -> bytes:
        async with JournalClient(address, file_root=file_root) as client:
            reader = RetryReader(client, journal, offset=offset, end_offset=end_offset, do_not_proxy=do_not_proxy)
            try:
                return b"".join([chunk async for chunk in reader])
            finally:
                await reader.close()

    return _run(run(), timeout)


def append(
    address: str | None, journal: str, data: bytes, *, timeout: float | None = None, **params: Any
) -> pb.AppendResponse:
    """Append `data` to `journal` atomically; `params` are AppendRequest fields (e.g. `offset`)."""

    async def run() -> pb.AppendResponse:
        async with JournalClient(address) as client:
            return await _append(client, journal, data, **params)

    return _run(run(), timeout)


def list_journals(
    address: str | None, selector: pb.LabelSelector | None = None, *, timeout: float | None = None
) -> pb.ListResponse:
    """Every journal matching `selector` (all if None)."""

    async def run() -> pb.ListResponse:
        async with JournalClient(address) as client:
            return await listing.list_journals(client, selector)

    return _run(run(), timeout)


def apply_journals(
    address: str | None,
    changes: Sequence[pb.ApplyRequest.Change],
    *,
    max_txn_size: int = 0,
    timeout: float | None = None,
) -> pb.ApplyResponse:
    """Apply journal spec changes (see `listing.upsert` and `listing.delete`)."""

    async def run() -> pb.ApplyResponse:
        async with JournalClient(address) as client:
            return await listing.apply_journals(client, changes, max_txn_size=max_txn_size)

    return _run(run(), timeout)


def list_all_fragments(
    address: str | None, journal: str, *, timeout: float | None = None, **params: Any
) -> pb.FragmentsResponse:
    """Every fragment of `journal`; `params` are those of `listing.fragments_request`."""

    async def run() -> pb.FragmentsResponse:
        async with JournalClient(address) as client:
            return await listing.list_all_fragments(client, listing.fragments_request(journal, **params))

    return _run(run(), timeout)
