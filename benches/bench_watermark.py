"""keyed_watermark: late rows per view on skewed-clock sensors, and annotation throughput.

Seed 002 §3.2 / Table 10 setting: sensors whose readings are in order per sensor, three sources,
one with a 4 s clock skew, arrival interleaved so that 25, 50 and 75 % of rows are out of order
overall. For each, the rows marked late by the key-level watermark (``is_late``) and by the
partition-level one (``is_late_partition``, what a single Spark watermark of the same delay
decides), delay 1 s. Then throughput: ``keyed_watermark`` on 2,000,000 rows against the same
rows written without it (the baseline a plain pass costs), per core of ``local[2]``.

Run: ``python benches/bench_watermark.py`` (writes benches/results/watermark.json).
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median_time, write_json  # noqa: E402

import trilink_spark as tl  # noqa: E402

SENSORS = 300
READINGS = 200
SKEW_S = 4.0


def skewed_sources(disorder: float, seed: int = 0) -> pd.DataFrame:
    """Per-sensor in-order readings; source 0 runs SKEW_S ahead; a share of rows swapped."""
    rng = np.random.default_rng(seed)
    sensor = np.repeat(np.arange(SENSORS), READINGS)
    step = np.tile(np.arange(READINGS, dtype=np.float64), SENSORS)
    source = sensor % 3
    t = step + np.where(source == 0, SKEW_S, 0.0)
    arrival = step + rng.random(sensor.size) * 0.5  # sources interleave in true time
    order = np.argsort(arrival, kind="stable")
    sensor, t = sensor[order], t[order]
    # move a share of rows later in arrival order, keeping each sensor's own order
    n = sensor.size
    moved = rng.random(n) < disorder
    keys = np.arange(n, dtype=np.float64)
    keys[moved] += rng.integers(1, 200, moved.sum())
    arrival_order = np.argsort(keys, kind="stable")
    frame = pd.DataFrame({"sensor": sensor[arrival_order], "t": t[arrival_order]})
    frame["t"] = frame.groupby("sensor")["t"].transform(lambda s: np.sort(s.to_numpy()))
    frame["arrival"] = np.arange(n)
    ahead = frame["t"].to_numpy() < np.maximum.accumulate(frame["t"].to_numpy())
    frame.attrs["out_of_order"] = float(ahead.mean())
    return frame


def lateness(spark: Any) -> list[dict[str, Any]]:
    rows = []
    for disorder in (0.25, 0.5, 0.75):
        frame = skewed_sources(disorder)
        frame["ts"] = pd.to_datetime(frame["t"], unit="s")
        df = spark.createDataFrame(frame[["sensor", "ts", "arrival"]]).coalesce(1)
        marked = tl.keyed_watermark(df, "sensor", "ts", timedelta(seconds=1), order_by="arrival")
        got = marked.selectExpr(
            "count(*) AS n", "sum(int(is_late)) AS key_late", "sum(int(is_late_partition)) AS p"
        ).first()
        rows.append({
            "disorder_target": disorder,
            "out_of_order_overall": frame.attrs["out_of_order"],
            "rows": got["n"],
            "late_key_level": got["key_late"],
            "late_partition_level": got["p"],
        })
        print(rows[-1], flush=True)
    return rows


def throughput(spark: Any, rows: int = 2_000_000, repeat: int = 3) -> dict[str, Any]:
    df = spark.range(rows).selectExpr(
        "id % 10000 AS sensor", "timestamp_seconds(id DIV 10000) AS ts", "id AS arrival"
    ).cache()
    df.count()

    def plain() -> None:
        df.write.format("noop").mode("overwrite").save()

    def keyed() -> None:
        tl.keyed_watermark(df, "sensor", "ts", 1.0).write.format("noop").mode(
            "overwrite").save()

    base = median_time(plain, repeat=repeat)
    took = median_time(keyed, repeat=repeat)
    cores = 2
    out = {"rows": rows, "plain_s": base, "keyed_watermark_s": took,
           "rows_per_s_per_core": rows / took / cores}
    print(out, flush=True)
    df.unpersist()
    return out


def main() -> None:
    spark = tl.get_session("local[2]", shuffle_partitions=4,
                           extra_conf={"spark.driver.memory": "4g"})
    start = time.perf_counter()
    payload = {"lateness": lateness(spark), "throughput": throughput(spark)}
    payload["seconds"] = time.perf_counter() - start
    spark.stop()
    print(write_json("watermark", payload))


if __name__ == "__main__":
    main()
