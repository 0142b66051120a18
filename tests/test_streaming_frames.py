"""Every public call that takes a DataFrame, on a streaming DataFrame: it either returns a
streaming frame that a query runs, inspects the frame without running a job, or refuses it when
called (StreamingNotSupportedError naming the route). A call added later without a decision
here fails ``test_every_dataframe_api_has_a_decision``."""

from __future__ import annotations

import importlib
import inspect
import itertools
import pkgutil
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark import cli, columns, eventtime, keyed, merge, placement
from trilink_spark.errors import StreamingNotSupportedError
from trilink_spark.kafka import write_kafka
from trilink_spark.merge import Combine

ROWS = 24


class Count(tl.KeyedWatermarkProcessFunction):
    output_schema = "k long, n long"

    def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
        return [(key, len(rows))]


def _hash(n: int = 4) -> Any:
    return tl.HashPartitioner(n)


def _bits(values: Any) -> float:
    return float(np.max(values))


#: One case: (API, what is tried, verdict, call on the stream, and for "works" the output mode
#: of the query, for "refuses" what the message must say, "|"-separated: the name of what was
#: refused, then the route).
#: Verdicts: "works" (a streaming frame a query runs), "inspects" (an answer, no Spark job),
#: "refuses" (StreamingNotSupportedError when called, no Spark job).
CASES: list[tuple[str, str, str, Callable[[Any], Any], str]] = [
    ("key_by", "hash", "works", lambda s: tl.key_by(s, "k", "hash", 4), "append"),
    ("key_by", "auto", "refuses", lambda s: tl.key_by(s, "k"), "strategy='auto'|fit='none'"),
    ("keyed_agg", "combined", "works",
     lambda s: tl.keyed_agg(s, "k", F.count("*").alias("n")), "update"),
    ("keyed_agg", "placed", "works",
     lambda s: tl.keyed_agg(s, "k", F.collect_list("v").alias("vs"), strategy="hash",
                            num_partitions=4), "update"),
    ("keyed_agg", "placed, auto", "refuses",
     lambda s: tl.keyed_agg(s, "k", F.collect_list("v").alias("vs")),
     "strategy='auto'|fit='none'"),
    ("keyed_agg", "keyed_by_source", "refuses",
     lambda s: tl.keyed_agg(placement.keyed_by_source(s, "k"), "k", F.count("*").alias("n")),
     "keyed_by_source frame|foreachBatch"),
    ("keyed_apply", "hash", "works",
     lambda s: tl.keyed_apply(s, "k", lambda pdf: pdf.head(1), "k long, t double, v double",
                              strategy="hash", num_partitions=4), "append"),
    ("keyed_watermark", "n_keys=1", "refuses",
     lambda s: tl.keyed_watermark(s, "k", "t", 2.0),
     "keyed_watermark|keyed_foreach_batch(sink, key, event_time, processor"),
    ("keyed_process", "per key", "refuses",
     lambda s: tl.keyed_process(s, "k", "t", Count(), 2.0),
     "keyed_process|keyed_foreach_batch(sink, key, event_time, processor"),
    ("local_merge", "quantity", "works",
     lambda s: tl.local_merge(s, "k", "t", 10.0, {"n": ("count", None)}), "append"),
    ("merge_partials", "Spark merge", "works",
     lambda s: tl.merge_partials(tl.local_merge(s, "k", "t", 10.0, {"n": ("count", None)}),
                                 "k", {"n": ("count", None)}), "update"),
    ("merge_partials", "Python Combine", "refuses",
     lambda s: tl.merge_partials(
         tl.local_merge(s, "k", "t", 10.0, {"m": (Combine(_bits), "v")}), "k",
         {"m": (Combine(_bits), "v")}), "merge_partials|foreachBatch"),
    ("global_merge", "driver", "refuses",
     lambda s: tl.global_merge(s, "k", {"n": ("count", None)}),
     "global_merge|foreachBatch"),
    ("explain_keyed_process", "engine", "refuses",
     lambda s: keyed.explain_keyed_process(s, "k", tl.KeyedWindowAggregate(10.0)),
     "keyed_process|keyed_foreach_batch(sink, key, event_time, processor"),
    ("explain_local_merge", "engine", "inspects",
     lambda s: merge.explain_local_merge(s, "k", "t", 10.0, {"n": ("count", None)}), ""),
    ("explain_global_merge", "engine", "refuses",
     lambda s: merge.explain_global_merge(s, "k", {"n": ("count", None)}),
     "global_merge|foreachBatch"),
    ("partition_balance", "frame", "refuses", lambda s: tl.partition_balance(s),
     "partition_balance|foreachBatch"),
    ("resolve_strategy", "hash", "inspects", lambda s: tl.resolve_strategy(s, "k", "hash", 4), ""),
    ("resolve_strategy", "auto", "refuses", lambda s: tl.resolve_strategy(s, "k"),
     "strategy='auto'|fit='none'"),
    ("resolve_strategy", "table to fit", "refuses",
     lambda s: tl.resolve_strategy(s, "k", "least_count", 4),
     "fitting a table strategy|fit='none'"),
    ("AdaptivePartitioner.observe_df", "sample", "refuses",
     lambda s: tl.AdaptivePartitioner(4).observe_df(s, "k"),
     "observe_df|adaptive_foreach_batch"),
    ("AdaptivePartitioner.before_batch", "observe", "refuses",
     lambda s: tl.AdaptivePartitioner(4).before_batch(s, "k", 0),
     "observe_df|adaptive_foreach_batch"),
    ("Partitioner.before_batch", "no-op", "inspects",
     lambda s: _hash().before_batch(s, "k", 0), ""),
    ("write_kafka", "append", "refuses",
     lambda s: write_kafka(s.selectExpr("string(v) AS value"), "127.0.0.1:1", "topic"),
     "write_kafka|writeStream.format('trilink-kafka')"),
    ("run_balance", "cli", "refuses",
     lambda s: cli.run_balance(s, "k", "stream", 4, 1.0, 0, False),
     "run_balance|foreachBatch"),
    ("key_kind", "schema", "inspects", lambda s: placement.key_kind(s, "k"), ""),
    ("with_partition_id", "hash", "works",
     lambda s: placement.with_partition_id(s, "k", _hash()), "append"),
    ("explain_keyed_agg", "plan", "inspects",
     lambda s: placement.explain_keyed_agg(s, "k", F.countDistinct("v")), ""),
    ("is_keyed_by_source", "schema", "inspects",
     lambda s: placement.is_keyed_by_source(s, "k"), ""),
    ("keyed_by_source", "declare", "works", lambda s: placement.keyed_by_source(s, "k"), "append"),
    ("keyed_by_source", "verify", "refuses",
     lambda s: placement.keyed_by_source(s, "k", verify=True),
     "keyed_by_source(verify=True)|foreachBatch"),
    ("ahead_key_by", "hash", "works", lambda s: placement.ahead_key_by(s, "k", "hash", 4),
     "append"),
    ("ahead_key_by", "auto", "refuses", lambda s: placement.ahead_key_by(s, "k", "auto", 4),
     "ahead_key_by(strategy='auto')|Name a strategy"),
    ("physical_plan", "plan", "inspects", lambda s: placement.physical_plan(s), ""),
    ("shuffle_exchanges", "plan", "inspects",
     lambda s: placement.shuffle_exchanges(tl.key_by(s, "k", "hash", 4)), ""),
    # a stream is never taken as placed: False at once, nothing planned
    ("already_placed", "hash", "inspects",
     lambda s: {False: "not placed"}[placement.already_placed(s, "k", _hash())], ""),
    ("time_kind", "schema", "inspects", lambda s: eventtime.time_kind(s, "t"), ""),
    ("event_time_micros", "column", "inspects", lambda s: eventtime.event_time_micros(s, "t"), ""),
    ("event_time_whole", "column", "inspects", lambda s: eventtime.event_time_whole(s, "t"), ""),
    ("require_columns", "schema", "inspects", lambda s: columns.require_columns(s, ["k"]), ""),
    ("check_user_columns", "schema", "inspects", lambda s: columns.check_user_columns(s), ""),
    ("check_atomic_key", "schema", "inspects", lambda s: columns.check_atomic_key(s, "k"), ""),
    ("strategy_partitions", "metadata", "inspects",
     lambda s: columns.strategy_partitions(tl.key_by(s, "k", "hash", 4)), ""),
    ("python_input", "aliases", "works",
     lambda s: columns.python_input(s.withColumnRenamed("v", "v.x"))[0], "append"),
]


