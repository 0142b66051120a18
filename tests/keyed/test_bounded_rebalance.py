"""The load-aware rebalancer moves a bounded table's key groups and named keys: its units
(``keyed.swaps.units``) are measured by the tasks and moved as blocks, and the table it moves
to is a bounded table again."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from conftest import RunningCount
from testkit.slow import SlowCount
from trilink_spark.keyed.swaps.placement import (check_rebalancer, rebalance_target,
                                                 rebalancer_decision)
from trilink_spark.keyed.swaps.units import from_units, unit_rows, unit_table
from trilink_spark.switching import LoadAwareRebalancer

cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = [f"w{i:03d}" for i in range(300)]
BOUND = 12


def bounded(n: int = 2, **kw: Any) -> tl.LeastCountPartitioner:
    counts = {k: (400 if i < 4 else 1 + i % 5) for i, k in enumerate(KEYS)}
    p = tl.LeastCountPartitioner(n, max_keys=BOUND, **kw).fit(counts)
    assert p.bounded and len(p) == BOUND
    return p


def test_units_are_the_groups_then_the_entries_and_come_back_as_the_table() -> None:
    p = bounded(3).for_column("string")
    units = unit_table(p)
    assert units is not None and units.num_blocks == p.num_groups + BOUND
    keys, pids = p.table_arrays()
    assert units.table[: p.num_groups].tolist() == p.groups.tolist()
    assert units.table[p.num_groups:].tolist() == pids.tolist()
    same = from_units(p, units)
    assert same.to_dict() == p.to_dict()
    moved = units.table.copy()
    moved[p.num_groups] = (moved[p.num_groups] + 1) % 3  # the first named key
    moved[7] = (moved[7] + 2) % 3  # group 7
    out = from_units(p, units.with_table(moved))
    assert out.bounded and len(out) == BOUND and out.max_keys == p.max_keys
    assert out.partition(keys[0]) == moved[p.num_groups]
    assert int(out.groups[7]) == moved[7]
    rest = [k for k in KEYS if k not in set(keys)]
    for k in rest:  # every other key follows its group
        assert out.partition(k) == moved[int(p.key_groups([k])[0])]
    with pytest.raises(ValueError, match="not over this table"):
        from_units(p, tl.BlockPartitioner(3, num_blocks=64))
    assert unit_table(tl.LeastCountPartitioner(2).fit({"a": 1})) is None


@pytest.mark.parametrize("kind", ["int", "long", "string", "binary"])
def test_a_tasks_rows_per_unit_count_named_keys_apart(kind: str) -> None:
    values: list[Any] = {"int": list(range(300)), "long": [2**40 + i for i in range(300)],
                         "string": KEYS, "binary": [k.encode() for k in KEYS]}[kind]
    p = tl.LeastCountPartitioner(2, max_keys=BOUND).fit(
        {v: (400 if i < 4 else 1 + i % 5) for i, v in enumerate(values)}).for_column(kind)
    counter = unit_rows(p, kind)
    assert counter is not None
    rng = np.random.default_rng(3)
    picked = [values[i] for i in rng.integers(0, 300, 2_000)] + [None] * 3
    arrow = pa.array(picked, {"int": pa.int32(), "long": pa.int64(), "string": pa.string(),
                              "binary": pa.binary()}[kind])
    got = counter.rows(arrow)
    per_unit = dict(zip(got["blocks"], got["rows"]))
    assert sum(per_unit.values()) == 2_000  # the null key has no unit
    keys, _ = p.table_arrays()
    position = {k: i for i, k in enumerate(keys)}
    want: dict[int, int] = {}
    for v in picked:
        if v is None:
            continue
        unit = p.num_groups + position[v] if v in position else int(p.key_groups([v])[0])
        want[unit] = want.get(unit, 0) + 1
    assert per_unit == want


def test_the_rebalancer_decides_on_units_and_swaps_to_a_bounded_table(tmp_path: Path) -> None:
    """Timings as the tasks record them: partition 0 is slow. The decision moves units of
    partition 0 to partition 1; the target is the bounded table with those units moved."""
    p = bounded(2).for_column("string")
    units = unit_table(p)
    assert units is not None

    class Timings:
        def __init__(self) -> None:
            self.per = {}
            for q in (0, 1):
                owned = np.flatnonzero(units.table == q)
                rows = np.where(owned >= p.num_groups, 50, 1)
                self.per[q] = {"rows": int(rows.sum()), "process_ms": 900.0 if q == 0 else 100.0,
                               "block_rows": {"blocks": owned.tolist(), "rows": rows.tolist()}}

        def timing(self, q: int, batch_id: int) -> dict[str, Any]:
            return self.per[q]

        def load_plan(self, batch_id: int) -> None:
            return None

    store: Any = Timings()
    rb = LoadAwareRebalancer(window=1, cooldown_batches=0)
    decision = rebalancer_decision(rb, store, 0, p, 2)
    assert decision is not None and decision.state == "skewed" and decision.moves
    assert all(src == 0 and dst == 1 for _, src, dst in decision.moves)
    target = rebalance_target(rb, store, 0, p, decision, False)
    assert isinstance(target, tl.LeastCountPartitioner) and target.bounded
    after = unit_table(target)
    assert after is not None
    for unit, _, dst in decision.moves:
        assert after.table[unit] == dst
    untouched = np.setdiff1d(np.arange(units.num_blocks), [u for u, _, _ in decision.moves])
    assert (after.table[untouched] == units.table[untouched]).all()
    # a per-key table is not rebalanced (logged): nothing decided
    assert rebalancer_decision(LoadAwareRebalancer(), store, 0,
                               tl.LeastCountPartitioner(2).fit({"a": 1}), 2) is None


def test_a_rebalancer_takes_a_table_strategy_and_refuses_the_rest() -> None:
    rb = LoadAwareRebalancer()
    for strategy in (tl.BlockPartitioner(2), tl.LeastCountPartitioner(2),
                     tl.LeastKeyPartitioner(2), "least_count", "least-key", "block"):
        check_rebalancer(rb, strategy)
    check_rebalancer(rb, tl.WeightPartitioner([50, 50], mode="random"))
    for strategy in ("hash", tl.HashPartitioner(2), "auto", 3, "weight",
                     tl.WeightPartitioner([50, 50])):
        with pytest.raises(ValueError, match="BlockPartitioner"):
            check_rebalancer(rb, strategy)
    with pytest.raises(ValueError, match="unknown strategy 'no such'"):
        check_rebalancer(rb, "no such")


ROWS = 600


def test_a_stream_on_a_bounded_table_rebalances_with_exact_results(
        spark: Any, tmp_path: Path) -> None:
    """A stream placed by a bounded LeastCount table, partition 0's keys slowed: the
    rebalancer moves units (groups and named keys) off it, every swap moves only those
    units' keys, the placement stays a bounded table, and every batch's state is exact."""
    p = bounded(2)
    owner = dict(zip(KEYS, p.for_column("string").assign(KEYS).tolist()))
    slow = frozenset(k for k in KEYS if owner[k] == 0)
    assert 50 < len(slow) < 250
    rebalancer = LoadAwareRebalancer()
    run = tl.keyed_foreach_batch(lambda df, b: None, "k", "t", SlowCount(slow), 1_000_000,
                                 str(tmp_path / "state"), strategy=p, rebalancer=rebalancer)
    rng = np.random.default_rng(5)
    oracle: pd.Series = pd.Series(dtype="int64")
    for b in range(10):
        picked = rng.choice(len(KEYS), size=ROWS)
        frame = pd.DataFrame({"k": [KEYS[i] for i in picked],
                              "t": np.arange(b * ROWS, (b + 1) * ROWS, dtype=np.int64)})
        run(spark.createDataFrame(frame), b)
        oracle = oracle.add(frame["k"].value_counts(), fill_value=0)
        stored = {k: int(v["n"]) for k, v in run.state_values().items()}
        assert stored == {k: int(v) for k, v in oracle.items()}
        placed, _ = run.store.placement_at(b)
        assert isinstance(placed, tl.LeastCountPartitioner) and placed.bounded
        record = run.store.timing(0, b)
        assert record is not None and record["block_rows"] is not None
        assert max(record["block_rows"]["blocks"]) < p.num_groups + BOUND
    decisions = [d for _, d in run.rebalances]
    assert decisions and decisions[0].state == "skewed", [d.reason for d in decisions]
    assert run.swaps, [d.reason for d in decisions]
    for report in run.swaps:
        assert report.refused is None and 0 < report.moved_keys < report.keys_total
    final, _ = run.store.placement_at(9)
    moved_off = [k for k in slow if final.for_column("string").partition(k) == 1]
    assert moved_off, "no slow key left partition 0"
