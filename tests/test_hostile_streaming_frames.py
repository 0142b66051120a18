"""Streaming DataFrames against the decisions of tests/test_streaming_frames.py, on classic
and Spark Connect sessions: a refusal starts no Spark job and touches no state path (counted
by the driver's scheduler, whatever thread or job group ran it), the calls that run on a
stream give what the same call gives on the whole input as one batch when the stream comes
in several micro-batches, and no public DataFrame API, the ``foreachBatch`` callables
included, is left without a decision."""

from __future__ import annotations

import inspect
import itertools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark import placement
from trilink_spark.errors import StreamingNotSupportedError
from trilink_spark.merge import local_merge_foreach_batch
from trilink_spark.switching import adaptive_foreach_batch
from test_streaming_frames import CASES, Count, _public_modules, _takes_a_frame

pytestmark = pytest.mark.connect
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # _per_key_rows ships to workers

SCHEMA = "k long, t double, v double"
FILES = 3


def _sink(df: Any, batch_id: int) -> None:
    df.write.format("noop").mode("overwrite").save()


#: Refusals the table of tests/test_streaming_frames.py does not hold: the callables that
#: keyed_foreach_batch, local_merge_foreach_batch and adaptive_foreach_batch return, given the
#: stream itself, and two refusals that raised a plain InvalidArgumentError.
HOSTILE_REFUSALS: list[tuple[str, str, Callable[[Any, Path], Any], str]] = [
    ("KeyedBatchFunction.__call__", "stream given",
     lambda s, p: tl.keyed_foreach_batch(_sink, "k", "t", Count(), 2.0, str(p / "kfb"))(s, 0),
     "KeyedBatchFunction|writeStream.foreachBatch(run)"),
    ("LocalMergeBatchFunction.__call__", "stream given",
     lambda s, p: local_merge_foreach_batch(_sink, "k", "t", 10.0, {"n": ("count", None)},
                                            str(p / "lm"))(s, 0),
     "LocalMergeBatchFunction|writeStream.foreachBatch(run)"),
    ("AdaptiveBatchFunction.__call__", "stream given, no observation",
     lambda s, p: adaptive_foreach_batch(_sink, tl.AdaptivePartitioner(4), "k",
                                         observe=False)(s, 0),
     "AdaptiveBatchFunction|writeStream.foreachBatch(run)"),
    ("local_merge", "engine='spark'",
     lambda s, p: tl.local_merge(s, "k", "t", 10.0, {"n": ("count", None)}, engine="spark"),
     "local_merge(engine='spark')|engine='python'"),
    ("ahead_key_by", "table strategy, nothing learnt",
     lambda s, p: placement.ahead_key_by(s, "k", "least_count", 4),
     "ahead_key_by(strategy='least_count')|assignment_path"),
]


def test_no_public_dataframe_call_is_left_without_a_decision() -> None:
    """As test_every_dataframe_api_has_a_decision, with the ``__call__`` of public classes:
    the ``foreachBatch`` callables take a DataFrame too (``run(stream_df, 0)``)."""
    found: set[str] = set()
    for module in _public_modules():
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name, None)
            if inspect.isclass(obj) and obj.__module__.startswith("trilink_spark"):
                call = obj.__dict__.get("__call__")
                if inspect.isfunction(call) and _takes_a_frame(call):
                    found.add(call.__qualname__)
    decided = {api for api, *_ in CASES} | {api for api, *_ in HOSTILE_REFUSALS}
    assert found, "no public __call__ taking a DataFrame was found: the scan is broken"
    assert found - decided == set()


