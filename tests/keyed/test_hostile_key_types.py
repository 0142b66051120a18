"""Hostile probes of the key type a keyed stream places by: tinyint, smallint, int and bigint.

Spark hashes a ``tinyint``/``smallint``/``int`` value as a 32-bit int and a ``bigint`` as a
64-bit long. The JVM places a micro-batch's rows by the key column's own type; the driver
plans a swap by placing the stored keys in Python. Both must hash as the same type, or a
moved key's state lands on one partition and its rows on another.

Every probe checks, after every batch: each key's state is stored in exactly one partition,
that partition is the one the JVM sent the key's rows to in that batch, and each key's
count equals an oracle.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from trilink_spark._internal.io.sealed import CHECKSUM_KEY, SEALED_KEY
from trilink_spark.errors import InvalidArgumentError, InvalidKeyTypeError
from trilink_spark.keyed import KeyedBatchFunction
from trilink_spark.keyed.swaps.placement import bound_placement, stored_key_type
from trilink_spark.switching import LoadAwareRebalancer, RebalanceDecision
from testkit.swaps import check_invariants

cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Spark type -> (lowest, highest) value it holds.
BOUNDS = {"tinyint": (-(2**7), 2**7 - 1), "smallint": (-(2**15), 2**15 - 1),
          "int": (-(2**31), 2**31 - 1), "bigint": (-(2**63), 2**63 - 1)}
TYPES = list(BOUNDS)


class KeyCount(tl.KeyedWatermarkProcessFunction):
    """Running count per key; emits (key, count, the partition the rows were processed on)."""

    output_schema = "k long, n long, p int"
    state_schema = "n long"

    def open(self, partition_id: int) -> None:
        self.pid = partition_id

    def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
        n = ctx.get_state("n", 0) + len(rows)
        ctx.set_state("n", n)
        return [(int(key), n, self.pid)]


def key_pool(spark_type: str, seed: int, size: int = 48) -> list[int]:
    """Seeded distinct keys of ``spark_type``: both bounds, near them, -1, 0, 1, and random
    values (negative ones included)."""
    low, high = BOUNDS[spark_type]
    rng = np.random.default_rng(seed)
    keys = {low, low + 1, low + 2, high, high - 1, high - 2, -1, 0, 1}
    while len(keys) < size:
        keys.add(int(rng.integers(low, high, endpoint=True, dtype=np.int64)))
    return sorted(keys)


class Stream:
    """One keyed stream of ``spark_type`` keys with its oracle; :meth:`batch` runs a batch and
    checks every invariant."""

    def __init__(self, spark: Any, tmp_path: Path, spark_type: str, seed: int = 0,
                 **kw: Any) -> None:
        self.spark, self.spark_type = spark, spark_type
        self.keys = key_pool(spark_type, seed)
        self.rng = np.random.default_rng(seed + 1)
        self.path = str(tmp_path / "state")
        self.total: pd.Series = pd.Series(dtype=np.int64)
        self.placed: dict[int, int] = {}  # the partition the JVM sent each key's rows to
        self.run = self.runner(**kw)

    def runner(self, **kw: Any) -> KeyedBatchFunction:
        def sink(df: Any, batch_id: int) -> None:
            for row in df.collect():
                self.placed[int(row["k"])] = int(row["p"])

        kw.setdefault("num_partitions", None)
        return tl.keyed_foreach_batch(sink, "k", "t", KeyCount(), 10**9, self.path, **kw)

    def frame(self, b: int, rows: int = 120) -> tuple[Any, pd.Series]:
        picked = self.rng.choice(len(self.keys), size=rows)
        ks = [self.keys[i] for i in picked]
        frame = pd.DataFrame({"k": ks, "t": np.arange(b * rows, (b + 1) * rows,
                                                      dtype=np.int64)})
        df = self.spark.createDataFrame(frame, f"k {self.spark_type}, t long")
        return df, pd.Series(ks, dtype=object).value_counts()

    def batch(self, b: int) -> None:
        df, counts = self.frame(b)
        self.placed = {}
        self.run(df, b)
        self.total = self.total.add(counts, fill_value=0).astype(np.int64)
        self.check(b)

    def check(self, b: int) -> None:
        check_invariants(self.run, self.total)  # one partition per key, exact counts
        owners = self.run.owners()
        wrong = {k: (owners.get(k), p) for k, p in self.placed.items() if owners.get(k) != p}
        assert not wrong, f"batch {b}: keys stored away from their rows: {wrong}"
        # and the stored placement, as the runner reads it, places every stored key where
        # it is stored
        placement, _, recorded = self.run.store.placement_record_at(b)
        assert placement is not None
        kind = "long" if self.spark_type == "bigint" else "int"
        placement = bound_placement(placement, kind, recorded is not None)
        stored = list(owners)
        assert placement.assign(stored).tolist() == [owners[k] for k in stored]


class ForcedRebalancer(LoadAwareRebalancer):
    """A rebalancer that, at its first decision, moves half of partition 0's blocks holding
    rows to partition 1 (and never again): a deterministic rebalancer-driven swap."""

    def __init__(self) -> None:
        super().__init__(cooldown_batches=0, window=1)
        self.sizes: Any = None
        self.placement: Any = None
        self.decided = False

    def observe(self, latency: Any, sizes: Any, partitioner: tl.BlockPartitioner) -> None:
        super().observe(latency, sizes, partitioner)
        self.sizes, self.placement = np.asarray(sizes), partitioner

    def decide(self) -> RebalanceDecision:
        if self.decided:
            return RebalanceDecision("balanced", [], "forced: done")
        self.decided = True
        table = self.placement.table
        full = [int(b) for b in np.flatnonzero(self.sizes > 0) if table[b] == 0]
        moves = [(b, 0, 1) for b in full[: max(1, len(full) // 2)]]
        return RebalanceDecision("skewed", moves, "forced", latencies_ms=[2.0, 1.0])


# ---------------------------------------------------------------------- swaps
# Spark hashes every integral type up to int as a 32-bit int: tinyint (the narrowest
# stored type) and bigint (the 64-bit hash) cover both paths of these long runs; the hash
# swap below runs every type.
@pytest.mark.parametrize("spark_type", ["tinyint", "bigint"])
def test_rebalancer_rescale_and_fluid_swaps_keep_every_key_with_its_rows(
        spark: Any, tmp_path: Path, spark_type: str) -> None:
    """BlockPartitioner (default blocks, key type "auto"): a rebalancer's move, a sync
    rescale, then, after a restart (a new runner on the same state path), a fluid rescale."""
    kind = "long" if spark_type == "bigint" else "int"
    s = Stream(spark, tmp_path, spark_type, seed=BOUNDS[spark_type][1] % 97,
               strategy=tl.BlockPartitioner(2), rebalancer=ForcedRebalancer())
    s.batch(0)  # the rebalancer decides: half of partition 0's blocks go to partition 1
    body = json.loads((tmp_path / "state" / "placements" / f"{0:012d}.json").read_text())
    assert body["key_type"] == body["strategy"]["key_type"] == kind
    assert s.run.pending_swap is not None
    s.batch(1)
    assert s.run.swaps[-1].moved_keys > 0 and s.run.swaps[-1].partitions_after == 2
    s.run.request_swap(num_partitions=3)  # sync, refit="minimal"
    s.batch(2)
    assert s.run.swaps[-1].moved_keys > 0 and s.run.swaps[-1].partitions_after == 3
    s.run = s.runner(takeover=True)  # a restart: the stored placement and key type go on
    s.run.request_swap(num_partitions=5, mode="fluid", max_keys_per_batch=10)
    b = 3
    while True:
        s.batch(b)
        b += 1
        if s.run.swaps[-1].complete:
            break
        assert b < 10, "the fluid swap does not finish"
    assert len(s.run.swaps) > 1  # it took more than one batch (s.run: since the restart)
    placement, n = s.run.store.placement_at(b - 1)
    assert n == 5 and isinstance(placement, tl.BlockPartitioner)
    assert placement.key_type == kind


@pytest.mark.parametrize("spark_type", TYPES)
def test_a_hash_swap_with_refit_none_keeps_every_key_with_its_rows(
        spark: Any, tmp_path: Path, spark_type: str) -> None:
    s = Stream(spark, tmp_path, spark_type, seed=3, strategy=tl.HashPartitioner(4))
    s.batch(0)
    s.run.request_swap(tl.HashPartitioner(8), refit="none")  # key type "auto"
    s.batch(1)
    assert s.run.swaps[-1].moved_keys > 0
    if spark_type == "smallint":
        s.run.request_swap("hash", num_partitions=3, refit="none")  # by name
        s.batch(2)


# ---------------------------------------------------------------------- stored type
def test_an_explicit_long_key_type_on_an_int_column_is_honoured_everywhere(
        spark: Any, tmp_path: Path) -> None:
    """An explicit key type other than the column's (compatible: an int column hashed as
    long) is honoured by the JVM as by the planner; a later "auto" strategy takes the key
    column's type, the one recorded with the state."""
    s = Stream(spark, tmp_path, "int", seed=7,
               strategy=tl.HashPartitioner(4, key_type="long"))
    s.batch(0)
    first, _ = s.run.store.placement_at(0)
    assert isinstance(first, tl.HashPartitioner) and first.key_type == "long"
    s.run.request_swap(tl.HashPartitioner(8), refit="none")
    s.batch(1)
    assert s.run.swaps[-1].moved_keys > 0
    placement, _, recorded = s.run.store.placement_record_at(1)
    assert isinstance(placement, tl.HashPartitioner) and placement.key_type == "int"
    assert recorded == "int"


