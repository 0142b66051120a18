"""keyed_watermark: late rows per view on skewed-clock sensors, and annotation throughput.

The Table 10 streams of ``bench_keyed_window.py`` (sensors in order per sensor, one source's
clock 4 s ahead, 25/50/75 % of rows out of order overall), in one partition: rows marked late
by the key-level watermark (``is_late``) and by a single watermark over the partition
(``is_late_partition``), delay 1 s. Then throughput: ``keyed_watermark`` on 2,000,000 rows
(10,000 keys) against a plain pass over the same cached rows, per core of ``local[2]``.

Run: ``python benches/keyed/bench_watermark.py`` (writes benches/results/watermark.json).
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import median_time, write_json  # noqa: E402

import trilink_spark as tl  # noqa: E402

def lateness(spark: Any) -> list[dict[str, Any]]:
    """Rows each view marks late on the Table 10 streams (bench_keyed_window.stream_rows)."""
    from bench_keyed_window import stream_rows

    rows = []
    for disorder in (0.25, 0.5, 0.75):
        frame = stream_rows(disorder)
        frame["arrival"] = np.arange(len(frame))
        df = spark.createDataFrame(frame[["sensor", "ts", "arrival"]]).coalesce(1)
        marked = tl.keyed_watermark(df, "sensor", "ts", timedelta(seconds=1), order_by="arrival")
        got = marked.selectExpr(
            "count(*) AS n", "sum(int(is_late)) AS key_late", "sum(int(is_late_partition)) AS p"
        ).first()
        rows.append({
            "out_of_order_target": disorder,
            "out_of_order_overall": frame.attrs["out_of_order"],
            "rows": got["n"],
            "late_key_level": got["key_late"],
            "late_partition_level": got["p"],
        })
        print(rows[-1], flush=True)
    return rows


def throughput(spark: Any, rows: int = 2_000_000, repeat: int = 5) -> dict[str, Any]:
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
