"""Fixtures of the Spark pipeline tests: one local Spark session (the brokers are the root conftest's:
`broker` with a file:// store, `store_broker` reaching the object stores' emulators)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from pipelines.datasource import register
from tests.support.spark_session import local_spark


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """A `local[2]` Spark session with format `gazette` registered; its Python workers run this interpreter."""
    with local_spark(tmp_path_factory.mktemp("spark"), "gazette-tests") as session:
        register(session)
        yield session
