"""What the broker's RPC handlers share: the etcd mirror, resolver, peer dialer, stores and limits."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from broker.flow_control import TokenBucket, effective_rate
from broker.peers import PeerDialer
from broker.pipeline import PEER_TIMEOUT
from broker.protocol import pb
from broker.resolver import Resolver
from broker.stores import StoreRegistry
from cluster.keyspace import KeySpace, desired_replication


@dataclass
class BrokerState:
    etcd: Any  # aetcd.Client
    root: str
    keyspace: KeySpace
    resolver: Resolver
    dialer: PeerDialer
    stores: StoreRegistry | None = None
    """The fragment stores and their health checks (None: appends do not look at store health)."""
    max_append_rate: int = 0
    min_append_rate: int = 0
    max_replication: int = 9
    buckets: dict[str, TokenBucket] = field(default_factory=dict)
    peer_timeout: float = PEER_TIMEOUT
    """Seconds a replication pipeline waits on a peer (broker.pipeline.peer_timeout of the lease)."""
    lease_lost: bool = False
    """Set when the broker's etcd lease is gone: its assignments are void, it acknowledges nothing more."""
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the broker, exiting, has handed its journals off: RPCs in flight are given a grace
    period, and an append still looking for its primary gives up with a status rather than wait."""

    def bucket(self, spec: pb.JournalSpec) -> TokenBucket:
        """The journal's append token bucket, rebuilt when its rate changes."""
        rate = effective_rate(spec.max_append_rate, self.max_append_rate)
        bucket = self.buckets.get(spec.name)
        if bucket is None or bucket.rate != rate:
            bucket = self.buckets[spec.name] = TokenBucket(rate)
        return bucket

    def desired_replication(self, spec: pb.JournalSpec) -> int:
        """The journal's desired replication (see the allocator's), capped by --broker.max-replication."""
        return min(desired_replication(spec), self.max_replication)