def _public_modules() -> Iterator[Any]:
    yield tl
    for info in pkgutil.iter_modules(tl.__path__):
        if not info.name.startswith("_"):
            yield importlib.import_module(f"trilink_spark.{info.name}")


def _takes_a_frame(func: Any) -> bool:
    """The first parameter (after ``self``) is a Spark DataFrame: named ``df``, or annotated
    ``DataFrame`` (``pd.DataFrame`` is pandas')."""
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return False
    if params and params[0].name == "self":
        params = params[1:]
    if not params:
        return False
    first = params[0]
    return first.name == "df" or bool(re.match(r"(pyspark\.sql\.)?DataFrame\b",
                                               str(first.annotation)))


def dataframe_apis() -> set[str]:
    """The qualified names of every public function and public method, reachable from the
    ``__all__`` of the package and its public modules, whose first parameter is a Spark
    DataFrame."""
    found: set[str] = set()
    for module in _public_modules():
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name, None)
            if inspect.isfunction(obj):
                candidates = [obj]
            elif inspect.isclass(obj) and obj.__module__.startswith("trilink_spark"):
                candidates = [f for n, f in inspect.getmembers(obj, inspect.isfunction)
                              if not n.startswith("_")]
            else:
                continue
            found.update(f.__qualname__ for f in candidates if _takes_a_frame(f))
    return found


