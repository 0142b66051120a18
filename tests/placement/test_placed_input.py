"""A frame already laid out by ``repartition(n, key)`` is not placed again under ``hash``.

Each test counts the shuffle exchanges of the physical plan and checks where every row ends
up: in the Spark partition that its ``_tl_partition`` names, which is the partition the
strategy gives it, exactly as on a frame that had to be placed.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

import trilink_spark as tl
from trilink_spark.columns import PARTITION_COL
from trilink_spark.errors import TrilinkError
from trilink_spark.placement import shuffle_exchanges
from trilink_spark.placement.key_by import already_placed

N = 4


def frame(spark: Any, rows: list[tuple[Any, ...]], ddl: str = "k bigint, t double, v double"
          ) -> Any:
    return spark.createDataFrame(rows, ddl)


def rows_of(n_keys: int = 30, per_key: int = 5, seed: int = 0) -> list[tuple[Any, ...]]:
    rng = random.Random(seed)
    out = [(k, float(i * 7 + rng.random()), float(rng.randint(0, 9)))
           for k in range(n_keys) for i in range(per_key)]
    rng.shuffle(out)
    return out


def layout(df: Any, key: str = "k") -> list[tuple[Any, int, int]]:
    """(key, Spark partition, PARTITION_COL) of every row."""
    from pyspark.sql import functions as F

    got = df.select(F.col(key), F.spark_partition_id().alias("sp"), F.col(PARTITION_COL))
    return sorted(((r[0], int(r[1]), int(r[2])) for r in got.collect()),
                  key=lambda t: (t[0] is None, str(t[0]), t[1]))


def check_layout(placed: Any, key: str, strategy: tl.Partitioner) -> None:
    """Every row in the partition its column names, which is the one ``strategy`` gives."""
    for k, sp, pid in layout(placed, key):
        assert sp == pid, (k, sp, pid)
        want = strategy.partition(k) if k is not None else tl.HashPartitioner(N).partition(None)
        assert pid == want, (k, pid, want)


@pytest.mark.connect
def test_key_by_on_a_frame_hash_partitioned_by_the_key_adds_no_exchange(spark: Any) -> None:
    df = frame(spark, rows_of())
    pre = df.repartition(N, "k").sortWithinPartitions("t")
    assert shuffle_exchanges(pre) == 1
    placed = tl.key_by(pre, "k", "hash", N)
    assert shuffle_exchanges(placed) == 1  # the input's own: none added
    check_layout(placed, "k", tl.HashPartitioner(N))
    # the same rows, in the same partitions, as key_by on the frame before its repartition
    fresh = tl.key_by(df, "k", "hash", N)
    assert shuffle_exchanges(fresh) == 1
    assert layout(placed) == layout(fresh)


@pytest.mark.connect
def test_projections_and_filters_above_the_exchange_keep_the_layout(spark: Any) -> None:
    from pyspark.sql import functions as F

    pre = (frame(spark, rows_of()).repartition(N, "k")
           .withColumn("w", F.col("v") * 2).where(F.col("v") > 1).select("k", "t", "w"))
    placed = tl.key_by(pre, "k", "hash", N)
    assert shuffle_exchanges(placed) == 1
    check_layout(placed, "k", tl.HashPartitioner(N))


@pytest.mark.parametrize("case", ["other_count", "round_robin", "two_columns", "by_other",
                                  "renamed_onto_key", "cast_key", "group_by", "joined"])
def test_any_other_layout_is_placed_again(spark: Any, case: str) -> None:
    from pyspark.sql import functions as F

    df = frame(spark, rows_of())
    other = df.withColumn("k2", (F.col("k") + 1) % 7)
    pre = {
        "other_count": df.repartition(N * 2, "k"),
        "round_robin": df.repartition(N),
        "two_columns": df.repartition(N, "k", "t"),
        "by_other": other.repartition(N, "k2"),
        # hashed by the old k, then another column takes its name: placed by the new k
        "renamed_onto_key": other.repartition(N, "k").withColumnRenamed("k", "k_old")
        .withColumnRenamed("k2", "k"),
        "cast_key": df.repartition(N, F.col("k").cast("int")),
        # groupBy's exchange may be coalesced by adaptive execution: never taken as a layout
        "group_by": df.groupBy("k").agg(F.max("t").alias("t")),
        "joined": df.repartition(N, "k").join(df.select("k").distinct(), "k"),
    }[case]
    before = shuffle_exchanges(pre)
    placed = tl.key_by(pre, "k", "hash", N)
    # placed again by Spark's repartition(n, k), which Spark's optimiser may merge with a
    # shuffle of the input's (CollapseRepartition): one exchange more at most, never none
    assert 1 <= shuffle_exchanges(placed) <= before + 1
    assert not tl.placement.already_placed(pre, "k", tl.HashPartitioner(N))
    check_layout(placed, "k", tl.HashPartitioner(N))


@pytest.mark.parametrize("policy", ["group", "partition0", "error"])
def test_null_keys_go_where_the_policy_says(spark: Any, policy: str) -> None:
    rows = rows_of(n_keys=10) + [(None, 1.0, 1.0), (None, 2.0, 2.0)]
    pre = frame(spark, rows).repartition(N, "k")
    placed = tl.key_by(pre, "k", tl.HashPartitioner(N, null_policy=policy), N)
    if policy == "error":
        assert shuffle_exchanges(placed) == 1  # Spark's null partition is the policy's too
        # the JVM's refusal, as on any key_by output (the runners raise it typed)
        with pytest.raises(Exception, match="NullKeyError: column 'k' has null keys"):
            placed.collect()
        return
    # "group": Spark's own null partition, pmod(42, n); "partition0": rows move to 0
    assert shuffle_exchanges(placed) == (1 if policy == "group" else 2)
    nulls = [(sp, pid) for k, sp, pid in layout(placed) if k is None]
    want = 42 % N if policy == "group" else 0
    assert nulls == [(want, want)] * 2
    assert all(sp == pid for _, sp, pid in layout(placed))


def test_a_key_type_the_strategy_casts_to_is_placed_again(spark: Any) -> None:
    pre = frame(spark, rows_of(), "k int, t double, v double").repartition(N, "k")
    as_long = tl.HashPartitioner(N, key_type="long")
    placed = tl.key_by(pre, "k", as_long, N)
    assert shuffle_exchanges(placed) == 2  # Spark hashed int values; the strategy longs
    check_layout(placed, "k", as_long)
    as_int = tl.HashPartitioner(N, key_type="int")
    assert shuffle_exchanges(tl.key_by(pre, "k", as_int, N)) == 1


def test_only_hash_is_reused(spark: Any) -> None:
    pre = frame(spark, rows_of()).repartition(N, "k")
    modulo = tl.ModuloPartitioner(N)
    placed = tl.key_by(pre, "k", modulo, N)
    assert shuffle_exchanges(placed) == 2
    check_layout(placed, "k", modulo)


def test_a_streaming_frame_is_never_looked_into(spark: Any, tmp_path: Any) -> None:
    src = tmp_path / "src"
    frame(spark, rows_of(n_keys=3)).write.parquet(str(src))
    stream = spark.readStream.schema("k bigint, t double, v double").parquet(str(src))
    assert already_placed(stream, "k", tl.HashPartitioner(N)) is False


@pytest.mark.parametrize("seed", range(6))
def test_random_frames_keep_every_row_where_the_strategy_puts_it(spark: Any, seed: int
                                                                  ) -> None:
    """Seeded: key type, partition count, nulls and the operators above the exchange."""
    from pyspark.sql import functions as F

    rng = random.Random(seed)
    n = rng.choice([1, 3, 4, 7])
    kind = rng.choice(["bigint", "int", "string"])
    keys: list[Any] = [rng.randint(-50, 50) for _ in range(rng.randint(20, 80))]
    if kind == "string":
        keys = [f"u{k}" for k in keys]
    keys += [None] * rng.randint(0, 3)
    df = spark.createDataFrame([(k, float(i)) for i, k in enumerate(keys)], f"k {kind}, t double")
    pre = df.repartition(n, "k")
    if rng.random() < 0.5:
        pre = pre.sortWithinPartitions("t")
    if rng.random() < 0.5:
        pre = pre.where(F.col("t") >= 0).withColumn("t2", F.col("t") + 1)
    strategy = tl.HashPartitioner(n)
    placed = tl.key_by(pre, "k", strategy, n)
    # Spark hashes an int column as int; the Python side hashes ints as long unless told
    expect = tl.HashPartitioner(n, key_type="int") if kind == "int" else strategy
    assert shuffle_exchanges(placed) == 1
    got = layout(placed)
    assert len(got) == len(keys)  # nothing lost, nothing doubled
    for k, sp, pid in got:
        assert sp == pid
        assert pid == (42 % n if k is None else expect.partition(k))


@pytest.mark.connect
@pytest.mark.parametrize("engine", ["spark", "python"])
def test_keyed_process_on_placed_input_adds_no_exchange(spark: Any, engine: str) -> None:
    df = frame(spark, rows_of(n_keys=40, per_key=12))
    agg = tl.KeyedWindowAggregate(size=20.0, value="v", aggs=("count", "sum"))
    pre = df.repartition(N, "k").sortWithinPartitions("t")
    got = tl.keyed_process(pre, "k", "t", agg, delay=3.0, num_partitions=N, engine=engine)
    # the same arrival order, placed again: a null policy other than Spark's asks for it
    again = tl.HashPartitioner(N, null_policy="partition0")
    want = tl.keyed_process(pre, "k", "t", agg, delay=3.0, strategy=again, engine=engine)
    assert shuffle_exchanges(got) == 1
    assert shuffle_exchanges(want) == 2
    assert got.count() > 0
    assert sorted(map(tuple, got.collect())) == sorted(map(tuple, want.collect()))


@pytest.mark.connect
def test_keyed_agg_and_keyed_apply_on_placed_input_add_no_exchange(spark: Any) -> None:
    from pyspark.sql import functions as F

    df = frame(spark, rows_of())
    pre = df.repartition(N, "k")
    agg = tl.keyed_agg(pre, "k", F.sum("v").alias("s"), strategy="hash", num_partitions=N)
    assert shuffle_exchanges(agg) == 1
    want = df.groupBy("k").agg(F.sum("v").alias("s"))
    assert sorted(map(tuple, agg.collect())) == sorted(map(tuple, want.collect()))

    def first(pdf: Any) -> Any:
        return pdf.nsmallest(1, "t")

    applied = tl.keyed_apply(pre, "k", first, df.schema, strategy="hash", num_partitions=N)
    assert shuffle_exchanges(applied) == 1
    assert applied.count() == 30


@pytest.mark.connect
def test_a_hash_key_by_output_is_placed_for_the_next_keyed_operator(spark: Any) -> None:
    from trilink_spark.columns import PARTITION_COL

    df = frame(spark, rows_of(n_keys=40, per_key=6, seed=5))
    placed = tl.key_by(df, "k", "hash", N)
    assert shuffle_exchanges(placed) == 1
    check_layout(placed, "k", tl.HashPartitioner(N))
    agg = tl.KeyedWindowAggregate(size=20.0, value="v", aggs=("count", "sum"))
    # no row is late under this delay: the windows do not depend on the arrival order,
    # which a shuffle's block fetches do not fix
    got = tl.keyed_process(placed.drop(PARTITION_COL), "k", "t", agg, delay=1e6,
                           num_partitions=N)
    assert shuffle_exchanges(got) == 1  # key_by's own, nothing more
    want = tl.keyed_process(df, "k", "t", agg, delay=1e6, num_partitions=N)
    assert got.count() > 0
    assert sorted(map(tuple, got.collect())) == sorted(map(tuple, want.collect()))


@pytest.mark.parametrize("order_by", [None, "v"])
def test_keyed_watermark_on_placed_input_adds_no_exchange(spark: Any, order_by: Any) -> None:
    pre = frame(spark, rows_of(per_key=12, seed=3)).repartition(N, "k")
    marked = tl.keyed_watermark(pre, "k", "t", 3.0, order_by=order_by)
    assert shuffle_exchanges(marked) == 1
    # the same partitions and order, its plan hidden: the path with the exchange
    hidden = spark.createDataFrame(pre.rdd, pre.schema)
    reference = tl.keyed_watermark(hidden, "k", "t", 3.0, order_by=order_by)
    assert shuffle_exchanges(reference) == 1  # its own: the input's is out of the plan
    got = sorted(tuple(r) for r in marked.collect())
    assert len(got) == 360
    assert got == sorted(tuple(r) for r in reference.collect())
    late = [r for r in got if r[4]]
    partition_late = [r for r in got if r[5]]
    assert late and partition_late and late != partition_late  # both views have work to do


def test_a_typed_error_is_still_typed_on_placed_input(spark: Any) -> None:
    pre = frame(spark, rows_of()).repartition(N, "k")
    with pytest.raises(TrilinkError):
        tl.key_by(pre, "missing", "hash", N)