@pytest.fixture(scope="module")
def source(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FILES parquet files of ``k long, t double, v double`` (40 rows each, 6 keys)."""
    root = tmp_path_factory.mktemp("hostile-stream-src")
    rng = np.random.default_rng(7)
    for i in range(FILES):
        part = pd.DataFrame({"k": rng.integers(0, 6, 40).astype("int64"),
                             "t": np.arange(40) + 100.0 * i, "v": rng.random(40)})
        spark.createDataFrame(part).coalesce(1).write.parquet(str(root / f"part={i}"))
    return root


def _stream(spark: Any, source: Path) -> Any:
    """One micro-batch per file."""
    return (spark.readStream.schema(SCHEMA).option("recursiveFileLookup", "true")
            .option("maxFilesPerTrigger", 1).parquet(str(source)))


def _batch(spark: Any, source: Path) -> Any:
    return spark.read.schema(SCHEMA).option("recursiveFileLookup", "true").parquet(str(source))


def _jobs_started() -> int:
    """Jobs the driver's scheduler has started so far (any thread, any job group); a local
    Spark Connect server runs its driver in this process too."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    assert sc is not None, "no driver in this process to count jobs on"
    return int(sc._jsc.sc().dagScheduler().numTotalJobs())


def test_the_job_count_sees_a_job(spark: Any) -> None:
    """The control of the refusal test: a job run on the session moves the count."""
    before = _jobs_started()
    assert spark.range(3).count() == 3
    assert _jobs_started() > before


REFUSALS = [(api, label, lambda s, p, call=call: call(s), detail)
            for api, label, verdict, call, detail in CASES if verdict == "refuses"]


@pytest.mark.parametrize("api,label,call,detail", REFUSALS + HOSTILE_REFUSALS,
                         ids=[f"{c[0]}[{c[1]}]" for c in REFUSALS + HOSTILE_REFUSALS])
def test_a_refusal_starts_no_job_and_writes_no_state(spark: Any, source: Path, tmp_path: Path,
                                                     api: str, label: str,
                                                     call: Callable[[Any, Path], Any],
                                                     detail: str) -> None:
    stream = _stream(spark, source)
    state = tmp_path / "state"
    before = _jobs_started()
    with pytest.raises(StreamingNotSupportedError) as err:
        call(stream, state)
    assert _jobs_started() == before, f"{api} ran a job before refusing"
    # making a foreachBatch callable may create its state folder; the refused call writes
    # nothing in it (it claimed the state path and wrote a placement before)
    assert [p for p in state.rglob("*") if not p.is_dir()] == [], f"{api} wrote state first"
    message = str(err.value)
    assert "does not run on a streaming DataFrame" in message
    for fragment in detail.split("|"):
        assert fragment in message, (fragment, message)


_names = itertools.count()


def _run(spark: Any, out: Any, mode: str, checkpoint: Path) -> pd.DataFrame:
    """What a query of ``out`` wrote to a memory table, after one micro-batch per file."""
    name = f"tl_hostile_stream_{next(_names)}"
    query = (out.writeStream.format("memory").queryName(name).outputMode(mode)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        query.awaitTermination(180)
        assert query.exception() is None
        # p.numInputRows: a Connect progress holds the count per source only
        assert len([p for p in query.recentProgress if p.numInputRows]) == FILES
        return spark.table(name).toPandas()
    finally:
        query.stop()
        spark.catalog.dropTempView(name)


def _same(stream: pd.DataFrame, batch: pd.DataFrame, keys: list[str]) -> None:
    columns = sorted(batch.columns)
    assert sorted(stream.columns) == columns
    pd.testing.assert_frame_equal(
        stream[columns].sort_values(keys).reset_index(drop=True),
        batch[columns].sort_values(keys).reset_index(drop=True), check_dtype=False)


def _per_key_rows(pdf: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"k": [pdf["k"].iloc[0]], "n": [len(pdf)]})


AGGS = {"n": ("count", None), "sv": ("sum", "v"), "mv": ("mean", "v"), "mx": ("max", "v"),
        "first_t": ("min", "t")}

#: (what, the call, output mode, the columns a row is known by, how a stream's output is
#: read: None, or a fold of its micro-batches' rows).
RUNS: list[tuple[str, Callable[[Any], Any], str, list[str], Any]] = [
    ("key_by hash", lambda df: tl.key_by(df, "k", "hash", 4), "append", ["k", "t"], None),
    ("keyed_agg placed", lambda df: tl.keyed_agg(
        df, "k", F.count("*").alias("n"), F.max("v").alias("mx"), strategy="hash",
        num_partitions=4), "complete", ["k"], None),
    ("local_merge + merge_partials", lambda df: tl.merge_partials(
        tl.local_merge(df, "k", "t", 10.0, AGGS, quantity=7), "k", AGGS), "complete", ["k"],
     None),
    # a function of each key's rows of one micro-batch: the counts add up to the batch's
    ("keyed_apply", lambda df: tl.keyed_apply(df, "k", _per_key_rows, "k long, n long",
                                              strategy="hash", num_partitions=4),
     "append", ["k"], lambda out: out.groupby("k", as_index=False)["n"].sum()),
]


@pytest.mark.parametrize("what,call,mode,keys,fold", RUNS, ids=[r[0] for r in RUNS])
def test_what_runs_on_a_stream_gives_the_batch_result(spark: Any, source: Path,
                                                      tmp_path: Path, what: str,
                                                      call: Callable[[Any], Any], mode: str,
                                                      keys: list[str], fold: Any) -> None:
    streamed = _run(spark, call(_stream(spark, source)), mode, tmp_path / "checkpoint")
    if fold is not None:
        streamed = fold(streamed)
    _same(streamed, call(_batch(spark, source)).toPandas(), keys)
