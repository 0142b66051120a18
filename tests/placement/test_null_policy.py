"""Null keys, one story at every entry point: a key of its own by default, as in Spark's
``groupBy``, on the partition Spark's hash partitioning gives it (``pmod(42, n)``: Spark's
Murmur3 of null is its seed); ``null_policy="error"`` refuses it naming the argument and the
conf; ``"partition0"`` places it on partition 0; ``spark.trilink.nullPolicy`` sets the default.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.cli import main
from trilink_spark.errors import InvalidArgumentError, NullKeyError
from trilink_spark.partitioners import BlockPartitioner, balance_degree, rebalance_minimal
from trilink_spark.partitioners.core.keys import NULL_POLICIES, null_partition
from trilink_spark.partitioners.tables.overlay import OverlayPartitioner
from trilink_spark.placement import ahead_key_by, resolve_strategy

#: What every refusal says: the policy, the argument, the conf and the other choices.
REFUSAL = r"null_policy='error' \(argument null_policy, or conf spark\.trilink\.nullPolicy\)" \
          r".*null_policy='group'.*'partition0'"


def strategies(n: int) -> dict[str, tl.Partitioner]:
    return {"hash": tl.HashPartitioner(n), "modulo": tl.ModuloPartitioner(n),
            "least_key": tl.LeastKeyPartitioner(n).fit([1, 2, 3]),
            "least_count": tl.LeastCountPartitioner(n, history={1: 9, 2: 1}),
            "weight": tl.WeightPartitioner([100 / n] * n),
            "weight_random": tl.WeightPartitioner([100 / n] * n, "random").fit([1, 2]),
            "block": BlockPartitioner(n, num_blocks=4 * n),
            "overlay": OverlayPartitioner(tl.HashPartitioner(n), {1: n - 1})}


# ---------------------------------------------------------------------- strategies (Python)
@pytest.mark.parametrize("n", [1, 4, 7, 60])
def test_every_strategy_places_the_null_key_on_pmod_42_n_by_default(n: int) -> None:
    for name, p in strategies(n).items():
        assert p.null_policy == "group", name
        assert p.partition(None) == 42 % n == null_partition("group", n), name
        assert p.assign([1, None, 2]).tolist()[1] == 42 % n, name
        if isinstance(p, tl.TablePartitioner):
            assert p.lookup([None, 5]).tolist()[0] == 42 % n, name
        assert p.with_null_policy("partition0").assign([1, None]).tolist()[1] == 0, name
        with pytest.raises(NullKeyError, match=REFUSAL):
            p.with_null_policy("error").partition(None)
    assert NULL_POLICIES == ("group", "error", "partition0")


def test_error_messages_name_the_argument_and_the_conf() -> None:
    p = tl.HashPartitioner(4, null_policy="error")
    for call in (lambda: p.partition(None), lambda: p.assign(["a", None]),
                 lambda: p.fit({None: 3}), lambda: tl.evaluate_strategies(
                     {None: 1, "a": 2}, 4, null_policy="error")):
        with pytest.raises(NullKeyError, match=REFUSAL):
            call()
    with pytest.raises(InvalidArgumentError, match="'group', 'error', 'partition0'"):
        tl.HashPartitioner(4, null_policy="drop")


def test_least_count_balances_around_the_null_key_load() -> None:
    n = 4
    history = {None: 100.0, **{f"k{i}": 10.0 for i in range(30)}}
    p = tl.LeastCountPartitioner(n, history=history)
    assert p.loads.sum() == pytest.approx(400.0)  # the null key's rows are counted
    assert p.loads[42 % n] >= 100.0
    # the other keys go around it: its partition gets no more than its share
    others = p.assign([f"k{i}" for i in range(30)])
    assert np.count_nonzero(others == 42 % n) <= 1
    online = tl.LeastCountPartitioner(n).fit([None] * 5 + ["a", "b", "c", "d"])
    assert online.loads.tolist()[42 % n] == 5.0 and "a" in online
    assert online.partition("a") != 42 % n  # placed while the null rows already weighed


def test_evaluate_strategies_counts_every_row() -> None:
    counts = {None: 500, **{i: 10 for i in range(100)}}
    for score in tl.evaluate_strategies(counts, 8):
        assert score.loads.sum() == 1500, score.name
        assert score.loads[42 % 8] >= 500, score.name
    keys = [None, 1, 1, 2, None, 3]
    for score in tl.evaluate_strategies(keys, 3):
        assert score.loads.sum() == len(keys), score.name


def test_rebalance_keeps_the_null_key_on_pmod_42_of_the_new_count() -> None:
    counts = {None: 25.0, **{f"k{i}": 1.0 for i in range(120)}}
    for start in (tl.HashPartitioner(4), BlockPartitioner(4, num_blocks=64),
                  tl.LeastCountPartitioner(4, history=counts)):
        p = rebalance_minimal(start, counts, num_partitions=6, target_balance=0.9)
        assert p.null_policy == "group" and p.partition(None) == 42 % 6 == 0
        loads = np.bincount(p.assign(list(counts)), weights=list(counts.values()), minlength=6)
        assert loads.sum() == pytest.approx(145.0)
        # balanced around the null key's load: its partition takes (almost) no other key
        assert balance_degree(loads) >= 0.9, (type(start).__name__, loads)
    block = rebalance_minimal(BlockPartitioner(4, num_blocks=16), {None: 9.0, 3: 1.0},
                              num_partitions=5, unit="block")
    assert block.partition(None) == 42 % 5


# ---------------------------------------------------------------------- Spark placement
@pytest.fixture(scope="module")
def frames(spark: Any) -> dict[str, Any]:
    ints = [(None if i % 5 == 0 else i % 13, i) for i in range(120)]
    strings = [(None if k is None else f"s{k}", v) for k, v in ints]
    return {"int": spark.createDataFrame(ints, "k int, v long").repartition(3),
            "string": spark.createDataFrame(strings, "k string, v long").repartition(3)}


def rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


def spark_null_partition(df: Any, n: int) -> int:
    """Where Spark's own hash partitioning puts the null key."""
    got = {r["p"] for r in df.repartition(n, "k").where(F.col("k").isNull())
           .select(F.spark_partition_id().alias("p")).collect()}
    assert len(got) == 1
    return got.pop()


