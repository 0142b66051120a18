"""AdaptivePartitioner: sampling view, modes, hysteresis, config updates, delegation."""

from __future__ import annotations

import logging
import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import trilink_spark as tl
from trilink_spark.errors import InvalidKeyTypeError, NullKeyError
from trilink_spark.partitioners import CANDIDATES, balance_degree
from trilink_spark.partitioners.choosing.scenarios import make_scenario


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def skewed_sample(rng: np.random.Generator, size: int = 2000) -> dict[int, int]:
    """A few heavy keys on a multiple-of-4 grid: hash and modulo place them badly."""
    keys = np.arange(0, 400, 4)
    weights = np.where(keys < 40, 30.0, 1.0)
    counts = rng.multinomial(size, weights / weights.sum())
    return {int(k): int(c) for k, c in zip(keys, counts) if c}


def uniform_sample(rng: np.random.Generator, size: int = 4000, keys: int = 5000) -> Any:
    return rng.integers(0, keys, size)


# ---------------------------------------------------------------------- view
def test_view_decays_and_forgets_old_keys() -> None:
    ap = tl.AdaptivePartitioner(4, sample_rate=1.0, decay=0.5, min_sample=1)
    ap.observe(["old"] * 8)
    ap.observe(["new"] * 8)
    view = ap.sample_view
    assert view["old"] == pytest.approx(4.0) and view["new"] == pytest.approx(8.0)
    for _ in range(10):
        ap.observe(["new"])
    assert "old" not in ap.sample_view.index  # pruned once its weight fell below 0.01
    assert ap.records_observed == 26


def test_decay_zero_keeps_only_the_latest_observation() -> None:
    ap = tl.AdaptivePartitioner(4, decay=0.0)
    ap.observe({1: 5, 2: 5})
    ap.observe({3: 7})
    assert ap.sample_view.to_dict() == {3: 7.0}


def test_observe_refuses_mixed_key_types_and_nulls() -> None:
    ap = tl.AdaptivePartitioner(4, null_policy="error")
    ap.observe([1, 2, 3])
    with pytest.raises(InvalidKeyTypeError):
        ap.observe(["a"])
    with pytest.raises(NullKeyError):
        ap.observe([1, None])
    for policy in ("group", "partition0"):  # counted, never in the view (a fixed partition)
        lenient = tl.AdaptivePartitioner(4, sample_rate=1.0, null_policy=policy)
        lenient.observe([1, None, 1])
        assert lenient.sample_view.to_dict() == {1: 2.0}
        assert lenient.records_observed == 3


# ---------------------------------------------------------------------- modes
def test_quantity_mode_decides_every_n_records() -> None:
    rng = np.random.default_rng(0)
    ap = tl.AdaptivePartitioner(8, mode="quantity", quantity=10_000, min_sample=100)
    ap.observe(skewed_sample(rng), represents=6_000)
    d = ap.decide()
    assert not d.triggered and "6000 of 10000" in d.reason and ap.decisions == []
    ap.observe(skewed_sample(rng), represents=6_000)
    d = ap.decide()
    assert d.triggered and d.switched and d.chosen.startswith("least")
    assert ap.decisions == [d]
    assert not ap.decide().triggered  # the count restarts after a decision


def test_threshold_mode_only_when_balance_drops() -> None:
    rng = np.random.default_rng(1)
    ap = tl.AdaptivePartitioner(4, mode="threshold", threshold=0.6, min_sample=100)
    ap.observe(uniform_sample(rng, 20_000, 200))
    d = ap.decide()
    assert not d.triggered and d.current_balance is not None and d.current_balance > 0.6
    ap.observe(skewed_sample(rng, 20_000))
    ap.observe(skewed_sample(rng, 20_000))
    d = ap.decide()
    assert d.triggered and d.current_balance is not None and d.current_balance < 0.6
    assert d.switched


def test_periodic_mode_by_time_and_by_batches() -> None:
    clock = FakeClock()
    rng = np.random.default_rng(2)
    ap = tl.AdaptivePartitioner(8, mode="periodic", period_s=20, min_sample=100, clock=clock)
    ap.observe(skewed_sample(rng))
    clock.now = 19.0
    assert not ap.decide().triggered
    clock.now = 20.0
    assert ap.decide().triggered
    by_batch = tl.AdaptivePartitioner(8, mode="periodic", period_batches=3, min_sample=100)
    by_batch.observe(skewed_sample(rng))
    results = []
    for _ in range(6):
        by_batch.batch_boundary()
        results.append(by_batch.decide().triggered)
    assert results == [False, False, True, False, False, True]


