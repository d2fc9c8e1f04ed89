"""trim_heap gives a reused worker's freed heap back to the OS (glibc), and is harmless elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from dpq_spark.spark._heap import _malloc_trim, trim_heap

# Run in a fresh interpreter: the test's own process has an unknown heap history.
_CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    from dpq_spark.spark._heap import trim_heap

    def rss_mib():
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    big = np.ones(1 << 21)  # 16 MiB, mmapped; freeing it raises glibc's mmap threshold to 16 MiB
    del big
    parts = [np.ones(1 << 18) for _ in range(200)]  # 200 x 2 MiB, now from the heap
    del parts[:-1]  # all but the last one freed: the heap's top is still in use
    held = rss_mib()
    if sys.argv[1] == "trim":
        trim_heap()
    print(held - rss_mib())
""")


@pytest.mark.skipif(_malloc_trim() is None or not os.path.exists("/proc/self/statm"),
                    reason="glibc's malloc_trim and /proc are Linux-only")
def test_freed_heap_goes_back_to_the_os():
    def freed(mode):
        out = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True,
                             text=True, check=True)
        return float(out.stdout)

    assert freed("keep") < 50  # without the trim glibc keeps the freed 2 MiB blocks mapped
    assert freed("trim") > 300  # with it, most of the 400 MiB goes back


def test_trim_heap_is_harmless_twice():
    trim_heap()
    trim_heap()