@pytest.mark.parametrize("kind", ["int", "string"])
def test_key_by_places_the_null_key_where_spark_does(frames: Any, kind: str) -> None:
    df = frames[kind]
    every = ["hash", "least_key", "least_count", "block"]
    every += ["modulo"] if kind == "int" else ["auto"]
    for n, names in ((11, every), (4, ["hash", "least_count"])):
        expected = spark_null_partition(df, n)
        assert expected == 42 % n
        for name in names:
            placed = tl.key_by(df, "k", name, n)
            got = placed.select("k", "v", tl.PARTITION_COL,
                                F.spark_partition_id().alias("sp")).collect()
            assert len(got) == 120, name  # no row dropped
            nulls = {(r[tl.PARTITION_COL], r["sp"]) for r in got if r["k"] is None}
            assert nulls == {(expected, expected)}, (name, n, nulls)
        weights = tl.WeightPartitioner([100 / n] * n)
        placed = tl.key_by(df, "k", weights)
        assert {r[0] for r in placed.where("k IS NULL").select(tl.PARTITION_COL).collect()} \
            == {expected}


def test_a_column_of_null_keys_only(spark: Any) -> None:
    df = spark.createDataFrame([(None, i) for i in range(6)], "k string, v long")
    for name in ("auto", "least_count", "hash"):
        placed = tl.key_by(df, "k", name, 4)
        assert {r[0] for r in placed.select(tl.PARTITION_COL).collect()} == {42 % 4}, name
    assert rows(tl.keyed_agg(df, "k", F.count("*"), combine="never")) == [(None, 6)]


