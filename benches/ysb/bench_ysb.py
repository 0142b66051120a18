"""Issue 18: the Yahoo Streaming Benchmark end to end, plain Spark against the trilink variants.

Real parts on one machine: tansu (Kafka protocol), redis-server (append-only) and a local
Structured Streaming query per variant. For each variant, a rate ladder (events/s): the
sustainable rate is the highest rung at which every event was processed (processed >= input)
and the lag did not grow over the last 5 batches. At each rung the run also gives p50/p99
latency (``time_updated - window end`` over complete windows), shuffle exchanges in the batch
plan and Redis round trips per 1,000 events. Separately: records/s per partition of the
Python ``trilink-kafka`` source alone (a batch read of a filled topic).

Run (``python -m benches.ysb.bench_ysb ...`` from the repository root works too):
``python benches/ysb/bench_ysb.py [--rungs 2000,5000,10000,20000,40000] [--seconds 20]
[--producer-processes auto|N] [--skip-alone] [--out NAME]`` (writes
benches/results/ysb.json, or NAME.json). The producer
spreads a rung over ``ceil(rate / 15,000)`` processes (at most the machine's cores) with
``auto``, the default; ``--skip-alone`` leaves out the producer-alone and source-alone
measurements (a quick smoke of the ladder).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # run as a script (benches/run_all.py, python benches/ysb/...)
    sys.path.insert(0, ROOT)

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import trilink_spark as tl  # noqa: E402
from trilink_spark.kafka import read_kafka  # noqa: E402
from benches.common import write_json  # noqa: E402
from benches.ysb import VARIANTS, Producer, run_variant, setup  # noqa: E402
from benches.ysb.runner import SUSTAINED_RULE  # noqa: E402
from trilink_spark.testing import KafkaBroker, RedisServer, create_topic  # noqa: E402

LADDER = (2_000, 5_000, 10_000, 20_000, 40_000)


def producer_alone(bootstrap: str, cat: Any, work: Path, events: int, partitions: int,
                   processes: int = 1) -> dict[str, Any]:
    """Events/s of the YSB producer alone (as fast as it goes: no pacing), with ``processes``
    producing processes (their start-up is not counted: they start sending together)."""
    topic = f"producer-alone-{processes}"
    create_topic(bootstrap, topic, partitions)
    report = Producer(bootstrap, cat, work / f"producer-{processes}.parquet", rate=1e9,
                      events=events, topic=topic, processes=processes).run()
    return {"events": report.events, "seconds": report.seconds, "events_per_s": report.rate,
            "processes": processes}


def producer_processes(choice: str, rate: float) -> int:
    """``auto``: one process per 15,000 events/s of ``rate``, at most the machine's cores;
    else the number given."""
    if choice != "auto":
        return max(1, int(choice))
    return max(1, min(os.cpu_count() or 1, math.ceil(rate / 15_000)))


def source_alone(spark: Any, bootstrap: str, cat: Any, work: Path, events: int,
                 partitions: int) -> dict[str, Any]:
    """Records/s per partition of the trilink-kafka source: a batch read, counted in Spark."""
    create_topic(bootstrap, "source-alone", partitions)
    Producer(bootstrap, cat, work / "alone.parquet", rate=1e9, events=events,
             topic="source-alone").run()
    df = read_kafka(spark, bootstrap, "source-alone")
    df.count()  # warm-up
    times = []
    for _ in range(3):
        start = time.perf_counter()
        n = df.count()
        times.append(time.perf_counter() - start)
    best = min(times)
    return {"records": n, "partitions": partitions, "seconds": best,
            "records_per_s": n / best, "records_per_s_per_partition": n / best / partitions,
            "note": "2 cores: 2 partitions read at once"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rungs", default=",".join(str(r) for r in LADDER))
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--producer-processes", default="auto",
                    help="producing processes per rung: auto (one per 15k events/s, at most "
                         "the cores) or a number")
    ap.add_argument("--skip-alone", action="store_true",
                    help="skip the producer-alone and source-alone measurements")
    ap.add_argument("--out", default="ysb",
                    help="results name: benches/results/NAME.json (default ysb; give another "
                         "for a smoke run, so the recorded figures are kept)")
    args = ap.parse_args()
    rungs = [int(r) for r in args.rungs.split(",")]
    variants = args.variants.split(",")
    spark = tl.get_session("local[2]", app_name="bench-ysb", shuffle_partitions=args.partitions)
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(tempfile.mkdtemp(prefix="bench-ysb-"))
    ladder: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    with KafkaBroker() as broker, RedisServer(append_only=True) as redis:
        cat = setup(redis.url)
        produced: list[dict[str, Any]] = []
        alone: dict[str, Any] | None = None
        if not args.skip_alone:
            for n in sorted({1, min(os.cpu_count() or 1, 4)}):
                produced.append(producer_alone(broker.bootstrap, cat, work, 100_000,
                                               args.partitions, processes=n))
                print("producer alone:", produced[-1], flush=True)
            alone = source_alone(spark, broker.bootstrap, cat, work, 200_000, args.partitions)
            print("source alone:", alone, flush=True)
        for variant in variants:
            for rate in rungs:
                r = run_variant(spark, variant, bootstrap=broker.bootstrap, redis_url=redis.url,
                                catalogue=cat, workdir=work, rate=rate, duration=args.seconds,
                                partitions=args.partitions,
                                producer_processes=producer_processes(
                                    args.producer_processes, rate))
                row = r.to_dict()
                row["rate"] = rate
                # the producer is part of the machine: a rung it could not drive is not a rung
                row["producer_kept_rate"] = r.input_rate >= 0.9 * rate
                row["round_trips_per_batch"] = (
                    None if r.redis_round_trips_per_1000 is None or not r.batches
                    else r.redis_round_trips_per_1000 * r.events / 1000 / r.batches)
                ladder[variant].append(row)
                print(variant, rate, {k: row[k] for k in (
                    "events", "mismatches", "exchanges", "throughput", "input_rate",
                    "capacity", "sustained", "p50_latency_ms", "p99_latency_ms",
                    "redis_round_trips_per_1000", "redis_round_trips", "batches",
                    "producer_processes", "stage_seconds")}, flush=True)
                if not (r.sustained and row["producer_kept_rate"]):
                    break
    summary: dict[str, Any] = {}
    common_rate = None
    for variant, rows in ladder.items():
        ok = [r["rate"] for r in rows if r["sustained"] and r["producer_kept_rate"]
              and r["mismatches"] == 0]
        cut = [r["rate"] for r in rows if not r["producer_kept_rate"]]
        summary[variant] = {"sustainable_rate": max(ok) if ok else 0,
                            "cut_by_producer": cut,
                            "rungs_run": [r["rate"] for r in rows],
                            "exchanges": rows[0]["exchanges"] if rows else None,
                            "mismatches": sum(r["mismatches"] for r in rows)}
    rates = [s["sustainable_rate"] for s in summary.values()]
    common_rate = min(rates) if rates else None
    for variant, rows in ladder.items():
        at = [r for r in rows if r["rate"] == common_rate]
        if at:
            summary[variant].update({k: at[0][k] for k in (
                "p50_latency_ms", "p99_latency_ms", "p50_event_latency_ms",
                "p99_event_latency_ms", "redis_round_trips_per_1000",
                "redis_round_trips", "round_trips_per_batch", "capacity",
                "stage_seconds")})
    path = write_json(args.out, {"rungs": rungs, "seconds_per_rung": args.seconds,
                              "sustained_rule": SUSTAINED_RULE,
                              "rung_cut_rule": "a rung the producer could not drive (below 90% "
                                               "of the rate) is cut, not failed; the ladder "
                                               "stops at the first rung not sustained or cut",
                              "producer_alone": produced,
                              "partitions": args.partitions, "common_rate": common_rate,
                              "source_alone": alone, "summary": summary, "ladder": ladder})
    print("summary:", summary, flush=True)
    print(f"written {path}")


if __name__ == "__main__":
    main()