def test_manual_mode_never_decides_but_force_does() -> None:
    rng = np.random.default_rng(3)
    ap = tl.AdaptivePartitioner(8, mode="manual", min_sample=100)
    ap.observe(skewed_sample(rng))
    assert not ap.decide().triggered
    assert ap.decide(force=True).switched


def test_no_decision_before_min_sample() -> None:
    ap = tl.AdaptivePartitioner(8, mode="quantity", quantity=1, min_sample=500)
    ap.observe(list(range(100)))
    d = ap.decide()
    assert not d.triggered and "min_sample" in d.reason


def test_hysteresis_keeps_a_good_strategy_through_noise() -> None:
    """Uniform keys: Hash is fine; sample noise must not make the partitioner flap."""
    rng = np.random.default_rng(4)
    ap = tl.AdaptivePartitioner(8, mode="quantity", quantity=1, min_sample=100, min_gain=0.05)
    for _ in range(40):
        ap.observe(uniform_sample(rng, 4000, 50_000))
        ap.decide()
    switches = sum(d.switched for d in ap.decisions)
    assert len(ap.decisions) == 40 and switches <= 1


def test_stale_history_triggers_a_refit() -> None:
    """A LeastCount table learnt on one distribution is refit when the heavy keys move."""
    ap = tl.AdaptivePartitioner(4, mode="quantity", quantity=1, min_sample=10, decay=0.0,
                                initial=tl.LeastCountPartitioner(4))
    ap.observe({k: 100 for k in range(8)})
    ap.decide()
    ap.current.fit({k: 100 for k in range(8)})  # what key_by(fit="full") would teach it
    heavy = {0: 1000, 4: 1000, 1: 1000, 5: 1000}  # two heavy keys per old partition pair
    ap.observe(heavy)
    d = ap.decide()
    assert d.current_balance is not None
    assert d.switched and "refit least_count" in d.reason or d.chosen != "least_count"
    assert ap.decisions[-1].scores


