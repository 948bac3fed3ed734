"""Batch reads: `spark.read.format("gazette")`. Partitions are planned on the driver (one per fragment)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from pipelines.source.options import SourceOptions, parse_options
from pipelines.source.planning import GazettePartition, plan_batch, run
from pipelines.source.read import read_partition
from pipelines.source.schema import arrow_schema, check_schema
from pipelines.source.worker import prepare_worker


class GazetteBatchReader(DataSourceReader):
    """Reads every journal the selector matches, from startingOffsets to endingOffsets."""

    def __init__(self, options: dict[str, str], schema: StructType, *, streaming: bool = False) -> None:
        self.opts: SourceOptions = parse_options(options, streaming=streaming)
        extra = check_schema(schema, self.opts)
        self.arrow = arrow_schema(schema)
        self.extra = pa.schema([self.arrow.field(name) for name in extra]) if extra else None

    def partitions(self) -> Sequence[InputPartition]:
        return run(plan_batch(self.opts))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        prepare_worker()  # Executor side: once per Python worker process.
        if not isinstance(partition, GazettePartition):
            return iter(())  # Spark plans one empty partition when there are none.
        return read_partition(partition, self.opts, self.arrow, self.extra)
