"""Run a module with its wall clock shifted, as libfaketime would: `python clock_shift.py SECONDS MODULE ARGS...`.

For a test of behaviour aligned to wall-clock windows (a broker's flush_interval boundaries, at
epoch minutes) that would otherwise wait for the next boundary: the process's `time.time()` and
`time.time_ns()` read SECONDS later than the host's. Monotonic clocks, and everything outside the
process (etcd's leases, file modification times), are untouched.
"""

from __future__ import annotations

import runpy
import sys
import time


def main() -> None:
    # As `python -m MODULE` would run it: from the working directory, not this script's.
    sys.path[0] = ""
    offset = float(sys.argv[1])
    offset_ns = round(offset * 1e9)
    host_time, host_time_ns = time.time, time.time_ns
    time.time = lambda: host_time() + offset
    time.time_ns = lambda: host_time_ns() + offset_ns
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