def test_frozen_partitioner_logs_but_never_switches(caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(5)
    ap = tl.AdaptivePartitioner(8, mode="quantity", quantity=1, min_sample=100)
    ap.freeze("keyed state in use")
    ap.observe(skewed_sample(rng))
    with caplog.at_level(logging.WARNING, logger="trilink_spark.switching.adaptive"):
        d = ap.decide()
    assert d.triggered and not d.switched and ap.current_name == "hash"
    assert "switching is off: keyed state in use" in d.reason
    assert "would switch" in caplog.text
    ap.config.publish({"strategy": "least_key"})
    ap.batch_boundary()
    assert ap.current_name == "hash"


# ---------------------------------------------------------------------- config updates
def test_config_updates_apply_at_the_next_batch_boundary() -> None:
    ap = tl.AdaptivePartitioner(8, mode="threshold")
    ap.config.publish({"mode": "quantity", "quantity": 50, "sample_rate": 0.2,
                       "strategy": "least_key", "candidates": ["hash", "least_key"]})
    assert ap.mode == "threshold" and ap.current_name == "hash"
    assert ap.batch_boundary() is not None
    assert (ap.mode, ap.sample_rate, ap.current_name) == ("quantity", 0.2, "least_key")
    assert ap.settings["candidates"] == ["hash", "least_key"]
    assert ap.decisions[-1].reason == "config version 1 pinned strategy least_key"
    # a later snapshot that only changes the rate does not re-pin (keys keep their table)
    ap.current.fit([1, 2, 3])
    ap.config.publish({"sample_rate": 0.1})
    ap.batch_boundary()
    assert ap.current_name == "least_key" and len(ap.current) == 3  # type: ignore[arg-type]


def test_bad_config_updates_change_nothing(caplog: pytest.LogCaptureFixture) -> None:
    ap = tl.AdaptivePartitioner(8)
    before = ap.settings
    with caplog.at_level(logging.WARNING):
        assert ap.config.publish({"sample_rate": -1}) is None
        assert ap.config.publish({"strategy": "weight"}) is not None  # valid, but no weights
        ap.batch_boundary()
    assert ap.settings == before and ap.current_name == "hash"
    assert "weight needs weights" in caplog.text


def test_modulo_is_never_pinned_on_string_keys(caplog: pytest.LogCaptureFixture) -> None:
    ap = tl.AdaptivePartitioner(4)
    ap.observe(["a", "b"])
    ap.config.publish({"strategy": "modulo"})
    with caplog.at_level(logging.WARNING):
        ap.batch_boundary()
    assert ap.current_name == "hash" and "modulo needs integer keys" in caplog.text
    assert "modulo" not in {s.name for s in ap.decide(force=True).scores}


# ---------------------------------------------------------------------- delegation
def test_delegates_placement_and_round_trips() -> None:
    rng = np.random.default_rng(6)
    ap = tl.AdaptivePartitioner(8, mode="quantity", quantity=1, min_sample=100)
    ap.observe(skewed_sample(rng))
    ap.decide()
    keys = list(range(0, 400, 4))
    assert ap.assign(keys).tolist() == ap.current.assign(keys).tolist()
    assert [ap(k) for k in keys] == ap.current.assign(keys).tolist()
    clone = pickle.loads(pickle.dumps(ap))
    assert clone.assign(keys).tolist() == ap.assign(keys).tolist()
    again = tl.Partitioner.from_json(ap.to_json())
    assert isinstance(again, tl.AdaptivePartitioner) and again == ap
    assert again.current_name == ap.current_name and again.settings == ap.settings


def test_argument_errors() -> None:
    with pytest.raises(ValueError):
        tl.AdaptivePartitioner(4, mode="sometimes")
    with pytest.raises(TypeError):
        tl.AdaptivePartitioner(4, sample_rate="1%")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        tl.AdaptivePartitioner(4, strategies=["hash", "teleport"])
    with pytest.raises(ValueError):
        tl.AdaptivePartitioner(4, initial=tl.HashPartitioner(5))
    with pytest.raises(TypeError):
        tl.AdaptivePartitioner(4, config={"mode": "manual"})  # type: ignore[arg-type]


# ---------------------------------------------------------------------- decision quality
@pytest.mark.parametrize("scenario", ["uniform", "skewed_keys", "skewed_records", "skewed_both"])
def test_decision_at_one_percent_is_near_the_best(scenario: str) -> None:
    """The chosen strategy, used as key_by would (table fitted on every key), is within 2 %."""
    sc = make_scenario(scenario, 200_000, 2000, seed=7)
    full = sc.as_mapping()
    rng = np.random.default_rng(7)
    sampled = rng.binomial(sc.counts, 0.01)
    ap = tl.AdaptivePartitioner(16, mode="manual", min_sample=1)
    ap.observe({int(k): int(c) for k, c in zip(sc.keys, sampled) if c}, represents=200_000)
    chosen = ap.decide(force=True)
    best = max(s.balance_degree for s in tl.evaluate_strategies(full, 16))
    p = ap.unwrap(refit=True).copy()  # as key_by(fit="full") takes it
    if p.is_stateful:
        p.fit(full if isinstance(p, tl.LeastCountPartitioner) else list(full))
    loads = np.bincount(p.assign(list(full)), weights=list(full.values()), minlength=16)
    assert balance_degree(loads) >= 0.98 * best, chosen.reason


# ---------------------------------------------------------------------- randomised
@settings(max_examples=30, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["observe", "decide", "boundary", "publish"]),
                  st.integers(0, 10_000)),
        min_size=1, max_size=25,
    ),
    mode=st.sampled_from(["periodic", "quantity", "threshold", "manual"]),
)
def test_random_operation_sequences_keep_invariants(ops: list[tuple[str, int]], mode: str) -> None:
    clock = FakeClock()
    ap = tl.AdaptivePartitioner(6, mode=mode, quantity=500, period_s=1.0, min_sample=20,
                                clock=clock)
    rng = np.random.default_rng(len(ops))
    names = ["hash", "modulo", "least_key", "least_count"]
    for op, arg in ops:
        clock.now += 0.5
        if op == "observe":
            ap.observe(rng.zipf(1.5, 50 + arg % 500) % 1000)
        elif op == "decide":
            d = ap.decide(force=arg % 7 == 0)
            assert d.chosen == ap.current_name
            assert d.switched == (d.previous != d.chosen) or "refit" in d.reason
        elif op == "boundary":
            ap.batch_boundary()
        else:
            ap.config.publish({"strategy": names[arg % 4]})
        _check(ap)


def _check(ap: tl.AdaptivePartitioner) -> None:
    """Invariants after every step."""
    view = ap.sample_view
    assert (view >= 0.01).all()
    assert ap.current.num_partitions == ap.num_partitions
    assert ap.current_name in CANDIDATES
    if isinstance(ap.current, (tl.LeastKeyPartitioner, tl.LeastCountPartitioner)):
        ap.current._check()
    if len(view):
        pids = ap.assign(view.index.to_numpy())
        assert ((pids >= 0) & (pids < ap.num_partitions)).all()
