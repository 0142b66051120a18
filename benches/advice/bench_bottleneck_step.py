"""The bottleneck advisor on a real query: time from a rate step to a correct report.

A Structured Streaming query on ``local[2]`` reads JSON files (one file per trigger,
``maxFilesPerTrigger=1``, a 1-second trigger), passes every row through a Python UDF that
costs 0.4 ms per row (stage 0), counts per key
(stage 1, after the exchange) and writes to a no-op sink. A ``BottleneckListener`` feeds a
``BottleneckAdvisor`` (window 3, warm-up 2, ``trigger_interval="1 second"``: a file source
reports no backlog, so a batch outgrowing its trigger is the unmet flow) with each batch's
progress and stages.

The input runs at 200 rows per file, well within what the UDF stage sustains (about 3,600
rows/s on 2 tasks), then steps to 8,000 rows per file. Reported: the batches and seconds from
the first stepped file to the first report naming stage 0, the reports before the step (none
may name a bottleneck) and DS2's parallelism for stage 0 after the step.

Run: ``python benches/advice/bench_bottleneck_step.py`` (writes
benches/results/bottleneck_step.json).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import write_json  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import trilink_spark as tl  # noqa: E402
from trilink_spark.advice import BottleneckAdvisor, BottleneckListener  # noqa: E402

LOW, HIGH = 200, 8_000
COST_S = 0.0004


def write_file(folder: Path, index: int, rows: int) -> None:
    tmp = folder.parent / f".tmp-{index}.json"
    with tmp.open("w") as f:
        for i in range(rows):
            f.write(json.dumps({"k": i % 50, "v": i}) + "\n")
    tmp.rename(folder / f"part-{index:05d}.json")


def main() -> None:
    from pyspark.sql import functions as F

    spark = tl.get_session("local[2]", shuffle_partitions=2)
    root = Path(tempfile.mkdtemp(prefix="tl-bench-step-"))
    inbox = root / "in"
    inbox.mkdir()

    @F.udf("long")
    def costly(v: int) -> int:
        time.sleep(COST_S)
        return v

    advisor = BottleneckAdvisor(window_batches=3, warmup_batches=2, slots=2,
                                trigger_interval="1 second")
    listener = BottleneckListener(advisor, spark)
    spark.streams.addListener(listener)
    write_file(inbox, 0, LOW)
    stream = (spark.readStream.schema("k long, v long").option("maxFilesPerTrigger", 1)
              .json(str(inbox)))
    query = (stream.select(costly("v").alias("v")).groupBy((F.col("v") % 50).alias("k")).count()
             .writeStream.outputMode("update").format("noop")
             .option("checkpointLocation", str(root / "ckpt"))
             .trigger(processingTime="1 second").start())
    reports: list[dict[str, Any]] = []
    step_at = None
    step_batch = None
    found = None
    try:
        index = 1
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and found is None:
            progress = query.lastProgress
            batch = -1 if progress is None else int(progress["batchId"])
            if index <= batch + 2:  # keep one or two files waiting: one per trigger
                stepped = index >= 8
                write_file(inbox, index, HIGH if stepped else LOW)
                if stepped and step_at is None:
                    step_at, step_batch = time.monotonic(), batch
                index += 1
            if listener.reports and (not reports or listener.reports[-1].batches and
                                     listener.reports[-1] is not reports[-1]["obj"]):
                r = listener.reports[-1]
                reports.append({"obj": r, "at": time.monotonic(), "batch": batch,
                                "bottleneck": r.bottleneck, "reason": r.reason})
                if step_at is not None and r.bottleneck == ["stage 0"]:
                    found = reports[-1]
            time.sleep(0.2)
    finally:
        query.stop()
        spark.streams.removeListener(listener)
        shutil.rmtree(root, ignore_errors=True)
    before = [r for r in reports if step_at is None or r["at"] < step_at]
    result = {
        "rows_per_file": [LOW, HIGH],
        "udf_cost_ms_per_row": COST_S * 1000,
        "false_reports_before_step": sum(1 for r in before if r["bottleneck"]),
        "reports_before_step": len(before),
        "seconds_to_correct_report": None if found is None or step_at is None
        else round(found["at"] - step_at, 2),
        "batches_to_correct_report": None if found is None or step_batch is None
        else found["batch"] - step_batch,
        "report": None if found is None else found["obj"].to_dict(),
        "reasons": [f"batch {r['batch']}: {r['reason']}" for r in reports[-6:]],
    }
    path = write_json("bottleneck_step", result)
    print(json.dumps({k: v for k, v in result.items() if k != "report"}, indent=2))
    if found is None and reports:
        print(reports[-1]["obj"])
    if found is not None:
        print(found["obj"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
