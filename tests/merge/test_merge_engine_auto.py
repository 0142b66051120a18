"""``engine="auto"``, the default of ``local_merge`` and ``global_merge``: Spark's JVM engine
wherever the call can run there, the Python engine elsewhere, each choice with its reason;
``explain_local_merge`` / ``explain_global_merge`` give what the call runs (checked against
the physical plan, or against the operator timings only the Python engine writes), and the
conf ``spark.trilink.mergeEngine`` forces an engine when the call gives none."""

from __future__ import annotations

import logging
import math
from collections import Counter
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import ArithmeticOverflowError, InvalidArgumentError
from trilink_spark.errors import MissingColumnError, StreamingNotSupportedError
from trilink_spark.measurement import read_operator_timings
from trilink_spark.merge import Combine, MergeEnginePlan, RedisStore
from trilink_spark.merge import explain_global_merge, explain_local_merge
from trilink_spark.placement import physical_plan

CONF = "spark.trilink.mergeEngine"
#: Physical plan nodes that send rows to a Python worker.
PYTHON_NODES = ("MapInArrow", "MapInPandas", "ArrowEvalPython", "BatchEvalPython",
                "FlatMapGroupsInPandas")
AGGS = {"n": ("count", None), "nv": ("count", "v"), "s": ("sum", "v"), "si": ("sum", "i"),
        "m": ("mean", "v"), "lo": ("min", "v"), "hi": ("max", "i"), "ds": ("sum", "d"),
        "dm": ("mean", "d")}
FLOAT_SUMS = ("s", "m__sum", "m")


def runs_python(df: Any) -> bool:
    """Whether the physical plan of ``df`` sends rows to a Python worker."""
    plan = physical_plan(df)
    return any(node in plan for node in PYTHON_NODES)


def _value(name: str, value: Any) -> Any:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if name in FLOAT_SUMS and math.isfinite(value):
            return round(value, 6) + 0.0
    return value


def multiset(df: Any) -> Counter[tuple[Any, ...]]:
    """The rows of ``df`` as a multiset, float sums rounded (Spark and Arrow add in other
    orders), NaN comparable."""
    return Counter(tuple((k, _value(k, v)) for k, v in r.asDict().items()) for r in df.collect())


