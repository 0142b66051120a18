"""rebalance_minimal: reach the target balance moving few units; every unit placed once, in range."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark.errors import InvalidKeyTypeError, NullKeyError
from trilink_spark.partitioners import balance_degree, keyed_bound
from trilink_spark.partitioners import BlockPartitioner, OverlayPartitioner
from trilink_spark.partitioners import moved_units, rebalance_minimal
from trilink_spark.partitioners.choosing.refit import _rebalance
from trilink_spark.partitioners.choosing.scenarios import make_scenario


# ---------------------------------------------------------------------- the invariant checker
def check_step(start, weights, pids, n, target, max_moves=None, fixed=None):
    """What every rebalance must satisfy, whatever the input."""
    start, weights, pids = np.asarray(start), np.asarray(weights, float), np.asarray(pids)
    fixed = np.zeros(n) if fixed is None else np.asarray(fixed, float)
    assert pids.shape == start.shape, "every unit placed exactly once"
    assert pids.size == 0 or (pids.min() >= 0 and pids.max() < n), "every unit in range"
    forced = start >= n
    moved = pids != start
    assert moved[forced].all(), "units on removed partitions move"
    if max_moves is not None:
        assert moved.sum() <= max(max_moves, forced.sum())
    after = fixed + np.bincount(pids, weights=weights, minlength=n)
    total = after.sum()
    if not forced.any() and start.size and start.max() < n:
        before = fixed + np.bincount(start, weights=weights, minlength=n)
        if total > 0 and balance_degree(before) >= target:
            assert not moved.any(), "nothing moves when the target is met already"
        assert balance_degree(after) >= balance_degree(before) - 1e-12, \
            "every move is an improvement"
    # a unit moved for balance never lifts its receiver above the target's top load
    top = max(2 * total / n / (1 + target), weights.max(initial=0.0))
    received = np.unique(pids[moved & ~forced])
    assert (after[received] <= top * (1 + 1e-9) + 1e-9).all()
    assert not (moved & ~forced & (weights <= 0)).any(), "empty units move only when forced"
    return after, moved


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 9),
    st.integers(1, 9),
    st.lists(st.tuples(st.integers(0, 8), st.floats(0, 1000)), max_size=60),
    st.sampled_from([0.5, 0.8, 0.97, 1.0]),
    st.one_of(st.none(), st.integers(0, 20)),
)
def test_the_core_keeps_its_invariants(n_old, n_new, units, target, max_moves):
    start = np.array([p % n_old for p, _ in units], dtype=np.int64)
    weights = np.array([w for _, w in units], dtype=np.float64)
    forced = int((start >= n_new).sum())
    if max_moves is not None and forced > max_moves:
        with pytest.raises(InvalidArgumentError, match="max_moved_fraction"):
            _rebalance(start, weights, np.zeros(n_new), target, max_moves)
        return
    pids = _rebalance(start, weights, np.zeros(n_new), target, max_moves)
    check_step(start, weights, pids, n_new, target, max_moves)


# ---------------------------------------------------------------------- the headline figures
def _zipf(s, seed, keys=400):
    sc = make_scenario("zipf", 1_000_000, keys, zipf_s=s, seed=seed)
    counts = sc.as_mapping()
    return counts, list(counts), np.array(list(counts.values()), dtype=np.float64)


@pytest.mark.parametrize("seed", range(5))
def test_zipf_08_from_hash_reaches_097_moving_few_keys(seed):
    counts, keys, w = _zipf(0.8, seed)
    start = tl.HashPartitioner(8)
    assert keyed_bound(w, 8) > 0.99
    assert balance_degree(np.bincount(start.assign(keys), weights=w, minlength=8)) < 0.8
    p = rebalance_minimal(start, counts)
    assert isinstance(p, tl.LeastCountPartitioner) and p.num_partitions == 8
    after = p.assign(keys)
    check_step(start.assign(keys), w, after, 8, 0.97)
    assert balance_degree(np.bincount(after, weights=w, minlength=8)) >= 0.97
    moved = moved_units(start, p, keys).mean()
    assert moved <= 0.10
    # a fresh fit places every key anew: about 7/8 of them change partition
    fresh = moved_units(start, tl.LeastCountPartitioner(8, history=counts), keys).mean()
    assert fresh > 0.6 and fresh > 5 * moved
    assert p.loads.tolist() == np.bincount(after, weights=w, minlength=8).tolist()
    p._check()


def test_above_the_keyed_bound_it_gets_close_and_says_so(caplog):
    counts, keys, w = _zipf(1.2, 0)
    bound = keyed_bound(w, 8)
    assert bound < 0.5
    start = tl.HashPartitioner(8)
    with caplog.at_level(logging.INFO, logger="trilink_spark.partitioners.choosing.refit"):
        p = rebalance_minimal(start, counts)
    assert "above the best whole units allow" in caplog.text
    balance = balance_degree(np.bincount(p.assign(keys), weights=w, minlength=8))
    assert bound >= balance >= 0.9 * bound
    assert moved_units(start, p, keys).mean() < 0.5


def test_a_balanced_placement_moves_nothing():
    counts = {k: 10 for k in range(100)}
    p = rebalance_minimal(tl.LeastKeyPartitioner(4).fit(list(range(100))), counts)
    assert isinstance(p, tl.LeastKeyPartitioner)
    assert p.assignments == tl.LeastKeyPartitioner(4).fit(list(range(100))).assignments
    p._check()


def test_only_the_overloaded_partition_gives():
    table = {k: k % 4 for k in range(40)}
    counts = {k: (50 if k % 4 == 0 else 10) for k in range(40)}
    start = tl.LeastCountPartitioner.from_dict({
        "strategy": "least_count", "num_partitions": 4,
        "table": [[k, p] for k, p in table.items()]})
    p = rebalance_minimal(start, counts)
    moved = [k for k in table if p.partition(k) != table[k]]
    assert moved and all(table[k] == 0 for k in moved)
    loads = np.bincount(p.assign(list(table)), weights=list(counts.values()), minlength=4)
    assert balance_degree(loads) >= 0.97


# ---------------------------------------------------------------------- rescaling
@pytest.mark.parametrize("kind", ["hash", "least_count", "block"])
def test_rescale_8_to_6_empties_partitions_6_and_7(kind):
    counts, keys, w = _zipf(0.8, 1, keys=2000)
    start = {"hash": tl.HashPartitioner(8),
             "least_count": tl.LeastCountPartitioner(8, history=counts),
             "block": BlockPartitioner(8, 512)}[kind]
    before = start.assign(keys)
    p = rebalance_minimal(start, counts, num_partitions=6)
    after = p.assign(keys)
    assert p.num_partitions == 6 and after.max() <= 5
    moved = before != after
    assert moved[before >= 6].all()
    # at least what the removed partitions held moves, and not much more
    assert moved.mean() >= (before >= 6).mean()
    loads = np.bincount(after, weights=w, minlength=6)
    assert balance_degree(loads) >= 0.97
    if kind == "block":
        check_step(start.table, np.bincount(start.blocks(keys), weights=w, minlength=512),
                   p.table, 6, 0.97)


@pytest.mark.parametrize("kind", ["hash", "least_key", "block"])
def test_rescale_4_to_5_fills_partition_4(kind):
    counts, keys, w = _zipf(0.8, 2, keys=2000)
    start = {"hash": tl.HashPartitioner(4),
             "least_key": tl.LeastKeyPartitioner(4).fit(keys),
             "block": BlockPartitioner(4, 512)}[kind]
    before = start.assign(keys)
    p = rebalance_minimal(start, counts, num_partitions=5)
    after = p.assign(keys)
    assert p.num_partitions == 5
    loads = np.bincount(after, weights=w, minlength=5)
    assert loads[4] > 0 and balance_degree(loads) >= 0.97
    moved = before != after
    assert set(np.unique(after[moved]).tolist()) >= {4}
    # the lower bound is 1/5 of the load; keys are moved in whole, so a bit more
    assert moved.mean() < 0.4
    if kind == "least_key":
        p._check()


# ---------------------------------------------------------------------- blocks
def test_blocks_per_key_and_per_block_agree():
    counts, keys, w = _zipf(0.8, 3, keys=3000)
    start = BlockPartitioner(8, 256)
    per_block = np.bincount(start.blocks(keys), weights=w, minlength=256)
    by_key = rebalance_minimal(start, counts)
    by_block = rebalance_minimal(start, per_block, unit="block")
    as_map = rebalance_minimal(start, dict(enumerate(per_block.tolist())), unit="block")
    as_series = rebalance_minimal(start, pd.Series(per_block), unit="block")
    assert by_key == by_block == as_map == as_series
    assert isinstance(by_key, BlockPartitioner) and by_key.num_blocks == 256
    check_step(start.table, per_block, by_key.table, 8, 0.97)
    assert balance_degree(np.bincount(by_key.table, weights=per_block, minlength=8)) >= 0.97
    assert moved_units(start, by_key).mean() < 0.2
    assert start.table.tolist() == BlockPartitioner(8, 256).table.tolist()  # unchanged


def test_max_moved_fraction_caps_units_moved(caplog):
    counts, keys, w = _zipf(0.8, 0)
    start = tl.HashPartitioner(8)
    with caplog.at_level(logging.INFO, logger="trilink_spark.partitioners.choosing.refit"):
        p = rebalance_minimal(start, counts, max_moved_fraction=0.01)
    assert moved_units(start, p, keys).sum() <= 4
    assert "max_moved_fraction" in caplog.text
    assert moved_units(start, rebalance_minimal(start, counts, max_moved_fraction=0.0),
                       keys).sum() == 0
    with pytest.raises(InvalidArgumentError, match="at least 0.2"):
        rebalance_minimal(BlockPartitioner(8, 64), counts, num_partitions=6,
                          max_moved_fraction=0.1)


# ---------------------------------------------------------------------- table strategies
def test_a_table_strategy_keeps_keys_counts_do_not_list_and_places_new_ones():
    start = tl.LeastCountPartitioner(4, history={f"old{i}": 5 for i in range(40)})
    counts = pd.Series({**{f"old{i}": 5 for i in range(20)}, **{f"new{i}": 3 for i in range(30)}})
    p = rebalance_minimal(start, counts, num_partitions=3)
    assert isinstance(p, tl.LeastCountPartitioner) and len(p) == 70
    for i in range(40):
        k = f"old{i}"
        if start.partition(k) < 3 and i >= 20:  # no load, not on a removed partition: stays
            assert p.partition(k) == start.partition(k)
    assert start.assign([f"old{i}" for i in range(40)]).max() == 3  # start is unchanged
    assert len(start) == 40
    p._check()


def test_an_overlay_or_adaptive_current_is_rebalanced_through_what_it_places():
    counts, keys, w = _zipf(0.8, 4)
    overlay = OverlayPartitioner(tl.HashPartitioner(8), {keys[0]: 3})
    p = rebalance_minimal(overlay, counts)
    assert moved_units(overlay, p, keys).mean() <= 0.1
    ap = tl.AdaptivePartitioner(8, mode="manual")
    q = rebalance_minimal(ap, counts)
    assert q == rebalance_minimal(tl.HashPartitioner(8), counts)


def test_stepwise_random_rebalances_keep_every_invariant():
    rng = np.random.default_rng(11)
    keys = np.arange(600)
    for start in (tl.HashPartitioner(5), tl.LeastKeyPartitioner(5).fit(keys.tolist()),
                  BlockPartitioner(5, 128)):
        current = start
        for step in range(12):
            n = int(rng.integers(2, 9)) if step % 3 == 2 else current.num_partitions
            live = rng.choice(keys, size=int(rng.integers(50, 600)), replace=False)
            loads = rng.lognormal(0, float(rng.uniform(0.2, 1.5)), live.size)
            counts = dict(zip(live.tolist(), loads.tolist()))
            target = float(rng.choice([0.8, 0.9, 0.97]))
            frac = None if step % 4 else 1.0
            nxt = rebalance_minimal(current, counts, num_partitions=n, target_balance=target,
                                    max_moved_fraction=frac)
            assert nxt.num_partitions == n
            if isinstance(current, BlockPartitioner):
                per_block = np.bincount(current.blocks(live), weights=loads, minlength=128)
                check_step(current.table, per_block, nxt.table, n, target)
            else:
                every = np.unique(np.concatenate([live, keys[:0]]))
                if isinstance(current, tl.TablePartitioner):
                    every = np.array(sorted(set(current.assignments) | set(live.tolist())))
                w = pd.Series(counts).reindex(every).fillna(0.0).to_numpy()
                before = (current.lookup(every) if isinstance(current, tl.TablePartitioner)
                          else current.assign(every))
                check_step(before, w, nxt.lookup(every), n, target)
                nxt._check()
            current = nxt


# ---------------------------------------------------------------------- arguments
@pytest.mark.parametrize("kwargs,error,match", [
    ({"target_balance": 0}, InvalidArgumentError, r"target_balance must be in \(0, 1\]"),
    ({"target_balance": 1.5}, InvalidArgumentError, "target_balance"),
    ({"target_balance": "high"}, InvalidArgumentTypeError, "number"),
    ({"target_balance": True}, InvalidArgumentTypeError, "number"),
    ({"max_moved_fraction": -0.1}, InvalidArgumentError, r"\[0, 1\]"),
    ({"max_moved_fraction": 2}, InvalidArgumentError, "max_moved_fraction"),
    ({"num_partitions": 0}, InvalidArgumentError, ">= 1"),
    ({"num_partitions": 2.5}, InvalidArgumentTypeError, "int"),
    ({"unit": "row"}, InvalidArgumentError, "unit must be one of 'key', 'block'"),
    ({"unit": "block"}, InvalidArgumentError, "needs a BlockPartitioner"),
])
def test_bad_arguments_raise_typed_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        rebalance_minimal(tl.HashPartitioner(4), {"a": 1}, **kwargs)


def test_bad_inputs_raise_typed_errors():
    with pytest.raises(InvalidArgumentTypeError, match="Partitioner"):
        rebalance_minimal("hash", {"a": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError, match="capacities"):
        rebalance_minimal(tl.WeightPartitioner([50, 50], "random").fit(["a"]), {"a": 1})
    with pytest.raises(InvalidArgumentTypeError, match="mapping"):
        rebalance_minimal(tl.HashPartitioner(4), ["a", "b"])
    with pytest.raises(InvalidArgumentError, match="non-negative"):
        rebalance_minimal(tl.HashPartitioner(4), {"a": -1})
    with pytest.raises(InvalidArgumentError, match="non-negative"):
        rebalance_minimal(tl.HashPartitioner(4), {"a": float("nan")})
    with pytest.raises(InvalidKeyTypeError):
        rebalance_minimal(tl.HashPartitioner(4), {"a": 1, 2: 1})
    with pytest.raises(NullKeyError):
        rebalance_minimal(tl.HashPartitioner(4, null_policy="error"), {None: 1})
    with pytest.raises(InvalidKeyTypeError, match="table holds int"):
        rebalance_minimal(tl.LeastKeyPartitioner(4).fit([1, 2]), {"a": 1})
    with pytest.raises(InvalidArgumentError, match="exceeds the strategy's 8 blocks"):
        rebalance_minimal(BlockPartitioner(4, 8), {"a": 1}, num_partitions=9)
    with pytest.raises(InvalidArgumentError, match=r"block ids must be in \[0, 8\)"):
        rebalance_minimal(BlockPartitioner(4, 8), {9: 1.0}, unit="block")
    with pytest.raises(InvalidArgumentError, match="8 loads"):
        rebalance_minimal(BlockPartitioner(4, 8), [1.0, 2.0], unit="block")
    with pytest.raises(InvalidArgumentTypeError, match="block id"):
        rebalance_minimal(BlockPartitioner(4, 8), {"a": 1.0}, unit="block")
    with pytest.raises(InvalidArgumentError, match="without keys"):
        moved_units(tl.HashPartitioner(2), tl.HashPartitioner(3))


def test_null_keys_load_partition_0_and_stay():
    start = tl.HashPartitioner(4, null_policy="partition0")
    counts = {None: 100.0, **{f"k{i}": 1.0 for i in range(200)}}
    p = rebalance_minimal(start, counts, target_balance=0.5)
    assert p.null_policy == "partition0" and p.partition(None) == 0
    keys = [f"k{i}" for i in range(200)]
    loads = np.bincount(p.assign(keys), weights=np.ones(200), minlength=4)
    loads[0] += 100
    assert balance_degree(loads) >= 0.5
    assert loads[0] == loads.max()


def test_empty_counts_and_zero_loads_only_move_what_must_move():
    assert rebalance_minimal(tl.HashPartitioner(4), {}) == tl.LeastCountPartitioner(4)
    start = BlockPartitioner(6, 12)
    p = rebalance_minimal(start, np.zeros(12), unit="block", num_partitions=4)
    moved = moved_units(start.with_table(np.minimum(start.table, 3), 6), p.with_table(p.table, 6))
    assert p.table.max() == 3 and not moved[start.table < 4].any()
    # the blocks of removed partitions spread over the survivors
    assert len(set(p.table[start.table >= 4].tolist())) > 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 30)), min_size=1, max_size=50),
       st.lists(st.tuples(st.integers(0, 3), st.floats(0, 40), st.floats(0, 40),
                          st.floats(0, 60)), max_size=30))
def test_the_unit_index_finds_what_a_scan_finds(units, queries):
    from trilink_spark.partitioners.choosing.refit import _Units

    pids = np.array([p for p, _ in units], dtype=np.int64)
    loads = np.array([w for _, w in units], dtype=np.float64)
    index = _Units(pids, loads, np.ones(len(units), bool), 4)
    alive = set(range(len(units)))
    for p, target, cap, below in queries:
        j = index.best(p, target, cap, below)
        fits = [i for i in alive if pids[i] == p and 0 < loads[i] <= cap and loads[i] < below]
        if not fits:
            assert j is None
            continue
        assert j is not None
        unit = index.ids[j]
        assert unit in fits
        assert abs(loads[unit] - target) == min(abs(loads[i] - target) for i in fits)
        alive.discard(unit)
        index.remove(j)
