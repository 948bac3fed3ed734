"""A member's lifecycle in etcd (Gazette's `allocator/announce.go`): announce under a lease, keep it alive,
mark it exiting, release it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from typing import Any

from aetcd import rpc
from aetcd.exceptions import ClientError

from cluster.keyspace.errors import AnnounceError, LeaseLostError
from cluster.keyspace.keyspace import (
    BROKER_SCHEMA,
    KeySpaceSchema,
    compare_create,
    compare_mod,
    get_op,
    member_key,
    put_op,
    txn,
    txn_response,
)

LEASE_TTL = 20.0
"""Seconds of the member's session lease (`--etcd.lease`)."""
RELEASE_TIMEOUT = 3.0
"""Seconds a member waits for etcd to revoke its lease at exit."""
RETRY_INTERVAL = 0.5
"""Seconds between announce attempts while the key is held under another lease (a restarted
process's predecessor, whose lease etcd expires within its TTL)."""

_log = logging.getLogger(__name__)


class Announcement:
    """The member key `<root>/members/<zone>#<suffix>`, held under this process's lease. `spec` is
    the member's spec (a BrokerSpec, or what `schema` decodes: a consumer's ConsumerSpec)."""

    def __init__(
        self,
        client: Any,
        root: str,
        spec: Any,
        *,
        schema: KeySpaceSchema = BROKER_SCHEMA,
        ttl: float = LEASE_TTL,
        retry_interval: float = RETRY_INTERVAL,
        on_lost: Callable[[], None] | None = None,
        log: logging.Logger | None = None,
    ) -> None:
        self.client = client
        self.spec = spec
        self.schema = schema
        process_id = schema.member_process(spec).id
        self.key = member_key(root.rstrip("/"), process_id.zone, process_id.suffix)
        # etcd leases have whole-second TTLs.
        self.ttl = max(1, math.ceil(ttl))
        self.retry_interval = retry_interval
        self.on_lost = on_lost
        self.log = log or _log
        self.lease_id = 0
        self.revision = 0
        """Revision at which the member key was announced."""
        self.lost = False
        self._keepalive: asyncio.Task[None] | None = None

    async def announce(self) -> int:
        """Grant the lease (once), start its keepalive, then create the member key; return the revision."""
        await self.grant_lease()
        value = self.spec.SerializeToString()
        warned = False
        while True:
            if self.lost:
                raise LeaseLostError(f"lease {self.lease_id:x} lost while announcing {self.key}")
            resp = await txn_response(
                self.client,
                [compare_create(self.key, 0)],
                [put_op(self.key, value, lease=self.lease_id)],
                [get_op(self.key)],
            )
            if resp.succeeded:
                self.revision = resp.header.revision
                break
            kvs = resp.responses[0].response_range.kvs
            if kvs and kvs[0].lease == self.lease_id:
                # Already ours: announcing again is a no-op.
                self.revision = kvs[0].mod_revision
                break
            held = f"{kvs[0].lease:x}" if kvs else "?"
            if not warned:
                warned = True
                self.log.warning(
                    "member key %s is held under another lease (%s), likely a previous process with the "
                    "same id (zone and suffix); waiting for it to be released or to expire (at most its TTL)",
                    self.key,
                    held,
                )
            await asyncio.sleep(self.retry_interval)
        self.log.info("announced %s under lease %x at revision %d", self.key, self.lease_id, self.revision)
        return self.revision

    async def grant_lease(self) -> None:
        """Grant the member's lease, unless held already, and start refreshing it."""
        if self.lease_id:
            return
        granted = asyncio.get_running_loop().time()  # etcd counts the TTL from later than this.
        lease = await self.client.lease(self.ttl)
        self.lease_id = lease.id
        self._keepalive = asyncio.create_task(self._keep_alive(granted + self.ttl), name=f"lease-keepalive {self.key}")

    async def _keep_alive(self, expires: float) -> None:
        """Refresh the lease every third of its TTL until it is lost: declared at `expires`, the
        loop time by which etcd has expired it unless a refresh sent before then was granted (etcd
        counts a refresh's TTL from when it received it, which is after we sent it). So a member
        cut off from etcd knows its lease is gone no later than etcd does."""
        loop = asyncio.get_running_loop()
        interval = self.ttl / 3
        next_refresh = loop.time() + interval
        while True:
            await asyncio.sleep(max(0.0, min(next_refresh, expires) - loop.time()))
            if loop.time() >= expires:
                break
            sent = loop.time()
            try:
                async with asyncio.timeout_at(expires):
                    resp = await self.client.refresh_lease(self.lease_id)
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                break
            except Exception as exc:
                self.log.warning("refreshing lease %x failed: %s", self.lease_id, exc)
                next_refresh = min(loop.time() + RETRY_INTERVAL, expires)
                continue
            if resp is None or resp.TTL <= 0:
                break
            expires, next_refresh = sent + resp.TTL, sent + interval
        self._lose()

    def _lose(self) -> None:
        self.lost = True
        self.log.error("lease %x of member %s is lost", self.lease_id, self.key)
        if self.on_lost is not None:
            self.on_lost()

    async def set_exiting(self) -> int:
        """Mark the member `exiting` (ModRevision-guarded, keeping its lease); return the revision."""
        while True:
            resp = await self.client.kvstub.Range(
                rpc.RangeRequest(key=self.key.encode()),
                timeout=self.client._timeout,
                metadata=self.client.metadata,
            )
            if not resp.kvs or resp.kvs[0].lease != self.lease_id:
                raise AnnounceError(f"member key {self.key} is no longer held under lease {self.lease_id:x}")
            kv = resp.kvs[0]
            spec = self.schema.decode_member(kv.value)
            self.schema.mark_exiting(spec)
            ok, revision = await txn(
                self.client,
                [compare_mod(self.key, kv.mod_revision)],
                [put_op(self.key, spec.SerializeToString(), ignore_lease=True)],
            )
            if ok:
                self.spec = spec
                return revision

    async def release(self, timeout: float = RELEASE_TIMEOUT) -> None:
        """Stop the keepalive and revoke the lease, deleting the member key and its assignments. A
        lost lease is not revoked (etcd expired it, or will by its deadline: a member cut off from
        etcd would wait for the heal); a revoke not answered within `timeout` is given up, with
        AnnounceError, leaving the lease to expire."""
        task, self._keepalive = self._keepalive, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        lease_id, self.lease_id = self.lease_id, 0
        if not lease_id or self.lost:
            return
        try:
            async with asyncio.timeout(timeout):
                await self.client.revoke_lease(lease_id)
        except TimeoutError:
            raise AnnounceError(
                f"revoking lease {lease_id:x} of {self.key}: no answer from etcd within {timeout:g}s; it expires by"
                f" itself within {self.ttl}s"
            ) from None
        except ClientError as exc:
            # An expired lease has already removed everything it held.
            if "not found" not in str(exc):
                raise
        self.log.info("released %s (lease %x)", self.key, lease_id)
