"""The one engine ladder (``_internal.engines``) of local_merge, keyed_process and keyed_agg:
each rung for each operator, with the reason it gives; each operator and its ``explain_*``
twin check a call with one function, so they refuse the same arguments with the same error;
``order_by`` is keyword-only in ``keyed_process`` as in ``keyed_foreach_batch``."""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark import keyed, merge, placement
from trilink_spark._internal.engines import (EngineLadder, EnginePlan, EngineRequest,
                                             request_engine, resolve_engine)
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark.merge.algebra.expressions import combinable
from trilink_spark.placement import physical_plan

#: Physical plan nodes that send rows to a Python worker.
PYTHON_NODES = ("MapInArrow", "MapInPandas", "ArrowEvalPython", "BatchEvalPython",
                "FlatMapGroupsInPandas")
MERGE_PY = "the Python engine merges inside each input partition (no exchange)"
MERGE_SPARK = ("a batch DataFrame in the groups mode, without order_by, whose aggregates all "
               "have a Spark form (count, sum, min, max, mean): Spark's partial aggregation "
               "in the JVM, no row crosses into Python (one exchange of the partial rows)")
QUANTITY = "the quantity mode (its flushes are Python's)"
KEYED_PY = "the keyed runtime in one Python task per partition"
KEYED_SPARK = ("KeyedWindowAggregate on a bounded DataFrame: each key's watermark is a running "
               "maximum over its earlier rows (a window function) and the on-time rows "
               "aggregate by key and window in Spark, with no Python worker")
SUB = ("a _Sub processor (only the built-in KeyedWindowAggregate has a Spark plan: a subclass "
       "may change its hooks)")
IN_PLACE = "each input partition is aggregated where it is, with no exchange"


def runs_python(df: Any) -> bool:
    plan = physical_plan(df)
    return any(node in plan for node in PYTHON_NODES)


class _Sub(tl.KeyedWindowAggregate):
    pass


@pytest.fixture
def conf(spark: Any) -> Iterator[Callable[[str, str], None]]:
    """Sets ``spark.trilink.<name>`` for one test; every one set is unset after it."""
    names: set[str] = set()

    def put(name: str, value: str) -> None:
        names.add(name)
        spark.conf.set(f"spark.trilink.{name}", value)

    yield put
    for name in names:
        spark.conf.unset(f"spark.trilink.{name}")


# ------------------------------------------------------------------ the ladder itself
#: A ladder with no conf: every rung but the conf's, without Spark.
TOY = EngineLadder(
    operator="toy", argument="engine", choices=("auto", "fast", "slow"),
    engines={"fast": "jvm", "slow": "py"}, preferred="jvm", fallback="py",
    runs={"jvm": "the JVM plan", "py": "Python tasks", "here": "where it is"},
    scope="numbers only")


def _never_asked() -> tuple[bool, str]:
    raise AssertionError("the input was checked where the request settles the engine")


def test_the_first_rung_is_the_argument_checked_by_choice() -> None:
    assert request_engine(TOY, None, "fast") == EngineRequest("fast", True, "engine='fast'")
    assert request_engine(TOY, None, "auto") == EngineRequest("auto", False, "engine='auto'")
    with pytest.raises(InvalidArgumentError,
                       match="^engine must be one of 'auto', 'fast', 'slow', got 'jvm'$"):
        request_engine(TOY, None, "jvm")
    with pytest.raises(InvalidArgumentTypeError,
                       match="^engine must be a str, one of 'auto', 'fast', 'slow', got "
                             "NoneType$"):
        request_engine(TOY, None, None)  # None is "auto" only where the ladder says so
    lenient = dataclasses.replace(TOY, none_is_auto=True)
    assert request_engine(lenient, None, None).engine == "auto"


