"""Per-task overheads of Spark's Python worker, trimmed once per worker process.

Measured on Spark 4.0.1 / Python 3.11 (`tests/benchmarks/bench_spark_read.py`, 16 partitions of
64 MiB): with worker reuse, a Python worker spent ~0.1 s of CPU per task outside the reader,
more than reading its 64 MiB of fragments costs:

- `setup_spark_files` calls `importlib.invalidate_caches()` before every task. Before Python
  3.12 (gh-103200) that makes every `zipimporter` re-read its archive's whole directory, and the
  worker imports pyspark from `pyspark.zip`, through one zipimporter per package directory
  (~17): ~0.07 s per task. `_patch_zipimport` re-reads an archive only when its size or
  mtime changed (they do not while a worker lives).
- The daemon runs `gc.collect()` after every task, a full collection over every object the
  worker's imports created (pyspark, pyarrow, numpy, grpc, protobuf, ...): ~0.03 s per task.
  `gc.freeze()` after the imports moves them out of the collector's sight; objects created
  later are collected as before.

Neither changes what a task computes; both are idempotent and apply to the worker process only
(the reader calls `prepare_worker` from `read`, which runs on executors; elsewhere, such as a
read in the driver's process, it does nothing).
"""

from __future__ import annotations

import gc
import os
import sys
import zipimport
from typing import Any

_prepared = False


def prepare_worker() -> None:
    """Trim the Python worker's per-task overheads (once per process)."""
    global _prepared
    if _prepared:
        return
    _prepared = True
    if "PYTHON_WORKER_FACTORY_SECRET" not in os.environ:
        return  # Not a Spark Python worker (e.g. a read in the driver or in a test): change nothing.
    if sys.version_info < (3, 12):
        _patch_zipimport()
    gc.freeze()


def _patch_zipimport() -> None:
    original = zipimport.zipimporter.invalidate_caches

    def invalidate_caches(self: Any) -> None:
        try:
            st = os.stat(self.archive)
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if stamp is not None and getattr(self, "_gazette_stamp", None) == stamp:
            return  # The archive is unchanged: its directory, read before, still holds.
        original(self)
        self._gazette_stamp = stamp

    zipimport.zipimporter.invalidate_caches = invalidate_caches  # type: ignore[method-assign]
