"""The broker's malloc tuning applies on glibc and is a no-op elsewhere."""

from __future__ import annotations

import platform

import pytest

from broker.malloc import keep_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt tuning is glibc's")
def test_mallopt_accepts_the_brokers_thresholds() -> None:
    assert keep_freed_memory() is True
