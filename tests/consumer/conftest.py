"""Consumer test fixtures: a real PostgreSQL server per session, a fresh database per test, and `ajc`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.client import AppendService
from tests.support.postgres import MISSING_REASON, PostgresServer, find_bindir


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server for the whole session (see tests/support/postgres.py); skips only when
    PostgreSQL's server binaries are not installed."""
    bindir = find_bindir()
    if bindir is None:
        pytest.skip(MISSING_REASON)
    server = PostgresServer.start(bindir)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> str:
    """The DSN of a new, empty database of the session's server, for this test only."""
    return postgres_server.create_database()


@pytest.fixture
def ajc(appender: AppendService) -> AppendService:
    """The root conftest's `appender`, by the name Gazette's recovery-log and store tests give it."""
    return appender