def test_each_rung_of_the_ladder_gives_its_reason() -> None:
    auto, fast, slow = (request_engine(TOY, None, v) for v in ("auto", "fast", "slow"))
    # a value naming the other engine runs it, the input unchecked
    assert resolve_engine(TOY, slow, _never_asked) == EnginePlan(
        "py", "engine='slow': Python tasks")
    # what the input allows
    assert resolve_engine(TOY, auto, lambda: (True, "numbers")) == EnginePlan(
        "jvm", "engine='auto': numbers")
    assert resolve_engine(TOY, fast, lambda: (True, "numbers")) == EnginePlan(
        "jvm", "engine='fast': numbers")
    # the fallback, with the reason
    assert resolve_engine(TOY, auto, lambda: (False, "a string")) == EnginePlan(
        "py", "engine='auto': a string: Python tasks")
    with pytest.raises(InvalidArgumentError,
                       match="^engine='fast' cannot run a string; it runs numbers only: use "
                             "engine='auto' or engine='slow'$"):
        resolve_engine(TOY, fast, lambda: (False, "a string"))
    # an input that fixes the engine whatever was asked
    assert resolve_engine(TOY, auto, _never_asked, ("here", "a placed frame")) == EnginePlan(
        "here", "engine='auto': a placed frame: where it is")
    assert resolve_engine(TOY, fast, _never_asked, ("here", "a placed frame")) == EnginePlan(
        "here", "engine='fast' does not apply to a placed frame: where it is")


def test_a_ladder_that_forces_runs_the_preferred_engine_unchecked() -> None:
    forcing = dataclasses.replace(TOY, forces=True)
    assert resolve_engine(forcing, request_engine(forcing, None, "fast"),
                          _never_asked) == EnginePlan("jvm", "engine='fast': the JVM plan")


def test_the_three_operators_share_the_one_plan() -> None:
    assert merge.EnginePlan is EnginePlan and merge.MergeEnginePlan is EnginePlan
    assert keyed.KeyedProcessPlan is EnginePlan
    assert issubclass(placement.KeyedAggPlan, EnginePlan)
    assert placement.KeyedAggPlan("combine", "r").combine
    assert not placement.KeyedAggPlan("exact", "r").combine


# ------------------------------------------------------------------ local_merge
def test_local_merge_rungs_and_reasons(spark: Any, conf: Any) -> None:
    df = spark.createDataFrame([(1, 1, 1.0), (2, 2, 2.0)], "k long, t long, v double")
    count = {"n": ("count", None)}

    def plan(**kw: Any) -> EnginePlan:
        return merge.explain_local_merge(df, "k", "t", 10, count, **kw)

    assert plan(engine="python") == EnginePlan("python", f"engine='python': {MERGE_PY}")
    assert plan() == EnginePlan("spark", f"engine='auto': {MERGE_SPARK}")
    assert plan(engine=None) == plan()
    assert plan(engine="spark") == EnginePlan("spark", f"engine='spark': {MERGE_SPARK}")
    assert plan(mode="quantity") == EnginePlan("python", f"engine='auto': {QUANTITY}: {MERGE_PY}")
    with pytest.raises(InvalidArgumentError) as refused:
        plan(mode="quantity", engine="spark")
    assert str(refused.value) == (
        f"engine='spark' cannot run {QUANTITY}; it runs batch DataFrames in the groups mode "
        "without order_by, with count, sum, min, max and mean: use engine='auto' or "
        "engine='python'")
    conf("mergeEngine", "python")
    assert plan() == EnginePlan("python", f"spark.trilink.mergeEngine=python: {MERGE_PY}")
    assert plan(engine="spark").engine == "spark"  # the argument wins over the conf
    conf("mergeEngine", "spark")
    assert plan() == EnginePlan("spark", f"spark.trilink.mergeEngine=spark: {MERGE_SPARK}")
    assert plan(mode="quantity") == EnginePlan(
        "python", f"spark.trilink.mergeEngine=spark does not apply to {QUANTITY}: {MERGE_PY}")
    conf("mergeEngine", "jvm")
    with pytest.raises(InvalidArgumentError,
                       match="^spark.trilink.mergeEngine must be one of 'auto', 'python', "
                             "'spark', got 'jvm'$"):
        plan()


