"""A small end-to-end job: skewed orders, hash vs the strategy trilink-spark chooses.

Run: ``python examples/balance_orders.py`` (local Spark, no servers).
"""

from __future__ import annotations

from pyspark.sql import functions as F

import trilink_spark as tl
from trilink_spark.placement import shuffle_exchanges
from trilink_spark.partitioners.choosing.scenarios import make_scenario, scenario_frame


def main() -> None:
    spark = tl.get_session("local[2]", shuffle_partitions=8)
    # 200,000 orders from 2,000 customers, a few of them very active (Zipf s = 1.1)
    customers = make_scenario("zipf", 200_000, 2_000, zipf_s=1.1, seed=7)
    orders = scenario_frame(spark, customers, "customer").withColumn(
        "amount", (F.rand(7) * 100).cast("int")
    )

    chosen = tl.resolve_strategy(orders, "customer", "auto", 8)
    print(f"scores on {chosen.sample_rows:,} counted rows:")
    for score in chosen.scores:
        print(f"  {score.name:12s} balance {score.balance_degree:.3f}")
    print("chosen:", chosen.partitioner.strategy_name)

    for name, strategy in (("hash", "hash"), ("chosen", chosen.partitioner)):
        placed = tl.key_by(orders, "customer", strategy, 8, fit="none")
        report = tl.partition_balance(placed)
        print(f"{name:7s} rows per partition {report.loads.tolist()} balance {report.balance_degree:.3f}")

    totals = tl.keyed_agg(
        orders, "customer", F.sum("amount").alias("total"), strategy=chosen.partitioner, fit="none"
    )
    print("customers:", totals.count(), "shuffles:", shuffle_exchanges(totals))


if __name__ == "__main__":
    main()
    tl.get_session().stop()
