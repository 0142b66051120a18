"""Helpers shared by the benchmark scripts: JSON output and timing."""

from __future__ import annotations

import json
import platform
import statistics
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def write_json(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    payload = {
        "benchmark": name,
        "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
        **payload,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def _times(fn: Callable[[], Any], repeat: int, warmup: int) -> list[float]:
    """Seconds of ``repeat`` calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def median_time(fn: Callable[[], Any], repeat: int = 5, warmup: int = 1) -> float:
    return statistics.median(_times(fn, repeat, warmup))


def best_time(fn: Callable[[], Any], repeat: int = 2, warmup: int = 1) -> float:
    """The fastest of ``repeat`` calls after ``warmup`` (Python workers started, plans
    compiled): what the code costs when nothing else on the machine interferes."""
    return min(_times(fn, repeat, warmup))


# Spark's shuffle-write metrics, read from the driver UI's REST API on 127.0.0.1 (the session
# must run with spark.ui.enabled=true).
def shuffle_bytes(spark: Any, description: str) -> int:
    sc = spark.sparkContext
    base, app = sc.uiWebUrl, sc.applicationId

    def get(path: str) -> Any:
        with urllib.request.urlopen(f"{base}/api/v1/applications/{app}/{path}", timeout=30) as r:
            return json.load(r)

    jobs = [j for j in get("jobs") if j.get("description") == description]
    stages = {s for j in jobs for s in j["stageIds"]}
    total = 0
    for stage in stages:
        for attempt in get(f"stages/{stage}"):
            total += int(attempt.get("shuffleWriteBytes", 0))
    return total


def run(spark: Any, description: str, fn: Any) -> tuple[Any, float, int]:
    spark.sparkContext.setJobDescription(description)
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    spark.sparkContext.setJobDescription(None)
    time.sleep(1.0)  # the listener bus catches up before the REST API is read
    return result, seconds, shuffle_bytes(spark, description)


def long_count() -> Any:
    """A processor keeping a running count per key of a long key column (output
    ``k long, n long``, state ``n long``): the stateful work of the state benchmarks."""
    import trilink_spark as tl

    class LongCount(tl.KeyedWatermarkProcessFunction):
        output_schema = "k long, n long"
        state_schema = "n long"

        def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
            n = ctx.get_state("n", 0) + len(rows)
            ctx.set_state("n", n)
            return [(key, n)]

    return LongCount()
