"""The driver of ``test_standalone.py``: trilink-spark on a Spark standalone cluster whose
executors' Python lacks the package.

Usage: ``python cluster_driver.py MASTER_URL WORK NO_PYARROW_PYTHON``. ``PYSPARK_PYTHON``
names the executors' Python; ``NO_PYARROW_PYTHON`` the one of a second application, which
lacks pyarrow. Prints one JSON line: what each step found (the test judges it) and its seconds.

Steps: (a) ``local_merge`` before ``tl.ship``: the typed error up front; (b) ``tl.ship``,
then ``key_by``, ``keyed_agg``, ``local_merge`` and ``global_merge`` against plain Spark
``groupBy``; (c) a keyed state path the executors cannot see (relative to the driver's
working directory): the typed error; (d) a streaming ``keyed_foreach_batch`` over parquet
files, one per trigger, with a block placement rescaled from 4 to 8 partitions mid-stream:
each batch's running counts against the input's; (d2) a package that changes on disk after
``tl.ship`` shipped it, shipped again; (e) a second application whose executors'
Python lacks pyarrow: ``tl.ship``'s check, and a state path on a pyarrow filesystem that is
not the local one (so it travels with the check's tasks).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import time
import warnings
from typing import Any

import numpy as np
import pandas as pd
from pyarrow import fs as pafs
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark._internal.spark.executors import ensure_executors
from trilink_spark.errors import ExecutorEnvironmentError, TrilinkWarning
from trilink_spark.keyed.run.streaming import read_state_values
from trilink_spark.state import KeyedStateStore

BATCHES = 5
SWAP_AFTER = 1  # the rescale is requested after this batch, so it runs at the next one


class Count(tl.KeyedWatermarkProcessFunction):
    """Each key's running count, emitted at every batch that brings the key rows."""

    output_schema = "k string, n long"
    state_schema = "n long"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
        n = ctx.get_state("n", 0) + len(rows)
        ctx.set_state("n", n)
        return [(key, n)]


def rows_of(df: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in df.collect())


def step(name: str, found: dict[str, Any], started: float) -> None:
    found.setdefault("seconds", {})[name] = round(time.monotonic() - started, 2)


def unshipped(spark: Any, frame: Any, found: dict[str, Any]) -> None:
    """(a) Before shipping: the typed error, raised by the call itself."""
    started = time.monotonic()
    try:
        # the Python engine's tasks need the package (the Spark engine's would not)
        tl.local_merge(frame, "k", "t", 100.0, {"n": ("count", None)}, engine="python")
        found["unshipped"] = None
    except Exception as err:  # the test asserts its type and message
        found["unshipped"] = {"type": type(err).__name__, "message": str(err)}
    step("unshipped", found, started)


def batch_operators(spark: Any, frame: Any, found: dict[str, Any]) -> None:
    """(b) After ``tl.ship``: each operator equals plain Spark."""
    started = time.monotonic()
    found["shipped"] = [os.path.basename(p) for p in tl.ship(spark)]
    found["shipped_again"] = [os.path.basename(p) for p in tl.ship(spark)]
    step("ship", found, started)
    started = time.monotonic()
    truth = rows_of(frame.groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("s")))
    placed = tl.key_by(frame, "k", "hash", 4).withColumn("pid", F.spark_partition_id())
    found["key_by"] = {
        "counts": rows_of(placed.groupBy("k").agg(F.count("*"), F.sum("v"))) == truth,
        "one_partition_per_key": placed.groupBy("k").agg(
            F.countDistinct("pid").alias("p")).filter("p != 1").count() == 0,
        "where_the_strategy_says": placed.filter(F.col(tl.PARTITION_COL) != F.col("pid"))
        .count() == 0,
    }
    keyed = tl.keyed_agg(frame, "k", F.count("*").alias("n"), F.sum("v").alias("s"),
                         strategy="least_count", num_partitions=4)
    found["keyed_agg"] = rows_of(keyed.select("k", "n", "s")) == truth
    aggs = [F.count("*").alias("n"), F.sum("v").alias("s")]
    partials = tl.local_merge(frame, "k", "t", 100.0, aggs, engine="python")  # Python tasks
    merged = tl.merge_partials(partials, "k", aggs)
    found["local_merge"] = {"partial_rows": partials.count(), "rows": frame.count(),
                            "exact": rows_of(merged.select("k", "n", "s")) == truth}
    first = {"n": ("count", None), "s": ("sum", "v"), "f": ("first", "v")}
    merged = tl.global_merge(frame, "k", first, event_time="t")  # first: Python partials
    truth_first = rows_of(frame.groupBy("k").agg(F.count("*"), F.sum("v"),
                                                 F.min_by("v", "t")))
    found["global_merge"] = rows_of(merged.select("k", "n", "s", "f")) == truth_first
    step("batch_operators", found, started)


