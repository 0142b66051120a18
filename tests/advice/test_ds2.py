"""DS2 sizing: Eq. 7-8 by hand, one step on linear operators, at most three on sublinear ones
with no overshoot, the exponent fit, and the simulated pipeline."""

from __future__ import annotations

import math
import random
from collections.abc import Hashable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trilink_spark.advice.ds2 import (
    TrueRate,
    ds2_parallelism,
    ds2_plan,
    fit_exponent,
    scaled_parallelism,
)
from trilink_spark.elastic.pipeline import SimulatedOperator, SimulatedPipeline
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError


def test_equations_7_and_8_on_a_diamond() -> None:
    # src fans out to a and b (each gets every record), both feed join
    graph = {"src": ["a", "b"], "a": ["join"], "b": ["join"], "join": []}
    rates = {"a": TrueRate(500.0, 250.0), "b": TrueRate(2000.0, 4000.0), "join": 1000.0}
    plan = ds2_plan(graph, rates, {"src": 1000.0})
    assert plan.target_input == {"src": 1000.0, "a": 1000.0, "b": 1000.0, "join": 2500.0}
    assert plan.target_output["a"] == 500.0 and plan.target_output["b"] == 2000.0
    assert plan.parallelism == {"a": 2, "b": 1, "join": 3}
    assert plan.order[0] == "src"
    # the same graph as edges; bounds
    edges = [("src", "a"), ("src", "b"), ("a", "join"), ("b", "join")]
    assert ds2_parallelism(edges, rates, {"src": 1000.0}) == plan.parallelism
    assert ds2_parallelism(edges, rates, {"src": 1000.0}, max_parallelism=2)["join"] == 2
    assert ds2_parallelism(edges, rates, {"src": 0.0}) == {"a": 1, "b": 1, "join": 1}
    # a source listed in true_rates is sized too
    assert ds2_parallelism(edges, {**rates, "src": 300.0}, {"src": 1000.0})["src"] == 4


def test_ceil_tolerates_rounding() -> None:
    # 0.3 / 0.1 is 2.9999999999999996, 0.7 / 0.1 is 6.999999999999999: exact counts anyway
    assert ds2_parallelism({"s": ["x"]}, {"x": 0.1}, {"s": 0.3}) == {"x": 3}
    assert ds2_parallelism({"s": ["x"]}, {"x": 0.1}, {"s": 0.7}) == {"x": 7}
    assert ds2_parallelism({"s": ["x"]}, {"x": 100.0}, {"s": 300.0}) == {"x": 3}


def test_true_rate_from_counts() -> None:
    r = TrueRate.from_counts(records_in=1200, useful_seconds=4.0, records_out=300)
    assert (r.processing, r.output, r.selectivity) == (300.0, 75.0, 0.25)
    assert TrueRate.from_counts(10, 2.0).selectivity == 1.0


# ---------------------------------------------------------------------- convergence
def random_pipeline(rng: random.Random, exponent: tuple[float, float]
                    ) -> tuple[SimulatedPipeline, dict[Hashable, int], dict[Hashable, float]]:
    """A chain or a small DAG of 2-6 operators with random rates and selectivities, the
    initial parallelism (1-4) and a target rate."""
    n = rng.randint(2, 6)
    names = [f"op{i}" for i in range(n)]
    graph: dict[Hashable, list[Hashable]] = {"src": [names[0]]}
    for i, name in enumerate(names):
        graph[name] = [names[i + 1]] if i + 1 < n else []
        if i + 2 < n and rng.random() < 0.3:
            graph[name].append(names[i + 2])  # a skip edge: op i+2 gets two inputs
    ops = {"src": SimulatedOperator(1e9)}
    for name in names:
        ops[name] = SimulatedOperator(rng.uniform(500.0, 20_000.0),
                                      selectivity=rng.choice([0.1, 0.5, 1.0, 1.0, 2.0]),
                                      exponent=rng.uniform(*exponent))
    sim = SimulatedPipeline(graph, ops)
    initial: dict[Hashable, int] = {k: rng.randint(1, 4) for k in ops}
    initial["src"] = 1
    return sim, initial, {"src": rng.uniform(1_000.0, 20_000.0)}


