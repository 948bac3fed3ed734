"""The process settings `gazette serve` makes: malloc tuning on glibc, the open-file limit."""

from __future__ import annotations

import platform
import resource
import subprocess
import sys

import pytest

from cluster.server.tuning import keep_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt tuning is glibc's")
def test_mallopt_accepts_the_brokers_thresholds() -> None:
    assert keep_freed_memory() is True


def test_the_soft_open_file_limit_is_raised_to_the_hard_one() -> None:
    # In a child process, so that this one keeps its limits.
    script = (
        "import resource; from cluster.server.tuning import raise_open_file_limit; "
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE); "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard)); "
        "print(raise_open_file_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    returned, soft, hard = (int(x) for x in out)
    assert returned == soft == hard
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] > 0  # Ours untouched (and readable).
