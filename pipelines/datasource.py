"""The `gazette` PySpark data source: `spark.read.format("gazette")`, `readStream`, `write`, `writeStream`.

Each side lives in its own package (`pipelines.source`, `pipelines.sink`); this class only hands
Spark the right object. Imports are deferred so that a Spark worker loads only the side it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from pipelines.accumulators import quiet_planner_worker

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.session import SparkSession as ConnectSession

FORMAT = "gazette"

quiet_planner_worker()  # Spark's planner workers import this module to unpickle the data source.


class GazetteDataSource(DataSource):
    """Journals selected by label, as a Spark source and sink (see `pipelines/README.md` for the options)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        from pipelines.source.schema import source_schema

        return source_schema(dict(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        from pipelines.source.batch import GazetteBatchReader

        return GazetteBatchReader(dict(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from pipelines.source.stream import GazetteStreamReader

        return GazetteStreamReader(dict(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from pipelines.sink.writer import GazetteBatchWriter

        return GazetteBatchWriter(dict(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from pipelines.sink.writer import GazetteStreamWriter

        return GazetteStreamWriter(dict(self.options), schema, overwrite)


def register(spark: SparkSession | ConnectSession) -> None:
    """Make format `gazette` available to `spark`, a classic or a Spark Connect session (once per session).

    Over Spark Connect the class goes to the server by reference: the server's Python workers import
    `pipelines.datasource` themselves, so gazette-py must be installed where the server runs.
    """
    spark.dataSource.register(GazetteDataSource)