def test_an_int_key_type_on_a_bigint_column_is_refused(spark: Any, tmp_path: Path) -> None:
    """Asked before the first batch (the key type not known yet), the swap is refused when
    planned and the batch runs with the placement in force; asked once the state's key type
    is recorded, it is refused at once. Nothing is written either way."""
    s = Stream(spark, tmp_path, "bigint", seed=7, strategy=tl.HashPartitioner(4))
    s.run.request_swap(tl.HashPartitioner(8, key_type="int"), refit="none")
    s.batch(0)
    s.batch(1)
    report = s.run.swaps[-1]
    assert report.batch_id == 1 and report.refused and "bigint" in report.refused
    assert s.run.pending_swap is None  # the request was used once
    with pytest.raises(InvalidKeyTypeError, match="bigint"):
        s.run.request_swap(tl.HashPartitioner(8, key_type="int"), refit="none")
    assert s.run.pending_swap is None
    s.batch(2)  # nothing was changed by the refused swaps
    placement, partitions = s.run.store.placement_at(2)
    assert isinstance(placement, tl.HashPartitioner) and partitions == 4


def test_a_restart_with_another_key_column_type_is_refused(spark: Any,
                                                           tmp_path: Path) -> None:
    s = Stream(spark, tmp_path, "int", seed=11, strategy=tl.HashPartitioner(4))
    s.batch(0)
    s.spark_type = "bigint"  # the same key column, now bigint
    s.run = s.runner(takeover=True)
    df, _ = s.frame(1)
    with pytest.raises(InvalidArgumentError, match="int.*bigint|bigint.*int"):
        s.run(df, 1)


