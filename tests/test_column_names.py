"""Column names Spark's parser would split or refuse: a dot, a backtick, a space, unicode.

Every public call that takes column names runs on one frame whose key, event time, value and
an extra column are named ``user.id``, ``t`s``, ``amount eur`` and ``país``, and gives what the
same call gives on the same rows named ``k``, ``t``, ``v`` and ``x`` (renamed back to compare).
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.cli import main, run_balance
from trilink_spark.columns import column_of, python_aliases, quoted
from trilink_spark.keyed import read_state
from trilink_spark.merge import Combine
from trilink_spark.placement import ahead_key_by, explain_keyed_agg, keyed_by_source
from trilink_spark.placement import shuffle_exchanges
from trilink_spark.placement.ahead import KAFKA_PARTITION_COL
from trilink_spark.placement.key_by import key_counts, with_partition_id

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the processors ship to tasks

KEY, TIME, VALUE, EXTRA = "user.id", "t`s", "amount eur", "país"
#: The plain name of each odd one; ``SAME`` maps every name to itself.
PLAIN = {KEY: "k", TIME: "t", VALUE: "v", EXTRA: "x"}
SAME = {name: name for name in PLAIN}
ODD_DDL = ", ".join(f"{quoted(n)} {t}" for n, t in
                    zip(PLAIN, ["bigint", "bigint", "double", "string"]))
ROWS = [(i % 7 * 3, i, float(i % 5) + 0.5, f"p{i % 3}") for i in range(60)]


@pytest.fixture(scope="session")
def frames(spark: Any) -> tuple[Any, Any]:
    """The rows under the odd names, and the same rows and partitions under plain names."""
    odd = spark.createDataFrame(ROWS, ODD_DDL)
    return odd, odd.toDF(*[PLAIN[c] for c in odd.columns])


def back(df: Any) -> Any:
    """``df`` with the odd names written plain (by position: nothing parses them)."""
    return df.toDF(*[PLAIN.get(c, c) for c in df.columns])


def rows(df: Any, where: bool = False) -> list[tuple[Any, ...]]:
    """The rows of ``df`` sorted, with each row's Spark partition when ``where``."""
    if where:
        df = df.select(*[column_of(c) for c in df.columns], F.spark_partition_id().alias("_sp"))
    return sorted((tuple(r) for r in df.collect()), key=repr)


def same(odd: Any, plain: Any, where: bool = False) -> None:
    """The odd-named result holds exactly the plain one's columns and rows."""
    renamed = back(odd)
    assert renamed.columns == plain.columns
    assert rows(renamed, where) == rows(plain, where)


def test_the_fixture_names_are_what_spark_parses() -> None:
    # the names this file is about: two need aliases into Python, two do not
    assert python_aliases(list(PLAIN)) == {"_tl_col0": KEY, "_tl_col1": TIME}


@pytest.mark.parametrize("strategy", ["hash", "modulo", "least_key", "least_count", "weight",
                                      "block", "auto"])
def test_key_by_places_as_with_plain_names(frames: Any, strategy: str) -> None:
    odd, plain = frames

    def made() -> Any:
        if strategy == "weight":
            return tl.WeightPartitioner([50, 30, 20])
        if strategy == "block":
            return tl.BlockPartitioner(3, num_blocks=16)
        return strategy

    placed = tl.key_by(odd, KEY, made(), 3)
    want = tl.key_by(plain, "k", made(), 3)
    same(placed, want, where=True)
    assert placed.schema[tl.PARTITION_COL].metadata == want.schema[tl.PARTITION_COL].metadata
    got, expected = tl.partition_balance(placed), tl.partition_balance(want)
    assert got.loads.tolist() == expected.loads.tolist() and got.total == len(ROWS)


def test_compacted_key_by_and_with_partition_id(frames: Any) -> None:
    odd, plain = frames
    same(tl.key_by(odd, KEY, "hash", 64, compact="always"),
         tl.key_by(plain, "k", "hash", 64, compact="always"), where=True)
    table = tl.LeastKeyPartitioner(4).fit(sorted({r[0] for r in ROWS})[:4])  # a join and a hash
    same(with_partition_id(odd, KEY, table.copy()), with_partition_id(plain, "k", table.copy()))


def test_key_counts_and_the_auto_choice(frames: Any) -> None:
    odd, plain = frames
    got, want = key_counts(odd, KEY, 1.0, 0, "group"), key_counts(plain, "k", 1.0, 0, "group")
    assert got.column_names[0] == KEY
    assert got.columns == want.columns  # keys and counts, column by column
    chosen = tl.resolve_strategy(odd, KEY, "auto", 3)
    expected = tl.resolve_strategy(plain, "k", "auto", 3)
    assert [(s.name, s.balance_degree) for s in chosen.scores] == \
        [(s.name, s.balance_degree) for s in expected.scores]
    assert chosen.partitioner.strategy_name == expected.partitioner.strategy_name
    counts = dict(zip(got.column(0).to_pylist(), got.column(1).to_pylist()))
    scores = tl.evaluate_strategies(counts, 3)
    assert [s.name for s in scores] == [s.name for s in chosen.scores]


