"""A simulated dataflow to test rescale policies with: DS2's operators in a steady state.

:class:`SimulatedPipeline` is a steady-state model of a dataflow of :class:`SimulatedOperator`
s (per-instance rates, selectivities, linear or power-law scaling, backpressure that throttles
the sources to what the slowest operator sustains). Each simulated window reports what a
running job would: per operator the parallelism, rates, utilisation, latency and the *true*
rates measured over useful time (:class:`~trilink_spark.advice.ds2.TrueRate`, with optional
noise), which DS2 (:func:`~trilink_spark.advice.ds2.ds2_plan`) and the flow-network advisor
size from. The tests and the convergence benchmark run the rescale policies against it, as
:func:`~trilink_spark.elastic.simulate` runs CRAA against TA and KPA.

Examples
--------
>>> from trilink_spark.elastic.pipeline import SimulatedOperator, SimulatedPipeline
>>> sim = SimulatedPipeline({"src": ["map"], "map": []},
...                         {"src": SimulatedOperator(10_000.0),
...                          "map": SimulatedOperator(1_000.0)})
>>> sim.minimal_parallelism({"src": 4_000.0})
{'src': 1, 'map': 4}
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import numpy as np

from .._internal.validation import check_real, count
from ..advice.ds2 import (EXACT_INSTANCES, Graph, TrueRate, scaled_parallelism, topology,
                          total_rate)
from ..errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = ["SimulatedOperator", "OperatorWindow", "PipelineWindow", "SimulatedPipeline"]


@dataclass(frozen=True)
class SimulatedOperator:
    """A simulated operator: ``capacity(p) = rate * p ** exponent`` records/s.

    Attributes
    ----------
    rate : float
        Records/s one instance processes alone (> 0).
    selectivity : float
        Records out per record in (>= 0).
    exponent : float
        Scaling exponent in (0, 1]: 1 scales linearly, below 1 sublinearly (each added
        instance adds less: contention, skew, coordination).

    Examples
    --------
    >>> op = SimulatedOperator(rate=1000.0, exponent=0.8)
    >>> round(op.capacity(4), 1), op.min_parallelism(3000.0)
    (3031.4, 4)
    """

    rate: float
    selectivity: float = 1.0
    exponent: float = 1.0

    def __post_init__(self) -> None:
        check_real(self.rate, "rate", positive=True)
        check_real(self.selectivity, "selectivity")
        a = check_real(self.exponent, "exponent", positive=True)
        if a > 1:
            raise InvalidArgumentError(f"exponent must be in (0, 1], got {a!r}")

    def capacity(self, parallelism: int) -> float:
        """Records/s ``parallelism`` instances process together (``1 <= parallelism <=
        2**53``, else a typed error). Cost O(1)."""
        p = count(parallelism, "parallelism", plain=True)
        if p > EXACT_INSTANCES:
            raise InvalidArgumentError(
                f"parallelism must be <= 2**53, got an integer of {p.bit_length()} bits")
        return float(self.rate * float(p) ** self.exponent)

    def instance_rate(self, parallelism: int) -> float:
        """True processing rate of one instance among ``parallelism``. Cost O(1)."""
        return self.capacity(parallelism) / parallelism

    def min_parallelism(self, required: float) -> int:
        """The fewest instances that process ``required`` records/s. Cost O(1)."""
        return scaled_parallelism(required, 1, self.rate, self.exponent)


@dataclass(frozen=True)
class OperatorWindow:
    """What one operator showed over a simulated window.

    Attributes
    ----------
    parallelism : int
    input_rate, output_rate : float
        Records/s in and out, all instances together.
    capacity : float
        Records/s the instances could process (the simulation's truth).
    utilisation : float
        Busy fraction, ``input_rate / capacity``, in [0, 1].
    true_rate : TrueRate
        The per-instance true rates as measured (with the pipeline's noise).
    tuple_latency_ms : float
        Mean processing time of a tuple (ms), ``1000 / true_rate.processing``.
    latency_ms : float
        Mean time a tuple spends in the operator: ``tuple_latency_ms / (1 - utilisation)``
        (a single-server queue), or the window's length when it is saturated (the queue
        grows all window long).
    """

    parallelism: int
    input_rate: float
    output_rate: float
    capacity: float
    utilisation: float
    true_rate: TrueRate
    tuple_latency_ms: float
    latency_ms: float


@dataclass(frozen=True)
class PipelineWindow:
    """One simulated window of a :class:`SimulatedPipeline`.

    ``throttle`` is the fraction of the target source rates the pipeline sustained
    (backpressure slows every source alike); ``sustained`` says it is 1.
    """

    operators: dict[Hashable, OperatorWindow]
    target_rates: dict[Hashable, float]
    source_rates: dict[Hashable, float]
    throttle: float

    @property
    def sustained(self) -> bool:
        """Whether the target source rates were sustained."""
        return self.throttle >= 1.0 - 1e-9

    @property
    def throughput(self) -> float:
        """Records/s the sources emitted, all together."""
        return math.fsum(self.source_rates.values())


class SimulatedPipeline:
    """A steady-state model of a dataflow of :class:`SimulatedOperator` s.

    A source reads (processes) its target rate and emits ``selectivity`` times as many
    records; every other operator processes what its upstream emit (each downstream operator
    gets every record, as DS2's adjacency matrix). When an operator cannot keep up,
    backpressure throttles all sources by the same factor until none is over capacity.
    Measured true rates carry a multiplicative Gaussian noise of relative size ``noise``.

    Parameters
    ----------
    graph : Graph
        The dataflow, a DAG.
    operators : mapping operator -> SimulatedOperator
        One per operator of the graph, sources included.
    noise : float
        Relative standard deviation of the measured true rates (0: exact), in [0, 0.5].
    seed : int
        Seed of the noise.

    Raises
    ------
    InvalidArgumentError
        A cycle, an operator of the graph without a model (or one not in the graph), noise
        out of range.

    Notes
    -----
    :meth:`run` costs O(|V| + |E|).

    Examples
    --------
    >>> sim = SimulatedPipeline({"src": ["map"], "map": []},
    ...                         {"src": SimulatedOperator(10_000.0),
    ...                          "map": SimulatedOperator(1_000.0)})
    >>> w = sim.run({"src": 1, "map": 2}, {"src": 4_000.0})
    >>> w.throttle, w.operators["map"].utilisation, sim.minimal_parallelism({"src": 4_000.0})
    (0.5, 1.0, {'src': 1, 'map': 4})
    """

    def __init__(self, graph: Graph, operators: Mapping[Hashable, SimulatedOperator], *,
                 noise: float = 0.0, seed: int = 0) -> None:
        self._topo = topology(graph)
        if not isinstance(operators, Mapping):
            raise InvalidArgumentTypeError("operators must be a mapping operator -> "
                                           "SimulatedOperator")
        missing = [n for n in self._topo.order if n not in operators]
        extra = [n for n in operators if n not in self._topo.upstream]
        if missing or extra:
            raise InvalidArgumentError(
                f"operators must model exactly the graph's operators; missing {missing!r}, "
                f"not in the graph {extra!r}")
        for n, op in operators.items():
            if not isinstance(op, SimulatedOperator):
                raise InvalidArgumentTypeError(
                    f"operators[{n!r}] must be a SimulatedOperator, got {type(op).__name__}")
        self._ops = dict(operators)
        self._noise = check_real(noise, "noise")
        if self._noise > 0.5:
            raise InvalidArgumentError(f"noise must be in [0, 0.5], got {self._noise!r}")
        self._rng = np.random.default_rng(count(seed, "seed", 0, plain=True))

    @property
    def order(self) -> tuple[Hashable, ...]:
        """Operators in topological order."""
        return self._topo.order

    @property
    def sources(self) -> tuple[Hashable, ...]:
        """Operators without upstream."""
        return self._topo.sources

    @property
    def operators(self) -> dict[Hashable, SimulatedOperator]:
        """The operator models."""
        return dict(self._ops)

    def edges(self) -> list[tuple[Hashable, Hashable]]:
        """The dataflow's edges, ``(upstream, downstream)``."""
        return [(u, v) for u in self._topo.order for v in self._topo.downstream[u]]

    def upstream(self, op: Hashable) -> tuple[Hashable, ...]:
        """Operators feeding ``op``."""
        return self._topo.upstream[op]

    def _targets(self, source_rates: Mapping[Hashable, float]) -> dict[Hashable, float]:
        if not isinstance(source_rates, Mapping):
            raise InvalidArgumentTypeError("source_rates must be a mapping source -> rate")
        srcs = set(self._topo.sources)
        bad = [k for k in source_rates if k not in srcs]
        lack = [s for s in self._topo.sources if s not in source_rates]
        if bad or lack:
            raise InvalidArgumentError(
                f"source_rates must give every source a rate and name only sources; missing "
                f"{lack!r}, not sources {bad!r}")
        return {s: check_real(source_rates[s], f"source_rates[{s!r}]") for s in self._topo.sources}

    def required_input(self, source_rates: Mapping[Hashable, float]) -> dict[Hashable, float]:
        """Records/s each operator must process to sustain ``source_rates``. Cost O(V+E)."""
        targets = self._targets(source_rates)
        need: dict[Hashable, float] = {}
        for n in self._topo.order:
            if n in targets:
                need[n] = targets[n]
            else:
                need[n] = total_rate(need[u] * self._ops[u].selectivity
                                     for u in self._topo.upstream[n])
                if not math.isfinite(need[n]):
                    raise InvalidArgumentError(
                        f"operator {n!r} would need more than 1.8e308 records/s: the source "
                        "rates times the selectivities leave the float range")
        return need

    def minimal_parallelism(self, source_rates: Mapping[Hashable, float]
                            ) -> dict[Hashable, int]:
        """The fewest instances per operator that sustain ``source_rates``. Cost O(V+E)."""
        need = self.required_input(source_rates)
        return {n: self._ops[n].min_parallelism(need[n]) for n in self._topo.order}

    def run(self, parallelism: Mapping[Hashable, int], source_rates: Mapping[Hashable, float],
            window_s: float = 10.0) -> PipelineWindow:
        """Simulate one window at ``parallelism`` with the sources offered ``source_rates``.

        Returns
        -------
        PipelineWindow
            Cost O(|V| + |E|).

        Raises
        ------
        InvalidArgumentError, InvalidArgumentTypeError
            A parallelism that is not an int in ``[1, 2**53]``, a window that is not > 0,
            source rates that are not finite and >= 0, or that times the selectivities leave
            the float range.
        """
        if not isinstance(parallelism, Mapping):
            raise InvalidArgumentTypeError("parallelism must be a mapping operator -> int")
        lack = [n for n in self._topo.order if n not in parallelism]
        if lack:
            raise InvalidArgumentError(f"parallelism lacks the operators {lack!r}")
        par = {n: count(parallelism[n], f"parallelism[{n!r}]", plain=True)
               for n in self._topo.order}
        window = check_real(window_s, "window_s", positive=True)
        targets = self._targets(source_rates)
        need = self.required_input(targets)
        cap = {n: self._ops[n].capacity(par[n]) for n in self._topo.order}
        throttle = min([1.0] + [cap[n] / need[n] for n in self._topo.order if need[n] > 0])
        ops: dict[Hashable, OperatorWindow] = {}
        for n in self._topo.order:
            model = self._ops[n]
            inp = need[n] * throttle
            util = min(1.0, inp / cap[n])
            per = model.instance_rate(par[n])
            if self._noise > 0:
                per *= float(max(0.05, 1.0 + self._noise * self._rng.standard_normal()))
            true = TrueRate(per, per * model.selectivity)
            service = 1000.0 / per
            latency = window * 1000.0 if util >= 1.0 - 1e-9 else service / (1.0 - util)
            ops[n] = OperatorWindow(par[n], inp, inp * model.selectivity, cap[n], util, true,
                                    service, latency)
        return PipelineWindow(ops, dict(targets),
                              {s: targets[s] * throttle for s in targets}, throttle)
