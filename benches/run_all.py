"""Run every benchmark; each writes its JSON under benches/results/."""

from __future__ import annotations

import runpy
from pathlib import Path

HERE = Path(__file__).resolve().parent

SCRIPTS = (
    "bench_balance.py",
    "bench_assign.py",
    "bench_spark.py",
    "bench_adaptive.py",
    "bench_keyed_window.py",
    "bench_watermark.py",
    "bench_merge.py",
    "bench_ahead_keyby.py",
)

for script in SCRIPTS:
    print(f"== {script}")
    runpy.run_path(str(HERE / script), run_name="__main__")
