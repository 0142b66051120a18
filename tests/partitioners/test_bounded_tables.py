"""Bounded tables: the heaviest keys by name, every other key by its key group.

Seeded, randomised: after every step an invariant checker asks that every key has exactly one
partition, that the driver's ``partition``/``assign``/``lookup`` agree with each other, with a
pickled (executor) copy and with a copy restored from JSON (a restart), that no key moves
unless its entry or group does, and that the bounded form never balances worse than hash.
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError, InvalidKeyTypeError
from trilink_spark.partitioners import balance_degree
from trilink_spark.partitioners.tables.table import DEFAULT_MAX_KEYS, TablePartitioner, least_units

STRATEGIES = {
    "least_count": lambda n, m: tl.LeastCountPartitioner(n, max_keys=m),
    "least_key": lambda n, m: tl.LeastKeyPartitioner(n, max_keys=m),
    "weight_random": lambda n, m: tl.WeightPartitioner([100 / n] * n, "random", seed=3,
                                                       max_keys=m),
}


def _check(p: TablePartitioner, keys: list[object], before: dict[object, int] | None) -> dict:
    """The invariants of a bounded (or per-key) table over ``keys``; returns the placement."""
    if hasattr(p, "_check"):
        p._check()
    n = p.num_partitions
    pids = p.assign(keys)
    assert ((pids >= 0) & (pids < n)).all()
    one = [p.partition(k) for k in keys[:50]]
    assert one == pids[:50].tolist()
    assert p.lookup(keys).tolist() == pids.tolist()
    executor = pickle.loads(pickle.dumps(p))
    assert executor.assign(keys).tolist() == pids.tolist()
    restarted = tl.Partitioner.from_json(json.dumps(p.to_dict()))
    assert restarted.assign(keys).tolist() == pids.tolist()
    if p.bounded:
        assert p.groups is not None and p.groups.size == p.num_groups
        assert len(p) <= max(p.max_keys, len(p))
        groups = p.key_groups(keys)
        entry = p.lookup_known(keys)
        by_group = p.groups[groups]
        assert (pids[~entry] == by_group[~entry]).all()
    placed = dict(zip(keys, pids.tolist()))
    if before is not None:  # a plain fit never moves a key already placed
        for k, pid in before.items():
            assert placed.get(k, pid) == pid, k
    return placed


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.sampled_from([2, 3, 8]),
       name=st.sampled_from(sorted(STRATEGIES)), max_keys=st.sampled_from([1, 5, 40]),
       string_keys=st.booleans())
def test_bounded_table_properties(seed: int, n: int, name: str, max_keys: int,
                                  string_keys: bool) -> None:
    rng = np.random.default_rng(seed)
    p = STRATEGIES[name](n, max_keys)
    placed: dict[object, int] | None = None
    seen: list[object] = []
    for _step in range(4):
        raw = rng.zipf(1.3, int(rng.integers(20, 300))) % 500
        keys = [f"k{v}" for v in raw.tolist()] if string_keys else raw.tolist()
        if rng.random() < 0.5:
            p.fit(keys)
        else:
            uniq, counts = np.unique(np.asarray(keys, dtype=object), return_counts=True)
            p.fit(dict(zip(uniq.tolist(), counts.tolist())))
        seen = list(dict.fromkeys(seen + keys))
        placed = _check(p, seen, placed)
    if len(seen) > max_keys:
        assert p.bounded
        assert len(p) <= max_keys


@pytest.mark.parametrize("n", [8, 64])
@pytest.mark.parametrize("dist", ["uniform", "zipf"])
def test_bounded_balances_like_per_key_and_never_below_hash(n: int, dist: int) -> None:
    rng = np.random.default_rng(11)
    k = 50_000
    raw = rng.integers(0, k, 4 * k) if dist == "uniform" else rng.zipf(1.1, 4 * k) % k
    uniq, counts = np.unique(raw, return_counts=True)
    mapping = dict(zip(uniq.tolist(), counts.tolist()))
    bounded = tl.LeastCountPartitioner(n, max_keys=5_000).fit(mapping)
    per_key = tl.LeastCountPartitioner(n, max_keys=k + 1).fit(mapping)
    assert bounded.bounded and not per_key.bounded and len(bounded) == 5_000

    def degree(p: tl.Partitioner) -> float:
        return balance_degree(np.bincount(p.assign(uniq), weights=counts, minlength=n))

    assert degree(bounded) >= degree(per_key) - 0.01
    assert degree(bounded) >= degree(tl.HashPartitioner(n)) - 1e-9
    keys_bounded = tl.LeastKeyPartitioner(n, max_keys=5_000).fit(mapping)
    key_loads = np.bincount(keys_bounded.assign(uniq), minlength=n)
    assert balance_degree(key_loads) >= 0.99


def test_within_the_bound_nothing_changes() -> None:
    mapping = {f"u{i}": (i * 7919) % 97 + 1 for i in range(2_000)}
    for cls in (tl.LeastCountPartitioner, tl.LeastKeyPartitioner):
        small = cls(8).fit(mapping)
        big = cls(8, max_keys=2_000).fit(mapping)
        assert not small.bounded and not big.bounded
        assert small.assignments == big.assignments
        assert "groups" not in small.to_dict() and "max_keys" not in small.to_dict()
        assert cls(8, max_keys=1_999).fit(mapping).bounded


def test_heaviest_keys_get_the_entries_and_new_keys_go_by_group() -> None:
    mapping = {"hot": 1_000, "warm": 500, **{f"c{i}": 1 for i in range(100)}}
    p = tl.LeastCountPartitioner(4, max_keys=2).fit(mapping)
    assert p.bounded and set(p.assignments) == {"hot", "warm"}
    version = p.table_version
    before = p.assign(["brand-new", "c5"]).tolist()
    p.fit({"brand-new": 10_000})  # heavy later: no entry until a refit, and no move
    assert "brand-new" not in p
    assert p.assign(["brand-new", "c5"]).tolist() == before
    assert p.table_version == version  # loads only: what was built from the table stands
    assert p.partition("c5") == int(p.groups[p.key_groups(["c5"])[0]])


def test_null_key_keeps_its_partition_and_loads() -> None:
    p = tl.LeastCountPartitioner(4, max_keys=1)
    p.fit([None, None, "a", "b", "c"])
    assert p.bounded and p.partition(None) == 42 % 4
    assert p.key_groups([None]).tolist() == [-1]
    assert p.assign([None]).tolist() == [2]


def test_stored_bounded_tables_are_checked() -> None:
    p = tl.LeastCountPartitioner(4, max_keys=1).fit({"a": 5, "b": 1, "c": 1})
    data = p.to_dict()
    assert data["max_keys"] == 1 and len(data["groups"]) == p.num_groups
    for field, bad in (("groups", [9] * p.num_groups), ("groups", [0] * 3),
                       ("group_loads", [-1.0] * p.num_groups), ("num_groups", 7),
                       ("max_keys", 0), ("group_loads", ["x"] * p.num_groups)):
        with pytest.raises(InvalidArgumentError):
            tl.Partitioner.from_dict({**data, field: bad})
    fresh = p.fresh()
    assert not fresh.bounded and fresh.max_keys == 1


def test_bounded_table_refuses_int_binding_of_long_groups() -> None:
    p = tl.LeastKeyPartitioner(2, max_keys=1).fit([1, 2, 3])
    with pytest.raises(InvalidKeyTypeError, match="bounded"):
        p.bind_key_type("int")
    p.bind_key_type("long")
    assert p.key_type == "long"


def test_max_keys_is_checked() -> None:
    for bad in (0, -1, 2**30):
        with pytest.raises(InvalidArgumentError):
            tl.LeastCountPartitioner(2, max_keys=bad)
    with pytest.raises(TypeError):
        tl.LeastKeyPartitioner(2, max_keys=1.5)  # type: ignore[arg-type]
    assert tl.LeastKeyPartitioner(2).max_keys == DEFAULT_MAX_KEYS


def test_fit_loads_checks_its_arguments() -> None:
    p = tl.LeastCountPartitioner(2)
    with pytest.raises(InvalidArgumentError, match="one number per key"):
        p.fit_loads(["a", "b"], [1.0])
    with pytest.raises(InvalidArgumentError, match="key group"):
        p.fit_loads(["a"], [1.0], (np.ones(3), np.ones(3)))
    with pytest.raises(InvalidArgumentError):
        p.fit_loads(["a"], [float("nan")])
    assert len(p) == 0  # bad input changed nothing


def test_least_units_spreads_empty_units_and_balances() -> None:
    loads = np.zeros(3)
    out = least_units(loads, np.array([0.0, 0.0, 0.0, 6.0, 3.0, 3.0]))
    assert sorted(out[:3].tolist()) == [0, 1, 2]
    assert loads.tolist() == [6.0, 3.0, 3.0]
    capped = least_units(np.zeros(2), np.ones(10), np.array([80.0, 20.0]))
    assert np.bincount(capped, minlength=2).tolist() == [8, 2]


def test_threads_agree_on_a_bounded_table() -> None:
    import threading

    p = tl.LeastCountPartitioner(4, max_keys=10).fit({i: 100 - i for i in range(100)})
    keys = list(range(1_000))
    expected = p.assign(keys).tolist()
    results: list[list[int]] = []

    def work() -> None:
        results.append(p.assign(keys).tolist())

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r == expected for r in results)


def test_evaluation_scores_the_bounded_form_and_says_what_it_gives_up() -> None:
    rng = np.random.default_rng(2)
    uniq, counts = np.unique(rng.zipf(1.2, 20_000) % 5_000, return_counts=True)
    mapping = dict(zip(uniq.tolist(), counts.tolist()))
    scores = {s.name: s for s in tl.evaluate_strategies(mapping, 8, max_keys=100)}
    lc = scores["least_count"]
    assert lc.bounded and len(lc.partitioner) == 100
    per_key = tl.LeastCountPartitioner(8, max_keys=len(mapping) + 1).fit(mapping)
    expected = balance_degree(np.bincount(per_key.assign(uniq), weights=counts, minlength=8))
    assert lc.per_key_balance == pytest.approx(expected)
    assert lc.bounded_gap == pytest.approx(expected - lc.balance_degree)
    assert lc.to_dict()["bounded"] and "per_key_balance_degree" in lc.to_dict()
    assert not scores["hash"].bounded and scores["hash"].per_key_balance is None
    unbounded = {s.name: s for s in tl.evaluate_strategies(mapping, 8)}
    assert not unbounded["least_count"].bounded
    assert unbounded["least_count"].per_key_balance is None
