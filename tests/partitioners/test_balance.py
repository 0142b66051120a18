"""Balance metrics, the keyed bound and measured partition loads."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

import trilink_spark as tl
from trilink_spark.partitioners import BalanceReport, balance_degree, extra_compute_time
from trilink_spark.partitioners import keyed_bound


def test_paper_definitions():
    assert balance_degree([10, 20, 40]) == 0.25
    assert balance_degree([0, 0, 0]) == 1.0
    assert extra_compute_time([10, 20, 30]) == 0.5
    assert extra_compute_time([0, 0]) == 0.0
    assert balance_degree([20, 50, 30, 7], weights=[20, 50, 30, 0]) == 1.0


def _best_keyed_balance(counts, n):
    best = 0.0
    for assignment in itertools.product(range(n), repeat=len(counts)):
        loads = np.bincount(assignment, weights=counts, minlength=n)
        best = max(best, balance_degree(loads))
    return best


@pytest.mark.parametrize("seed", range(25))
def test_keyed_bound_is_an_upper_bound_of_the_exhaustive_optimum(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 3)
    counts = [rng.randint(0, 30) for _ in range(rng.randint(1, 7))]
    optimum = _best_keyed_balance(counts, n)
    assert optimum <= keyed_bound(counts, n) + 1e-12


def test_keyed_bound_is_tight_when_one_key_dominates():
    # [90 | 5+5]: the best placement reaches the bound exactly
    assert keyed_bound([90, 5, 5], 2) == pytest.approx(10 / 90)
    assert _best_keyed_balance([90, 5, 5], 2) == pytest.approx(10 / 90)
    assert keyed_bound([], 4) == 1.0
    assert keyed_bound([5, 5], 1) == 1.0


def test_partition_balance_of_dataframe_and_rdd(spark):
    df = spark.range(100).repartition(4)
    report = tl.partition_balance(df)
    assert report.num_partitions == 4 and report.total == 100
    rdd = spark.sparkContext.parallelize(range(10), 3)
    rep = tl.partition_balance(rdd)
    assert rep.loads.tolist() == [3, 3, 4]
    assert rep.balance_degree == 0.75
    # empty partitions count as zero, not as missing
    sparse = spark.range(3).repartition(8)
    assert tl.partition_balance(sparse).num_partitions == 8
    assert tl.partition_balance(sparse).balance_degree == 0.0


def test_report_to_dict():
    rep = BalanceReport(loads=np.array([1, 3]))
    d = rep.to_dict()
    assert d["balance_degree"] == pytest.approx(1 / 3) and d["loads"] == [1, 3]
