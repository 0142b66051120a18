"""Keyed streams placed by bounded tables, and per-key tables past their bound made bounded.

Every batch is checked against an oracle: each key stored once, on the partition the
placement in force gives it, with its exact count.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pyspark import cloudpickle

import trilink_spark as tl
from trilink_spark.keyed import KeyedBatchFunction
from trilink_spark.state.store import KEY_FIELD
from conftest import RunningCount
from testkit.swaps import check_invariants

cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = [f"u{i:03d}" for i in range(300)]
ROWS = 400


def make_run(tmp_path: Path, strategy: Any) -> KeyedBatchFunction:
    return tl.keyed_foreach_batch(lambda df, b: df.collect(), "k", "t", RunningCount(),
                                  10**6, str(tmp_path / "state"), strategy=strategy,
                                  num_partitions=4)


def batch(spark: Any, b: int) -> tuple[Any, pd.Series]:
    rng = np.random.default_rng(b)
    ks = [KEYS[i] for i in (rng.zipf(1.3, ROWS) - 1) % len(KEYS)]
    frame = pd.DataFrame({"k": ks, "t": np.arange(b * ROWS, (b + 1) * ROWS, dtype=np.int64)})
    return spark.createDataFrame(frame, "k string, t long"), \
        pd.Series(ks, dtype=object).value_counts()


def stored_where_placed(run: KeyedBatchFunction, version: int) -> Any:
    """The placement at ``version``; every stored key is on the partition it gives."""
    placement, partitions = run.store.placement_at(version)
    keys = run.store.key_table(version)
    where = keys.column("partition").to_numpy()
    assert (placement.assign(keys.column(KEY_FIELD).to_pylist()) == where).all()
    assert partitions == placement.num_partitions
    return placement


def drive(spark: Any, run: KeyedBatchFunction, batches: int) -> list[Any]:
    """Run ``batches`` batches, checking the state after each; the placement of each."""
    total = pd.Series(dtype=float)
    placements = []
    for b in range(batches):
        df, counts = batch(spark, b)
        run(df, b)
        total = total.add(counts, fill_value=0)
        check_invariants(run, total)
        placements.append(stored_where_placed(run, b))
    return placements


def test_a_stream_placed_by_a_bounded_table(spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path, tl.LeastCountPartitioner(4, max_keys=20))
    for placement in drive(spark, run, 3):
        assert placement.bounded and len(placement) == 20
    record = json.loads((tmp_path / "state" / "placements" / f"{0:012d}.json").read_text())
    assert len(json.dumps(record)) < 200_000  # 20 entries and the group table, not every key


def test_a_per_key_table_past_its_bound_is_bounded_at_the_next_batch(
        spark: Any, tmp_path: Path) -> None:
    # a per-key placement with more keys than its bound, as a release before bounded tables
    # stored it: every key of the stream has an entry
    legacy = tl.LeastCountPartitioner(4, max_keys=len(KEYS) + 1).fit({k: 1 for k in KEYS})
    data = legacy.to_dict()
    data["max_keys"] = 30
    legacy = tl.Partitioner.from_dict(data)
    assert not legacy.bounded and len(legacy) == len(KEYS)
    run = make_run(tmp_path, legacy)
    placements = drive(spark, run, 4)
    assert [p.bounded for p in placements] == [False, True, True, True]
    placement = placements[-1]
    assert [s.batch_id for s in run.swaps if s.refused is None] == [1]
    assert run.swaps[0].moved_keys < len(KEYS)
    assert len(placement) == 30