def random_frame(spark: Any, seed: int) -> Any:
    """Seeded rows in random partitions: null and NaN keys, null/NaN/inf doubles, null longs
    and decimals, null, NaN, infinite and negative event times."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(50, 400))
    rows = []
    for _ in range(n):
        k: Any = float(rng.integers(0, int(rng.integers(1, 30))))
        u = rng.random()
        k = None if u < 0.05 else (math.nan if u < 0.08 else k)
        v: Any = float(rng.normal() * 100)
        u = rng.random()
        v = None if u < 0.05 else (math.nan if u < 0.08 else (math.inf if u < 0.09 else v))
        i = None if rng.random() < 0.05 else int(rng.integers(-2**40, 2**40))
        d = None if rng.random() < 0.05 else Decimal(int(rng.integers(-10**6, 10**6))) / 100
        t: Any = float(rng.uniform(-500, 500))
        u = rng.random()
        t = None if u < 0.04 else (math.nan if u < 0.07 else (-math.inf if u < 0.08 else t))
        rows.append((k, v, i, d, t))
    df = spark.createDataFrame(rows, "k double, v double, i bigint, d decimal(12,2), t double")
    return df.repartition(int(rng.integers(1, 5)))


@pytest.fixture
def conf(spark: Any) -> Any:
    """Sets ``spark.trilink.mergeEngine`` for one test, unset after it."""
    def put(value: str) -> None:
        spark.conf.set(CONF, value)

    yield put
    spark.conf.unset(CONF)



# ---------------------------------------------------------------------- local_merge
def test_the_default_runs_a_batch_groups_call_in_the_jvm(spark: Any,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    df = random_frame(spark, 1)
    with caplog.at_level(logging.INFO, logger="trilink_spark.merge.engines.local"):
        out = tl.local_merge(df, "k", "t", 25.0, AGGS)
    assert not runs_python(out)
    assert runs_python(tl.local_merge(df, "k", "t", 25.0, AGGS, engine="python"))
    plan = explain_local_merge(df, "k", "t", 25.0, AGGS)
    assert isinstance(plan, MergeEnginePlan) and plan.engine == "spark"
    assert "groups mode" in plan.reason and "engine='auto'" in plan.reason
    # logged once, with the explain helper's words
    logged = [r.getMessage() for r in caplog.records if "local_merge on" in r.getMessage()]
    assert logged == [f"local_merge on 'k': the spark engine ({plan.reason})"]
    assert explain_local_merge(df, "k", "t", 25.0, AGGS, engine=None) == plan
    with pytest.raises(Exception):  # a frozen dataclass
        plan.engine = "python"  # type: ignore[misc]


def test_auto_gives_the_python_engines_partials_on_random_input(spark: Any) -> None:
    for seed in range(4):
        df = random_frame(spark, 10 + seed)
        slot = [7.0, 2.5, 100.0, 1.0][seed]
        auto = tl.local_merge(df, "k", "t", slot, AGGS)
        python = tl.local_merge(df, "k", "t", slot, AGGS, engine="python")
        assert not runs_python(auto)
        assert auto.schema.simpleString() == python.schema.simpleString()
        assert multiset(auto) == multiset(python)
        merged = tl.merge_partials(auto, "k", AGGS)
        truth = df.groupBy("k").agg(F.count(F.lit(1)).alias("n"), F.sum("i").alias("si"),
                                    F.max("i").alias("hi"), F.sum("d").alias("ds"),
                                    F.avg("d").alias("dm"))
        assert multiset(merged.select("k", "n", "si", "hi", "ds", "dm")) == multiset(truth)


def _cases(df: Any) -> list[tuple[str, dict[str, Any], dict[str, Any], str]]:
    """Calls the Spark engine cannot run: (what, arguments, aggregates, words of the reason)."""
    count = {"n": ("count", None)}
    return [
        ("quantity", {"quantity": 5}, count, "the quantity mode"),
        ("quantity mode", {"mode": "quantity"}, count, "the quantity mode"),
        ("periodic", {"delay": 5.0}, count, "the periodic mode"),
        ("punctuation", {"punctuation": "p"}, count, "the punctuation mode"),
        ("order_by", {"order_by": "t"}, count, "order_by"),
        ("first", {}, {"f": ("first", "v"), **count}, "aggregate 'f'"),
        ("last", {}, {"x": ("last", "v")}, "aggregate 'x'"),
        ("Combine", {}, {"c": (Combine(np.sum), "v")}, "aggregate 'c'"),
    ]


def test_each_call_the_jvm_cannot_run_takes_python_with_its_reason(spark: Any) -> None:
    df = spark.createDataFrame([(1, 1.0, True, 1.0), (1, 2.0, False, 2.0), (2, 3.0, True, 4.0)],
                               "k long, t double, p boolean, v double")
    for what, kw, aggs, words in _cases(df):
        plan = explain_local_merge(df, "k", "t", 10.0, aggs, **kw)
        assert plan.engine == "python", what
        assert words in plan.reason and "engine='auto'" in plan.reason, (what, plan.reason)
        out = tl.local_merge(df, "k", "t", 10.0, aggs, **kw)
        assert runs_python(out), what  # what the helper said is what runs
        want = tl.local_merge(df, "k", "t", 10.0, aggs, engine="python", **kw)
        assert multiset(out) == multiset(want), what
        with pytest.raises(InvalidArgumentError, match=f"engine='spark' cannot run.*{words}"):
            explain_local_merge(df, "k", "t", 10.0, aggs, engine="spark", **kw)
        with pytest.raises(InvalidArgumentError, match=f"engine='spark' cannot run.*{words}"):
            tl.local_merge(df, "k", "t", 10.0, aggs, engine="spark", **kw)


def test_decimal_sums_and_means_run_in_the_jvm(spark: Any) -> None:
    df = spark.createDataFrame(
        [(1, 1, Decimal("10000000000000000000")), (1, 2, Decimal("1.000000000000000001")),
         (1, 3, Decimal("-10000000000000000000")), (2, 4, None)],
        "k long, t long, d decimal(38,18)")
    aggs = {"s": ("sum", "d"), "m": ("mean", "d")}
    assert explain_local_merge(df, "k", "t", 10, aggs).engine == "spark"
    auto = tl.local_merge(df.coalesce(1), "k", "t", 10, aggs)
    assert not runs_python(auto)
    python = tl.local_merge(df.coalesce(1), "k", "t", 10, aggs, engine="python")
    assert auto.schema.simpleString() == python.schema.simpleString()
    assert multiset(auto) == multiset(python)


def test_a_stream_takes_python_and_an_explicit_spark_engine_is_refused(spark: Any) -> None:
    stream = spark.readStream.format("rate").load().selectExpr("value % 3 AS k",
                                                               "timestamp AS t")
    count = {"n": ("count", None)}
    plan = explain_local_merge(stream, "k", "t", "10 seconds", count)
    assert plan.engine == "python" and "a streaming DataFrame" in plan.reason
    assert "quantity" not in plan.reason  # the stream decided, not its mode
    assert tl.local_merge(stream, "k", "t", "10 seconds", count).isStreaming
    with pytest.raises(StreamingNotSupportedError, match="local_merge.engine='spark'"):
        explain_local_merge(stream, "k", "t", "10 seconds", count, engine="spark")


@pytest.mark.connect
def test_the_conf_forces_an_engine_when_the_call_gives_none(spark: Any, conf: Any) -> None:
    df = spark.createDataFrame([(1, 1, 1.0), (1, 2, 2.0), (2, 3, 3.0)],
                               "k long, t long, v double")
    count, first = {"n": ("count", None)}, {"f": ("first", "v")}
    conf("python")
    for engine in ("auto", None):
        plan = explain_local_merge(df, "k", "t", 10, count, engine=engine)
        assert plan == MergeEnginePlan("python", plan.reason)
        assert f"{CONF}=python" in plan.reason
        assert runs_python(tl.local_merge(df, "k", "t", 10, count, engine=engine))
    # an explicit engine wins over the conf
    assert explain_local_merge(df, "k", "t", 10, count, engine="spark").engine == "spark"
    assert not runs_python(tl.local_merge(df, "k", "t", 10, count, engine="spark"))
    conf("spark")
    plan = explain_local_merge(df, "k", "t", 10, count)
    assert plan.engine == "spark" and f"{CONF}=spark" in plan.reason
    assert not runs_python(tl.local_merge(df, "k", "t", 10, count))
    plan = explain_local_merge(df, "k", "t", 10, first)  # the conf's falls back
    assert plan.engine == "python"
    assert f"{CONF}=spark does not apply to aggregate 'f'" in plan.reason
    assert runs_python(tl.local_merge(df, "k", "t", 10, first))
    assert runs_python(tl.local_merge(df, "k", "t", 10, count, engine="python"))
    conf("auto")
    assert explain_local_merge(df, "k", "t", 10, count).engine == "spark"
    assert not runs_python(tl.local_merge(df, "k", "t", 10, count))
    for bad in ("fast", "Spark", ""):
        conf(bad)
        for call in (explain_local_merge, tl.local_merge):
            with pytest.raises(InvalidArgumentError,
                               match=rf"{CONF} must be one of 'auto', 'python', 'spark', got '{bad}'"):
                call(df, "k", "t", 10, count)
        with pytest.raises(InvalidArgumentError, match=CONF):
            tl.global_merge(df, "k", count)
        # an explicit engine never reads the conf
        assert explain_local_merge(df, "k", "t", 10, count, engine="python").engine == "python"


def test_explain_checks_the_arguments_as_local_merge_does(spark: Any) -> None:
    df = spark.createDataFrame([(1, 1, 1.0)], "k long, t long, v double")
    count = {"n": ("count", None)}
    bad: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"mode": "often"}, InvalidArgumentError, "mode must be"),
        ({"engine": "jvm"}, InvalidArgumentError,
         "engine must be one of 'auto', 'python', 'spark', got 'jvm'"),
        ({"engine": 1}, TypeError, "engine must be a str, one of 'auto', 'python', 'spark'"),
        ({"max_groups": 0}, TypeError, "max_groups"),
        ({"mode": "periodic"}, InvalidArgumentError, "delay")]
    for kw, error, words in bad:
        for call in (explain_local_merge, tl.local_merge):
            with pytest.raises(error, match=words):
                call(df, "k", "t", 10, count, **kw)
    with pytest.raises(MissingColumnError, match="key column 'nope'"):
        explain_local_merge(df, "nope", "t", 10, count)


# ---------------------------------------------------------------------- global_merge
def test_global_merge_default_takes_sparks_aggregation_where_it_can(spark: Any,
                                                                    timing_dir: str) -> None:
    """Only the Python engine's tasks (and the driver's merge of their partials) write
    operator timings: a call that writes none ran in the JVM."""
    for seed in range(3):
        df = random_frame(spark, 20 + seed)
        aggs = {k: AGGS[k] for k in ("n", "nv", "si", "hi", "lo", "ds", "dm")}
        for kw in ({}, {"mode": "quantity", "quantity": 3}):
            plan = explain_global_merge(df, "k", aggs, **kw)
            assert plan.engine == "spark" and "groupBy(key)" in plan.reason
            got = tl.global_merge(df, "k", aggs, **kw)
            assert not read_operator_timings(timing_dir).operator.isin(
                ["local_merge", "global_merge"]).any()
        python = tl.global_merge(df, "k", aggs, engine="python")
        assert set(read_operator_timings(timing_dir).operator) == {"local_merge",
                                                                   "global_merge"}
        assert multiset(got) == multiset(python)
        _clear(timing_dir)


def _clear(root: str) -> None:
    import shutil

    shutil.rmtree(root, ignore_errors=True)


def test_global_merge_takes_python_where_the_jvm_cannot_merge(spark: Any, conf: Any,
                                                              timing_dir: str) -> None:
    df = spark.createDataFrame([(1, 1, 1.0), (1, 2, 2.0), (2, 3, 3.0)],
                               "k long, t long, v double")
    cases = [({"f": ("first", "v")}, "aggregate 'f' (first"),
             ({"c": (Combine(np.sum), "v"), "n": ("count", None)}, "aggregate 'c' (a Combine")]
    for aggs, words in cases:
        plan = explain_global_merge(df, "k", aggs, event_time="t")
        assert plan.engine == "python" and plan.reason.startswith(words), plan.reason
        tl.global_merge(df, "k", aggs, event_time="t").collect()
        assert "local_merge" in set(read_operator_timings(timing_dir).operator)
        _clear(timing_dir)
        with pytest.raises(InvalidArgumentError, match="engine='spark' cannot run aggregate"):
            tl.global_merge(df, "k", aggs, event_time="t", engine="spark")
    conf("python")
    count = {"n": ("count", None)}
    plan = explain_global_merge(df, "k", count)
    assert plan.engine == "python" and f"{CONF}=python" in plan.reason
    assert [r.n for r in tl.global_merge(df, "k", count).orderBy("k").collect()] == [2, 1]
    assert "local_merge" in set(read_operator_timings(timing_dir).operator)
    _clear(timing_dir)
    assert explain_global_merge(df, "k", count, engine="spark").engine == "spark"
    conf("spark")
    assert explain_global_merge(df, "k", count).engine == "spark"


def test_global_merge_with_ansi_off_takes_the_jvm_partials(spark: Any,
                                                           timing_dir: str) -> None:
    """With ANSI mode off Spark's sum of longs wraps around, so the driver store does not take
    Spark's groupBy; its partials still come from the JVM (exact, failing beyond 64 bits)."""
    df = spark.createDataFrame([(1, 1, 2**62), (1, 2, 2**62), (1, 3, -2**62), (2, 4, 5)],
                               "k long, t long, i bigint").repartition(2)
    # 2**62 twice: in one partition the JVM's partial fails; one in each, the driver's merge
    over = spark.range(0, 2, 1, 2).selectExpr("1L AS k", "id AS t", f"{2**62}L AS i")
    sums = {"s": ("sum", "i")}
    spark.conf.set("spark.sql.ansi.enabled", "false")
    try:
        plan = explain_global_merge(df, "k", sums)
        assert plan.engine == "spark", plan.reason
        assert plan.reason.startswith("aggregate 's' (sum of bigint with "
                                      "spark.sql.ansi.enabled=false")
        assert "the partials the driver merges: engine='auto': a batch DataFrame" in plan.reason
        got = tl.global_merge(df, "k", sums).orderBy("k").collect()
        assert [tuple(r) for r in got] == [(1, 2**62), (2, 5)]
        # the driver merged the JVM's partials: its own timing record, no Python task's
        assert set(read_operator_timings(timing_dir).operator) == {"global_merge"}
        with pytest.raises(Exception, match="ArithmeticOverflowError: sum 's'"):
            tl.global_merge(over.coalesce(1), "k", sums).collect()
        with pytest.raises(ArithmeticOverflowError, match="sum 's'"):
            tl.global_merge(over, "k", sums).collect()
        quantity = explain_global_merge(df, "k", sums, mode="quantity")
        assert quantity.engine == "python" and "the quantity mode" in quantity.reason
    finally:
        spark.conf.unset("spark.sql.ansi.enabled")
    assert explain_global_merge(df, "k", sums).engine == "spark"  # ANSI on: Spark's groupBy
    assert "groupBy(key)" in explain_global_merge(df, "k", sums).reason


