"""A Python data source that reads nothing: what Spark alone charges a `gazette`-shaped read.

`bench_spark_read` queries it beside the `gazette` source. Each of its partitions (as many as the
journal has fragments) yields the same pre-built Arrow batches of `offset bigint, value binary`,
with the journal's message count and mean message length, in batches of the reader's size
(4 MiB of content). A query over it pays exactly Spark's part of a Python data source read (a
Python worker task per partition, Arrow IPC to the JVM, the JVM's handling of every row) and
nothing for reading, decompressing or splitting fragments: no Python data source can be faster
on the same machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from pipelines.source.worker import prepare_worker

BATCH_CONTENT = 4 << 20  # As the gazette reader's batches (pipelines/source/read.py CHUNK).
_batches: dict[tuple[int, int], pa.RecordBatch] = {}  # Built once per worker process.


def _batch(rows: int, value_size: int) -> pa.RecordBatch:
    key = (rows, value_size)
    if key not in _batches:
        data = np.full(rows * value_size, ord("x"), dtype=np.uint8)
        offsets = np.arange(0, (rows + 1) * value_size, value_size, dtype=np.int32)
        values = pa.BinaryArray.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        positions = pa.array(np.arange(rows, dtype=np.int64) * (value_size + 1))
        _batches[key] = pa.RecordBatch.from_arrays([positions, values], names=["offset", "value"])
    return _batches[key]


class CeilingDataSource(DataSource):
    """Format `gazette-ceiling`: options `partitions`, `rows` (per partition) and `valueSize`."""

    @classmethod
    def name(cls) -> str:
        return "gazette-ceiling"

    def schema(self) -> str:
        return "offset bigint, value binary"

    def reader(self, schema: Any) -> DataSourceReader:
        return CeilingReader(int(self.options["partitions"]), int(self.options["rows"]),
                             int(self.options["valueSize"]))


class CeilingReader(DataSourceReader):
    def __init__(self, partitions: int, rows: int, value_size: int) -> None:
        self.count = partitions
        self.rows = rows
        self.value_size = value_size

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(i) for i in range(self.count)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        prepare_worker()  # As the gazette reader does.
        per_batch = max(1, BATCH_CONTENT // (self.value_size + 1))
        full, rest = divmod(self.rows, per_batch)
        batch = _batch(per_batch, self.value_size)
        for _ in range(full):
            yield batch
        if rest:
            yield batch.slice(0, rest)