def test_key_by_error_and_partition0(frames: Any) -> None:
    df = frames["string"]
    with pytest.raises(NullKeyError, match=REFUSAL):  # counted on the driver: eagerly
        tl.key_by(df, "k", "least_count", 4, null_policy="error")
    with pytest.raises(NullKeyError, match=REFUSAL):
        resolve_strategy(df, "k", "auto", 4, null_policy="error")
    with pytest.raises(Exception, match="NullKeyError.*" + REFUSAL):  # in the JVM
        tl.key_by(df, "k", "hash", 4, null_policy="error").collect()
    placed = tl.key_by(df, "k", "least_key", 4, null_policy="partition0")
    assert {r[0] for r in placed.where("k IS NULL").select(tl.PARTITION_COL).collect()} == {0}
    # the argument overrides a strategy object's own policy (a copy; the object is kept)
    own = tl.HashPartitioner(4, null_policy="partition0")
    placed = tl.key_by(df, "k", own, null_policy="group")
    assert {r[0] for r in placed.where("k IS NULL").select(tl.PARTITION_COL).collect()} \
        == {42 % 4}
    assert own.null_policy == "partition0"
    placed = tl.key_by(df, "k", own)  # without the argument: the object's own
    assert {r[0] for r in placed.where("k IS NULL").select(tl.PARTITION_COL).collect()} == {0}


def test_the_conf_sets_the_default(spark: Any, frames: Any) -> None:
    df = frames["int"]
    spark.conf.set("spark.trilink.nullPolicy", "error")
    try:
        with pytest.raises(NullKeyError, match=REFUSAL):
            tl.key_by(df, "k", "least_key", 4)
        with pytest.raises(Exception, match="NullKeyError"):
            tl.keyed_agg(df, "k", F.sum("v")).collect()
        assert rows(tl.keyed_agg(df, "k", F.sum("v"), null_policy="group")) \
            == rows(df.groupBy("k").agg(F.sum("v")))  # the argument wins
        spark.conf.set("spark.trilink.nullPolicy", "partition0")
        placed = tl.key_by(df, "k", "hash", 4)
        assert {r[0] for r in placed.where("k IS NULL").select(tl.PARTITION_COL).collect()} \
            == {0}
        spark.conf.set("spark.trilink.nullPolicy", "nope")
        with pytest.raises(InvalidArgumentError, match="null_policy"):
            tl.key_by(df, "k", "hash", 4)
    finally:
        spark.conf.unset("spark.trilink.nullPolicy")
    placed = tl.key_by(df, "k", "hash", 4)  # unset: "group"
    assert {r[0] for r in placed.where("k IS NULL").select(tl.PARTITION_COL).collect()} \
        == {42 % 4}


# ---------------------------------------------------------------------- keyed operators
AGGS = {"combined": lambda: [F.sum("v").alias("s"), F.count("*").alias("c"),
                             F.avg("v").alias("a"), F.max("v").alias("m")],
        "exact": lambda: [F.sum("v").alias("s"),
                          F.percentile("v", 0.5).alias("p")]}


@pytest.mark.parametrize("which", list(AGGS))
def test_keyed_agg_keeps_the_null_group_on_every_plan(frames: Any, which: str) -> None:
    df = frames["string"]
    exprs = AGGS[which]()
    expected = rows(df.groupBy("k").agg(*exprs))
    assert any(r[0] is None for r in expected)
    for combine in ("auto", "always", "never"):
        got = tl.keyed_agg(df, "k", *exprs, strategy="least_count", num_partitions=5,
                           combine=combine)
        assert rows(got) == expected, combine
        refused = tl.keyed_agg(df, "k", *exprs, strategy="hash", num_partitions=5,
                               combine=combine, null_policy="error")  # lazily: no job yet
        with pytest.raises(Exception, match="NullKeyError.*" + REFUSAL):
            refused.collect()
        kept = tl.keyed_agg(df, "k", *exprs, strategy="hash", num_partitions=5,
                            combine=combine, null_policy="partition0")
        assert rows(kept) == expected, combine