def ds2_run(sim: SimulatedPipeline, par: dict[Hashable, int], target: dict[Hashable, float],
            max_steps: int = 10) -> tuple[int, list[dict[Hashable, int]]]:
    """DS2 in a loop: measure a window, resize; the number of resizes until the target is
    sustained, and the parallelism after each."""
    history = [dict(par)]
    for step in range(max_steps + 1):
        window = sim.run(par, target)
        if window.sustained:
            return step, history
        rates = {n: w.true_rate for n, w in window.operators.items() if n != "src"}
        par = {"src": 1, **ds2_parallelism(sim.edges(), rates, target)}
        history.append(dict(par))
    return max_steps + 1, history


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1))
def test_ds2_converges_in_one_step_on_linear_operators(seed: int) -> None:
    sim, initial, target = random_pipeline(random.Random(seed), (1.0, 1.0))
    minimal = sim.minimal_parallelism(target)
    steps, history = ds2_run(sim, initial, target)
    assert steps <= 1
    if steps == 1:  # the one decision is exactly the minimum (no over-, no under-provisioning)
        assert {k: v for k, v in history[1].items() if k != "src"} == {
            k: v for k, v in minimal.items() if k != "src"}


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1))
def test_ds2_converges_in_three_steps_on_sublinear_operators_without_overshoot(
        seed: int) -> None:
    """Power-law scaling, exponent 0.9-0.99, targets up to 20 single-instance rates: each
    decision under-estimates what more instances need (the per-instance rate falls), so
    scaling up approaches the minimum from below and never passes it."""
    rng = random.Random(seed)
    sim, initial, _ = random_pipeline(rng, (0.9, 0.99))
    need_one = sim.required_input({"src": 1.0})
    # the largest target keeping every operator within 20 single-instance rates
    cap = min(20 * sim.operators[n].rate / need_one[n] for n in need_one if n != "src")
    target = {"src": rng.uniform(0.1, 1.0) * cap}
    minimal = sim.minimal_parallelism(target)
    steps, history = ds2_run(sim, initial, target)
    assert steps <= 3, history
    for par in history[1:]:
        for n, p in par.items():
            if n != "src" and minimal[n] >= initial[n]:  # scaling up: never past the minimum
                assert p <= minimal[n], (n, history, minimal)
    final = history[-1]
    for n in minimal:
        if n != "src" and minimal[n] >= initial[n]:
            assert final[n] == minimal[n]


def test_fit_exponent_sizes_a_sublinear_operator_in_one_more_step() -> None:
    op = SimulatedOperator(1000.0, exponent=0.8)
    target = 25_000.0
    p1 = scaled_parallelism(target, 1, op.instance_rate(1))  # DS2's first (linear) guess
    assert op.capacity(p1) < target
    a = fit_exponent([(1, op.instance_rate(1)), (p1, op.instance_rate(p1))])
    assert math.isclose(a, 0.8)
    p2 = scaled_parallelism(target, p1, op.instance_rate(p1), a)
    assert p2 == op.min_parallelism(target)
    assert op.capacity(p2) >= target > op.capacity(p2 - 1)
    assert fit_exponent([]) == 1.0
    assert fit_exponent([(2, 10.0), (4, 30.0)]) == 1.0  # superlinear is clipped