# ------------------------------------------------------------------ keyed_process
def test_keyed_process_rungs_and_reasons(spark: Any, conf: Any) -> None:
    df = spark.createDataFrame([(1, 1.0, 2.0)], "k bigint, t double, v double")
    agg = tl.KeyedWindowAggregate(10.0, value="v")

    def plan(processor: Any = agg, **kw: Any) -> EnginePlan:
        return keyed.explain_keyed_process(df, "k", processor, **kw)

    assert plan(engine="python") == EnginePlan("python", f"engine='python': {KEYED_PY}")
    assert plan() == EnginePlan("spark", f"engine='auto': {KEYED_SPARK}")
    assert plan(engine="spark") == EnginePlan("spark", f"engine='spark': {KEYED_SPARK}")
    assert plan(_Sub(10.0)) == EnginePlan("python", f"engine='auto': {SUB}: {KEYED_PY}")
    with pytest.raises(InvalidArgumentError) as refused:
        plan(_Sub(10.0), engine="spark")
    assert str(refused.value) == (
        f"engine='spark' cannot run {SUB}; it runs the built-in KeyedWindowAggregate with "
        "numeric value columns (or none) on a frame not declared keyed_by_source: use "
        "engine='auto' or engine='python'")
    source = keyed.explain_keyed_process(placement.keyed_by_source(df, "k"), "k", agg)
    assert source.engine == "python" and source.reason.startswith(
        "engine='auto': a frame declared keyed_by_source (the runtime processes each input "
        "partition where it was read")
    conf("keyedEngine", "python")
    assert plan() == EnginePlan("python", f"spark.trilink.keyedEngine=python: {KEYED_PY}")
    assert plan(engine="spark").engine == "spark"  # the argument wins over the conf
    conf("keyedEngine", "spark")
    assert plan() == EnginePlan("spark", f"spark.trilink.keyedEngine=spark: {KEYED_SPARK}")
    assert plan(_Sub(10.0)) == EnginePlan(
        "python", f"spark.trilink.keyedEngine=spark does not apply to {SUB}: {KEYED_PY}")
    conf("keyedEngine", "jvm")
    with pytest.raises(InvalidArgumentError,
                       match="^spark.trilink.keyedEngine must be one of 'auto', 'spark', "
                             "'python', got 'jvm'$"):
        plan()


def test_keyed_process_runs_what_explain_says_and_logs_it(
        spark: Any, caplog: pytest.LogCaptureFixture) -> None:
    df = spark.createDataFrame([(1, 1.0, 2.0), (1, 20.0, 3.0), (2, 2.0, 4.0)],
                               "k bigint, t double, v double")
    for processor, kw in ((tl.KeyedWindowAggregate(10.0, value="v"), {}),
                          (tl.KeyedWindowAggregate(10.0, value="v"), {"engine": "python"}),
                          (_Sub(10.0, value="v"), {"order_by": "t", "strategy": "hash",
                                                   "num_partitions": 3})):
        said = keyed.explain_keyed_process(df, "k", processor, event_time="t", delay=1.0, **kw)
        with caplog.at_level(logging.INFO, logger="trilink_spark.keyed.run.window_plan"):
            caplog.clear()
            out = tl.keyed_process(df, "k", "t", processor, 1.0, **kw)
        assert runs_python(out) == (said.engine == "python"), (kw, said)
        assert caplog.messages == [f"keyed_process on 'k': the {said.engine} engine "
                                   f"({said.reason})"]


def test_order_by_is_keyword_only(spark: Any) -> None:
    df = spark.createDataFrame([(1, 1.0, 5.0)], "k bigint, t double, arrival double")
    agg = tl.KeyedWindowAggregate(10.0)
    with pytest.raises(TypeError, match="positional"):
        tl.keyed_process(df, "k", "t", agg, 1.0, "arrival")  # type: ignore[misc]
    with pytest.raises(TypeError, match="positional"):
        keyed.explain_keyed_process(df, "k", agg, "arrival")  # type: ignore[misc]
    assert tl.keyed_process(df, "k", "t", agg, 1.0, order_by="arrival").count() == 1
    for function in (tl.keyed_process, keyed.explain_keyed_process, tl.keyed_foreach_batch):
        parameter = inspect.signature(function).parameters["order_by"]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, function


