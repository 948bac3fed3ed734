"""Routing against two real brokers: the route cache, and the statuses of requests that may not be proxied."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import (
    Appender,
    JournalClient,
    NotJournalBroker,
    NotJournalPrimaryBroker,
    Reader,
    RetryReader,
    append,
)
from tests.support.harness import BrokerProcess
from tests.support.journals import new_journal, wait_for_primary


@pytest.fixture(scope="module")
def brokers(etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, ...]]:
    tmp: Path = tmp_path_factory.mktemp("cluster")
    prefix = f"/test/{uuid.uuid4().hex}"
    procs = (BrokerProcess(tmp, etcd_endpoint, prefix), BrokerProcess(tmp, etcd_endpoint, prefix))
    try:
        yield tuple(p.wait_ready() for p in procs)
    finally:
        for p in procs:
            assert p.stop() == 0, p.logs()


async def placed_journal(brokers: tuple[BrokerProcess, ...]) -> tuple[str, str, str]:
    """A replication-1 journal, its primary's endpoint, and the other broker's."""
    async with JournalClient(brokers[0].url) as setup:
        journal = await new_journal(setup, "client/routing")
        route = await wait_for_primary(setup, journal)
    for b in brokers[1:]:  # Every broker knows the journal before the test starts.
        async with JournalClient(b.url) as other:
            await wait_for_primary(other, journal)
    primary = route.endpoints[route.primary]
    other = next(b.url for b in brokers if b.url != primary)
    return journal, primary, other


async def test_route_cache_sends_requests_to_the_primary(brokers: tuple[BrokerProcess, ...]) -> None:
    journal, primary, other = await placed_journal(brokers)
    async with JournalClient(other) as client:
        first = Appender(client, journal)
        await first.write(b"proxied;")
        await first.commit()
        assert first.endpoint == other  # No route yet: the default broker proxies to the primary.
        assert first.response is not None
        assert list(first.response.header.route.endpoints) == [primary]

        second = Appender(client, journal)
        await second.write(b"direct")
        await second.commit()
        assert second.endpoint == primary

        reader = Reader(client, journal)
        assert b"".join([chunk async for chunk in reader]) == b"proxied;direct"
        assert reader.endpoint == primary


async def test_do_not_proxy_statuses_and_recovery(brokers: tuple[BrokerProcess, ...]) -> None:
    journal, primary, other = await placed_journal(brokers)
    async with JournalClient(other, route_cache=False) as uncached:
        with pytest.raises(NotJournalPrimaryBroker) as info:
            await append(uncached, journal, b"x", do_not_proxy=True)
        assert info.value.journal == journal
        assert str(info.value).startswith("NOT_JOURNAL_PRIMARY_BROKER")
        with pytest.raises(NotJournalBroker):
            await Reader(uncached, journal, do_not_proxy=True).read()

    async with JournalClient(other) as client:
        await append(client, journal, b"content")
        client.routes.invalidate(journal)  # type: ignore[union-attr]
        # The NOT_JOURNAL_BROKER reply carries the route: the RetryReader goes there next.
        reader = RetryReader(client, journal, do_not_proxy=True)
        assert await reader.read() == b"content"
        assert reader.restarts == 1 and reader.reader.endpoint == primary
        await reader.close()