def test_every_dataframe_api_has_a_decision() -> None:
    decided = {api for api, *_ in CASES}
    found = dataframe_apis()
    assert found - decided == set(), "DataFrame APIs without a streaming decision in CASES"
    assert decided - found == set(), "CASES names calls that are no longer public DataFrame APIs"


def test_every_refusal_goes_through_the_one_helper() -> None:
    """No module raises its own streaming refusal: ``isStreaming`` tests that raise are the
    helper's (``_internal.validation.refuse_streaming``)."""
    root = Path(tl.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        text = path.read_text()
        if "StreamingNotSupportedError(" in text and path.name not in ("errors.py",
                                                                       "validation.py"):
            offenders.append(str(path.relative_to(root)))
    assert offenders == []


@pytest.fixture(scope="module")
def source(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two parquet files of ``k long, t double, v double`` (12 rows each, 4 keys)."""
    root = tmp_path_factory.mktemp("stream-src")
    for i in range(2):
        part = pd.DataFrame({"k": np.arange(12) % 4 + 0, "t": np.arange(12) + 12.0 * i,
                             "v": np.linspace(0, 1, 12)})
        spark.createDataFrame(part).coalesce(1).write.parquet(str(root / f"part={i}"))
    return root


def _stream(spark: Any, source: Path) -> Any:
    return (spark.readStream.schema("k long, t double, v double")
            .option("recursiveFileLookup", "true").parquet(str(source)))


def _no_job(spark: Any, call: Callable[[], Any]) -> Any:
    """``call()``'s result (or exception, re-raised), asserting it ran no Spark job."""
    sc = spark.sparkContext
    group = "tl-streaming-frames"
    sc.setJobGroup(group, "no job expected")
    try:
        return call()
    finally:
        sc.setJobGroup("", "")
        assert list(sc.statusTracker().getJobIdsForGroup(group)) == []


_names = itertools.count()


@pytest.mark.parametrize(
    "api,label,verdict,call,detail", CASES, ids=[f"{c[0]}[{c[1]}]" for c in CASES])
def test_a_streaming_frame(spark: Any, source: Path, tmp_path: Path, api: str, label: str,
                           verdict: str, call: Callable[[Any], Any], detail: str) -> None:
    stream = _stream(spark, source)
    if verdict == "refuses":
        with pytest.raises(StreamingNotSupportedError) as err:
            _no_job(spark, lambda: call(stream))
        message = str(err.value)
        assert isinstance(err.value, TypeError) and isinstance(err.value, tl.TrilinkError)
        assert "does not run on a streaming DataFrame" in message
        for fragment in detail.split("|"):  # what was refused, then the route
            assert fragment in message
        return
    if verdict == "inspects":
        got = _no_job(spark, lambda: call(stream))
        assert not getattr(got, "isStreaming", False)  # an answer, not a frame to run
        return
    assert verdict == "works"
    out = call(stream)
    assert out.isStreaming
    name = f"tl_streaming_frames_{next(_names)}"
    query = (out.writeStream.format("memory").queryName(name).outputMode(detail)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(120)
        assert query.exception() is None
        read = sum(p["numInputRows"] for p in query.recentProgress)
        assert read == ROWS
        assert spark.table(name).count() > 0
    finally:
        query.stop()
        spark.catalog.dropTempView(name)