def unseen_state_path(spark: Any, frame: Any, work: str, found: dict[str, Any]) -> None:
    """(c) A state path relative to the driver's working directory: the executors (whose
    working directories are their own) cannot see the driver's file there."""
    started = time.monotonic()
    os.chdir(work)
    run = tl.keyed_foreach_batch(lambda df, b: None, "k", "t", Count(), 1000.0,
                                 "relative-state", filesystem=pafs.LocalFileSystem())
    try:
        run(frame, 0)
        found["unseen"] = None
    except Exception as err:
        found["unseen"] = {"type": type(err).__name__, "message": str(err)}
    step("unseen_state_path", found, started)


def stream(spark: Any, work: str, found: dict[str, Any]) -> None:
    """(d) A keyed stream rescaled from 4 to 8 partitions mid-stream."""
    started = time.monotonic()
    rng = np.random.default_rng(7)
    inputs = os.path.join(work, "in")
    os.makedirs(inputs)
    frames = []
    for b in range(BATCHES):
        keys = rng.integers(0, 40, 400)
        part = pd.DataFrame({"k": [f"k{k:02d}" for k in keys],
                             "t": np.arange(400, dtype=float) + 400 * b})
        path = os.path.join(inputs, f"part-{b:03d}.parquet")
        part.to_parquet(path)
        os.utime(path, (1_700_000_000 + b, 1_700_000_000 + b))  # the file source's order
        frames.append(part)
    outputs: dict[int, dict[str, int]] = {}

    def sink(df: Any, batch_id: int) -> None:
        outputs[batch_id] = {r["k"]: int(r["n"]) for r in df.collect()}

    state = os.path.join(work, "state")  # absolute: every executor of this host sees it
    run = tl.keyed_foreach_batch(sink, "k", "t", Count(), 1000.0, state,
                                 strategy=tl.BlockPartitioner(4, num_blocks=64),
                                 num_partitions=4)

    def batch(df: Any, batch_id: int) -> None:
        run(df, batch_id)
        if batch_id == SWAP_AFTER:
            run.request_swap(num_partitions=8)

    caught: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                caught.append(record.getMessage())

    logging.getLogger("trilink_spark._internal.spark.executors").addHandler(Keep())
    query = (spark.readStream.schema("k string, t double").option("maxFilesPerTrigger", 1)
             .parquet(inputs).writeStream.foreachBatch(batch)
             .option("checkpointLocation", os.path.join(work, "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    running: dict[str, int] = {}
    exact = []
    for b, part in enumerate(frames):
        for key, n in part["k"].value_counts().items():
            running[key] = running.get(key, 0) + int(n)
        exact.append(outputs.get(b) == {k: running[k] for k in part["k"].unique()})
    store = KeyedStateStore.open_existing(state)
    truth = {r["k"]: int(r["n"]) for r in spark.read.parquet(inputs).groupBy("k")
             .agg(F.count("*").alias("n")).collect()}
    found["stream"] = {
        "batches": sorted(outputs),
        "each_batch_exact": exact,
        "final_state_exact": {k: v["n"] for k, v in read_state_values(store).items()} == truth,
        "partitions_after": store.committed_layout()[1],
        "swaps": [r.batch_id for r in run.swaps if not r.refused],
        "local_path_warning": [m for m in caught if "local filesystem" in m],
    }
    step("stream", found, started)


CHANGED = "tl_changed_package"


def changed_value(_: int) -> int:
    """What the executors import of the changing package."""
    module = importlib.import_module(CHANGED)
    return int(module.VALUE)


def executor_values(spark: Any) -> list[int]:
    value = F.udf(changed_value, "int", useArrow=False)
    return sorted(r[0] for r in spark.range(0, 32, 1, 8).select(value("id")).distinct()
                  .collect())


def changed_package(spark: Any, work: str, found: dict[str, Any]) -> None:
    """(d2) ``tl.ship`` of a package, which then changes on disk (an edit, an upgrade) and
    is shipped again to the same application: the executors' Python workers keep the
    modules they imported, so the second ship must refuse instead of adding a zip that only
    some tasks would import."""
    started = time.monotonic()
    extra = os.path.join(work, "extra")
    os.makedirs(os.path.join(extra, CHANGED))
    init = os.path.join(extra, CHANGED, "__init__.py")
    with open(init, "w") as out:
        out.write("VALUE = 1\n")
    sys.path.insert(0, extra)
    importlib.invalidate_caches()
    outcome: dict[str, Any] = {"first": None}
    tl.ship(spark, packages=[CHANGED], check=False)
    outcome["first"] = executor_values(spark)
    with open(init, "w") as out:
        out.write("VALUE = 2\n")
    try:
        outcome["again"] = [os.path.basename(p) for p in tl.ship(spark, packages=[CHANGED],
                                                                 check=False)]
    except Exception as err:  # the test asserts its type and message
        outcome["again"] = {"type": type(err).__name__, "message": str(err)}
    outcome["after"] = executor_values(spark)
    found["changed"] = outcome
    step("changed_package", found, started)


def without_pyarrow(spark: Any, master: str, work: str, python: str,
                    found: dict[str, Any]) -> Any:
    """(e) A second application, whose executors' Python lacks pyarrow: the typed error names
    pyarrow and its fix, for ``tl.ship``'s check and for a state path on a ``pyarrow.fs``
    filesystem that is not the local one (it travels with the check's tasks). Returns the
    new session."""
    started = time.monotonic()
    spark.stop()
    os.environ["PYSPARK_PYTHON"] = python  # read when a SparkContext starts
    spark = session(master)
    outcome: dict[str, Any] = {}
    try:
        tl.ship(spark)
        outcome["ship"] = None
    except Exception as err:  # the test asserts its type and message
        outcome["ship"] = {"type": type(err).__name__, "message": str(err)}
    os.makedirs(os.path.join(work, "subtree"))
    subtree = pafs.SubTreeFileSystem(os.path.join(work, "subtree"), pafs.LocalFileSystem())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TrilinkWarning)
        try:
            ensure_executors(spark, "state", subtree)
            outcome["subtree"] = None
        except Exception as err:
            outcome["subtree"] = {"type": type(err).__name__, "message": str(err)}
    outcome["subtree_warnings"] = [str(w.message) for w in caught
                                   if issubclass(w.category, TrilinkWarning)]
    found["no_pyarrow"] = outcome
    step("no_pyarrow", found, started)
    return spark


def session(master: str) -> Any:
    spark = (SparkSession.builder.master(master).appName("trilink-standalone-test")
             .config("spark.ui.enabled", "false")
             .config("spark.executor.memory", "512m")
             .config("spark.executor.cores", "1")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main() -> None:
    master, work, no_pyarrow = sys.argv[1], sys.argv[2], sys.argv[3]
    warnings.simplefilter("ignore", TrilinkWarning)  # logged as well: the stream reads that
    started = time.monotonic()
    spark = session(master)
    found: dict[str, Any] = {"executor_python": os.environ.get("PYSPARK_PYTHON")}
    step("session", found, started)
    rng = np.random.default_rng(3)
    n = 6000
    data = pd.DataFrame({"k": [f"key-{k:03d}" for k in rng.integers(0, 60, n)],
                         "t": rng.permutation(n).astype(float),  # distinct event times
                         "v": rng.integers(-1000, 1000, n)})
    frame = spark.createDataFrame(data).repartition(4)
    try:
        unshipped(spark, frame, found)
        batch_operators(spark, frame, found)
        unseen_state_path(spark, frame, work, found)
        stream(spark, work, found)
        changed_package(spark, work, found)
        spark = without_pyarrow(spark, master, work, no_pyarrow, found)
    finally:
        sys.stdout.write(json.dumps(found) + "\n")
        sys.stdout.flush()
        spark.stop()


if __name__ == "__main__":
    main()
