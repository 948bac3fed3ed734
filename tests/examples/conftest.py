"""Fixtures of the example tests: the consumer tests' real PostgreSQL server and per-test database."""

from tests.consumer.conftest import postgres_dsn, postgres_server

__all__ = ["postgres_dsn", "postgres_server"]
