"""Fixtures of the Spark pipeline tests: one local Spark session, and a broker reaching the object stores'
emulators (the file:// one is the root conftest's `broker`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from pipelines.datasource import register
from tests.harness import BrokerProcess, serving_broker
from tests.pipelines.spark_session import local_spark
from tests.store_emulators import EmulatorProcess


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """A `local[2]` Spark session with format `gazette` registered; its Python workers run this interpreter."""
    with local_spark(tmp_path_factory.mktemp("spark"), "gazette-tests") as session:
        register(session)
        yield session


@pytest.fixture(scope="module")
def store_broker(
    emulators: dict[str, EmulatorProcess | str], etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    """A broker started after the object stores' emulators (moto, fake-gcs-server, Azurite) put their
    endpoints and credentials in the environment, so it can reach `s3://`, `gs://` and `azure://` stores."""
    with serving_broker(tmp_path_factory.mktemp("s3-broker"), etcd_endpoint) as proc:
        yield proc
