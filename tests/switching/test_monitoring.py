"""Denoised balance: sampling noise removed, structural imbalance kept."""

from __future__ import annotations

import numpy as np
import pytest

from trilink_spark.partitioners import balance_degree
from trilink_spark.switching.monitoring import denoised_balance, split_counts


def sampled_loads(true_loads: np.ndarray, rate: float, rng: np.random.Generator) -> np.ndarray:
    return rng.binomial(true_loads.astype(np.int64), rate) / rate


def test_balanced_placement_is_seen_as_balanced_through_the_noise() -> None:
    rng = np.random.default_rng(0)
    true = np.full(16, 12_500.0)
    raw, denoised = [], []
    for _ in range(200):
        loads = sampled_loads(true, 0.01, rng)
        raw.append(balance_degree(loads))
        denoised.append(denoised_balance(loads, 1 / 0.01 - 1))
    assert np.median(raw) < 0.8  # the noise alone makes plain min/max look bad
    assert np.mean(np.asarray(denoised) == 1.0) > 0.97  # ~1 % false alarms at 3 SE


def test_structural_imbalance_survives() -> None:
    rng = np.random.default_rng(1)
    true = np.array([20_000.0] * 4 + [10_000.0] * 12)  # true balance 0.5
    estimates = [denoised_balance(sampled_loads(true, 0.05, rng), 1 / 0.05 - 1)
                 for _ in range(100)]
    assert 0.4 < float(np.median(estimates)) < 0.6


def test_exact_loads_are_plain_balance_degree() -> None:
    loads = [3.0, 5.0, 4.0]
    assert denoised_balance(loads, 0.0, significance=0.0) == pytest.approx(0.6)
    assert denoised_balance([0.0, 0.0], 5.0) == 1.0
    assert denoised_balance([], 5.0) == 1.0
    weighted = denoised_balance([20.0, 80.0], 0.0, capacity=[20, 80], significance=0.0)
    assert weighted == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(5))
def test_split_counts_partitions_every_count(seed: int) -> None:
    counts = np.random.default_rng(seed).integers(0, 50, 100).astype(np.float64)
    first, second = split_counts(counts, np.random.default_rng(seed))
    assert (first >= 0).all() and (second >= 0).all()
    assert (first + second == counts).all()
