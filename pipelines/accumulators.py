"""Spark's planner workers send no empty profiler accumulator updates for the `gazette` data source.

PySpark 4.3.0's driver-side Python workers (data source creation, read planning, write commits:
`pyspark.sql.worker.utils.worker_run`) register two profiler accumulators whether or not profiling is
on, and send their empty values back after every call. Over Spark Connect those updates reach the
client as `__python_accumulator__` observed metrics, which a command stream does not expect:
`spark-pipelines run` completes every flow, then fails with `[UNKNOWN_RESPONSE] Unknown response:
Plan observed(__python_accumulator__=...)` (SPARK-59135, whose upstream fix also stops sending empty
profiler updates). Non-empty ones (profiling on) and all other accumulators are still sent."""

from __future__ import annotations

import sys
from typing import IO

_PATCHED = "_gazette_skips_empty_profiler_updates"


def quiet_planner_worker() -> None:
    """In a planner worker (which has imported `pyspark.sql.worker.utils`), send only non-empty profiler updates.

    Elsewhere (a driver, an executor's task worker, a PySpark without that module) nothing changes.
    """
    utils = sys.modules.get("pyspark.sql.worker.utils")
    if utils is None or getattr(utils, _PATCHED, False) or not hasattr(utils, "send_accumulator_updates"):
        return
    from pyspark.accumulators import SpecialAccumulatorIds, _accumulatorRegistry
    from pyspark.serializers import CPickleSerializer, write_int

    profilers = {SpecialAccumulatorIds.SQL_UDF_PROFIER, SpecialAccumulatorIds.SQL_UDF_PROFIER_V2}
    pickle = CPickleSerializer()

    def send_accumulator_updates(outfile: IO[bytes]) -> None:
        updates = [
            (aid, acc._value) for aid, acc in _accumulatorRegistry.items() if aid not in profilers or acc._value
        ]
        write_int(len(updates), outfile)
        for update in updates:
            pickle._write_with_length(update, outfile)

    setattr(utils, "send_accumulator_updates", send_accumulator_updates)  # noqa: B010 (a module attribute worker_run looks up)
    setattr(utils, _PATCHED, True)