def _as_written_before(state: Path, key_type: str) -> None:
    """Rewrite the placement records as a release before the recorded key type wrote them:
    no ``key_type`` field, the strategy's own key type ``key_type``, and no checksum seal."""
    for record in (state / "placements").glob("*.json"):
        body = json.loads(record.read_text())
        for name in ("key_type", SEALED_KEY, CHECKSUM_KEY):
            body.pop(name, None)
        if body["strategy"] is not None:
            body["strategy"]["key_type"] = key_type
        record.write_text(json.dumps(body))


@pytest.mark.parametrize("spark_type, strategy, written", [
    ("tinyint", tl.BlockPartitioner(2), "auto"),
    # an older release's HashPartitioner(key_type="long") hashed an int column as int in
    # the JVM (it cast nothing): its state is where int hashes put it
    ("int", tl.HashPartitioner(2), "long"),
])
def test_state_written_before_the_recorded_key_type_resumes_exactly(
        spark: Any, tmp_path: Path, spark_type: str, strategy: tl.Partitioner,
        written: str) -> None:
    s = Stream(spark, tmp_path, spark_type, seed=13, strategy=strategy)
    s.batch(0)
    _as_written_before(tmp_path / "state", written)
    s.run = s.runner(takeover=True)
    s.batch(1)  # no swap: the rows go where the state is
    s.run.request_swap(num_partitions=4)
    s.batch(2)
    assert s.run.swaps[-1].moved_keys > 0
    body = json.loads((tmp_path / "state" / "placements" / f"{2:012d}.json").read_text())
    assert body["key_type"] == ("long" if spark_type == "bigint" else "int")


def test_the_stored_key_type_is_derived_from_the_stored_keys() -> None:
    for arrow_type, kind in [(pa.int8(), "int"), (pa.int16(), "int"), (pa.int32(), "int"),
                             (pa.int64(), "long"), (pa.string(), "string"),
                             (pa.binary(), "binary"), (pa.float64(), None)]:
        assert stored_key_type(arrow_type) == kind
