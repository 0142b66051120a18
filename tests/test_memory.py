"""A task's freed memory goes back to the system (reused Python workers keep no peaks)."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = r"""
import numpy as np
import pyarrow as pa
from trilink_spark._internal.memory import release_unused_memory

def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
held = [pa.array(np.arange(12_000, dtype=np.int64) + i) for i in range(2000)]  # 190 MB
kept = held[::50]  # a few stay alive, as a task's output batches do
peak = rss_mb()
del held  # freed, but Arrow's allocator keeps the pages for later allocations
before = rss_mb()
release_unused_memory()
after = rss_mb()
release_unused_memory()  # twice is harmless
print(peak, before, after)
"""


def test_freed_arrow_memory_is_returned_to_the_system() -> None:
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                         check=True, timeout=120)
    peak, before, after = (float(x) for x in out.stdout.split())
    assert before > peak - 50, (peak, before, after)  # freed yet still resident
    assert before - after > 120, (peak, before, after)  # the release gave it back