def test_keyed_agg_partition0_takes_exact_placement(frames: Any) -> None:
    df = frames["int"]
    plan = tl.placement.explain_keyed_agg(df, "k", F.sum("v"))
    assert plan.combine  # Spark's combine would put the null group on pmod(42, n)
    said = tl.placement.explain_keyed_agg(df, "k", F.sum("v"), strategy="hash",
                                          num_partitions=5, null_policy="partition0")
    assert said.engine == "exact" and "null_policy='partition0'" in said.reason
    out = tl.keyed_agg(df, "k", F.sum("v"), strategy="hash", num_partitions=5,
                       null_policy="partition0")
    where = out.select("k", F.spark_partition_id().alias("p")).collect()
    assert {r["p"] for r in where if r["k"] is None} == {0}
    grouped = tl.keyed_agg(df, "k", F.sum("v"), strategy="hash", num_partitions=5,
                           combine="never")
    where = grouped.select("k", F.spark_partition_id().alias("p")).collect()
    assert {r["p"] for r in where if r["k"] is None} == {42 % 5}


def test_keyed_apply_and_keyed_process_see_one_null_group(frames: Any) -> None:
    df = frames["string"]

    def sizes(key: tuple[Any, ...], pdf: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame({"k": [key[0]], "n": [len(pdf)]})

    out = tl.keyed_apply(df, "k", sizes, "k string, n long", strategy="least_key",
                         num_partitions=4)
    expected = rows(df.groupBy("k").count())
    assert rows(out) == expected
    with pytest.raises(NullKeyError, match=REFUSAL):  # "auto" counts the keys: eagerly
        tl.keyed_apply(df, "k", sizes, "k string, n long", null_policy="error")
    timed = df.withColumn("t", F.col("v").cast("double"))
    windows = tl.keyed_process(timed, "k", "t", tl.KeyedWindowAggregate(1000.0), delay=1e6,
                               num_partitions=3).collect()
    assert sorted(((r["k"], r["count"]) for r in windows), key=repr) == expected
    with pytest.raises(Exception, match="NullKeyError"):
        tl.keyed_process(timed, "k", "t", tl.KeyedWindowAggregate(1000.0), delay=1e6,
                         null_policy="error").collect()


def test_ahead_key_by_follows_the_policy(frames: Any) -> None:
    df = frames["int"]
    out = ahead_key_by(df, "k", "hash", 6)
    assert {r[0] for r in out.where("k IS NULL").select("partition").collect()} == {42 % 6}
    out = ahead_key_by(df, "k", tl.ModuloPartitioner(6), null_policy="partition0")
    assert {r[0] for r in out.where("k IS NULL").select("partition").collect()} == {0}
    with pytest.raises(Exception, match="NullKeyError"):
        ahead_key_by(df, "k", "hash", 6, null_policy="error").collect()


# ---------------------------------------------------------------------- the command
def test_balance_counts_null_key_rows(spark: Any, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "keys.csv"
    keys = [""] * 300 + [f"u{i % 40}" for i in range(100)]  # an empty CSV field: null
    path.write_text("user,v\n" + "".join(f"{k},{i}\n" for i, k in enumerate(keys)))
    out = io.StringIO()
    args = ["balance", str(path), "--key", "user", "--partitions", "4", "--json"]
    assert main(args + ["--measure"], out=out) == 0
    data = json.loads(out.getvalue())["datasets"][0]
    assert data["records"] == 400 and data["null_rows"] == 300
    assert data["distinct_keys"] == 41
    for s in data["strategies"]:
        assert sum(s["loads"]) == 400, s["strategy"]
    best = data["best"]
    assert data["measured"][best]["max_load"] >= 300  # measured by Spark, null rows placed
    out = io.StringIO()
    assert main(args[:-1] + ["--no-measure"], out=out) == 0
    assert "400 records (300 with a null key)" in out.getvalue()
    assert main(args + ["--null-policy", "error", "--no-measure"], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "NullKeyError" not in err and "--null-policy error refuses them" in err
    assert "Traceback" not in err and len(err.splitlines()) == 1
