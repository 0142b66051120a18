"""Rescale convergence: the flow-network advisor, DS2 alone and a threshold autoscaler.

The convergence experiment of FAR-Flink (Li et al., 2019) and DS2 (Kalavri et al., OSDI
2018), in simulation (``trilink_spark.elastic.pipeline.SimulatedPipeline``: per-instance rates,
selectivities, backpressure that throttles the source to what the slowest operator
sustains, true rates measured over useful time with optional noise). Two topologies:

- WordCount-like: source -> flatmap (8 words per line) -> count -> sink;
- YSB-like: source -> parse/filter (a third are views) -> project -> join (campaign lookup)
  -> window count (one row per campaign and window) -> sink;

each with linear scaling (capacity = rate x p) and sublinear scaling (rate x p ** 0.85 for
every operator but the source).

Policies, deciding once per interval (a 10 s window measured at the current parallelism):

- **advisor**: the flow-network approach. Per operator, the capacity per instance is
  learnt from latency feedback (``learn_capacity``'s Algorithm 1 step, started from
  ``1000 / l``, Eq. 14); the instances form a flow network (capacities in source records/s,
  exchange nodes between operators); ``find_bottlenecks`` (Algorithm 2, lambda = 0.85)
  names the operators of the saturated cut, each is sized DS2-style for the target
  (``scaled_parallelism`` with the exponent ``fit_exponent`` learns from the parallelisms
  seen), and the network is re-solved with the planned parallelism until it carries the
  target (several cuts in one decision). It only acts on unmet flow (no scale-down).
- **DS2**: ``ds2_parallelism`` on the measured true rates, every interval.
- **threshold**: per operator, one instance more when utilisation > 0.8, one fewer below 0.3.

Experiments:

1. Load step: the job starts at the minimum parallelism for a base rate, then the target
   jumps to 2x, 4x and 8x. Reported: steps (reconfigurations) until the target is
   sustained, whether it stays sustained for 5 more intervals, and over- and
   under-provisioning (instances beyond / short of the minimum that sustains the target,
   summed over operators, as a share of that minimum) when it is first reached (or after
   30 intervals), and again 5 intervals later. Noise-free, and with 5 % noise on the
   measured rates (20 seeds: median and worst).
3. Capacity learning (Algorithm 1): steps until one edge's capacity stays within 5 % of
   the true one, with the dynamic step of Eq. 17 and with fixed steps of 1 % and 30 %.
2. Rising load: arrivals grow 2 % or 8 % per interval for 30 intervals (1.8x or 9.3x);
   what is not served waits at the source and is offered again (backlog counts as unmet
   flow, drained over one window). Reported: records served against the static initial
   configuration (beside FAR-Flink's +27.6 % throughput over stock Flink), the share of
   arrivals served, the lag left (seconds of input) and the mean instances used.

Run: ``python benches/advice/bench_convergence.py`` (writes
benches/results/convergence.json; ``--quick`` runs 5 noisy seeds).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import write_json  # noqa: E402

from trilink_spark.advice.ds2 import (  # noqa: E402
    TrueRate,
    ds2_parallelism,
    ds2_plan,
    fit_exponent,
    scaled_parallelism,
)
from trilink_spark.advice.analysis import find_bottlenecks  # noqa: E402
from trilink_spark.advice.capacity import (  # noqa: E402
    CapacityObservation,
    capacity_step,
    learn_capacity,
)
from trilink_spark.advice.network import FlowNetwork  # noqa: E402
from trilink_spark.elastic.pipeline import (  # noqa: E402
    PipelineWindow,
    SimulatedOperator,
    SimulatedPipeline,
)

Par = dict[Hashable, int]
THETA_MS = 1000.0  # latency bound of the capacity learner
SUBLINEAR = 0.85
STEPS = (2, 4, 8)
HORIZON = 30
STABLE = 5
RISES = (1.02, 1.08)  # arrivals per interval: x1.8 and x9.3 over 30 intervals


# ----------------------------------------------------------------------------- topologies
def wordcount(exponent: float) -> tuple[dict[Hashable, list[Hashable]],
                                       dict[Hashable, SimulatedOperator], float]:
    graph: dict[Hashable, list[Hashable]] = {
        "source": ["flatmap"], "flatmap": ["count"], "count": ["sink"], "sink": []}
    ops = {
        "source": SimulatedOperator(200_000.0),
        "flatmap": SimulatedOperator(25_000.0, selectivity=8.0, exponent=exponent),
        "count": SimulatedOperator(60_000.0, exponent=exponent),
        "sink": SimulatedOperator(150_000.0, selectivity=0.0, exponent=exponent),
    }
    return graph, ops, 20_000.0  # base rate: lines/s


def ysb(exponent: float) -> tuple[dict[Hashable, list[Hashable]],
                                 dict[Hashable, SimulatedOperator], float]:
    graph: dict[Hashable, list[Hashable]] = {
        "source": ["parse_filter"], "parse_filter": ["project"], "project": ["join"],
        "join": ["window_count"], "window_count": ["sink"], "sink": []}
    ops = {
        "source": SimulatedOperator(300_000.0),
        "parse_filter": SimulatedOperator(40_000.0, selectivity=1 / 3, exponent=exponent),
        "project": SimulatedOperator(120_000.0, exponent=exponent),
        "join": SimulatedOperator(12_000.0, exponent=exponent),
        "window_count": SimulatedOperator(30_000.0, selectivity=0.001, exponent=exponent),
        "sink": SimulatedOperator(2_000.0, selectivity=0.0, exponent=exponent),
    }
    return graph, ops, 50_000.0  # base rate: events/s


TOPOLOGIES: dict[str, Callable[[float], tuple[dict[Hashable, list[Hashable]],
                                              dict[Hashable, SimulatedOperator], float]]] = {
    "wordcount": wordcount, "ysb": ysb}


# ----------------------------------------------------------------------------- policies
class Policy:
    name = "policy"

    def decide(self, sim: SimulatedPipeline, window: PipelineWindow, par: Par,
               target: Mapping[Hashable, float]) -> Par:
        raise NotImplementedError


class Ds2(Policy):
    name = "DS2"

    def decide(self, sim: SimulatedPipeline, window: PipelineWindow, par: Par,
               target: Mapping[Hashable, float]) -> Par:
        rates = {n: w.true_rate for n, w in window.operators.items()}
        return dict(ds2_parallelism(sim.edges(), rates, target))


class Threshold(Policy):
    name = "threshold"

    def __init__(self, up: float = 0.8, down: float = 0.3) -> None:
        self.up, self.down = up, down

    def decide(self, sim: SimulatedPipeline, window: PipelineWindow, par: Par,
               target: Mapping[Hashable, float]) -> Par:
        out = dict(par)
        for n, w in window.operators.items():
            if w.utilisation > self.up:
                out[n] = par[n] + 1
            elif w.utilisation < self.down:
                out[n] = max(1, par[n] - 1)
        return out


class Advisor(Policy):
    """Capacity learning + flow network + lambda-saturated cuts + DS2-style sizing."""

    name = "advisor"

    def __init__(self, lambda_: float = 0.85) -> None:
        self.lambda_ = lambda_
        self.capacity: dict[Hashable, float] = {}   # learnt per-instance capacity
        self.at: dict[Hashable, int] = {}           # the parallelism it was learnt at
        self.seen: dict[Hashable, dict[int, float]] = {}  # parallelism -> per-instance rate

    def learn(self, window: PipelineWindow) -> None:
        for n, w in window.operators.items():
            self.seen.setdefault(n, {})[w.parallelism] = w.true_rate.processing
            per_instance_flow = w.input_rate / w.parallelism
            if self.at.get(n) != w.parallelism:  # new parallelism: Eq. 14 start
                self.capacity[n] = 1000.0 / w.tuple_latency_ms
                self.at[n] = w.parallelism
            obs = CapacityObservation(per_instance_flow, w.latency_ms, w.tuple_latency_ms)
            self.capacity[n] = capacity_step(self.capacity[n], obs,
                                             threshold_ms=THETA_MS).capacity

    def network(self, sim: SimulatedPipeline, par: Par, gains: Mapping[Hashable, float],
                exponents: Mapping[Hashable, float], demand: float) -> FlowNetwork:
        """Instances as nodes, capacities in source records/s; an exchange node in front of
        every operator (wide: the simulation has no network limit)."""
        cap: dict[tuple[Hashable, Hashable], float] = {}
        wide = 10.0 * demand + 1.0
        for n in sim.order:
            p0, c0 = self.at[n], self.capacity[n]
            total = c0 * p0 * (par[n] / p0) ** exponents[n] / max(gains[n], 1e-12)
            xn = ("exchange", n)
            ups = sim.upstream(n)
            if not ups:
                cap[("in", xn)] = wide
            for u in ups:
                for j in range(par[u]):
                    cap[((u, j), xn)] = wide
            for k in range(par[n]):
                cap[(xn, (n, k))] = total / par[n]
            if n not in {u for e in sim.edges() for u in e[:1]}:  # no downstream: the sink
                for k in range(par[n]):
                    cap[((n, k), "out")] = wide
        return FlowNetwork(cap)

    def decide(self, sim: SimulatedPipeline, window: PipelineWindow, par: Par,
               target: Mapping[Hashable, float]) -> Par:
        self.learn(window)
        if window.sustained:
            return dict(par)
        rates = {n: TrueRate(self.capacity[n], self.capacity[n] * w.true_rate.selectivity)
                 for n, w in window.operators.items()}
        gains = ds2_plan(sim.edges(), rates, {s: 1.0 for s in target}).target_input
        exponents = {n: fit_exponent(self.seen[n].items()) for n in sim.order}
        demand = math.fsum(target.values())
        plan = dict(par)
        for _ in range(len(sim.order) + 1):
            net = self.network(sim, plan, gains, exponents, demand)
            verdict = find_bottlenecks(net, "in", "out", lambda_=self.lambda_, demand=demand,
                                       start="zero")
            if not verdict.saturated:
                break
            grew = False
            for op in verdict.operators:
                if not isinstance(op, str) or op not in plan:
                    continue  # an exchange node: never the cut here
                # sized for the demand; an operator within 1/lambda of the cut that already
                # carries the demand keeps its parallelism
                size = scaled_parallelism(demand * gains[op], self.at[op], self.capacity[op],
                                          exponents[op])
                if size > plan[op]:
                    plan[op], grew = size, True
            if not grew:
                break
        return plan


POLICIES: dict[str, Callable[[], Policy]] = {"advisor": Advisor, "DS2": Ds2,
                                             "threshold": Threshold}


# ----------------------------------------------------------------------------- experiments
def provisioning(par: Par, minimal: Par) -> dict[str, Any]:
    need = sum(minimal.values())
    over = sum(max(0, par[n] - minimal[n]) for n in minimal)
    under = sum(max(0, minimal[n] - par[n]) for n in minimal)
    return {"instances": sum(par.values()), "minimal": need, "over": over, "under": under,
            "over_pct": round(100.0 * over / need, 1), "under_pct": round(100.0 * under / need, 1)}


def load_step(topology: str, exponent: float, factor: float, policy: str, noise: float,
              seed: int) -> dict[str, Any]:
    graph, ops, base = TOPOLOGIES[topology](exponent)
    sim = SimulatedPipeline(graph, ops, noise=noise, seed=seed)
    src = sim.sources[0]
    par: Par = sim.minimal_parallelism({src: base})
    target = {src: base * factor}
    minimal = sim.minimal_parallelism(target)
    pol = POLICIES[policy]()
    reached: int | None = None
    stable = True
    at_reach: Par = dict(par)
    served = 0.0
    for step in range(HORIZON + STABLE + 1):
        window = sim.run(par, target)
        served += window.throughput
        if reached is None and window.sustained:
            reached, at_reach = step, dict(par)
        elif reached is not None and step <= reached + STABLE and not window.sustained:
            stable = False
        if reached is not None and step >= reached + STABLE:
            break
        if reached is None and step >= HORIZON:
            break
        par = pol.decide(sim, window, par, target)
    out: dict[str, Any] = {"steps": reached, "stable": stable if reached is not None else None}
    out.update(provisioning(at_reach if reached is not None else par, minimal))
    out["end"] = provisioning(par, minimal)  # after the 5 intervals that test stability
    return out


def rising(topology: str, exponent: float, policy: str | None, noise: float,
           seed: int = 0, growth: float = 1.08, intervals: int = 30,
           window_s: float = 10.0) -> dict[str, float]:
    """Arrivals grow by ``growth`` per interval; what is not served waits at the source
    (lag) and is offered again, drained over one window: backlog counts as unmet flow."""
    graph, ops, base = TOPOLOGIES[topology](exponent)
    sim = SimulatedPipeline(graph, ops, noise=noise, seed=seed)
    src = sim.sources[0]
    par: Par = sim.minimal_parallelism({src: base})
    pol = POLICIES[policy]() if policy else None
    served = arrived = instances = backlog = max_lag = 0.0
    for k in range(intervals):
        arrival = base * growth ** k
        target = {src: arrival + backlog / window_s}
        window = sim.run(par, target, window_s)
        served += window.throughput * window_s
        arrived += arrival * window_s
        backlog = max(0.0, backlog + (arrival - window.throughput) * window_s)
        max_lag = max(max_lag, backlog / arrival)
        instances += sum(par.values())
        if pol is not None:
            par = pol.decide(sim, window, par, target)
    return {"served": served, "arrived": arrived, "mean_instances": instances / intervals,
            "final_lag_s": backlog / (base * growth ** (intervals - 1)), "max_lag_s": max_lag}


def capacity_learning(seeds: range) -> list[dict[str, Any]]:
    """Algorithm 1 on one edge of true capacity 10,000 tuples/s (M/M/1-like latency below
    it, a growing queue above it, 2 % noise on the per-tuple time), theta = 1 s, 60 windows:
    the dynamic step of Eq. 17 against fixed steps of 1 % and 30 % of the true capacity."""
    true, theta = 10_000.0, THETA_MS
    rows: list[dict[str, Any]] = []
    for start in (0.3, 3.0):
        for label, step in (("dynamic (Eq. 17)", "dynamic"), ("fixed 1 %", 0.01 * true),
                            ("fixed 30 %", 0.3 * true)):
            reach: list[int | None] = []
            swings: list[int] = []
            spread: list[float] = []
            for seed in seeds:
                rng = random.Random(seed)

                def observe(c: float, rng: random.Random = rng) -> CapacityObservation:
                    service = 1000.0 / true
                    latency = service / (1 - c / true) if c < true else 5 * theta
                    return CapacityObservation(min(c, true), latency,
                                               service * (1 + 0.02 * rng.uniform(-1, 1)))

                trace = learn_capacity(start * true, observe, threshold_ms=theta,
                                       step=step, steps=60)  # type: ignore[arg-type]
                reach.append(trace.steps_to_within(true, 0.05))
                swings.append(trace.reversals())
                spread.append(max(abs(c - true) for c in trace.capacities[-10:]) / true)
            done = [r for r in reach if r is not None]
            rows.append({"start": start, "step": label, "runs": len(reach),
                         "reached_5pct": len(done),
                         "steps_median": statistics.median(done) if done else None,
                         "reversals_median": statistics.median(swings),
                         "last10_max_error_pct": round(100 * max(spread), 1)})
            print(f"capacity start {start}x {label:17} within 5 %: {len(done)}/{len(reach)}, "
                  f"steps median {rows[-1]['steps_median']}, reversals median "
                  f"{rows[-1]['reversals_median']}, last-10 max error "
                  f"{rows[-1]['last10_max_error_pct']} %", flush=True)
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 noisy seeds instead of 20")
    args = parser.parse_args(argv)
    seeds = range(5 if args.quick else 20)
    started = time.perf_counter()
    cases: list[dict[str, Any]] = []
    for topology in TOPOLOGIES:
        for scaling, exponent in (("linear", 1.0), ("sublinear", SUBLINEAR)):
            for factor in STEPS:
                for policy in POLICIES:
                    exact = load_step(topology, exponent, factor, policy, 0.0, 0)
                    noisy = [load_step(topology, exponent, factor, policy, 0.05, s)
                             for s in seeds]
                    steps = [r["steps"] for r in noisy]
                    done = [s for s in steps if s is not None]
                    row = {
                        "topology": topology, "scaling": scaling, "factor": factor,
                        "policy": policy, "exact": exact,
                        "noisy": {
                            "runs": len(noisy), "reached": len(done),
                            "steps_median": statistics.median(done) if done else None,
                            "steps_max": max(done) if done else None,
                            "stable": sum(1 for r in noisy if r["stable"]),
                            "over_pct_median": statistics.median(r["over_pct"] for r in noisy),
                            "under_pct_median": statistics.median(
                                r["under_pct"] for r in noisy),
                            "end_under_runs": sum(1 for r in noisy if r["end"]["under"] > 0),
                            "end_over_pct_median": statistics.median(
                                r["end"]["over_pct"] for r in noisy),
                        }}
                    cases.append(row)
                    print(f"{topology:9} {scaling:9} x{factor} {policy:9} exact: steps "
                          f"{exact['steps']}, over {exact['over_pct']} %, under "
                          f"{exact['under_pct']} % | noisy: steps median "
                          f"{row['noisy']['steps_median']} max {row['noisy']['steps_max']} "
                          f"({len(done)}/{len(noisy)} reached, {row['noisy']['stable']} stable)",
                          flush=True)
    throughput: list[dict[str, Any]] = []
    for growth in RISES:
        for topology in TOPOLOGIES:
            for scaling, exponent in (("linear", 1.0), ("sublinear", SUBLINEAR)):
                static = rising(topology, exponent, None, 0.0, growth=growth)
                for policy in POLICIES:
                    r = rising(topology, exponent, policy, 0.05, growth=growth)
                    row = {"growth": growth, "topology": topology, "scaling": scaling,
                           "policy": policy,
                           "served_pct": round(100 * r["served"] / r["arrived"], 1),
                           "gain_vs_static_pct": round(
                               100 * (r["served"] / static["served"] - 1), 1),
                           "mean_instances": round(r["mean_instances"], 1),
                           "final_lag_s": round(r["final_lag_s"], 1),
                           "max_lag_s": round(r["max_lag_s"], 1),
                           "static_served_pct": round(
                               100 * static["served"] / static["arrived"], 1),
                           "static_instances": static["mean_instances"]}
                    throughput.append(row)
                    print(f"rising x{growth} {topology:9} {scaling:9} {policy:9} served "
                          f"{row['served_pct']} % of arrivals (static "
                          f"{row['static_served_pct']} %), gain {row['gain_vs_static_pct']} %,"
                          f" mean instances {row['mean_instances']} (static "
                          f"{row['static_instances']}), lag final {row['final_lag_s']} s max "
                          f"{row['max_lag_s']} s", flush=True)
    learning = capacity_learning(seeds)
    path = write_json("convergence", {
        "setup": {"theta_ms": THETA_MS, "lambda": 0.85, "sublinear_exponent": SUBLINEAR,
                  "factors": list(STEPS), "horizon": HORIZON, "stable_intervals": STABLE,
                  "noise": 0.05, "noisy_seeds": len(seeds), "rising_growth": list(RISES),
                  "rising_intervals": 30, "window_s": 10.0},
        "paper": {"ds2_steps": "1-3 (36 Flink runs)", "far_flink_throughput_gain_pct": 27.61},
        "load_step": cases,
        "rising_load": throughput,
        "capacity_learning": learning,
        "seconds": round(time.perf_counter() - started, 1),
    })
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