# ---------------------------------------------------------------------- simulation
def test_pipeline_backpressure_and_measurements() -> None:
    sim = SimulatedPipeline([("src", "map"), ("map", "agg")],
                            {"src": SimulatedOperator(1e6),
                             "map": SimulatedOperator(1000.0, selectivity=3.0),
                             "agg": SimulatedOperator(2000.0, exponent=0.5)})
    w = sim.run({"src": 1, "map": 4, "agg": 4}, {"src": 1000.0})
    # agg needs 3000/s, has 2000 * 4 ** 0.5 = 4000: map's 4000 is enough too
    assert w.sustained and w.throughput == 1000.0
    assert w.operators["agg"].utilisation == 0.75
    assert w.operators["agg"].true_rate.processing == 1000.0  # 4000 / 4 per instance
    assert math.isclose(w.operators["agg"].latency_ms, 1.0 / 0.25)
    w = sim.run({"src": 1, "map": 4, "agg": 1}, {"src": 1000.0})
    assert math.isclose(w.throttle, 2000.0 / 3000.0) and not w.sustained
    assert w.operators["agg"].utilisation == 1.0
    assert w.operators["agg"].latency_ms == 10_000.0  # saturated: the queue grows
    # true rates ignore backpressure: map is throttled but its rate per useful second holds
    assert w.operators["map"].true_rate.processing == 1000.0
    assert sim.minimal_parallelism({"src": 1000.0}) == {"src": 1, "map": 1, "agg": 3}
    noisy = SimulatedPipeline([("src", "map")], {"src": SimulatedOperator(1e6),
                                                 "map": SimulatedOperator(1000.0)},
                              noise=0.05, seed=3)
    rates = [noisy.run({"src": 1, "map": 1}, {"src": 10.0}).operators["map"].true_rate.processing
             for _ in range(200)]
    assert 990 < sum(rates) / len(rates) < 1010 and len(set(rates)) > 1


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize("graph, rates, sources, error, match", [
    ({"s": ["a"], "a": ["s"]}, {"a": 1.0}, {"s": 1.0}, InvalidArgumentError, "cycle"),
    ({"s": ["s"]}, {}, {"s": 1.0}, InvalidArgumentError, "self-loop"),
    ({"s": ["a"]}, {"a": 1.0}, {}, InvalidArgumentError, "lacks the sources"),
    ({"s": ["a"]}, {}, {"s": 1.0}, InvalidArgumentError, "lacks the operators"),
    ({"s": ["a"]}, {"a": 1.0, "z": 1.0}, {"s": 1.0}, InvalidArgumentError, "not in the graph"),
    ({"s": ["a"]}, {"a": 1.0}, {"s": 1.0, "a": 2.0}, InvalidArgumentError, "upstream"),
    ({"s": ["a"]}, {"a": 0.0}, {"s": 1.0}, InvalidArgumentError, "> 0"),
    ({"s": ["a"]}, {"a": math.nan}, {"s": 1.0}, InvalidArgumentError, "finite"),
    ({"s": ["a"]}, {"a": 1.0}, {"s": -1.0}, InvalidArgumentError, ">= 0"),
    ({"s": ["a"]}, {"a": "fast"}, {"s": 1.0}, InvalidArgumentTypeError, "real number"),
    ({"s": "a"}, {"a": 1.0}, {"s": 1.0}, InvalidArgumentTypeError, "iterable"),
    ("sa", {"a": 1.0}, {"s": 1.0}, InvalidArgumentTypeError, "string"),
    ({}, {}, {}, InvalidArgumentError, "empty"),
])
def test_bad_arguments_are_refused(graph: Any, rates: Any, sources: Any,
                                   error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        ds2_parallelism(graph, rates, sources)


def test_bad_models_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="exponent"):
        SimulatedOperator(1.0, exponent=1.5)
    with pytest.raises(InvalidArgumentError, match="missing"):
        SimulatedPipeline({"s": ["a"]}, {"s": SimulatedOperator(1.0)})
    with pytest.raises(InvalidArgumentTypeError, match="SimulatedOperator"):
        SimulatedPipeline({"s": []}, {"s": 1.0})  # type: ignore[dict-item]
    sim = SimulatedPipeline({"s": []}, {"s": SimulatedOperator(1.0)})
    with pytest.raises(InvalidArgumentError, match="parallelism"):
        sim.run({}, {"s": 1.0})
    with pytest.raises(InvalidArgumentError, match=">= 1"):
        sim.run({"s": 0}, {"s": 1.0})
    with pytest.raises(InvalidArgumentError, match="exponent"):
        scaled_parallelism(1.0, 1, 1.0, 2.0)
    with pytest.raises(InvalidArgumentError, match="noise"):
        SimulatedPipeline({"s": []}, {"s": SimulatedOperator(1.0)}, noise=0.9)
