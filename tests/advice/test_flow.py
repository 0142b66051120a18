"""Flow networks: max flow and cuts against brute force, operator cuts, Algorithm 2's
saturated cuts, and Algorithm 1's capacity learning (dynamic against fixed steps)."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Hashable, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trilink_spark.advice.analysis import find_bottlenecks
from trilink_spark.advice.capacity import CapacityObservation, capacity_step, learn_capacity
from trilink_spark.advice.cuts import operator_min_cut
from trilink_spark.advice.network import FlowNetwork, FlowResult, max_flow, operator_of
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError, TrilinkError

TOL = 1e-7


# ---------------------------------------------------------------------- helpers
def random_dag(rng: random.Random, *, integer: bool = True) -> tuple[FlowNetwork, int, int]:
    """A DAG on 2..8 nodes (edges go from lower to higher index), source 0, sink n-1."""
    n = rng.randint(2, 8)
    density = rng.uniform(0.2, 0.9)
    cap: dict[tuple[Hashable, Hashable], float] = {}
    for i, j in itertools.combinations(range(n), 2):
        if rng.random() < density:
            cap[(i, j)] = float(rng.randint(0, 10)) if integer else rng.uniform(0.0, 10.0)
    for k in range(n):  # every node appears, so the network has all n of them
        if not any(k in e for e in cap):
            cap[(k, (k + 1) % n) if k < n - 1 else (0, k)] = 0.0
    return FlowNetwork(cap), 0, n - 1


def brute_min_cut(net: FlowNetwork, s: Hashable, t: Hashable,
                  group: Mapping[Hashable, Hashable] | None = None) -> float:
    """Minimum of Eq. 5 over every s-t cut (keeping each group whole when given)."""
    others = [v for v in net.nodes if v not in (s, t)]
    best = math.inf
    for bits in itertools.product((0, 1), repeat=len(others)):
        x = {s} | {v for v, b in zip(others, bits) if b}
        if group is not None:
            sides: dict[Hashable, set[bool]] = {}
            for v in net.nodes:
                sides.setdefault(group[v], set()).add(v in x)
            if any(len(side) > 1 for side in sides.values()):
                continue
        best = min(best, net.cut_capacity(x))
    return best


def check_invariants(net: FlowNetwork, res: FlowResult) -> None:
    """Capacity bounds and conservation after every augmenting step, the path amounts, and
    max-flow = min-cut."""
    s, t = res.source, res.sink
    assert net.violations(s, t, res.flows) == []
    # replay the augmenting paths from the starting flow, checking after each step
    start = net.flows if net.has_flows else {e: 0.0 for e in net.edges}
    skew: dict[tuple[Hashable, Hashable], float] = {}
    for (u, v), f in start.items():
        skew[(u, v)] = skew.get((u, v), 0.0) + f
        skew[(v, u)] = skew.get((v, u), 0.0) - f
    for path, amount in res.paths:
        assert path[0] == s and path[-1] == t and amount > 0
        assert len(set(path)) == len(path)  # a simple path
        for a, b in zip(path, path[1:]):
            assert (a, b) in net.capacities or (b, a) in net.capacities  # an edge, either way
            skew[(a, b)] = skew.get((a, b), 0.0) + amount
            skew[(b, a)] = skew.get((b, a), 0.0) - amount
        step = {e: max(0.0, skew.get(e, 0.0)) for e in net.edges}
        assert net.violations(s, t, step, tolerance=1e-9) == [], (path, amount)
    assert math.isclose(res.value, res.initial_value + sum(a for _, a in res.paths),
                        abs_tol=TOL)
    x, y = res.min_cut
    assert s in x and t in y and not x & y and x | y == set(net.nodes)
    assert res.saturated
    assert math.isclose(res.cut_capacity, res.value, abs_tol=TOL)
    assert math.isclose(net.cut_flow(x, res.flows), res.value, abs_tol=TOL)  # Eq. 6
    assert set(res.cut_edges) == {e for e in net.edges if e[0] in x and e[1] in y}
    for e in res.cut_edges:  # the cut's edges are full
        assert math.isclose(res.flows[e], net.capacity(*e), abs_tol=TOL)


# ---------------------------------------------------------------------- max flow vs brute force
@pytest.mark.parametrize("integer", [True, False])
def test_max_flow_equals_brute_force_min_cut_on_200_random_dags(integer: bool) -> None:
    rng = random.Random(1600 + integer)
    for _ in range(200):
        net, s, t = random_dag(rng, integer=integer)
        res = max_flow(net, s, t)
        check_invariants(net, res)
        assert math.isclose(res.value, brute_min_cut(net, s, t), abs_tol=TOL)


def test_operator_min_cut_equals_brute_force_over_cuts_that_keep_operators_whole() -> None:
    rng = random.Random(1601)
    for _ in range(200):
        net, s, t = random_dag(rng)
        n = len(net.nodes)
        k = rng.randint(1, max(1, n - 2))
        group: dict[Hashable, Hashable] = {v: f"op{rng.randrange(k)}" for v in net.nodes}
        group[s], group[t] = "source", "sink"
        cut = operator_min_cut(net, s, t, operator_of=group)
        for members in ({v for v in net.nodes if group[v] == g} for g in set(group.values())):
            assert members <= cut.source_side or members <= cut.sink_side
        assert s in cut.source_side and t in cut.sink_side
        assert math.isclose(cut.capacity, brute_min_cut(net, s, t, group), abs_tol=TOL)
        assert cut.capacity >= max_flow(net, s, t).value - TOL
        assert set(cut.heads) == {group[v] for (u, v) in cut.edges}
        # the same answer through a function and through (name, index) node naming
        assert cut.capacity == operator_min_cut(net, s, t, operator_of=group.__getitem__).capacity
        renamed = {v: (group[v], i) if v not in (s, t) else v for i, v in enumerate(net.nodes)}
        net2 = FlowNetwork({(renamed[u], renamed[v]): c for (u, v), c in
                            net.capacities.items()})
        assert math.isclose(operator_min_cut(net2, s, t).capacity, cut.capacity, abs_tol=TOL)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1))
def test_start_from_current_flow_and_limit(seed: int) -> None:
    rng = random.Random(seed)
    net, s, t = random_dag(rng, integer=False)
    full = max_flow(net, s, t)
    # a feasible partial flow: the full one scaled down
    scale = rng.uniform(0, 1)
    part = {e: f * scale for e, f in full.flows.items()}
    warm = net.with_flows(part)
    res = max_flow(warm, s, t)
    check_invariants(warm, res)
    assert math.isclose(res.initial_value, scale * full.value, abs_tol=TOL)
    assert math.isclose(res.value, full.value, abs_tol=TOL)
    assert max_flow(warm, s, t, start="zero").initial_value == 0.0
    limit = rng.uniform(0, 1.5) * full.value
    lim = max_flow(net, s, t, limit=limit)
    assert net.violations(s, t, lim.flows) == []
    assert math.isclose(lim.value, min(limit, full.value), abs_tol=TOL)


def test_max_flow_is_deterministic_and_reports_paths() -> None:
    net = FlowNetwork({("s", "a"): 3, ("s", "b"): 2, ("a", "b"): 1, ("a", "t"): 2,
                       ("b", "t"): 3})
    one, two = max_flow(net, "s", "t"), max_flow(net, "s", "t")
    assert one == two
    assert one.paths == ((("s", "a", "t"), 2.0), (("s", "b", "t"), 2.0),
                         (("s", "a", "b", "t"), 1.0))


def test_antiparallel_edges_and_paths_against_the_flow() -> None:
    # the second path must undo flow on (a, b) through the reverse residual edge
    net = FlowNetwork({("s", "a"): 1, ("s", "b"): 1, ("a", "b"): 1, ("b", "a"): 1,
                       ("a", "t"): 1, ("b", "t"): 1})
    res = max_flow(net, "s", "t")
    check_invariants(net, res)
    assert res.value == 2.0


def test_operator_naming_and_the_split_that_max_flow_allows() -> None:
    assert operator_of(("map", 2)) == "map"
    assert operator_of(("map", True)) == ("map", True)
    assert operator_of("x") == "x"
    net = FlowNetwork({("s", ("a", 0)): 1, ("s", ("a", 1)): 9, (("a", 0), "t"): 9,
                       (("a", 1), "t"): 1})
    assert max_flow(net, "s", "t").value == 2.0
    cut = operator_min_cut(net, "s", "t")
    assert cut.capacity == 10.0 and cut.heads == ("a",)
    assert cut.min_cut == (cut.source_side, cut.sink_side)


# ---------------------------------------------------------------------- Algorithm 2
def chain_network(caps: list[float], instances: list[int]) -> FlowNetwork:
    """src -> op0 (instances[0]) -> x0 -> op1 -> ... -> sink; op i's instances together
    take caps[i]."""
    cap: dict[tuple[Hashable, Hashable], float] = {}
    prev: list[Hashable] = ["src"]
    for i, (c, p) in enumerate(zip(caps, instances)):
        inst = [(f"op{i}", k) for k in range(p)]
        for v in inst:
            for u in prev:
                cap[(u, v)] = c / p / len(prev)
        prev = inst
    for u in prev:
        cap[(u, "sink")] = 1e6
    return FlowNetwork(cap)


def test_bottleneck_is_the_narrowest_operator_of_a_chain() -> None:
    net = chain_network([100.0, 40.0, 90.0, 60.0], [2, 3, 1, 4])
    a = find_bottlenecks(net, "src", "sink", demand=80.0)
    assert a.saturated and math.isclose(a.unmet, 40.0) and a.operators == ("op1",)
    assert math.isclose(a.flow.value, 40.0)
    for cut in a.cuts:
        assert cut.saturated(0.85) and math.isclose(cut.flow, 40.0)
    # lambda = 0.85 also names an operator within 1/0.85 of the bottleneck
    b = find_bottlenecks(chain_network([100.0, 40.0, 45.0], [1, 2, 2]), "src", "sink",
                         demand=80.0)
    assert b.operators == ("op1", "op2")
    assert find_bottlenecks(chain_network([100.0, 40.0, 45.0], [1, 2, 2]), "src", "sink",
                            demand=80.0, lambda_=0.95).operators == ("op1",)
    met = find_bottlenecks(net, "src", "sink", demand=30.0)
    assert not met.saturated and met.unmet == 0.0 and met.operators == () and met.cuts == ()
    assert find_bottlenecks(net, "src", "sink").operators == ("op1",)  # no demand: full load


def test_bottlenecks_redistribute_before_scaling() -> None:
    # measured flow all on the path through b0, but b1 has room: no operator needs scaling
    cap = {("s", ("b", 0)): 10, ("s", ("b", 1)): 10, (("b", 0), "t"): 10, (("b", 1), "t"): 10}
    flows = {("s", ("b", 0)): 10, (("b", 0), "t"): 10}
    a = find_bottlenecks(FlowNetwork(cap, flows), "s", "t", demand=15.0)
    assert not a.saturated and a.flow.initial_value == 10.0 and a.flow.value == 15.0
    assert a.flow.paths == ((("s", ("b", 1), "t"), 5.0),)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1), st.sampled_from([0.85, 0.9, 1.0]))
def test_bottleneck_operators_match_brute_force_over_cuts(seed: int, lam: float) -> None:
    rng = random.Random(seed)
    net, s, t = random_dag(rng)
    group = {v: f"op{rng.randrange(3)}" for v in net.nodes}
    group[s], group[t] = "source", "sink"
    a = find_bottlenecks(net, s, t, lambda_=lam, operator_of=group)
    assert a.saturated
    flows = a.flow.flows
    expected: set[Hashable] = set()
    others = [v for v in net.nodes if v not in (s, t)]
    for bits in itertools.product((0, 1), repeat=len(others)):
        x = {s} | {v for v, b in zip(others, bits) if b}
        sides: dict[Hashable, set[bool]] = {}
        for v in net.nodes:
            sides.setdefault(group[v], set()).add(v in x)
        if any(len(side) > 1 for side in sides.values()):
            continue
        c, f = net.cut_capacity(x), net.cut_flow(x, flows)
        assert math.isclose(f, a.flow.value, abs_tol=TOL)  # every cut carries |f|
        if f >= lam * c - 1e-9 * max(1.0, c):
            expected |= {group[v] for (u, v) in net.edges if u in x and v not in x}
    assert set(a.operators) == expected


# ---------------------------------------------------------------------- Algorithm 1
class Edge:
    """A simulated edge of true capacity ``true`` (tuples/s): M/M/1-like latency below it,
    a growing queue above it; the per-tuple time carries a relative noise."""

    def __init__(self, true: float, theta: float, noise: float, seed: int) -> None:
        self.true, self.theta, self.noise = true, theta, noise
        self.rng = random.Random(seed)

    def __call__(self, c: float) -> CapacityObservation:
        service = 1000.0 / self.true
        flow = min(c, self.true)
        latency = service / (1 - c / self.true) if c < self.true else 5 * self.theta
        measured = service * (1 + self.noise * self.rng.uniform(-1, 1))
        return CapacityObservation(flow=flow, latency_ms=latency, tuple_latency_ms=measured)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(true=st.floats(200.0, 50_000.0), start=st.sampled_from([0.3, 2.0, 3.0]),
       noise=st.floats(0.0, 0.02), seed=st.integers(0, 2**16))
def test_dynamic_step_converges_faster_than_small_and_steadier_than_large(
        true: float, start: float, noise: float, seed: int) -> None:
    theta = 1000.0  # well above the per-tuple time: a narrow band between << theta and theta
    steps = 60
    dyn = learn_capacity(start * true, Edge(true, theta, noise, seed), threshold_ms=theta,
                         steps=steps)
    small = learn_capacity(start * true, Edge(true, theta, noise, seed), threshold_ms=theta,
                           step=0.01 * true, steps=steps)
    large = learn_capacity(start * true, Edge(true, theta, noise, seed), threshold_ms=theta,
                           step=0.3 * true, steps=steps)
    for trace in (dyn, small, large):  # capacities stay positive and finite
        assert all(0 < c < math.inf for c in trace.capacities)
    k_dyn = dyn.steps_to_within(true, 0.05)
    k_small = small.steps_to_within(true, 0.05)
    assert k_dyn is not None
    assert k_small is None or k_dyn < k_small
    tail = dyn.capacities[k_dyn:]
    assert max(abs(c - true) for c in tail) <= 0.05 * true  # no oscillation once there
    # the large fixed step never settles: it keeps swinging around the true capacity
    assert large.steps_to_within(true, 0.05) is None
    assert large.reversals() >= 10
    assert max(abs(c - true) for c in large.capacities[-10:]) >= 0.1 * true


def test_capacity_step_rules() -> None:
    fast_full = CapacityObservation(flow=1000.0, latency_ms=10.0, tuple_latency_ms=0.5)
    assert capacity_step(1000.0, fast_full, threshold_ms=100.0).capacity == 2000.0
    slow = CapacityObservation(flow=800.0, latency_ms=300.0, tuple_latency_ms=1.25)
    step = capacity_step(1000.0, slow, threshold_ms=100.0)
    assert (step.capacity, step.direction) == (800.0, -1)
    idle = CapacityObservation(flow=100.0, latency_ms=10.0, tuple_latency_ms=0.5)
    assert capacity_step(1000.0, idle, threshold_ms=100.0).direction == 0  # f far from c
    band = CapacityObservation(flow=1000.0, latency_ms=70.0, tuple_latency_ms=0.5)
    assert capacity_step(1000.0, band, threshold_ms=100.0).direction == 0  # not << theta
    # Eq. 17's derivative term bounds the step of a slow edge: c = 100/s moves by <= 10
    slow_edge = CapacityObservation(flow=100.0, latency_ms=1.0, tuple_latency_ms=1.0)
    assert capacity_step(100.0, slow_edge, threshold_ms=100.0).capacity == 110.0
    with pytest.raises(InvalidArgumentError, match="tuple_latency_ms"):
        capacity_step(1000.0, CapacityObservation(1000.0, 10.0), threshold_ms=100.0)
    assert capacity_step(1000.0, CapacityObservation(1000.0, 10.0), threshold_ms=100.0,
                         step=10.0).capacity == 1010.0


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize("caps, flows, error, match", [
    ({("a", "b"): -1}, None, InvalidArgumentError, ">= 0"),
    ({("a", "b"): math.nan}, None, InvalidArgumentError, "finite"),
    ({("a", "b"): math.inf}, None, InvalidArgumentError, "finite"),
    ({("a", "b"): True}, None, InvalidArgumentTypeError, "real number"),
    ({("a", "b"): "3"}, None, InvalidArgumentTypeError, "real number"),
    ({("a", "a"): 1}, None, InvalidArgumentError, "self-loop"),
    ({"ab": 1}, None, InvalidArgumentTypeError, "pairs"),
    ([(("a", "b"), 1)], None, InvalidArgumentTypeError, "mapping"),
    ({("a", "b"): 1}, {("a", "b"): 2}, InvalidArgumentError, "exceeds its capacity"),
    ({("a", "b"): 1}, {("b", "c"): 1}, InvalidArgumentError, "not in capacities"),
    ({("a", "b"): 1}, {("a", "b"): -0.5}, InvalidArgumentError, ">= 0"),
])
def test_bad_networks_are_refused(caps: Any, flows: Any, error: type[Exception],
                                  match: str) -> None:
    with pytest.raises(error, match=match) as info:
        FlowNetwork(caps, flows)
    assert isinstance(info.value, TrilinkError)


def test_bad_calls_are_refused() -> None:
    net = FlowNetwork({("s", "a"): 1, ("a", "t"): 1})
    with pytest.raises(InvalidArgumentError, match="not a node"):
        max_flow(net, "s", "nowhere")
    with pytest.raises(InvalidArgumentError, match="differ"):
        max_flow(net, "s", "s")
    with pytest.raises(InvalidArgumentTypeError, match="FlowNetwork"):
        max_flow({("s", "t"): 1}, "s", "t")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="finite"):
        max_flow(net, "s", "t", limit=math.nan)
    with pytest.raises(InvalidArgumentError, match="start"):
        max_flow(net, "s", "t", start="warm")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="not a feasible flow"):
        max_flow(net.with_flows({("s", "a"): 1}), "s", "t")
    with pytest.raises(InvalidArgumentError, match=r"\[0.85, 1\]"):
        find_bottlenecks(net, "s", "t", lambda_=0.5)
    with pytest.raises(InvalidArgumentError, match="one operator"):
        operator_min_cut(net, "s", "t", operator_of={"s": "x", "t": "x"})
    with pytest.raises(InvalidArgumentError, match="not in the network"):
        operator_min_cut(net, "s", "t", operator_of={"zz": "x"})
    with pytest.raises(InvalidArgumentError, match="cycle"):
        FlowNetwork({("a", "b"): 1, ("b", "a"): 1}).topological_order()
    assert not FlowNetwork({("a", "b"): 1, ("b", "a"): 1}).is_acyclic()
    with pytest.raises(InvalidArgumentError, match="dynamic"):
        learn_capacity(1.0, lambda c: CapacityObservation(c, 1.0, 1.0), threshold_ms=1.0,
                       step="fast")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="steps"):
        learn_capacity(1.0, lambda c: CapacityObservation(c, 1.0, 1.0), threshold_ms=1.0,
                       steps=0)
    with pytest.raises(InvalidArgumentError, match="> 0"):
        capacity_step(0.0, CapacityObservation(1.0, 1.0, 1.0), threshold_ms=1.0)
    with pytest.raises(InvalidArgumentError, match="finite"):
        capacity_step(1.0, CapacityObservation(math.inf, 1.0, 1.0), threshold_ms=1.0)