def test_a_redis_store_is_python_and_refuses_an_explicit_spark_engine(spark: Any,
                                                                     conf: Any) -> None:
    df = spark.createDataFrame([(1, 1, 1.0)], "k long, t long, v double")
    store = RedisStore("redis://127.0.0.1:1", "never-reached")  # explain calls no Redis
    count = {"n": ("count", None)}
    plan = explain_global_merge(df, "k", count, store)
    assert plan.engine == "python" and "a RedisStore" in plan.reason
    with pytest.raises(InvalidArgumentError, match="engine='spark' cannot run a RedisStore"):
        explain_global_merge(df, "k", count, store, engine="spark")
    with pytest.raises(InvalidArgumentError, match="engine='spark' cannot run a RedisStore"):
        tl.global_merge(df, "k", count, store, engine="spark")
    with pytest.raises(InvalidArgumentError, match="Combine"):  # Redis cannot merge it
        explain_global_merge(df, "k", {"c": (Combine(np.sum), "v")}, store)
    conf("spark")
    plan = explain_global_merge(df, "k", count, store)
    assert plan.engine == "python" and f"{CONF}=spark does not apply to a RedisStore" in \
        plan.reason


def test_explain_global_merge_refuses_what_global_merge_refuses(spark: Any) -> None:
    df = spark.createDataFrame([(1, 1, 1.0)], "k long, t long, v double")
    count = {"n": ("count", None)}
    with pytest.raises(InvalidArgumentError, match="store must be"):
        explain_global_merge(df, "k", count, "disk")
    with pytest.raises(InvalidArgumentError, match="needs event_time"):
        explain_global_merge(df, "k", count, delay=5.0)
    with pytest.raises(InvalidArgumentError, match="mode must be"):
        explain_global_merge(df, "k", count, mode="often")
    with pytest.raises(InvalidArgumentError, match="mode must be"):
        tl.global_merge(df, "k", count, mode="often")  # also on the JVM path
    stream = spark.readStream.format("rate").load().selectExpr("value % 3 AS k")
    with pytest.raises(StreamingNotSupportedError, match="global_merge"):
        explain_global_merge(stream, "k", count)