# ------------------------------------------------------------------ keyed_agg
def test_keyed_agg_rungs_and_reasons(spark: Any) -> None:
    df = spark.createDataFrame([(1, 1.0), (None, 2.0)], "k bigint, v double")

    def plan(*exprs: Any, frame: Any = df, **kw: Any) -> Any:
        return placement.explain_keyed_agg(frame, "k", *(exprs or (F.sum("v"),)), **kw)

    assert plan(combine="always") == placement.KeyedAggPlan(
        "combine", "combine='always': Spark's partial aggregation, hash placement")
    assert plan(combine="never") == placement.KeyedAggPlan(
        "exact", "combine='never': exact placement by the strategy")
    _, fixed = combinable((F.sum("v"),), df)
    assert plan() == placement.KeyedAggPlan("combine", f"combine='auto': {fixed}")
    _, unbounded = combinable((F.collect_list("v"),), df)
    assert plan(F.collect_list("v")) == placement.KeyedAggPlan(
        "exact", f"combine='auto': {unbounded}: exact placement by the strategy")
    # forced: combine='always' takes the combine even where auto would not
    assert plan(F.collect_list("v"), combine="always").engine == "combine"
    assert plan(null_policy="partition0") == placement.KeyedAggPlan(
        "exact", "combine='auto': null_policy='partition0', which puts the null key's group "
                 "on partition 0, where Spark's combine does not: exact placement by the "
                 "strategy")
    assert plan(null_policy="partition0", combine="always").engine == "combine"
    declared = placement.keyed_by_source(df, "k")
    assert plan(frame=declared) == placement.KeyedAggPlan(
        "in_place", f"combine='auto': a frame declared keyed_by_source: {IN_PLACE}")
    assert plan(frame=declared, combine="always") == placement.KeyedAggPlan(
        "in_place", f"combine='always' does not apply to a frame declared keyed_by_source: "
                    f"{IN_PLACE}")


def test_keyed_agg_runs_what_explain_says_and_logs_it(
        spark: Any, caplog: pytest.LogCaptureFixture) -> None:
    df = spark.createDataFrame([(1, 1.0), (None, 2.0), (2, 3.0)], "k bigint, v double")
    titles = {"combine": "Spark's map-side combine", "exact": "exact placement"}
    for kw in ({}, {"null_policy": "partition0"}, {"combine": "never"}):
        said = placement.explain_keyed_agg(df, "k", F.sum("v"), strategy="hash",
                                           num_partitions=3, **kw)
        with caplog.at_level(logging.INFO, logger="trilink_spark.placement.keyed"):
            caplog.clear()
            out = tl.keyed_agg(df, "k", F.sum("v"), strategy="hash", num_partitions=3, **kw)
        assert caplog.messages == [f"keyed_agg on 'k': {titles[said.engine]} ({said.reason})"]
        # exact placement groups by the placement's partition column
        assert ("_tl_" in physical_plan(out)) == (said.engine == "exact"), (kw, said)


# ------------------------------------------------------------------ same refusals
def _same_refusal(calls: list[Callable[[], Any]], operator: str, explain: str) -> None:
    """Each call raises, with the same error type and message (the streaming refusal names
    the call it refuses)."""
    errors = []
    for call in calls:
        try:
            call()
        except Exception as err:  # noqa: BLE001 - compared below
            errors.append(err)
    assert len(errors) == len(calls), "a call did not refuse"
    kinds = {type(e) for e in errors}
    messages = {str(e).replace(explain, operator) for e in errors}
    assert len(kinds) == 1 and len(messages) == 1, [f"{type(e).__name__}: {e}" for e in errors]


