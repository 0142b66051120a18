"""Every DataFrame-level API on the session the ``spark`` fixture gives: classic, or Spark
Connect under ``TRILINK_TEST_SESSION=connect``. Results are checked against plain Spark or
pandas oracles (the ones the classic tests use), so both kinds must give the same answers;
what Spark Connect cannot do is refused with ``ConnectUnsupportedError``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.errors import ConnectUnsupportedError, InvalidArgumentError
from trilink_spark.errors import InvalidArgumentTypeError, KeysNotGroupedError
from trilink_spark.kafka import read_kafka, write_kafka
from trilink_spark.merge import RedisStore, local_merge_foreach_batch
from trilink_spark.placement import ahead_key_by, is_keyed_by_source, keyed_by_source
from trilink_spark.placement import physical_plan, shuffle_exchanges
from trilink_spark.switching import ConfigCenter, adaptive_foreach_batch
from conftest import ON_CONNECT, assert_same_aggregates, raw_truth
from trilink_spark._internal.spark import compat
from trilink_spark.keyed.swaps import replanner as keyed_replan

pytestmark = pytest.mark.connect

AGGS = {"n": ("count", None), "s": ("sum", "v"), "lo": ("min", "v"), "hi": ("max", "v"),
        "m": ("mean", "v")}
SIZE, DELAY = 10, 2

# keyed/replan.py counts a keyed_by_source batch's partitions with batch_df.rdd until it uses
# trilink_spark._internal.spark.compat.num_partitions (issue 14); Spark Connect has no RDDs
_RUNNER_USES_RDD = "batch_df.rdd" in Path(keyed_replan.__file__).read_text(encoding="utf-8")


def rows_frame(n: int = 600, keys: int = 23, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    pdf = pd.DataFrame({"k": rng.integers(0, keys, n), "t": np.arange(n) // 3,
                        "v": rng.normal(size=n).round(3)})
    pdf.loc[rng.random(n) < 0.1, "v"] = np.nan
    return pdf


def readings(start: int, stop: int, sensors: int = 6) -> pd.DataFrame:
    rows = [(f"s{s:02d}", t, float(s + t)) for t in range(start, stop) for s in range(sensors)]
    return pd.DataFrame(rows, columns=["sensor", "t", "v"])


def complete_windows(rows: pd.DataFrame) -> pd.DataFrame:
    """Windows of SIZE every sensor's own watermark (max t - DELAY) has passed."""
    start = (rows["t"] // SIZE) * SIZE
    want = (rows.assign(window_start=start).groupby(["sensor", "window_start"])["v"]
            .agg(["count", "sum"]).reset_index())
    high = rows.groupby("sensor")["t"].max() - DELAY
    done = want[want["window_start"] + SIZE <= want["sensor"].map(high)]
    return done.sort_values(["sensor", "window_start"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def frame(spark: Any) -> Any:
    return spark.createDataFrame(rows_frame()).repartition(3).cache()


def test_the_fixture_gives_the_session_kind_asked_for(spark: Any) -> None:
    assert compat.is_connect(spark) is ON_CONNECT
    assert compat.is_connect(spark.range(1)) is ON_CONNECT
    assert compat.is_connect(F.col("x")) is ON_CONNECT
    assert tl.get_session() is spark  # the active session, whichever kind
    compat.require_classic(pd.DataFrame(), "anything", "nothing")  # not Spark: no refusal
    if ON_CONNECT:
        with pytest.raises(ConnectUnsupportedError, match="use that instead"):
            compat.require_classic(spark.range(1), "this feature", "use that instead")
        with pytest.raises(NotImplementedError):  # also an ordinary NotImplementedError
            compat.require_classic(spark, "this feature", "use that instead")


def test_plans_and_shuffle_counts(spark: Any) -> None:
    frame = spark.createDataFrame(rows_frame())  # not cached: a cache shows its own plan
    grouped = frame.groupBy("k").count()
    plan = physical_plan(grouped)
    assert "Exchange" in plan and not plan.startswith("==")
    assert "== Physical Plan ==" in compat.plan_text(grouped)
    assert "== Analyzed Logical Plan ==" in compat.plan_text(grouped, "extended")
    with pytest.raises(InvalidArgumentError):
        compat.plan_text(grouped, "nope")
    assert shuffle_exchanges(spark.range(10)) == 0
    assert shuffle_exchanges(grouped) == 1
    assert shuffle_exchanges(tl.key_by(frame, "k", "hash", 4)) == 1
    assert shuffle_exchanges(tl.local_merge(frame, "k", "t", 100, AGGS, engine="python")) == 0


def test_partition_counts_see_empty_partitions(spark: Any) -> None:
    # range(0, 6) in 4 slices: [0], [1, 2], [3], [4, 5]; the filter empties the last two
    df = spark.range(0, 6, 1, 4).filter("id < 3")
    assert compat.partition_counts(df).tolist() == [1, 2, 0, 0]
    assert compat.num_partitions(df) == 4
    report = tl.partition_balance(df)
    assert report.loads.tolist() == [1, 2, 0, 0]
    assert report.num_partitions == 4 and report.balance_degree == 0.0
    with pytest.raises(InvalidArgumentTypeError):
        tl.partition_balance([1, 2, 3])  # type: ignore[arg-type]


@pytest.mark.parametrize("strategy", [
    "hash", "least_count", "auto", tl.BlockPartitioner(4, 64, np.arange(64) % 4),
], ids=["hash", "least_count", "auto", "block"])
def test_key_by_places_rows_where_the_strategy_says(spark: Any, frame: Any,
                                                   strategy: Any) -> None:
    placed = tl.key_by(frame, "k", strategy, 4)
    got = placed.selectExpr("k", tl.PARTITION_COL, "spark_partition_id() AS pid").toPandas()
    assert len(got) == 600
    assert (got[tl.PARTITION_COL] == got["pid"]).all()  # the rows are where the column says
    model = tl.resolve_strategy(frame, "k", strategy, 4).partitioner
    assert got[tl.PARTITION_COL].tolist() == model.assign(got["k"].to_numpy()).tolist()


def test_keyed_agg_and_apply_equal_group_by(frame: Any) -> None:
    got = tl.keyed_agg(frame, "k", F.count(F.lit(1)).alias("n"), F.sum("v").alias("s"),
                       F.min("v").alias("lo"), F.max("v").alias("hi"), F.avg("v").alias("m"),
                       strategy="least_count", num_partitions=4)
    assert_same_aggregates(got.toPandas(), raw_truth(frame))

    def top(pdf: pd.DataFrame) -> pd.DataFrame:
        return pdf.nlargest(1, "t")

    applied = tl.keyed_apply(frame, "k", top, frame.schema, strategy="least_key",
                             num_partitions=4).toPandas().sort_values("k")
    want = frame.toPandas().sort_values("t").groupby("k").tail(1).sort_values("k")
    assert applied["t"].tolist() == want["t"].tolist()


def test_keyed_watermark_and_process(spark: Any) -> None:
    rows = readings(0, 40)
    rows["arr"] = np.arange(len(rows))
    df = spark.createDataFrame(rows).coalesce(1)
    marked = tl.keyed_watermark(df, "sensor", "t", DELAY, order_by="arr").toPandas()
    assert len(marked) == len(rows) and not marked["is_late"].any()  # in order per sensor
    # each sensor's readings come in order, one per t: its watermark is the previous t - DELAY
    assert marked.loc[marked["t"] == 0, "key_watermark"].isna().all()
    later = marked[marked["t"] > 0]
    assert (later["key_watermark"] == later["t"] - 1 - DELAY).all()
    agg = tl.KeyedWindowAggregate(SIZE, value="v", aggs=("count", "sum"))
    got = (tl.keyed_process(df, "sensor", "t", agg, delay=DELAY, order_by="arr",
                            num_partitions=3).toPandas()
           .sort_values(["sensor", "window_start"]).reset_index(drop=True))
    start = (rows["t"] // SIZE) * SIZE
    want = (rows.assign(window_start=start).groupby(["sensor", "window_start"])["v"]
            .agg(["count", "sum"]).reset_index())
    assert got[["sensor", "window_start", "count", "sum"]].values.tolist() == \
        want[["sensor", "window_start", "count", "sum"]].values.tolist()


def test_local_and_global_merge_equal_group_by(frame: Any) -> None:
    partial = tl.local_merge(frame, "k", "t", 50, AGGS, quantity=97)
    assert partial.count() < 600
    assert_same_aggregates(tl.merge_partials(partial, "k", AGGS).toPandas(), raw_truth(frame))
    merged = tl.global_merge(frame, "k", AGGS)
    assert merged is not None
    assert_same_aggregates(merged.toPandas(), raw_truth(frame))


def test_global_merge_into_redis(frame: Any, redis_server: Any, spark: Any) -> None:
    store = RedisStore(redis_server.url, f"t:connect:{ON_CONNECT}")
    got = tl.global_merge(frame, "k", AGGS, store=store, batch_id=1)
    assert got is not None
    assert_same_aggregates(got.toPandas(), raw_truth(frame))
    assert_same_aggregates(store.read(spark).toPandas(), raw_truth(frame))


def test_ahead_key_by_and_keyed_by_source(spark: Any, frame: Any, tmp_path: Path) -> None:
    out = ahead_key_by(frame, "k", "least_count", 4,
                       assignment_path=str(tmp_path / "assignment.json"))
    placed = dict(tl.key_by(frame, "k", tl.Partitioner.from_json(
        (tmp_path / "assignment.json").read_text()), fit="none")
        .select("k", tl.PARTITION_COL).distinct().collect())
    assert dict(out.select("k", "partition").distinct().collect()) == placed
    # rows whole per input partition: one partition per Kafka partition, as read back
    source = out.repartitionById(4, F.col("partition")).localCheckpoint()
    declared = keyed_by_source(source, "k", verify=True)
    assert is_keyed_by_source(declared, "k") and not is_keyed_by_source(source, "k")
    with pytest.raises(KeysNotGroupedError):
        keyed_by_source(frame, "k", verify=True)
    sums = tl.keyed_agg(declared, "k", F.count("*").alias("n"), F.sum("v").alias("s"),
                        F.min("v").alias("lo"), F.max("v").alias("hi"), F.avg("v").alias("m"),
                        F.count_distinct("t").alias("d"), F.first("v", True).alias("f"))
    assert shuffle_exchanges(sums) == 0
    got = sums.toPandas()
    assert_same_aggregates(got, raw_truth(frame))
    assert got.sort_values("k")["d"].tolist() == \
        frame.groupBy("k").agg(F.count_distinct("t")).orderBy("k").toPandas().iloc[:, 1].tolist()
    applied = tl.keyed_apply(declared, "k", lambda p: p.head(1), declared.schema)
    assert shuffle_exchanges(applied) == 0 and applied.count() == 23
    with pytest.raises(KeysNotGroupedError):  # shuffled after the declaration
        tl.keyed_agg(declared.repartition(3), "k", F.sum("v"))


def test_sql_text_aggregates_are_refused_per_partition(frame: Any) -> None:
    declared = keyed_by_source(frame.coalesce(1), "k")
    with pytest.raises(InvalidArgumentError, match=r"F\.expr"):  # on both kinds
        tl.keyed_agg(declared, "k", F.expr("sum(v)").alias("s"))
    with pytest.raises(InvalidArgumentError, match="not computed per partition"):
        tl.keyed_agg(declared, "k", (F.sum("v") + 1).alias("x"))


def test_adaptive_placement(spark: Any, frame: Any) -> None:
    ap = tl.AdaptivePartitioner(4, sample_rate=1.0, min_sample=10, mode="quantity", quantity=1)
    assert ap.observe_df(frame, "k") == 600
    ap.decide()
    placed = tl.key_by(frame, "k", ap)
    rows = placed.selectExpr("k", tl.PARTITION_COL, "spark_partition_id() AS pid").toPandas()
    assert (rows[tl.PARTITION_COL] == rows["pid"]).all()
    assert rows[tl.PARTITION_COL].tolist() == ap.current.assign(rows["k"].to_numpy()).tolist()
    sizes: list[int] = []
    run = adaptive_foreach_batch(lambda d, b: sizes.append(d.count()), ap, "k")
    run(frame, 0)
    assert sizes == [600] and run.last_decision is not None


def test_foreach_batch_functions_by_hand(spark: Any, tmp_path: Path) -> None:
    sink: list[pd.DataFrame] = []
    agg = tl.KeyedWindowAggregate(SIZE, value="v", aggs=("count", "sum"))
    run = tl.keyed_foreach_batch(lambda d, b: sink.append(d.toPandas()), "sensor", "t", agg,
                                 DELAY, str(tmp_path / "keyed"), num_partitions=3)
    parts = [readings(0, 15), readings(15, 33)]
    for batch_id, part in enumerate(parts):
        run(spark.createDataFrame(part), batch_id)
    got = (pd.concat(sink, ignore_index=True).sort_values(["sensor", "window_start"])
           .reset_index(drop=True))
    want = complete_windows(pd.concat(parts))
    assert got[["sensor", "window_start", "count", "sum"]].values.tolist() == \
        want[["sensor", "window_start", "count", "sum"]].values.tolist()

    merged: list[pd.DataFrame] = []
    lm = local_merge_foreach_batch(lambda d, b: merged.append(d.toPandas()), "k", "t", 50,
                                   AGGS, str(tmp_path / "merge"), quantity=97)
    pdf = rows_frame()
    halves = [pdf.iloc[:300], pdf.iloc[300:]]
    for batch_id, half in enumerate(halves):
        lm(spark.createDataFrame(half).repartition(2), batch_id)
    flushed = pd.concat(merged, ignore_index=True)
    assert int(flushed["n"].sum()) + lm.buffered() == 600


@pytest.mark.xfail(ON_CONNECT and _RUNNER_USES_RDD, strict=True,
                   reason="keyed/replan.py still reads batch_df.rdd (issue 14)")
def test_keyed_foreach_batch_on_a_source_declared_batch(spark: Any, tmp_path: Path) -> None:
    sink: list[pd.DataFrame] = []
    agg = tl.KeyedWindowAggregate(SIZE, value="v", aggs=("count", "sum"))
    run = tl.keyed_foreach_batch(lambda d, b: sink.append(d.toPandas()), "sensor", "t", agg,
                                 DELAY, str(tmp_path / "keyed-source"))
    rows = readings(0, 30)
    run(keyed_by_source(spark.createDataFrame(rows).coalesce(1), "sensor"), 0)
    got = (pd.concat(sink, ignore_index=True).sort_values(["sensor", "window_start"])
           .reset_index(drop=True))
    assert got[["sensor", "window_start", "count", "sum"]].values.tolist() == \
        complete_windows(rows)[["sensor", "window_start", "count", "sum"]].values.tolist()


def test_keyed_state_through_a_streaming_query(spark: Any, tmp_path: Path) -> None:
    """A real query: on Spark Connect the server runs foreachBatch in its own Python process
    (a copy of the function), where the query id is unavailable."""
    src, out, ids = tmp_path / "in", tmp_path / "out", tmp_path / "ids"
    rows = readings(0, 33)
    src.mkdir()
    rows.to_parquet(src / "part-0.parquet")
    agg = tl.KeyedWindowAggregate(SIZE, value="v", aggs=("count", "sum"))

    def write(df: Any, batch_id: int) -> None:
        df.write.mode("append").parquet(str(out))

    keyed = tl.keyed_foreach_batch(write, "sensor", "t", agg, DELAY, str(tmp_path / "state"),
                                   num_partitions=3)

    def run(df: Any, batch_id: int) -> None:
        ids.mkdir(exist_ok=True)
        (ids / f"{batch_id}.json").write_text(json.dumps(compat.streaming_query_id(df)))
        keyed(df, batch_id)

    stream = spark.readStream.schema("sensor string, t long, v double").parquet(str(src))
    query = (stream.writeStream.foreachBatch(run)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    got = (spark.read.parquet(str(out)).toPandas().sort_values(["sensor", "window_start"])
           .reset_index(drop=True))
    want = complete_windows(rows)
    assert got[["sensor", "window_start", "count", "sum"]].values.tolist() == \
        want[["sensor", "window_start", "count", "sum"]].values.tolist()
    seen = {json.loads(p.read_text()) for p in ids.iterdir()}
    assert seen == ({None} if ON_CONNECT else {str(query.id)})
    assert compat.streaming_query_id(spark.range(1)) is None  # outside a query


def test_a_detached_config_center_is_refused_on_connect(spark: Any, frame: Any) -> None:
    """What Spark Connect's foreachBatch worker sees: a copy of the function whose
    partitioner's config center stayed in the client."""
    from pyspark import cloudpickle

    center = ConfigCenter()
    ap = tl.AdaptivePartitioner(4, sample_rate=1.0, min_sample=10, config=center)
    run = adaptive_foreach_batch(lambda d, b: None, ap, "k")
    blob = cloudpickle.dumps(run)
    assert not cloudpickle.loads(blob).adaptive.config_detached  # same process: same center
    ap.close()
    del center, ap, run  # the center is gone, as it is in another process
    import gc

    gc.collect()
    copy = cloudpickle.loads(blob)
    assert copy.adaptive.config_detached
    if ON_CONNECT:
        with pytest.raises(ConnectUnsupportedError, match="config center"):
            copy(frame, 0)
    else:
        copy(frame, 0)  # classic foreachBatch never copies the function; a copy still runs
    plain = adaptive_foreach_batch(lambda d, b: None, tl.AdaptivePartitioner(4), "k")
    assert not cloudpickle.loads(cloudpickle.dumps(plain)).adaptive.config_detached


def test_kafka_round_trip_without_a_shuffle(spark: Any, kafka_broker: Any, frame: Any) -> None:
    topic = f"connect-{int(ON_CONNECT)}"
    kafka_broker.create_topic(topic, 4)
    placed = ahead_key_by(frame, "k", "modulo", 4)
    write_kafka(placed.selectExpr("CAST(k AS STRING) AS key", "CAST(t AS STRING) AS value",
                                  "partition"), kafka_broker.bootstrap, topic)
    raw = read_kafka(spark, kafka_broker.bootstrap, topic)  # one partition per Kafka one
    read = raw.selectExpr("CAST(CAST(key AS STRING) AS LONG) AS k",
                          "CAST(CAST(value AS STRING) AS LONG) AS t")
    counts = tl.keyed_agg(keyed_by_source(read, "k"), "k", F.count("*").alias("n"),
                          F.max("t").alias("last"))
    assert shuffle_exchanges(counts) == 0
    got = counts.orderBy("k").toPandas()
    want = frame.groupBy("k").agg(F.count("*").alias("n"), F.max("t").alias("last"))
    assert got.values.tolist() == want.orderBy("k").toPandas().values.tolist()


def test_the_balance_command(spark: Any, tmp_path: Path) -> None:
    import io

    from trilink_spark.cli import main

    out = io.StringIO()
    assert main(["balance", "--scenario", "uniform", "--records", "2000", "--keys", "40",
                 "--partitions", "4", "--json", "--measure"], out=out) == 0
    data = json.loads(out.getvalue())["datasets"][0]
    assert data["records"] == 2000
    hashed = data["strategies"][0]
    assert hashed["strategy"] == "hash"
    # the placement measured with Spark agrees with the one computed on the driver
    assert data["measured"]["hash"]["balance_degree"] == pytest.approx(hashed["balance_degree"])
