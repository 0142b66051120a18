"""Ahead KeyBy, writing side: the Kafka partition column and producer-side partitioners."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import trilink_spark as tl
from trilink_spark.placement import KafkaPythonPartitioner, ahead_key_by, confluent_partition
from trilink_spark.placement import shuffle_exchanges


def orders(spark: Any, users: range) -> Any:
    rows = [(u, f"order-{u}-{i}") for u in users for i in range(u % 5 + 1)]
    return spark.createDataFrame(rows, "user long, payload string")


@pytest.mark.connect
@pytest.mark.parametrize("strategy", ["hash", "modulo"])
def test_partition_column_is_the_key_by_placement(spark: Any, strategy: str) -> None:
    df = orders(spark, range(200))
    out = ahead_key_by(df, "user", strategy, 6)
    assert shuffle_exchanges(out) == 0  # rows stay where they are
    rows = out.select("user", "partition").collect()
    placed = tl.key_by(df, "user", strategy, 6).select("user", tl.PARTITION_COL).collect()
    assert dict((r[0], r[1]) for r in rows) == dict((r[0], r[1]) for r in placed)


def test_table_assignment_survives_between_runs(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "assignment.json")
    first = ahead_key_by(orders(spark, range(100)), "user", "least_count", 4,
                         assignment_path=path)
    before = {r[0]: r[1] for r in first.select("user", "partition").collect()}
    # a later run with other traffic: known keys keep their partition, new keys get one
    second = ahead_key_by(orders(spark, range(50, 160)), "user", "least_count", 4,
                          assignment_path=path)
    after = {r[0]: r[1] for r in second.select("user", "partition").collect()}
    assert all(after[u] == before[u] for u in range(50, 100))
    assert set(after) == set(range(50, 160))
    stored = tl.Partitioner.from_json(Path(path).read_text())
    assert len(stored) == 160  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="assignment_path"):
        ahead_key_by(orders(spark, range(5)), "user", "least_key", 4)
    with pytest.raises(ValueError, match="would move keys"):
        ahead_key_by(orders(spark, range(5)), "user", "least_count", 8, assignment_path=path)


def test_producer_partitioners_agree_with_spark(spark: Any) -> None:
    strategy = tl.LeastCountPartitioner(4, history={u: u % 7 + 1 for u in range(40)})
    out = ahead_key_by(orders(spark, range(40)), "user", strategy)
    spark_side = {r[0]: r[1] for r in out.select("user", "partition").collect()}
    producer = KafkaPythonPartitioner(strategy, key_decoder=lambda b: int(b))
    assert all(producer(str(u).encode(), [0, 1, 2, 3], [0, 1, 2, 3]) == spark_side[u]
               for u in range(40))
    assert all(confluent_partition(strategy, u, 4) == spark_side[u] for u in range(40))
    hashed = tl.HashPartitioner(4, key_type="long")
    spark_hash = {r[0]: r[1] for r in ahead_key_by(orders(spark, range(40)), "user", hashed)
                  .select("user", "partition").collect()}
    by_bytes = KafkaPythonPartitioner(hashed, key_decoder=lambda b: int(b))
    assert all(by_bytes(str(u).encode(), range(4)) == spark_hash[u] for u in range(40))


def test_partition_count_mismatch_is_refused(spark: Any) -> None:
    producer = KafkaPythonPartitioner(tl.ModuloPartitioner(4), key_decoder=int)
    with pytest.raises(ValueError, match="3 partitions"):
        producer(b"7", [0, 1, 2])
    with pytest.raises(ValueError):
        confluent_partition(tl.ModuloPartitioner(4), 7, num_partitions=8)
    assert producer(None, [0, 1, 2, 3]) == 0
    plain = orders(spark, range(3))
    df = plain.withColumn("partition", plain.user)
    with pytest.raises(ValueError, match="overwrite"):
        ahead_key_by(df, "user", "hash", 2)
    assert "partition" in ahead_key_by(df, "user", "hash", 2, overwrite=True).columns
