"""evaluate_strategies and choose_best."""

from __future__ import annotations

import numpy as np
import pytest

import trilink_spark as tl
from trilink_spark.partitioners import choose_best
from trilink_spark.partitioners.choosing.scenarios import PAPER_SCENARIOS, make_scenario, records


def test_scores_match_independent_placement():
    sc = make_scenario("skewed_keys", 50_000, 1_000, seed=4)
    counts = sc.as_mapping()
    scores = {s.name: s for s in tl.evaluate_strategies(counts, 12)}
    assert set(scores) == {"hash", "modulo", "least_key", "least_count"}
    hash_loads = np.bincount(
        tl.HashPartitioner(12).assign(list(counts)), weights=list(counts.values()), minlength=12
    )
    assert scores["hash"].loads.tolist() == hash_loads.tolist()
    for s in scores.values():
        assert s.loads.sum() == sc.num_records
        assert s.balance_degree <= s.keyed_bound + 1e-12


def test_record_sequence_adds_online_least_count():
    stream = records(make_scenario("skewed_records", 20_000, 500, seed=1))
    names = [s.name for s in tl.evaluate_strategies(stream, 8)]
    assert "least_count_no_history" in names


def test_string_keys_skip_modulo_and_weights_add_weight():
    scores = tl.evaluate_strategies(["a", "b", "c"] * 5, 3, weights=[50, 25, 25])
    names = [s.name for s in scores]
    assert "modulo" not in names and {"weight", "weight_random"} <= set(names)


@pytest.mark.parametrize("name", PAPER_SCENARIOS)
def test_best_reaches_target_where_the_bound_allows(name):
    sc = make_scenario(name, 200_000, 4_000, seed=0)
    scores = tl.evaluate_strategies(sc.as_mapping(), 20)
    best = choose_best(scores)
    lc = next(s for s in scores if s.name == "least_count")
    assert lc.gap_to_bound <= 0.01
    if lc.keyed_bound >= 0.97:
        assert best.balance_degree >= 0.97


def test_choose_best_prefers_stateless_unless_clearly_better():
    counts = {k: 10 for k in range(600)}
    scores = tl.evaluate_strategies(counts, 6)
    assert choose_best(scores).name == "modulo"  # ties with least_*: stateless wins
    skew = make_scenario("skewed_records", 100_000, 2_000, seed=3).as_mapping()
    assert choose_best(tl.evaluate_strategies(skew, 10)).name == "least_count"


def test_fit_on_sample_evaluate_on_all():
    sc = make_scenario("skewed_records", 100_000, 2_000, seed=5)
    full = sc.as_mapping()
    sample = {k: v for i, (k, v) in enumerate(full.items()) if i % 2 == 0}
    scores = tl.evaluate_strategies(sample, 8, evaluate_on=full)
    assert all(s.loads.sum() == sc.num_records for s in scores)
