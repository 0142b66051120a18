"""Table strategies at millions of keys: key_by, the driver's memory for a fit, and keyed state.

Each part runs our code and Spark's (or the stateless) baseline in the same run, and reports
the ratio ours / baseline. Parts (``--parts``, default all five):

0. ``balance``. No Spark: the balance degree of the bounded form against the per-key
   algorithm (the same strategy with ``max_keys`` above the key count) and hash, from
   ``assign`` (which equals the JVM's placement): the paper's four scenarios (1,000,000
   records, 10,000 keys, 60 partitions) bounded at 1,000 entries, and Zipf 1.1 over
   1,000,000 keys (4 rows per key) at the default 65,536 entries on 8 and 64 partitions;
   LeastKey also by keys per partition, its own measure.

1. ``key_by``. For K distinct keys in ``--sizes`` (default 100,000, 1,000,000, 10,000,000;
   ``--quick``: 100,000 and 1,000,000), ``--rows-per-key`` (4) rows per key on average, two
   distributions (``--dists``): ``uniform`` (``k = id % K``, every key exactly 4 rows) and
   ``zipf`` (exponent ``--zipf-s`` 1.1 over the K keys, key 0 the heaviest). Both are
   generated in the JVM from ``spark.range``: the Zipf keys by inverse CDF of one ``rand`` per
   row, exact for the 64 heaviest keys (a ``CASE`` over their CDF, computed with numpy) and the
   midpoint-rule continuous inverse over the tail (relative error of a key's probability about
   1e-4). The input (``k`` long, ``v`` long) is cached and counted before anything is timed.
   For n in ``--partitions`` (default 8 and 64), timed as the median of ``--repeat`` (3) runs
   after one warm-up of each (``benches.common.median_time``; every run builds its frames
   afresh, so no shuffle files are reused):

   - ours: ``tl.key_by(df, "k", name, n)`` (``fit="full"``, the default: the fit's jobs are
     inside the time) then ``.write.format("noop").mode("overwrite").save()``, for name in
     ``--names`` (default ``least_count`` and ``least_key``);
   - Spark: ``df.repartition(n, "k")`` with the same noop write.

   Reported per (K, distribution, n): the seconds and ``ratio = key_by / repartition``; the
   fitted strategy (``resolve_strategy(df, "k", name, n)``, the object key_by places with,
   its fit timed once as ``fit_seconds``): ``bounded``, ``len(p)`` (entries) and ``max_keys``;
   ``tl.partition_balance(placed).balance_degree`` (min / max rows per partition) of our
   placement, of ``tl.key_by(df, "k", "hash", n)`` and, where K <= ``--per-key-max``
   (1,000,000), of the per-key algorithm: the same strategy built with ``max_keys=K + 1``
   (e.g. ``tl.LeastCountPartitioner(n, max_keys=K + 1)``) placed by ``tl.key_by(df, "k", p)``,
   timed once with its noop write as ``per_key_seconds``. At the first partition count,
   ``fit_methods``: ``fit_table``'s two ways (``how="aggregate"`` and ``"sample"``) against
   Spark's own ``groupBy("k").count()``, the same data. Also the keys actually present and
   the heaviest key's rows (a balance degree of 1 needs it to be at most rows / n).

2. ``driver_rss``. At the largest size, for each of ``--rss-dists``: a child process
   (``multiprocessing`` spawn) starts its own SparkSession, builds and caches the same input,
   then reads ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (the driver Python process's peak
   RSS) before and after the fit alone, ``fit_table(df, "k", tl.LeastCountPartitioner(8))``.
   Baseline, in a fresh child each: what a per-key fit has to bring to the driver, Spark's
   ``df.groupBy("k").count().toArrow()`` (every key's count). Ratio: the fit's peak RSS
   increase / the baseline's. The JVM of each child (the ``SparkSubmit`` process under it) is
   read from ``/proc/<pid>/status``: its peak (``VmHWM``) is reset (``clear_refs`` = 5) before
   the measured step, so ``jvm_hwm_mb`` is the JVM's peak during it. In local mode that JVM is
   the driver and the executors at once: its figures hold the tasks' memory too. MB = 2**20
   bytes.

3. ``stream``. ``keyed_foreach_batch`` with ``strategy="least_count"`` against
   ``strategy="hash"``, a running count per key (``benches.common.long_count``, long keys,
   event time ``t``, delay 10**15 so nothing closes), ``--stream-partitions`` (4) partitions,
   for state sizes K in ``--state-sizes`` (default 10,000, 1,000,000, 10,000,000; ``--quick``:
   10,000 and 1,000,000). The batch function is called directly with batch frames
   (``run(batch_df, batch_id)``, no streaming query, as in ``benches/state/bench_keep_open.py``):
   batch 0 brings every key once (``spark.range(K)``), then ``--stream-batches`` (5) batches of
   ``--stream-rows`` (20,000) rows with keys drawn uniformly from ``range(K)``
   (``rand(seed) * K``, the same rows for both strategies), or with ``--stream-touched N``
   from N keys spread evenly over ``range(K)`` (every ``K // N``-th key), so that a batch
   touches about the same keys at every K and only the state's size differs (over all K, a
   20,000-row batch touches 8,675 distinct keys at K = 10,000 and about 19,800 at a
   million). Each batch's keys read (its tasks' ``keys_read``) are reported, and the
   seconds per key read. The two runners alternate batch by
   batch (the order flips each batch) on fresh temporary state paths and local store
   directories (``spark.trilink.state.localDir``). Reported: the median wall seconds of the
   20,000-row batches for both, ratio least_count / hash at each K, and each strategy's
   median at K over its own median at the smallest K (10,000 by default); bytes written per
   batch (the run object exposes no byte counts, so they are measured as in
   ``benches/state/bench_state_scale.py``: ``os.walk`` snapshots of the state path and of the
   local store directory before and after each batch, new and rewritten files counted). After
   the load batch the bench waits (at most ``--drain-timeout`` s) until no snapshot writer runs
   on the machine, so the load's snapshot is not in the steady batches.

4. ``auto``. For each K in ``--sizes`` and distribution, at the first of ``--partitions``:
   ``resolve_strategy(df, "k", "auto", n, fit="none")`` (ours: the sample's keys counted
   in one job that returns at most ``maxKeys`` + 1 of them; past ``maxKeys`` sampled keys,
   each candidate scored on the executors) against what it replaces, in the same run: every
   sampled key's count brought to the driver (``key_counts`` of the same seeded sample, every
   row when it has fewer than ``minSample`` rows) and ``evaluate_strategies`` on that
   mapping. Median seconds of ``--repeat`` runs after a warm-up, the ratio, both choices,
   the candidates' balance on each side and the distinct sampled keys the baseline brings
   the driver.

Everything (the figures, the command line, Spark's version, the date, the load average) goes
to ``benches/results/<--out>.json`` (default ``table_scale``), written after every part;
a compact table per part is printed.

Run from the repository root: ``PYSPARK_PYTHON=.venv/bin/python .venv/bin/python -m
benches.placement.bench_table_scale [--quick] [--sizes 100000,1000000,10000000]
[--partitions 8,64] [--parts key_by,driver_rss,stream,auto] [--state-sizes 10000,1000000,10000000]
[--out NAME]``. The full run wants a quiet machine with room for one JVM of
``--driver-memory`` (default 8g) holding the 40,000,000-row input; the driver_rss children run
first, one at a time, before this process starts its own JVM. A smoke run (about 3 minutes on
2 cores): ``--sizes 20000 --partitions 8 --state-sizes 10000 --driver-memory 2g``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import multiprocessing
import os
import resource
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # run as a script (python benches/placement/bench_table_scale.py)
    sys.path.insert(0, ROOT)

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import numpy as np  # noqa: E402

import trilink_spark as tl  # noqa: E402
from benches.common import long_count, median_time, write_json  # noqa: E402
from benches.state.bench_state_scale import (  # noqa: E402
    JVM_MARKS, SNAPSHOT_MARK, Snapshot, guarded, int_list, read_cmdline, read_status,
    snapshot, written_bytes)

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from pyspark.sql import Column, DataFrame, SparkSession

# the module, not the function the package exports under the same name
KEY_BY_MODULE = importlib.import_module("trilink_spark.placement.key_by")

PARTS = ("balance", "key_by", "driver_rss", "stream", "auto")
SIZES = (100_000, 1_000_000, 10_000_000)
QUICK_SIZES = (100_000, 1_000_000)
STATE_SIZES = (10_000, 1_000_000, 10_000_000)
QUICK_STATE_SIZES = (10_000, 1_000_000)
PARTITIONS = (8, 64)
NAMES = ("least_count", "least_key")
DISTS = ("uniform", "zipf")
ROWS_PER_KEY = 4
REPEAT = 3
PER_KEY_MAX = 1_000_000
ZIPF_S = 1.1
ZIPF_HEAD = 64  # the heaviest keys drawn from their exact CDF; the tail by continuous inverse
TAIL_CHUNK = 1 << 20
RSS_PARTITIONS = 8
STREAM_ROWS = 20_000
STREAM_BATCHES = 5
STREAM_PARTITIONS = 4
STREAM_DELAY = 10**15  # event-time units (t is a long): no key's time ever closes
STREAM_STRATEGIES = ("least_count", "hash")
LOCAL_DIR_CONF = "spark.trilink.state.localDir"
DRAIN_TIMEOUT_S = 600.0
CHILD_TIMEOUT_S = 3600.0
MB = float(1 << 20)
LOCAL_MODE_NOTE = ("local mode: the JVM is the driver and the executors at once, so its RSS "
                   "holds the tasks' memory (and the cached input) too")
PARTITIONERS: dict[str, Callable[..., Any]] = {
    "least_count": tl.LeastCountPartitioner,
    "least_key": tl.LeastKeyPartitioner,
}


# ------------------------------------------------------------------ input
def zipf_tail_mass(head: int, keys: int, s: float) -> float:
    """``sum(r ** -s for r in head+1..keys)``, in chunks (the driver never holds K floats)."""
    total = 0.0
    for lo in range(head + 1, keys + 1, TAIL_CHUNK):
        r = np.arange(lo, min(keys, lo + TAIL_CHUNK - 1) + 1, dtype=np.float64)
        total += float(np.sum(r ** -s))
    return total


def zipf_key(u: Column, keys: int, s: float = ZIPF_S, head: int = ZIPF_HEAD) -> Column:
    """Key ``rank - 1`` in ``[0, keys)`` of a Zipf(``s``) rank drawn from the uniform ``u``.

    Ranks up to ``head`` by their exact CDF (a ``CASE``), the tail by inverting the midpoint
    approximation of the tail's CDF, ``integral of x ** -s from head + 0.5``, rounded to a
    rank; the tail's total mass is exact.
    """
    from pyspark.sql import functions as F

    if s == 1.0:
        raise ValueError("--zipf-s 1.0 has no closed-form tail inverse; use e.g. 1.1")
    h = min(keys, head)
    w_head = np.arange(1, h + 1, dtype=np.float64) ** -s
    tail = zipf_tail_mass(h, keys, s)
    cdf = np.cumsum(w_head) / (w_head.sum() + tail)
    expr = F.when(u < F.lit(float(cdf[0])), F.lit(0))
    for i in range(1, h):
        expr = expr.when(u < F.lit(float(cdf[i])), F.lit(i))
    if h == keys:
        return expr.otherwise(F.lit(keys - 1)).cast("long")
    c_h = float(cdf[-1])
    e = 1.0 - s
    a, b = (h + 0.5) ** e, (keys + 0.5) ** e
    v = (u - F.lit(c_h)) / F.lit(1.0 - c_h)
    x = F.pow(F.lit(a) + v * F.lit(b - a), F.lit(1.0 / e))
    rank = F.least(F.greatest(F.floor(x + F.lit(0.5)), F.lit(h + 1)), F.lit(keys))
    return expr.otherwise(rank - F.lit(1)).cast("long")


def make_frame(spark: SparkSession, keys: int, dist: str, rows_per_key: int = ROWS_PER_KEY,
               s: float = ZIPF_S, seed: int = 0) -> DataFrame:
    """``k`` long, ``v`` long: ``rows_per_key * keys`` rows, generated in the JVM."""
    from pyspark.sql import functions as F

    rows = rows_per_key * keys
    base = spark.range(rows)
    if dist == "uniform":
        return base.select((F.col("id") % F.lit(keys)).alias("k"), F.col("id").alias("v"))
    if dist == "zipf":
        drawn = base.select(F.col("id"), F.rand(seed).alias("u"))
        return drawn.select(zipf_key(F.col("u"), keys, s).alias("k"), F.col("id").alias("v"))
    raise ValueError(f"unknown distribution {dist!r}; known: {', '.join(DISTS)}")


def cached_frame(spark: SparkSession, keys: int, dist: str, args: argparse.Namespace
                 ) -> tuple[DataFrame, dict[str, Any]]:
    """The cached input and what it holds (rows, keys present, the heaviest key's rows)."""
    from pyspark.sql import functions as F

    started = time.perf_counter()
    df = make_frame(spark, keys, dist, args.rows_per_key, args.zipf_s, args.seed).cache()
    rows = df.count()
    stats = df.groupBy("k").count().agg(F.count(F.lit(1)).alias("present"),
                                        F.max("count").alias("heaviest")).collect()[0]
    return df, {"rows": int(rows), "keys_present": int(stats["present"]),
                "heaviest_key_rows": int(stats["heaviest"]),
                "generate_seconds": time.perf_counter() - started}


def noop(df: DataFrame) -> None:
    df.write.format("noop").mode("overwrite").save()


# ------------------------------------------------------------------ part 0: balance
def run_balance(args: argparse.Namespace, payload: dict[str, Any]) -> dict[str, Any]:
    """The bounded form against the per-key algorithm and hash, in Python (the placement
    ``assign`` gives is the JVM's): the paper's four scenarios (1,000,000 records, 10,000
    keys, 60 partitions, as RESULTS section 1) bounded at 1,000 entries, and Zipf 1.1 at
    1,000,000 keys (4 rows per key) bounded at the default 65,536, on 8 and 64 partitions."""
    from trilink_spark.partitioners import balance_degree
    from trilink_spark.partitioners.choosing.scenarios import PAPER_SCENARIOS, make_scenario

    cases: list[tuple[str, Any, Any, int, int]] = []
    for name in PAPER_SCENARIOS:
        sc = make_scenario(name)
        cases.append((name, sc.keys, sc.counts, 60, 1_000))
    rng = np.random.default_rng(7)
    keys = 1_000_000
    raw = zipf_numpy(rng, keys, 4 * keys)
    uniq, counts = np.unique(raw, return_counts=True)
    for n in (8, 64):
        cases.append((f"zipf 1.1, {keys:,} keys", uniq, counts, n, 65_536))
    rows = []
    for label, ks, cs, n, bound in cases:
        mapping = dict(zip(ks.tolist(), cs.tolist()))
        row: dict[str, Any] = {"case": label, "partitions": n, "keys": len(ks),
                               "max_keys": bound}
        row["hash"] = balance_degree(np.bincount(tl.HashPartitioner(n).assign(ks),
                                                 weights=cs, minlength=n))
        for sname, cls in PARTITIONERS.items():
            for form, m in (("bounded", bound), ("per_key", len(ks) + 1)):
                p = cls(n, max_keys=m).fit(mapping)
                loads = np.bincount(p.assign(ks), weights=cs, minlength=n)
                key_loads = np.bincount(p.assign(ks), minlength=n)
                row[f"{sname}_{form}"] = balance_degree(loads)
                row[f"{sname}_{form}_keys"] = balance_degree(key_loads)
        rows.append(row)
        print(f"  {label:<28} n={n:>2} hash {row['hash']:.3f} | least_count bounded "
              f"{row['least_count_bounded']:.4f} per-key {row['least_count_per_key']:.4f} | "
              f"least_key (keys) bounded {row['least_key_bounded_keys']:.4f} per-key "
              f"{row['least_key_per_key_keys']:.4f}", flush=True)
    payload["balance"] = rows
    write_json(args.out, payload)
    return payload


def zipf_numpy(rng: Any, keys: int, rows: int, s: float = 1.1) -> Any:
    """``rows`` Zipf(``s``) draws over ``keys`` keys (inverse CDF over the exact weights)."""
    weights = 1.0 / np.arange(1, keys + 1, dtype=np.float64) ** s
    cdf = np.cumsum(weights / weights.sum())
    return np.minimum(np.searchsorted(cdf, rng.random(rows)), keys - 1)


# ------------------------------------------------------------------ part 1: key_by
def strategy_facts(p: Any) -> dict[str, Any]:
    return {"strategy": p.strategy_name, "bounded": bool(p.bounded), "table_keys": len(p),
            "max_keys": int(p.max_keys)}


def run_key_by_name(df: DataFrame, name: str, n: int, keys: int, baseline_s: float,
                    args: argparse.Namespace) -> dict[str, Any]:
    """Ours for one strategy name at n partitions: time, fit, balance, the per-key variant."""
    seconds = median_time(lambda: noop(tl.key_by(df, "k", name, n)), repeat=args.repeat,
                          warmup=1)
    out: dict[str, Any] = {"seconds": seconds, "ratio_over_repartition": seconds / baseline_s}
    started = time.perf_counter()
    fitted = KEY_BY_MODULE.resolve_strategy(df, "k", name, n).partitioner
    out["fit_seconds"] = time.perf_counter() - started
    out.update(strategy_facts(fitted))
    placed = tl.key_by(df, "k", fitted, fit="none")
    out["balance_degree"] = tl.partition_balance(placed).balance_degree
    if keys <= args.per_key_max:
        p = PARTITIONERS[name](n, max_keys=keys + 1)
        started = time.perf_counter()
        placed = tl.key_by(df, "k", p)
        noop(placed)
        per_key: dict[str, Any] = {"per_key_seconds": time.perf_counter() - started}
        per_key["ratio_over_repartition"] = per_key["per_key_seconds"] / baseline_s
        per_key.update(strategy_facts(p))
        per_key["balance_degree"] = tl.partition_balance(placed).balance_degree
        out["per_key"] = per_key
    return out


def fit_methods(df: DataFrame, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """The two ways ``fit_table`` finds the heaviest keys, against Spark's own count of every
    key (``groupBy(k).count()``), median seconds each, same data."""
    out: dict[str, Any] = {"groupby_count_seconds": median_time(
        lambda: noop(df.groupBy("k").count()), repeat=args.repeat, warmup=1)}
    for how in ("aggregate", "sample"):
        out[f"{how}_seconds"] = median_time(
            lambda: KEY_BY_MODULE.fit_table(df, "k", tl.LeastCountPartitioner(n), how=how),
            repeat=args.repeat, warmup=1)
    print("  fit_table: " + ", ".join(f"{k} {v:.2f}" for k, v in out.items()), flush=True)
    return out


def run_key_by(spark: SparkSession, args: argparse.Namespace, payload: dict[str, Any]
               ) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = payload.setdefault("key_by", [])
    for keys in args.sizes:
        for dist in args.dists:
            print(f"key_by: K = {keys:,}, {dist}", flush=True)
            df, facts = cached_frame(spark, keys, dist, args)
            try:
                for n in args.partitions:
                    row: dict[str, Any] = {"keys": keys, "distribution": dist, "partitions": n,
                                           **facts, "mean_rows_per_partition":
                                           facts["rows"] / n}
                    row["repartition_seconds"] = median_time(
                        lambda: noop(df.repartition(n, "k")), repeat=args.repeat, warmup=1)
                    row["hash"] = guarded("hash balance", lambda: {
                        "balance_degree": tl.partition_balance(
                            tl.key_by(df, "k", "hash", n)).balance_degree})
                    if n == args.partitions[0]:
                        row["fit_methods"] = fit_methods(df, n, args)
                    row["ours"] = {}
                    for name in args.names:
                        row["ours"][name] = guarded(f"{name}, n = {n}", partial(
                            run_key_by_name, df, name, n, keys, row["repartition_seconds"],
                            args))
                    rows.append(row)
                    print_key_by([row])
                    write_json(args.out, payload)
            finally:
                df.unpersist()
    return rows


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def print_key_by(rows: list[dict[str, Any]]) -> None:
    head = (f"{'K':>10} {'dist':<7} {'n':>3} {'strategy':<11} {'key_by s':>8} {'repart s':>8} "
            f"{'ratio':>6} {'fit s':>6} {'bounded':>7} {'entries':>8} {'bal':>5} "
            f"{'hash':>5} {'perkey':>6} {'pk s':>7}")
    print(head)
    print("-" * len(head))
    for row in rows:
        hash_bal = row["hash"].get("balance_degree")
        for name, r in row["ours"].items():
            lead = f"{row['keys']:>10} {row['distribution']:<7} {row['partitions']:>3} {name:<11}"
            if "error" in r:
                print(f"{lead} {r['error'][:90]}")
                continue
            pk = r.get("per_key") or {}
            print(f"{lead} {r['seconds']:>8.3f} {row['repartition_seconds']:>8.3f} "
                  f"{r['ratio_over_repartition']:>6.2f} {r['fit_seconds']:>6.2f} "
                  f"{str(r['bounded']):>7} {r['table_keys']:>8} {r['balance_degree']:>5.3f} "
                  f"{_fmt(hash_bal):>5} {_fmt(pk.get('balance_degree')):>6} "
                  f"{_fmt(pk.get('per_key_seconds'), '.2f'):>7}")


# ------------------------------------------------------------------ part 2: driver RSS
def descendants(root: int) -> list[int]:
    """Every live process under ``root`` (from ``/proc``'s parent ids)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = read_status(int(entry)).get("PPid")
            if ppid is not None:
                parent[int(entry)] = ppid
    found: list[int] = []
    frontier = [root]
    while frontier:
        here = frontier.pop()
        kids = [pid for pid, pp in parent.items() if pp == here]
        found.extend(kids)
        frontier.extend(kids)
    return found


def find_jvm(root: int) -> int | None:
    """The Spark JVM started under ``root`` (its command line names SparkSubmit)."""
    for pid in descendants(root):
        if any(mark in read_cmdline(pid) for mark in JVM_MARKS):
            return pid
    return None


def clear_peak(pid: int) -> bool:
    """Reset a process's ``VmHWM`` to its current RSS; False where the kernel refuses."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # kB on Linux


def rss_child(conn: Connection, spec: dict[str, Any]) -> None:
    """In a fresh process: one SparkSession, the cached input, then the measured step alone
    (``spec["step"]``: ``"fit"`` ours, ``"collect"`` Spark's every-key count to the driver)."""
    out: dict[str, Any] = {"step": spec["step"], "keys": spec["keys"],
                           "distribution": spec["dist"], "pid": os.getpid()}
    spark = None
    try:
        import gc

        spark = tl.get_session("local[2]", shuffle_partitions=RSS_PARTITIONS, extra_conf={
            "spark.driver.memory": spec["driver_memory"], "spark.ui.enabled": "false"})
        out["spark_version"] = spark.version
        df = make_frame(spark, spec["keys"], spec["dist"], spec["rows_per_key"],
                        spec["zipf_s"], spec["seed"]).cache()
        out["rows"] = int(df.count())
        gc.collect()
        jvm = find_jvm(os.getpid())
        out["jvm_pid"] = jvm
        out["python_maxrss_before_mb"] = maxrss_mb()
        out["python_rss_before_mb"] = read_status(os.getpid()).get("VmRSS", 0) / 1024.0
        if jvm is not None:
            out["jvm_rss_before_mb"] = read_status(jvm).get("VmRSS", 0) / 1024.0
            out["jvm_hwm_reset"] = clear_peak(jvm)
        started = time.perf_counter()
        if spec["step"] == "fit":
            p = tl.LeastCountPartitioner(RSS_PARTITIONS)
            KEY_BY_MODULE.fit_table(df, "k", p)
            out.update(strategy_facts(p))
        else:
            counts = df.groupBy("k").count().toArrow()
            out["rows_to_driver"] = counts.num_rows
            out["arrow_mb"] = counts.nbytes / MB
        out["seconds"] = time.perf_counter() - started
        out["python_maxrss_after_mb"] = maxrss_mb()
        out["python_rss_after_mb"] = read_status(os.getpid()).get("VmRSS", 0) / 1024.0
        out["python_peak_increase_mb"] = (out["python_maxrss_after_mb"]
                                          - out["python_maxrss_before_mb"])
        if jvm is not None:
            status = read_status(jvm)
            out["jvm_rss_after_mb"] = status.get("VmRSS", 0) / 1024.0
            out["jvm_hwm_mb"] = status.get("VmHWM", 0) / 1024.0
    except Exception as exc:  # reported, the parent goes on
        text = str(exc).strip().splitlines()
        out["error"] = f"{type(exc).__name__}: {text[0][:500] if text else ''}"
    finally:
        conn.send(out)
        conn.close()
        if spark is not None:
            spark.stop()


def in_child(spec: dict[str, Any], timeout: float = CHILD_TIMEOUT_S) -> dict[str, Any]:
    """:func:`rss_child` in a spawned process (fresh interpreter, fresh JVM)."""
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=rss_child, args=(there, spec), name=f"rss-{spec['step']}")
    started = time.perf_counter()
    proc.start()
    there.close()
    try:
        if here.poll(timeout):
            out: dict[str, Any] = here.recv()
        else:
            out = {"error": f"no result within {timeout:.0f} s"}
    except EOFError:
        out = {"error": "the child ended without a result"}
    proc.join(120)
    if proc.is_alive():
        proc.terminate()
        proc.join()
    out["exitcode"] = proc.exitcode
    out["child_seconds"] = time.perf_counter() - started
    return out


def run_driver_rss(args: argparse.Namespace, payload: dict[str, Any]) -> dict[str, Any]:
    keys = max(args.sizes)
    part: dict[str, Any] = {"keys": keys, "rows_per_key": args.rows_per_key,
                            "partitions": RSS_PARTITIONS, "note": LOCAL_MODE_NOTE,
                            "baseline": "df.groupBy('k').count().toArrow() (every key's count "
                                        "on the driver, what a per-key fit needs)",
                            "runs": {}}
    payload["driver_rss"] = part
    for dist in args.rss_dists:
        found: dict[str, Any] = {}
        for step in ("fit", "collect"):
            print(f"driver_rss: K = {keys:,}, {dist}, {step} (child process)", flush=True)
            found[step] = in_child({"step": step, "keys": keys, "dist": dist,
                                    "rows_per_key": args.rows_per_key, "zipf_s": args.zipf_s,
                                    "seed": args.seed, "driver_memory": args.driver_memory})
        fit, base = found["fit"], found["collect"]
        if "error" not in fit and "error" not in base:
            found["ratio_python_peak_increase"] = (
                fit["python_peak_increase_mb"] / base["python_peak_increase_mb"]
                if base["python_peak_increase_mb"] > 0 else None)
            found["ratio_seconds"] = fit["seconds"] / base["seconds"]
        part["runs"][dist] = found
        if fit.get("spark_version"):
            payload.setdefault("spark_version", fit["spark_version"])
        write_json(args.out, payload)
    print_driver_rss(part)
    return part


def print_driver_rss(part: dict[str, Any]) -> None:
    head = (f"{'K':>10} {'dist':<7} {'step':<8} {'seconds':>8} {'py before':>9} "
            f"{'py after':>9} {'py +MB':>7} {'jvm hwm':>8} {'jvm rss':>8} {'bounded':>7} "
            f"{'entries':>8}")
    print(head)
    print("-" * len(head))
    for dist, found in part["runs"].items():
        for step in ("fit", "collect"):
            r = found[step]
            lead = f"{part['keys']:>10} {dist:<7} {step:<8}"
            if "error" in r:
                print(f"{lead} {r['error'][:90]}")
                continue
            print(f"{lead} {r['seconds']:>8.2f} {r['python_maxrss_before_mb']:>9.1f} "
                  f"{r['python_maxrss_after_mb']:>9.1f} {r['python_peak_increase_mb']:>7.1f} "
                  f"{_fmt(r.get('jvm_hwm_mb'), '.0f'):>8} "
                  f"{_fmt(r.get('jvm_rss_after_mb'), '.0f'):>8} "
                  f"{str(r.get('bounded', '-')):>7} {str(r.get('table_keys', '-')):>8}")
        ratio = found.get("ratio_python_peak_increase")
        print(f"{'':>10} {dist:<7} fit / collect: peak increase "
              f"{_fmt(ratio, '.3f')}, seconds {_fmt(found.get('ratio_seconds'), '.3f')}")
    print(f"({part['note']}; MB = 2**20 bytes)")


# ------------------------------------------------------------------ part 4: auto
def per_key_auto(df: DataFrame, n: int, limit: int, seed: int) -> dict[str, Any]:
    """What ``"auto"`` did before it scored on the executors: every sampled key's count on
    the driver, then :func:`trilink_spark.evaluate_strategies` there."""
    rate = float(df.sparkSession.conf.get("spark.trilink.sampleRate", "0.01") or 0.01)
    counts = KEY_BY_MODULE.key_counts(df, "k", rate, seed, "group")
    if int(np.sum(counts.column(1).to_numpy())) < 10_000:
        counts = KEY_BY_MODULE.key_counts(df, "k", 1.0, seed, "group")
    mapping = dict(zip(counts.column(0).to_pylist(), counts.column(1).to_numpy().tolist()))
    scores = tl.evaluate_strategies(mapping, n, key_type="long", seed=seed, max_keys=limit)
    best = tl.partitioners.choose_best(scores)
    return {"chosen": best.name, "keys_to_driver": len(mapping),
            "scores": {s.name: s.balance_degree for s in scores}}


def run_auto(spark: SparkSession, args: argparse.Namespace, payload: dict[str, Any]
             ) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = payload.setdefault("auto", [])
    limit = KEY_BY_MODULE.table_max_keys(spark)
    n = args.partitions[0]
    for keys in args.sizes:
        for dist in args.dists:
            print(f"auto: K = {keys:,}, {dist}", flush=True)
            df, facts = cached_frame(spark, keys, dist, args)
            try:
                row: dict[str, Any] = {"keys": keys, "distribution": dist, "partitions": n,
                                       "max_keys": limit, **facts}
                ours: list[Any] = []
                base: list[dict[str, Any]] = []
                row["seconds"] = median_time(lambda: ours.append(KEY_BY_MODULE.resolve_strategy(
                    df, "k", "auto", n, fit="none", seed=args.seed + 1)), repeat=args.repeat,
                    warmup=1)
                row["baseline_seconds"] = median_time(
                    lambda: base.append(per_key_auto(df, n, limit, args.seed + 1)),
                    repeat=args.repeat, warmup=1)
                row["ratio"] = row["seconds"] / row["baseline_seconds"]
                got = ours[-1]
                row["ours"] = {"chosen": got.partitioner.strategy_name,
                               "sample_rows": got.sample_rows,
                               "scores": {s.name: s.balance_degree for s in got.scores}}
                row["baseline"] = base[-1]
                rows.append(row)
                print(f"  ours {row['seconds']:.2f} s ({row['ours']['chosen']}), every sampled "
                      f"key {row['baseline_seconds']:.2f} s ({row['baseline']['chosen']}, "
                      f"{row['baseline']['keys_to_driver']:,} keys to the driver), ratio "
                      f"{row['ratio']:.2f}", flush=True)
                for name, bal in row["ours"]["scores"].items():
                    print(f"    {name:<12} ours {bal:.3f}  per key "
                          f"{row['baseline']['scores'].get(name, float('nan')):.3f}")
                write_json(args.out, payload)
            finally:
                df.unpersist()
    return rows


# ------------------------------------------------------------------ part 3: stream
def drain_snapshot_writers(timeout: float) -> tuple[float, bool]:
    """Wait until no snapshot writer process runs (any on this machine), at most
    ``timeout`` s; the seconds waited and whether none was left."""
    started = time.perf_counter()
    while any(SNAPSHOT_MARK in read_cmdline(int(e)) for e in os.listdir("/proc")
              if e.isdigit()):
        if time.perf_counter() - started > timeout:
            return time.perf_counter() - started, False
        time.sleep(0.2)
    return time.perf_counter() - started, True


def noop_sink(df: DataFrame, batch_id: int) -> None:
    noop(df)


def run_stream_size(spark: SparkSession, keys: int, args: argparse.Namespace, work: Path
                    ) -> dict[str, Any]:
    """Both strategies at state size ``keys``, batch by batch in alternating order."""
    runs: dict[str, Any] = {}
    dirs: dict[str, dict[str, Path]] = {}
    out: dict[str, Any] = {"keys": keys, "rows_per_batch": args.stream_rows,
                           "strategies": {}}
    for strategy in STREAM_STRATEGIES:
        dirs[strategy] = {"state": work / strategy / "state", "local": work / strategy / "local"}
        runs[strategy] = tl.keyed_foreach_batch(
            noop_sink, "k", "t", long_count(), STREAM_DELAY, str(dirs[strategy]["state"]),
            strategy=strategy, num_partitions=args.stream_partitions)
        out["strategies"][strategy] = {"batch_seconds": [], "state_bytes_per_batch": [],
                                       "local_bytes_per_batch": [], "keys_read_per_batch": []}
    snaps: dict[str, dict[str, Snapshot]] = {}
    for b in range(1 + args.stream_batches):
        if b == 0:
            df = spark.range(keys).selectExpr("id AS k", "id AS t")
        elif args.stream_touched and args.stream_touched < keys:
            # rows over ``stream_touched`` keys spread evenly over the K in state: the same
            # keys touched per batch at every K, so only the state's size differs
            stride = keys // args.stream_touched
            df = spark.range(args.stream_rows).selectExpr(
                f"CAST(FLOOR(rand({args.seed + b}) * {args.stream_touched}) * {stride} "
                "AS BIGINT) AS k", f"id + {keys + b * args.stream_rows} AS t")
        else:
            df = spark.range(args.stream_rows).selectExpr(
                f"CAST(rand({args.seed + b}) * {keys} AS BIGINT) AS k",
                f"id + {keys + b * args.stream_rows} AS t")
        order = STREAM_STRATEGIES if b % 2 else tuple(reversed(STREAM_STRATEGIES))
        for strategy in order:
            row = out["strategies"][strategy]
            if "error" in row:
                continue
            spark.conf.set(LOCAL_DIR_CONF, str(dirs[strategy]["local"]))
            started = time.perf_counter()
            try:
                runs[strategy](df, b)
            except Exception as exc:  # reported, the other strategy goes on
                text = str(exc).strip().splitlines()
                row["error"] = (f"batch {b}: {type(exc).__name__}: "
                                f"{text[0][:500] if text else ''}")
                print(f"    {strategy} failed: {row['error']}", flush=True)
                continue
            wall = time.perf_counter() - started
            if b == 0:
                row["load_seconds"] = wall
                continue
            row["batch_seconds"].append(wall)
            # the distinct keys the batch touched (its tasks' reads of the local store): a
            # batch of the same rows touches more keys over a larger key space
            row["keys_read_per_batch"].append(
                int(runs[strategy].task_timings(b)["keys_read"].sum()))
            for where in ("state", "local"):
                after = snapshot(dirs[strategy][where])
                row[f"{where}_bytes_per_batch"].append(
                    written_bytes(snaps[strategy][where], after))
                snaps[strategy][where] = after
        if b == 0:  # the load's snapshot is part of building the state, not of a batch
            waited, drained = drain_snapshot_writers(args.drain_timeout)
            out["load_snapshot_drain_seconds"] = waited
            out["load_snapshot_drained"] = drained
            snaps = {s: {w: snapshot(p) for w, p in dirs[s].items()} for s in STREAM_STRATEGIES}
    for strategy, row in out["strategies"].items():
        if row["batch_seconds"]:
            row["median_batch_seconds"] = statistics.median(row["batch_seconds"])
            row["median_state_bytes_per_batch"] = statistics.median(
                row["state_bytes_per_batch"])
            row["median_local_bytes_per_batch"] = statistics.median(
                row["local_bytes_per_batch"])
            row["median_keys_read_per_batch"] = statistics.median(row["keys_read_per_batch"])
            row["median_ms_per_key_read"] = statistics.median(
                1000.0 * t / max(k, 1)
                for t, k in zip(row["batch_seconds"], row["keys_read_per_batch"]))
    lc, h = (out["strategies"][s].get("median_batch_seconds") for s in STREAM_STRATEGIES)
    out["ratio_least_count_over_hash"] = lc / h if lc and h else None
    return out


def run_stream(spark: SparkSession, args: argparse.Namespace, payload: dict[str, Any]
               ) -> dict[str, Any]:
    part: dict[str, Any] = {"partitions": args.stream_partitions, "delay": STREAM_DELAY,
                            "batches": args.stream_batches, "rows": args.stream_rows,
                            "touched": args.stream_touched or "all",
                            "bytes_source": "os.walk snapshots of the state path and the "
                                            "local store directory (the run object exposes "
                                            "no byte counts)",
                            "sizes": {}}
    payload["stream"] = part
    root = Path(tempfile.mkdtemp(prefix="tl-table-scale-", dir=args.work_dir))
    try:
        for keys in args.state_sizes:
            print(f"stream: K = {keys:,}", flush=True)
            work = root / f"k{keys}"
            part["sizes"][str(keys)] = guarded("least_count and hash", partial(
                run_stream_size, spark, keys, args, work))
            shutil.rmtree(work, ignore_errors=True)
            write_json(args.out, payload)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        spark.conf.unset(LOCAL_DIR_CONF)
    part["ratios_to_smallest"] = stream_ratios(part["sizes"])
    print_stream(part)
    return part


def stream_ratios(sizes: dict[str, Any]) -> dict[str, Any]:
    """Each strategy's median batch seconds at K over its own at the smallest K."""
    out: dict[str, Any] = {}
    for strategy in STREAM_STRATEGIES:
        medians = {int(k): r["strategies"][strategy]["median_batch_seconds"]
                   for k, r in sizes.items()
                   if "strategies" in r
                   and "median_batch_seconds" in r["strategies"][strategy]}
        if medians:
            ref = min(medians)
            out[strategy] = {"reference_keys": ref,
                             **{str(k): v / medians[ref] for k, v in sorted(medians.items())}}
    return out


def print_stream(part: dict[str, Any]) -> None:
    head = (f"{'K':>10} {'strategy':<11} {'load s':>7} {'median s':>8} {'x smallest':>10} "
            f"{'state B/batch':>13} {'local B/batch':>13} {'lc/hash':>7} {'keys read':>9} "
            f"{'ms/key':>7}")
    print(head)
    print("-" * len(head))
    ratios = part.get("ratios_to_smallest", {})
    for key, size in part["sizes"].items():
        if "error" in size:
            print(f"{key:>10} {size['error'][:100]}")
            continue
        for strategy, r in size["strategies"].items():
            lead = f"{key:>10} {strategy:<11}"
            if "median_batch_seconds" not in r:
                print(f"{lead} {r.get('error', 'no batch')[:100]}")
                continue
            rel = ratios.get(strategy, {}).get(key)
            lc_h = size["ratio_least_count_over_hash"] if strategy == "least_count" else None
            print(f"{lead} {r['load_seconds']:>7.2f} {r['median_batch_seconds']:>8.3f} "
                  f"{_fmt(rel, '.3f'):>10} {r['median_state_bytes_per_batch']:>13.0f} "
                  f"{r['median_local_bytes_per_batch']:>13.0f} {_fmt(lc_h, '.3f'):>7} "
                  f"{r['median_keys_read_per_batch']:>9.0f} {r['median_ms_per_key_read']:>7.3f}")


# ------------------------------------------------------------------ main
def name_list(known: tuple[str, ...], what: str) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        wrong = [x for x in names if x not in known]
        if wrong or not names:
            raise argparse.ArgumentTypeError(
                f"{what}: {', '.join(wrong) or 'none given'}; known: {', '.join(known)}")
        return names
    return parse


def parse(argv: list[str]) -> argparse.Namespace:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="sizes 100000,1000000 and state sizes 10000,1000000")
    parser.add_argument("--sizes", type=int_list, default=None,
                        help="distinct keys K for key_by and driver_rss (default "
                             "100000,1000000,10000000)")
    parser.add_argument("--partitions", type=int_list, default=list(PARTITIONS),
                        help="partition counts n (default 8,64)")
    parser.add_argument("--parts", type=name_list(PARTS, "unknown part"), default=list(PARTS))
    parser.add_argument("--state-sizes", type=int_list, default=None,
                        help="state sizes K of the stream part (default 10000,1000000,10000000)")
    parser.add_argument("--names", type=name_list(tuple(PARTITIONERS), "unknown strategy"),
                        default=list(NAMES), help="our strategies in key_by")
    parser.add_argument("--dists", type=name_list(DISTS, "unknown distribution"),
                        default=list(DISTS))
    parser.add_argument("--rss-dists", type=name_list(DISTS, "unknown distribution"),
                        default=list(DISTS), help="distributions of the driver_rss part")
    parser.add_argument("--rows-per-key", type=int, default=ROWS_PER_KEY)
    parser.add_argument("--zipf-s", type=float, default=ZIPF_S)
    parser.add_argument("--repeat", type=int, default=REPEAT,
                        help="timed runs after one warm-up (the median is reported)")
    parser.add_argument("--per-key-max", type=int, default=PER_KEY_MAX,
                        help="time the per-key table (max_keys=K+1) at K up to this")
    parser.add_argument("--stream-rows", type=int, default=STREAM_ROWS)
    parser.add_argument("--stream-batches", type=int, default=STREAM_BATCHES)
    parser.add_argument("--stream-touched", type=int, default=0,
                        help="the keys a batch's rows are drawn from, spread over the K in "
                             "state (0: all K; a larger K then touches more keys per batch)")
    parser.add_argument("--stream-partitions", type=int, default=STREAM_PARTITIONS)
    parser.add_argument("--drain-timeout", type=float, default=DRAIN_TIMEOUT_S,
                        help="most seconds to wait for snapshot writers after the load")
    parser.add_argument("--driver-memory", default="8g")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", default=None, help="where the stream state goes (temp)")
    parser.add_argument("--out", default="table_scale", help="results/<out>.json")
    args = parser.parse_args(argv)
    if args.sizes is None:
        args.sizes = list(QUICK_SIZES if args.quick else SIZES)
    if args.state_sizes is None:
        args.state_sizes = list(QUICK_STATE_SIZES if args.quick else STATE_SIZES)
    counts = (args.sizes + args.partitions + args.state_sizes
              + [args.rows_per_key, args.repeat, args.stream_rows, args.stream_batches,
                 args.stream_partitions])
    if not args.sizes or not args.partitions or not args.state_sizes or min(counts) < 1:
        parser.error("sizes, partitions, state sizes, rows, repeats and batches must be "
                     "positive")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    import pyspark

    payload: dict[str, Any] = {
        "command": shlex.join([".venv/bin/python", "-m", "benches.placement.bench_table_scale",
                               *argv]),
        "argv": argv,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "pyspark": pyspark.__version__, "parts": args.parts, "sizes": args.sizes,
        "partitions": args.partitions, "state_sizes": args.state_sizes,
        "rows_per_key": args.rows_per_key, "zipf_s": args.zipf_s, "repeat": args.repeat,
        "per_key_max": args.per_key_max, "driver_memory": args.driver_memory,
        "master": "local[2]", "load_average_start": list(os.getloadavg()),
    }
    started = time.perf_counter()
    if "balance" in args.parts:
        run_balance(args, payload)
    # first, before this process starts a JVM: the children then have the machine alone
    if "driver_rss" in args.parts:
        run_driver_rss(args, payload)
    spark = None
    try:
        if {"key_by", "stream", "auto"} & set(args.parts):
            spark = tl.get_session("local[2]", shuffle_partitions=max(args.partitions),
                                   extra_conf={"spark.driver.memory": args.driver_memory,
                                               "spark.ui.enabled": "false"})
            payload["spark_version"] = spark.version
            payload["adaptive"] = spark.conf.get("spark.sql.adaptive.enabled")
        if spark is not None and "key_by" in args.parts:
            rows = run_key_by(spark, args, payload)
            print("key_by (all):")
            print_key_by(rows)
        if spark is not None and "stream" in args.parts:
            run_stream(spark, args, payload)
        if spark is not None and "auto" in args.parts:
            run_auto(spark, args, payload)
    finally:
        payload["bench_seconds"] = time.perf_counter() - started
        payload["load_average_end"] = list(os.getloadavg())
        print(write_json(args.out, payload))
        if spark is not None:
            spark.stop()


if __name__ == "__main__":
    main()
