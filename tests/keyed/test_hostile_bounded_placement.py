"""Hostile probes of keyed streams placed by bounded tables: several batches, a replayed batch
id, a swap to another strategy and back, int keys, a key turning heavy after the fit."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from trilink_spark.keyed import KeyedBatchFunction
from trilink_spark.state.store import KEY_FIELD
from conftest import RunningCount
from testkit.swaps import check_invariants

cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = [f"u{i:03d}" for i in range(300)] + ["", "😀"]
ROWS = 400


def make_run(tmp_path: Path, strategy: Any) -> KeyedBatchFunction:
    return tl.keyed_foreach_batch(lambda df, b: df.collect(), "k", "t", RunningCount(),
                                  10**6, str(tmp_path / "state"), strategy=strategy,
                                  num_partitions=4)


def batch(spark: Any, b: int, hot: str | None = None) -> tuple[Any, pd.Series]:
    rng = np.random.default_rng(b)
    ks = [KEYS[i] for i in (rng.zipf(1.3, ROWS) - 1) % len(KEYS)]
    if hot is not None:
        ks += [hot] * 2_000
    frame = pd.DataFrame({"k": ks, "t": np.arange(b * 10_000, b * 10_000 + len(ks),
                                                  dtype=np.int64)})
    return spark.createDataFrame(frame, "k string, t long"), \
        pd.Series(ks, dtype=object).value_counts()


def stored_where_placed(run: KeyedBatchFunction, version: int) -> Any:
    placement, partitions = run.store.placement_at(version)
    keys = run.store.key_table(version)
    where = keys.column("partition").to_numpy()
    place = placement.lookup if hasattr(placement, "lookup") else placement.assign
    assert (place(keys.column(KEY_FIELD).to_pylist()) == where).all()
    assert partitions == placement.num_partitions
    return placement


def test_bounded_stream_replay_and_swap_away_and_back(spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path, tl.LeastCountPartitioner(4, max_keys=15))
    total = pd.Series(dtype=float)
    versions = []

    def step(b: int, hot: str | None = None, replay: bool = False) -> Any:
        nonlocal total
        df, counts = batch(spark, b, hot)
        run(df, b)
        if not replay:
            total = total.add(counts, fill_value=0)
        check_invariants(run, total)
        placement = stored_where_placed(run, b)
        versions.append((b, placement))
        return placement

    first = step(0)
    assert first.bounded and 0 < len(first) <= 15
    step(1)
    step(1, replay=True)  # the same batch id again: counted once
    late = "u299"
    before = first.lookup([late])[0]
    p2 = step(2, hot=late)  # a key turning heavy after the fit does not move by itself
    assert p2.lookup([late])[0] == before
    run.request_swap("hash", refit="none")
    p3 = step(3)
    assert isinstance(p3, tl.HashPartitioner), (type(p3), run.swaps)
    run.request_swap(tl.LeastCountPartitioner(4, max_keys=15), refit="none")
    p4 = step(4)
    assert p4.bounded and len(p4) <= 15
    step(5)
    step(5, replay=True)
    refused = [s.refused for s in run.swaps]
    assert sum(r is None for r in refused) >= 2, refused


def test_bounded_stream_of_int_keys(spark: Any, tmp_path: Path) -> None:
    from conftest import KeylessCount

    run = tl.keyed_foreach_batch(lambda df, b: df.collect(), "k", "t", KeylessCount(),
                                 10**6, str(tmp_path / "state"),
                                 strategy=tl.LeastKeyPartitioner(4, max_keys=5),
                                 num_partitions=4)
    values = [0, 1, -1, 2**31 - 1, -(2**31)] + list(range(2, 60))
    total: dict = {}
    for b in range(3):
        rng = np.random.default_rng(b)
        ks = [values[i] for i in rng.integers(0, len(values), 300)]
        frame = pd.DataFrame({"k": np.asarray(ks, dtype=np.int32),
                              "t": np.arange(b * 1_000, b * 1_000 + 300, dtype=np.int64)})
        run(spark.createDataFrame(frame, "k int, t long"), b)
        for k in ks:
            total[k] = total.get(k, 0) + 1
        check_invariants(run, pd.Series(total))
        placement = stored_where_placed(run, b)
        assert placement.bounded
        assert placement.key_type in ("int", "long")


def test_a_small_first_batch_fills_the_entries(spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path, tl.LeastCountPartitioner(4, max_keys=15))
    df, counts = batch(spark, 0)
    run(df, 0)
    placement = stored_where_placed(run, 0)
    assert placement.bounded
    assert len(placement) == 15
    named = [k for k in counts.index if k in placement]
    # the 15 heaviest keys, ties at the 15th count broken either way
    assert min(counts[k] for k in named) >= counts.iloc[14]
    assert placement.lookup_known(counts.index[counts > counts.iloc[14]].tolist()).all()


def test_bounded_stream_rescaled_down_and_up_and_refit(spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path, tl.LeastCountPartitioner(4, max_keys=15))
    total = pd.Series(dtype=float)
    plan = [None, ("n", 2), None, ("n", 8), ("refit", None), None]
    for b, req in enumerate(plan):
        if req is not None and req[0] == "n":
            run.request_swap(num_partitions=req[1])
        elif req is not None:
            run.request_swap()
        df, counts = batch(spark, b)
        run(df, b)
        total = total.add(counts, fill_value=0)
        check_invariants(run, total)
        placement = stored_where_placed(run, b)
        assert placement.bounded and len(placement) <= 15
    assert [s.refused for s in run.swaps] == [None, None, None], run.swaps
    assert stored_where_placed(run, len(plan) - 1).num_partitions == 8


def test_replaying_the_bounding_batch_of_a_legacy_table(spark: Any, tmp_path: Path) -> None:
    legacy = tl.LeastCountPartitioner(4, max_keys=len(KEYS) + 1).fit({k: 1 for k in KEYS})
    data = legacy.to_dict()
    data["max_keys"] = 30
    legacy = tl.Partitioner.from_dict(data)
    run = make_run(tmp_path, legacy)
    total = pd.Series(dtype=float)
    for b, replay in [(0, False), (1, False), (1, True), (2, False), (2, True)]:
        df, counts = batch(spark, b)
        run(df, b)
        if not replay:
            total = total.add(counts, fill_value=0)
        check_invariants(run, total)
        placement = stored_where_placed(run, b)
        assert placement.bounded == (b >= 1), b
        assert len(placement) <= (len(KEYS) if b == 0 else 30)
    done = [s for s in run.swaps if s.refused is None]
    assert {s.batch_id for s in done} == {1}
