"""The swap plan's cost: by blocks from the local copies against by keys from the state path.

Running counts per key (K keys, long ids), on 4 partitions under ``tl.BlockPartitioner(4)``
(4,096 blocks), loaded one row per key in batches of at most 1M keys, then one small batch.
Two runners get the same batches: one plans swaps by blocks (the default,
``spark.trilink.state.blockPlans=true``), the other by keys (``false``: every partition's
version read from the state path on the driver, its keys decoded and placed). Each then runs
the same two swaps, one batch each:

1. ``request_swap(num_partitions=8)``: a rescale with a minimal refit (by blocks: one job that
   sums each copy's loads per block, then one that lists the moving blocks' keys);
2. ``request_swap(<that table with 1/16 of the blocks moved>, refit="none")``: a target given
   whole, as the load-aware rebalancer gives its moves (by blocks: one job, O(moved keys)).

Reported per K and swap: the plan's seconds (the driver's ``swap planned in`` log line: from
the request to the stored plan), the whole swap batch's seconds (``SwapReport.seconds``), the
moved keys, and the state bytes the key plan reads (every partition's version on the state
path). Both runners' plans are checked equal.

With ``--strategy bounded`` the runners place by ``tl.LeastCountPartitioner(4)``, whose table
is bounded past 65,536 keys (the heaviest keys by name, the rest by 4,096 key groups): the
rescale is a minimal refit of the bounded table (planned by keys by both runners: it weighs
every key's load), and the target given whole is that table with every 16th key group sent to
the next partition (by groups: one job range-scans the moving groups and looks up the named
keys that move).

Run: ``PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benches/keyed/bench_swap_plan.py``
(writes benches/results/swap_plan.json; ``--keys 100000,1000000,3000000`` by default, about
4 minutes on 2 cores; ``--strategy bounded --out swap_plan_bounded`` for bounded tables).
"""

from __future__ import annotations

import argparse
import logging
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import long_count, write_json  # noqa: E402

import trilink_spark as tl  # noqa: E402

LOAD_CHUNK = 1_000_000
PLANNED = re.compile(r"batch (\d+): swap planned in ([0-9.]+) s")


