"""Process settings `gazette serve` makes before it serves: memory reuse and the open-file limit.

Keep freed heap memory in the broker process instead of handing it back to the kernel. A
broker moves every appended and read byte through buffers of up to a few MiB (gRPC slices,
`bytes` objects, protobuf arenas). glibc serves allocations that large with a fresh `mmap` and
returns them with `munmap`, so each buffer's pages fault in anew: measured on the benchmark
machine (a VM), one minor page fault per 4 KiB streamed, about 95,000 faults a second at
400 MB/s of appends. Serving them from the heap and keeping its free top lets them be reused.

Raise the soft limit of open files to the hard one, as Go programs (Gazette) do at start: each
relayed gRPC connection holds two sockets and two pipes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import resource

log = logging.getLogger(__name__)

# mallopt(3) parameters, from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 << 20
"""Allocations below this come from the heap (glibc's largest allowed value on 64-bit)."""
TRIM_THRESHOLD = 256 << 20
"""Free memory at the heap's top kept for reuse before any is given back."""


def keep_freed_memory() -> bool:
    """Tune glibc's malloc as above; returns whether it applied (False off glibc)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # Not glibc (e.g. musl or macOS): nothing to tune.
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not applied:
        log.debug("mallopt refused the broker's malloc tuning")
    return applied


def raise_open_file_limit() -> int:
    """Set the soft RLIMIT_NOFILE to the hard limit; returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.debug("cannot raise the open-file limit", extra={"soft": soft, "hard": hard, "error": str(exc)})
        return soft
    return hard