def _aggregates(n: dict[str, str]) -> list[Any]:
    return [F.sum(column_of(n[VALUE])).alias("total eur"), F.count("*").alias("n"),
            F.max(column_of(n[EXTRA])).alias("top.x")]


@pytest.mark.parametrize("combine", ["auto", "never"])
def test_keyed_agg_on_both_plans(frames: Any, combine: str) -> None:
    odd, plain = frames
    assert explain_keyed_agg(odd, KEY, *_aggregates(SAME), combine=combine).combine == \
        (combine == "auto")  # sum, count and max: Spark's map-side combine
    same(tl.keyed_agg(odd, KEY, *_aggregates(SAME), strategy="least_count", num_partitions=3,
                      combine=combine),
         tl.keyed_agg(plain, "k", *_aggregates(PLAIN), strategy="least_count",
                      num_partitions=3, combine=combine))


def _summary(n: dict[str, str]) -> tuple[Any, str]:
    def summary(pdf: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame({n[KEY]: [pdf[n[KEY]].iloc[0]], "rows": [len(pdf)],
                             "total": [pdf[n[VALUE]].sum()],
                             "extras": [",".join(sorted(set(pdf[n[EXTRA]])))]})

    return summary, f"{quoted(n[KEY])} bigint, rows long, total double, extras string"


def test_keyed_apply_with_one_exchange(frames: Any) -> None:
    odd, plain = frames
    applied = tl.keyed_apply(odd, KEY, *_summary(SAME), strategy="hash", num_partitions=3)
    same(applied, tl.keyed_apply(plain, "k", *_summary(PLAIN), strategy="hash",
                                 num_partitions=3))
    assert shuffle_exchanges(applied) == 1  # the columns' aliases keep key_by's layout


def test_keyed_by_source_frames(frames: Any) -> None:
    odd, plain = frames
    declared = keyed_by_source(odd.repartition(2, column_of(KEY)), KEY, verify=True)
    plain_declared = keyed_by_source(plain.repartition(2, "k"), "k", verify=True)
    same(tl.keyed_agg(declared, KEY, *_aggregates(SAME)),
         tl.keyed_agg(plain_declared, "k", *_aggregates(PLAIN)))
    same(tl.keyed_apply(declared, KEY, *_summary(SAME)),
         tl.keyed_apply(plain_declared, "k", *_summary(PLAIN)))
    # a float key: -0.0 and 0.0 are written as one key, the declaration kept
    floats = keyed_by_source(declared.withColumn(KEY, column_of(KEY).cast("double")), KEY)
    got = tl.keyed_agg(floats, KEY, F.count("*").alias("n"))
    assert shuffle_exchanges(got) == shuffle_exchanges(floats) == 1  # the declaration kept
    assert sorted(tuple(r) for r in got.collect()) == \
        sorted((float(k), 60 // 7 + (k // 3 < 60 % 7)) for k in range(0, 21, 3))


@pytest.mark.parametrize("n_keys", [1, 2])
def test_keyed_watermark(frames: Any, n_keys: int) -> None:
    odd, plain = frames
    same(tl.keyed_watermark(odd, KEY, TIME, 3, order_by=VALUE, n_keys=n_keys),
         tl.keyed_watermark(plain, "k", "t", 3, order_by="v", n_keys=n_keys))


class LastSeen(tl.KeyedWatermarkProcessFunction):
    """Reads every column (no ``input_columns``): the task must see the user's names."""

    def __init__(self, n: dict[str, str]) -> None:
        self.n = n
        self.output_schema = f"{quoted(n[KEY])} bigint, rows long, extra string, total double"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
        return [(key, len(rows), rows[self.n[EXTRA]].iloc[-1], float(rows[self.n[VALUE]].sum()))]


def test_keyed_process(frames: Any) -> None:
    odd, plain = frames
    windows = tl.keyed_process(odd, KEY, TIME, tl.KeyedWindowAggregate(10, value=VALUE,
                               aggs=("count", "sum")), 2, order_by=EXTRA, strategy="least_key",
                               num_partitions=3)
    assert windows.columns[0] == KEY
    same(windows, tl.keyed_process(plain, "k", "t", tl.KeyedWindowAggregate(
        10, value="v", aggs=("count", "sum")), 2, order_by="x", strategy="least_key",
        num_partitions=3))
    same(tl.keyed_process(odd, KEY, TIME, LastSeen(SAME), 2),
         tl.keyed_process(plain, "k", "t", LastSeen(PLAIN), 2))


def test_keyed_foreach_batch_on_a_stream_and_read_state(spark: Any, frames: Any,
                                                        tmp_path: Path) -> None:
    odd, plain = frames
    source = tmp_path / "in"
    odd.coalesce(1).write.json(str(source))  # one file, read as one partition in row order
    sinks: dict[str, list[pd.DataFrame]] = {"odd": [], "plain": []}

    def runner(name: str, n: dict[str, str]) -> Any:
        window = tl.KeyedWindowAggregate(10, value=n[VALUE], aggs=("count", "sum"))
        return tl.keyed_foreach_batch(lambda df, b: sinks[name].append(df.toPandas()), n[KEY],
                                      n[TIME], window, 2, str(tmp_path / name),
                                      order_by=n[EXTRA], num_partitions=2)

    stream = spark.readStream.schema(odd.schema).json(str(source))
    query = (stream.writeStream.foreachBatch(runner("odd", SAME))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    runner("plain", PLAIN)(plain.coalesce(1), 0)
    got, want = (pd.concat(sinks[s], ignore_index=True) for s in ("odd", "plain"))
    assert len(want) and list(got.columns)[0] == KEY
    got.columns = [PLAIN.get(c, c) for c in got.columns]
    assert sorted(map(tuple, got.values.tolist())) == sorted(map(tuple, want.values.tolist()))
    state = read_state(spark, str(tmp_path / "odd"))
    assert state.count() == 7
    assert rows(state) == rows(read_state(spark, str(tmp_path / "plain")))


_AGGS = {"n": ("count", None), "total.eur": ("sum", VALUE), "mean`v": ("mean", VALUE),
         "high": ("max", VALUE)}


def _aggs(n: dict[str, str], aggs: dict[str, Any] = _AGGS) -> dict[str, Any]:
    return {name: (func, None if col is None else n[col]) for name, (func, col) in aggs.items()}


@pytest.mark.parametrize("engine", ["python", "spark"])
def test_local_merge_and_merge_partials(frames: Any, engine: str) -> None:
    odd, plain = frames
    partials = tl.local_merge(odd, KEY, TIME, 10, _aggs(SAME), engine=engine)
    want = tl.local_merge(plain, "k", "t", 10, _aggs(PLAIN), engine=engine)
    same(partials, want)
    same(tl.merge_partials(partials, KEY, _aggs(SAME)), tl.merge_partials(want, "k", _aggs(PLAIN)))


def test_merge_partials_of_a_python_combine(frames: Any) -> None:
    odd, plain = frames
    combined = {"mask": (Combine(np.bitwise_or.reduce, "bigint"), TIME)}
    partials = tl.local_merge(odd, KEY, TIME, 10, _aggs(SAME, combined))
    want = tl.local_merge(plain, "k", "t", 10, _aggs(PLAIN, combined))
    same(tl.merge_partials(partials, [KEY], _aggs(SAME, combined)),
         tl.merge_partials(want, ["k"], _aggs(PLAIN, combined)))


def test_global_merge_on_the_driver(frames: Any) -> None:
    odd, plain = frames
    same(tl.global_merge(odd, KEY, _aggs(SAME), store="driver"),
         tl.global_merge(plain, "k", _aggs(PLAIN), store="driver"))  # Spark's own aggregation
    ordered = {"first x": ("first", EXTRA), "last.x": ("last", EXTRA), "n": ("count", None)}
    same(tl.global_merge(odd, KEY, _aggs(SAME, ordered), store="driver", event_time=TIME),
         tl.global_merge(plain, "k", _aggs(PLAIN, ordered), store="driver", event_time="t"))


def test_ahead_key_by_and_the_adaptive_partitioner(frames: Any) -> None:
    odd, plain = frames
    placed = ahead_key_by(odd, KEY, "hash", 3)
    assert KAFKA_PARTITION_COL in placed.columns
    same(placed, ahead_key_by(plain, "k", "hash", 3))
    views = []
    for df, key in ((odd, KEY), (plain, "k")):
        adaptive = tl.AdaptivePartitioner(3, sample_rate=1.0, min_sample=1)
        assert adaptive.observe_df(df, key, seed=0) == len(ROWS)
        views.append((adaptive.sample_view.to_dict(), adaptive.decide(force=True).chosen))
    assert views[0] == views[1]


def test_balance_on_a_file_and_on_a_frame(spark: Any, frames: Any, tmp_path: Path) -> None:
    odd, plain = frames
    results = []
    for name, key in ((KEY, KEY), ("plain", "k")):
        path = tmp_path / f"{name}.csv"
        pd.DataFrame({key: [r[0] for r in ROWS], "amount eur": [r[2] for r in ROWS]}).to_csv(
            path, index=False)
        out = io.StringIO()
        assert main(["balance", str(path), "--key", key, "--partitions", "4", "--json",
                     "--no-measure"],
                    out=out) == 0
        data = json.loads(out.getvalue())["datasets"][0]
        data.pop("name")
        results.append(data)
    assert results[0] == results[1] and results[0]["distinct_keys"] == 7
    got = run_balance(odd, KEY, "frame", 4, 1.0, 0, measure=True).to_dict()
    want = run_balance(plain, "k", "frame", 4, 1.0, 0, measure=True).to_dict()
    assert got == want and got["records"] == len(ROWS)