# ---------------------------------------------------------------------- any session
@pytest.mark.connect
def test_explain_and_the_default_engine_on_any_session(spark: Any) -> None:
    df = spark.createDataFrame([(k % 3, t, float(t)) for k in range(9) for t in range(20)],
                               "k long, t long, v double").repartition(2)
    aggs = {"n": ("count", None), "s": ("sum", "v"), "lo": ("min", "v")}
    plan = explain_local_merge(df, "k", "t", 10, aggs)
    assert plan.engine == "spark"
    auto = tl.local_merge(df, "k", "t", 10, aggs)
    assert not runs_python(auto)
    python = tl.local_merge(df, "k", "t", 10, aggs, engine="python")
    assert runs_python(python)
    assert sorted(map(tuple, auto.collect())) == sorted(map(tuple, python.collect()))
    assert explain_local_merge(df, "k", "t", 10, {"f": ("first", "v")}).engine == "python"
    assert explain_global_merge(df, "k", aggs).engine == "spark"
    assert explain_global_merge(df, "k", {"f": ("first", "v")}).engine == "python"
    got = tl.global_merge(df, "k", aggs)
    want = tl.global_merge(df, "k", aggs, engine="python")
    assert sorted(map(tuple, got.collect())) == sorted(map(tuple, want.collect()))
