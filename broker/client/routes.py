"""The route cache: journal -> Route, learned from response headers and List results.

With a route, a request goes straight to the broker that serves it (the primary for appends,
a member in the client's zone for reads) instead of being proxied by whichever broker the
default address reaches. Entries expire after `ttl` seconds and the least recently used
are evicted past `size`, as Gazette's route cache does.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from broker.protocol import pb
from broker.protocol.paths import journal_of

DEFAULT_SIZE = 1024
DEFAULT_TTL = 60.0


def has_endpoints(route: pb.Route) -> bool:
    """Whether `route` has members and an endpoint for each of them."""
    return len(route.members) > 0 and len(route.endpoints) == len(route.members)


def primary_endpoint(route: pb.Route) -> str:
    """The primary's endpoint, or "" if the route has no primary or no endpoints."""
    if not has_endpoints(route) or not 0 <= route.primary < len(route.members):
        return ""
    return route.endpoints[route.primary]


def read_endpoint(route: pb.Route, zone: str) -> str:
    """A member's endpoint for reading: the first in `zone`, else the primary, else the first member."""
    if not has_endpoints(route):
        return ""
    for member, endpoint in zip(route.members, route.endpoints, strict=True):
        if member.zone == zone and endpoint:
            return endpoint
    return primary_endpoint(route) or route.endpoints[0]


class RouteCache:
    """A bounded, expiring map of journal name to its last known Route (with endpoints)."""

    def __init__(
        self, size: int = DEFAULT_SIZE, ttl: float = DEFAULT_TTL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.size = size
        self.ttl = ttl
        self._clock = clock
        self._routes: OrderedDict[str, tuple[float, pb.Route, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._routes)

    def get(self, journal: str) -> pb.Route | None:
        """The cached route of `journal`, or None if unknown or expired."""
        name = journal_of(journal)
        entry = self._routes.get(name)
        if entry is None:
            return None
        expires, route, _revision = entry
        if self._clock() >= expires:
            del self._routes[name]
            return None
        self._routes.move_to_end(name)
        return route

    def revision(self, journal: str) -> int:
        """The etcd revision at which `journal`'s cached route was current (0 if none is cached).

        Requests sent along the route carry it as `min_etcd_revision`, so that a broker whose view
        of etcd lags (e.g. of a journal just created) catches up before it answers.
        """
        entry = self._routes.get(journal_of(journal))
        return entry[2] if entry is not None and self.get(journal) is not None else 0

    def update(self, journal: str, route: pb.Route | None, revision: int = 0) -> None:
        """Remember `route` of `journal`, current at etcd `revision`; a route without members or
        endpoints forgets the journal."""
        name = journal_of(journal)
        if route is None or not has_endpoints(route) or self.size <= 0:
            self._routes.pop(name, None)
            return
        copy = pb.Route()
        copy.CopyFrom(route)
        self._routes[name] = (self._clock() + self.ttl, copy, revision)
        self._routes.move_to_end(name)
        while len(self._routes) > self.size:
            self._routes.popitem(last=False)

    def invalidate(self, journal: str) -> None:
        """Forget the route of `journal`."""
        self._routes.pop(journal_of(journal), None)

    def drop_endpoint(self, journal: str, endpoint: str) -> None:
        """Remove the member at `endpoint` from `journal`'s route (it failed), keeping the others.

        A route left without members is forgotten; one whose primary was dropped has none.
        """
        name = journal_of(journal)
        entry = self._routes.get(name)
        if entry is None:
            return
        expires, route, revision = entry
        kept = [i for i, e in enumerate(route.endpoints) if e != endpoint]
        if len(kept) == len(route.endpoints):
            return
        if not kept:
            del self._routes[name]
            return
        out = pb.Route(
            members=[route.members[i] for i in kept],
            endpoints=[route.endpoints[i] for i in kept],
            primary=kept.index(route.primary) if route.primary in kept else -1,
        )
        self._routes[name] = (expires, out, revision)