class Plans(logging.Handler):
    """Collects the runner's ``swap planned in`` seconds by batch."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seconds: dict[int, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        found = PLANNED.search(record.getMessage())
        if found:
            self.seconds[int(found.group(1))] = float(found.group(2))


def frames(spark: Any, keys: int) -> list[Any]:
    """The load batches (every key once, as a skew: key i gets 1 + i % 7 rows), then one
    small batch."""
    out = []
    for start in range(0, keys, LOAD_CHUNK):
        stop = min(keys, start + LOAD_CHUNK)
        out.append(spark.range(start, stop).selectExpr(
            "id AS k", "explode(sequence(0, CAST(id % 7 AS INT))) AS r", "id AS t")
            .drop("r"))
    out.append(spark.range(0, 2_000).selectExpr("id * 13 % " + str(keys) + " AS k",
                                                 "id + " + str(keys) + " AS t"))
    return out


def in_force(run: Any, batch: int) -> Any:
    """The placement in force at ``batch`` (from the state path's record)."""
    return run.store.placement_at(batch)[0]


def moved_table(run: Any, batch: int) -> tl.Partitioner:
    """The placement in force with every 16th block (of a bounded table: key group) sent to
    the next partition."""
    from trilink_spark.keyed.swaps.units import from_units, unit_table

    current = in_force(run, batch)
    units = unit_table(current) if isinstance(current, tl.TablePartitioner) else current
    if units is None:
        raise SystemExit(f"the placement in force is a table of one entry per key ({len(current)}"
                         " keys): bounded tables need more keys than max_keys (65,536)")
    table = np.asarray(units.table).copy()
    picked = np.arange(0, current.num_groups if units is not current else len(table), 16)
    table[picked] = (table[picked] + 1) % current.num_partitions
    moved = units.with_table(table)
    return from_units(current, moved) if units is not current else moved


def run_size(spark: Any, keys: int, work: Path, plans: Plans, strategy: str
             ) -> dict[str, Any]:
    batches = frames(spark, keys)
    out: dict[str, Any] = {}
    runners: dict[str, Any] = {}
    for how in ("blocks", "keys"):
        spark.conf.set("spark.trilink.state.blockPlans", "true" if how == "blocks" else "false")
        run = tl.keyed_foreach_batch(lambda df, b: df.write.format("noop").mode("overwrite")
                                     .save(), "k", "t", long_count(), 10**15,
                                     str(work / how / "state"),
                                     strategy=tl.BlockPartitioner(4) if strategy == "block"
                                     else tl.LeastCountPartitioner(4))
        for b, df in enumerate(batches):
            run(df, b)
        b = len(batches)
        rows = []
        for name, ask in (("rescale 4->8, refit", lambda r: r.request_swap(num_partitions=8)),
                          ("rebalancer moves", lambda r: r.request_swap(
                              moved_table(r, b - 1), refit="none"))):
            prev = b - 1
            state_bytes = sum(run.store.version_bytes(p, prev)
                              for p in range(in_force(run, prev).num_partitions))
            ask(run)
            run(batches[-1], b)
            report = run.swaps[-1]
            rows.append({"swap": name, "batch": b, "plan_s": plans.seconds.get(b),
                         "swap_batch_s": report.seconds, "moved_keys": report.moved_keys,
                         "keys_total": report.keys_total, "state_bytes_on_path": state_bytes,
                         "refused": report.refused})
            print(f"  K={keys:,} {how:6s} {name:20s} plan {plans.seconds.get(b, -1):.3f} s, "
                  f"swap batch {report.seconds:.2f} s, {report.moved_keys:,} keys moved",
                  flush=True)
            b += 1
        out[how] = rows
        runners[how] = run
    spark.conf.unset("spark.trilink.state.blockPlans")
    for b in (len(batches), len(batches) + 1):
        ours, theirs = (runners[h].store.load_plan(b) for h in ("blocks", "keys"))
        for plan in (ours, theirs):
            plan.pop("request", None)
            plan.pop("planned_by", None)
        if ours != theirs:
            raise SystemExit(f"K={keys}: the plans of batch {b} differ")
    out["ratio_plan_keys_over_blocks"] = [
        k["plan_s"] / max(bl["plan_s"], 1e-9) for k, bl in zip(out["keys"], out["blocks"])]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--keys", default="100000,1000000,3000000")
    parser.add_argument("--out", default="swap_plan")
    parser.add_argument("--strategy", choices=("block", "bounded"), default="block")
    args = parser.parse_args()
    sizes = [int(k.replace("_", "")) for k in args.keys.split(",") if k.strip()]
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("bench-swap-plan")
             .config("spark.sql.shuffle.partitions", "4").config("spark.ui.enabled", "false")
             .config("spark.driver.memory", "8g")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    plans = Plans()
    logging.getLogger("trilink_spark.keyed.run.streaming").addHandler(plans)
    logging.getLogger("trilink_spark.keyed.run.streaming").setLevel(logging.INFO)
    results: dict[str, Any] = {"strategy": args.strategy, "sizes": {}}
    try:
        for keys in sizes:
            work = Path(tempfile.mkdtemp(prefix="swap-plan-"))
            spark.conf.set("spark.trilink.state.localDir", str(work / "local"))
            try:
                results["sizes"][str(keys)] = run_size(spark, keys, work, plans, args.strategy)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    finally:
        spark.stop()
    path = write_json(args.out, results)
    print(path)
    for keys, found in results["sizes"].items():
        for bl, k, ratio in zip(found["blocks"], found["keys"],
                                found["ratio_plan_keys_over_blocks"]):
            print(f"K={int(keys):>10,} {bl['swap']:20s} plan by blocks {bl['plan_s']:.3f} s, "
                  f"by keys {k['plan_s']:.3f} s ({ratio:.1f}x); state on the path "
                  f"{bl['state_bytes_on_path'] / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