def test_keyed_process_and_its_explain_refuse_alike(spark: Any, conf: Any) -> None:
    df = spark.createDataFrame([(1, 1.0, 2.0, "x")], "k bigint, t double, v double, s string")
    dated = spark.createDataFrame([(1, 1.0, dt.date(2020, 1, 1))], "k bigint, t double, d date")
    agg = tl.KeyedWindowAggregate(10.0, value="v")
    stream = spark.readStream.format("rate").load().selectExpr("value AS k", "0.0 AS t")
    bad: list[tuple[Any, Any, dict[str, Any]]] = [
        (df, object(), {}),
        (df, agg, {"engine": "jvm"}),
        (df, agg, {"engine": None}),
        (df, _Sub(10.0), {"engine": "spark"}),
        (df, agg, {"order_by": "nope"}),
        (df, tl.KeyedWindowAggregate(10.0, value="nope", aggs=("sum",)), {}),
        (dated, tl.KeyedWindowAggregate(10.0, value="d", aggs=("max",)), {}),
        (df, agg, {"strategy": "nope"}),
        (df, agg, {"strategy": 3}),
        (df, agg, {"num_partitions": 0}),
        (df, agg, {"strategy": tl.HashPartitioner(4), "num_partitions": 3}),
        (df, agg, {"null_policy": "drop"}),
        (df, agg, {"delay": "5 fortnights"}),
        (df, agg, {"idle_timeout": -1.0}),
        (df, agg, {"event_time": "nope"}),
        (df, agg, {"event_time": "s"}),
        (stream, agg, {}),
    ]
    for frame, processor, kw in bad:
        args = {"event_time": "t", "delay": 1.0, **kw}
        event_time, delay = args.pop("event_time"), args.pop("delay")
        _same_refusal([
            lambda: tl.keyed_process(frame, "k", event_time, processor, delay, **args),
            lambda: keyed.explain_keyed_process(frame, "k", processor, event_time=event_time,
                                                delay=delay, **args),
        ], "keyed_process", "explain_keyed_process")
    conf("keyedEngine", "fast")
    _same_refusal([lambda: tl.keyed_process(df, "k", "t", agg, 1.0),
                   lambda: keyed.explain_keyed_process(df, "k", agg)],
                  "keyed_process", "explain_keyed_process")


def test_keyed_agg_and_its_explain_refuse_alike(spark: Any) -> None:
    df = spark.createDataFrame([(1, 1.0)], "k bigint, v double")
    stream = spark.readStream.format("rate").load().selectExpr("value AS k", "1.0 AS v")
    reserved = df.withColumn("_tl_x", F.lit(1))
    bad: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = [
        (df, (), {}),
        (df, (F.sum("v"),), {"combine": "sometimes"}),
        (df, (F.sum("v"),), {"combine": None}),
        (df, (F.sum("v"),), {"colour": "red"}),
        (df, (F.sum("v"),), {"strategy": "nope"}),
        (df, (F.sum("v"),), {"num_partitions": 0}),
        (df, (F.sum("v"),), {"null_policy": "drop"}),
        (df, (F.sum("v"),), {"fit": "some"}),
        (reserved, (F.sum("v"),), {}),
        (placement.keyed_by_source(stream, "k"), (F.sum("v"),), {}),
    ]
    key = "k"
    for frame, exprs, kw in bad:
        _same_refusal([lambda: tl.keyed_agg(frame, key, *exprs, **kw),
                       lambda: placement.explain_keyed_agg(frame, key, *exprs, **kw)],
                      "keyed_agg", "explain_keyed_agg")
    _same_refusal([lambda: tl.keyed_agg(df, "nope", F.sum("v")),
                   lambda: placement.explain_keyed_agg(df, "nope", F.sum("v"))],
                  "keyed_agg", "explain_keyed_agg")


def test_local_merge_and_its_explain_refuse_alike(spark: Any, conf: Any) -> None:
    df = spark.createDataFrame([(1, 1, 1.0)], "k long, t long, v double")
    count = {"n": ("count", None)}
    bad: list[dict[str, Any]] = [
        {"mode": "often"}, {"engine": "jvm"}, {"engine": 1}, {"max_groups": 0},
        {"mode": "periodic"}, {"order_by": "nope"}, {"mode": "quantity", "engine": "spark"},
        {"slot": -1}]
    for kw in bad:
        args = {"slot": 10, **kw}
        slot = args.pop("slot")
        _same_refusal([lambda: tl.local_merge(df, "k", "t", slot, count, **args),
                       lambda: merge.explain_local_merge(df, "k", "t", slot, count, **args)],
                      "local_merge", "explain_local_merge")
    conf("mergeEngine", "fast")
    _same_refusal([lambda: tl.local_merge(df, "k", "t", 10, count),
                   lambda: merge.explain_local_merge(df, "k", "t", 10, count)],
                  "local_merge", "explain_local_merge")
