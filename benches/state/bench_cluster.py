"""Keyed state on a Spark standalone cluster: do the tasks find their local copies?

The same keyed run goes through these drivers, each in a process of its own:

- ``local[2]``: the reference (one executor, every task finds its copy);
- a standalone cluster of W workers (``--workers``, default 2 and 3; one core and one
  executor each, on 127.0.0.1, started with the installed PySpark's ``spark-class``), twice:
  with ``spark.trilink.state.locality=true`` (each partition's task asks for the executor
  that ran it last) and with it ``false`` (Spark puts each task on whichever executor is free:
  the behaviour this replaces).

The run: ``keyed_foreach_batch(sink, "k", "t", KeyedWindowAggregate(size=3600.0, value="v",
aggs=("count", "sum")), delay=60.0, idle_timeout=inf, num_partitions=--partitions)``, fed by
hand with consecutive batch ids; the sink writes to ``noop``. Batch 0 loads ``--keys`` keys
(one row each, string keys ``k0000001`` style); then ``--batches`` batches of ``--rows`` rows
on keys drawn uniformly from them (``t`` rises by one second a batch, so no window closes and
a batch touches only its keys).

Measured per steady batch: the wall seconds of the runner's call, and from
``run.task_timings()`` each task's sync kind (``current``: the copy was up to date;
``catch-up``: it applied the changelogs it missed; ``rebuild``: it was read again from the
snapshot and changelogs) and executor. After the run: the disk the local copies use (every
``trilink-state`` directory under the executors' local directories, as the executors' Python
workers name them, measured before the application stops) against one copy per partition
(the largest copy of each partition), and the copies kept.

Beside it, Spark's own cost of a batch on the same driver: the same 20,000 rows placed by
``repartition(partitions, "k")`` and written to ``noop`` (the median of 10), so that the
cluster's fixed cost per job (scheduling, the shuffle between JVMs) is told apart from the
keyed run's.

Targets (issue: keyed state on a real cluster): at least 95 % of steady-state tasks
``current`` (the first two steady batches left out, while placement settles); the median
batch at most 1.2x the local run's; disk at most 1.5x one copy per partition.

Run from the repository root: ``PYSPARK_PYTHON=.venv/bin/python .venv/bin/python -m
benches.state.bench_cluster`` (writes ``benches/results/cluster_state.json``, or ``--out
NAME``). Options: ``--keys 1000000 --rows 20000 --batches 20 --partitions 4 --workers 2,3
--quick`` (100,000 keys, 8 batches, 2 workers).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benches" / "results"
SETTLE = 2  # steady batches left out of the locality share while placement settles


def copies(places: list[Path]) -> dict[str, Any]:
    """The local copies under ``places`` (each executor's local directory): their count,
    their bytes, and one copy per partition (the largest of each partition's copies)."""
    sizes: dict[str, list[int]] = {}
    states = {s.resolve() for place in places if place.exists()
              for s in ([place] if place.name == "trilink-state" else place.rglob("trilink-state"))}
    for state in sorted(states):
        for db in state.glob("*/p*.db"):
            size = sum(f.stat().st_size for f in db.rglob("*") if f.is_file())
            sizes.setdefault(db.name, []).append(size)
    total = sum(sum(v) for v in sizes.values())
    one = sum(max(v) for v in sizes.values())
    return {"copies": sum(len(v) for v in sizes.values()), "partitions": len(sizes),
            "bytes": total, "one_copy_bytes": one,
            "ratio": round(total / one, 3) if one else None}


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One driver's run (in its own process): returns what it measured."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import trilink_spark as tl

    builder = (SparkSession.builder.master(spec["master"]).appName("bench_cluster")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", str(spec["partitions"]))
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.executor.memory", "1g")
               .config("spark.trilink.state.locality", spec["locality"]))
    if spec["master"].startswith("local"):  # the one executor's copies, where they are counted
        builder = builder.config("spark.trilink.state.localDir",
                                 os.path.join(spec["local"], "trilink-state"))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    keys, rows = spec["keys"], spec["rows"]

    def named(ids: Any) -> Any:
        return F.concat(F.lit("k"), F.lpad(ids.cast("string"), 7, "0"))

    def sink(df: Any, batch_id: int) -> None:
        df.write.format("noop").mode("overwrite").save()

    run = tl.keyed_foreach_batch(
        sink, "k", "t", tl.KeyedWindowAggregate(size=3600.0, value="v", aggs=("count", "sum")),
        delay=60.0, idle_timeout=math.inf, state_path=spec["state"],
        num_partitions=spec["partitions"])
    load = spark.range(keys, numPartitions=8).select(
        named(F.col("id")).alias("k"), F.lit(0.0).alias("t"), F.rand(1).alias("v"))
    started = time.perf_counter()
    run(load, 0)
    load_s = time.perf_counter() - started
    batches = []
    for b in range(1, spec["batches"] + 1):
        df = spark.range(rows, numPartitions=4).select(
            named(F.floor(F.rand(100 + b) * keys).cast("long")).alias("k"),
            F.lit(float(b)).alias("t"), F.rand(200 + b).alias("v"))
        started = time.perf_counter()
        run(df, b)
        seconds = time.perf_counter() - started
        t = run.task_timings()
        batches.append({"batch": b, "seconds": round(seconds, 4),
                        "sync": dict(Counter(str(s) for s in t["sync"])),
                        "executors": [str(e) for e in t["executor"]]})
    plain = []  # Spark's own cost of a batch there: the same rows placed and written
    for b in range(1, min(spec["batches"], 10) + 1):
        df = spark.range(rows, numPartitions=4).select(
            named(F.floor(F.rand(100 + b) * keys).cast("long")).alias("k"),
            F.lit(float(b)).alias("t"), F.rand(200 + b).alias("v"))
        started = time.perf_counter()
        df.repartition(spec["partitions"], "k").write.format("noop").mode("overwrite").save()
        plain.append(time.perf_counter() - started)
    roots = set(spark.sparkContext.parallelize(range(64), 64).map(
        lambda _: os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0]).collect())
    disk = copies([Path(r) for r in roots if r] + [Path(spec["local"])])
    spark.stop()  # the executors remove their local directories as they stop
    return {"load_seconds": round(load_s, 3), "batches": batches,
            "locality_counts": dict(run.locality), "disk": disk,
            "spark_batch_median_s": round(statistics.median(plain), 4),
            "executor_local_dirs": sorted(roots)}


def summary(out: dict[str, Any]) -> dict[str, Any]:
    steady = out["batches"][SETTLE:]
    seconds = [b["seconds"] for b in out["batches"]]
    kinds: Counter[str] = Counter()
    for b in steady:
        kinds.update(b["sync"])
    tasks = sum(kinds.values())
    return {"median_s": round(statistics.median(seconds), 4), "max_s": round(max(seconds), 4),
            "sync_after_settle": dict(kinds),
            "current_share": round(kinds.get("current", 0) / tasks, 4) if tasks else None}


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ)
    # the executors start it from their own working directories: an absolute path
    env["PYSPARK_PYTHON"] = os.path.abspath(env.get("PYSPARK_PYTHON") or sys.executable)
    proc = subprocess.run([sys.executable, "-m", "benches.state.bench_cluster", "--child",
                           json.dumps(spec)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=3600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr or proc.stdout)[-3000:]}
    out: dict[str, Any] = json.loads(lines[-1])
    out.update(summary(out))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--workers", default="2,3")
    parser.add_argument("--out", default="cluster_state")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.quick:
        args.keys, args.batches, args.workers = 100_000, 8, "2"
    from trilink_spark.testing import SparkStandalone

    results: dict[str, Any] = {"keys": args.keys, "rows": args.rows, "batches": args.batches,
                               "partitions": args.partitions, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        work = Path(tmp)

        def spec(master: str, name: str, locality: str) -> dict[str, Any]:
            local = work / name / "local"
            local.mkdir(parents=True)
            return {"master": master, "locality": locality, "keys": args.keys,
                    "rows": args.rows, "batches": args.batches,
                    "partitions": args.partitions, "state": str(work / name / "state"),
                    "local": str(local)}

        runs = results["runs"]
        runs["local[2]"] = run_child(spec("local[2]", "local", "false"))
        print("local[2]", {k: v for k, v in runs["local[2]"].items() if k != "batches"})
        for w in [int(x) for x in args.workers.split(",") if x]:
            for locality in ("true", "false"):
                name = f"standalone-{w}-locality-{locality}"
                s = spec("", name, locality)
                with SparkStandalone(workers=w, cores=1, memory="1500m",
                                     workdir=work / name / "cluster",
                                     env={"SPARK_LOCAL_DIRS": s["local"]}) as cluster:
                    s["master"] = cluster.master_url
                    runs[name] = run_child(s)
                print(name, {k: v for k, v in runs[name].items() if k != "batches"})
        base = runs["local[2]"].get("median_s")
        for name, r in runs.items():
            if base and r.get("median_s"):
                r["median_vs_local"] = round(r["median_s"] / base, 3)
            plain = runs["local[2]"].get("spark_batch_median_s")
            if plain and r.get("spark_batch_median_s"):
                r["spark_batch_vs_local"] = round(r["spark_batch_median_s"] / plain, 3)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{args.out}.json"
    path.write_text(json.dumps(results, indent=1))
    print(path)


if __name__ == "__main__":
    main()
