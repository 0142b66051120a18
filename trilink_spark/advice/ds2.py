"""DS2 parallelism from true rates.

DS2 ("Three steps is all you need: fast, accurate, automatic scaling decisions for
distributed streaming dataflows", Vasiliki Kalavri, John Liagouris, Moritz Hoffmann,
Desislava Dimitrova, Matthew Forshaw, Timothy Roscoe, OSDI 2018) sizes every operator in
one pass from its **true rates**, measured over *useful* time only (time spent processing,
not waiting for input or blocked on output), so that backpressure does not hide what an
operator could do:

- true processing rate ``lambda_p = records processed / useful time`` (per instance);
- true output rate ``lambda_o = records emitted / useful time`` (per instance).

Over the dataflow in topological order, with ``A`` the adjacency matrix:

- a source's target output rate is the rate it must sustain, ``o_s[lambda_o]* = target``;
- an operator's target input rate is what its upstream emit at their targets (DS2 Eq. 8),
  ``o_i[lambda_p]* = sum_j A[j, i] * o_j[lambda_o]*``, and it emits
  ``o_i[lambda_o]* = o_i[lambda_p]* * lambda_o(i) / lambda_p(i)``;
- its optimal parallelism is (DS2 Eq. 7) ``pi_i = ceil(o_i[lambda_p]* / lambda_p(i))``.

With linear scaling, one decision reaches the target; with sublinear scaling the per-instance
rate drops as instances are added and the decision is repeated on fresh measurements (the
paper reports 1-3 steps). :func:`fit_exponent` and :func:`scaled_parallelism` extend the
sizing with a scaling exponent learnt from two or more parallelisms.

:class:`~trilink_spark.elastic.pipeline.SimulatedPipeline` is a steady-state model of such a
dataflow (per-instance rates, selectivities, linear or power-law scaling, backpressure that
throttles the sources to what the slowest operator sustains) for tests and benchmarks.

Examples
--------
>>> from trilink_spark.advice.ds2 import TrueRate, ds2_parallelism
>>> graph = {"source": ["flatmap"], "flatmap": ["count"], "count": []}
>>> rates = {"flatmap": TrueRate(processing=1000.0, output=8000.0), "count": 5000.0}
>>> ds2_parallelism(graph, rates, {"source": 3000.0})
{'flatmap': 3, 'count': 5}
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np

from .._internal.validation import check_real, count
from ..errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = [
    "Graph",
    "TrueRate",
    "Ds2Plan",
    "ds2_plan",
    "ds2_parallelism",
    "fit_exponent",
    "scaled_parallelism",
]

logger = logging.getLogger(__name__)

#: A dataflow: ``{operator: downstream operators}`` or an iterable of ``(upstream,
#: downstream)`` edges.
Graph: TypeAlias = Mapping[Hashable, Iterable[Hashable]] | Iterable[tuple[Hashable, Hashable]]

_CEIL_SLACK = 1e-9  # 3.0000000001 instances' worth of work is 3 instances
#: Largest count of instances sized exactly: below it, ``q`` and ``q - 1`` differ as floats.
EXACT_INSTANCES = 2 ** 53


def _ceil(x: float) -> int:
    return math.ceil(x * (1.0 - _CEIL_SLACK))


def total_rate(values: Iterable[float]) -> float:
    """The sum of rates, exact (``math.fsum``), ``inf`` when it leaves the float range.

    Examples
    --------
    >>> total_rate([1e308, 1e308])
    inf
    """
    try:
        return math.fsum(values)
    except OverflowError:
        return math.inf


def _instances(need: float, rate: float, what: str, hi: int | None) -> int:
    """``ceil(need / rate)`` (Eq. 7); beyond the float range, ``hi`` or a typed error."""
    ratio = need / rate
    if math.isfinite(ratio):
        return _ceil(ratio)
    if hi is not None:
        return hi
    raise InvalidArgumentError(
        f"{what} needs {need:.3g} records/s at {rate:.3g} per instance: more instances than a "
        "float counts; pass max_parallelism=, or rates in other units")


@dataclass(frozen=True)
class Topology:
    """A dataflow checked and ordered: its operators in topological order, with the upstream
    and downstream operators of each (in the order their edges were given)."""

    order: tuple[Hashable, ...]
    upstream: dict[Hashable, tuple[Hashable, ...]]
    downstream: dict[Hashable, tuple[Hashable, ...]]

    @property
    def sources(self) -> tuple[Hashable, ...]:
        """Operators without upstream, in topological order."""
        return tuple(n for n in self.order if not self.upstream[n])


def topology(graph: Graph) -> Topology:
    """Check a dataflow and order it topologically (Kahn's algorithm, ties in the order the
    operators first appear).

    Parameters
    ----------
    graph : Graph
        ``{operator: downstream operators}`` or an iterable of ``(upstream, downstream)``
        edges of hashable operators; duplicate edges count once.

    Returns
    -------
    Topology

    Raises
    ------
    InvalidArgumentError
        A self-loop, a cycle, an empty graph.
    InvalidArgumentTypeError
        A string, values that are not iterables of operators, edges that are not pairs,
        unhashable operators.

    Notes
    -----
    Cost O(|V| + |E|).

    Examples
    --------
    >>> topology([("a", "b"), ("src", "a")]).order
    ('src', 'a', 'b')
    >>> topology({"src": ["a"], "a": []}).sources
    ('src',)
    """
    if isinstance(graph, (str, bytes)):
        raise InvalidArgumentTypeError("graph must be a mapping {operator: downstream} or an "
                                       "iterable of (upstream, downstream) edges, got a string")
    edges: list[tuple[Hashable, Hashable]] = []
    nodes: dict[Hashable, None] = {}
    try:
        if isinstance(graph, Mapping):
            for u, vs in graph.items():
                nodes.setdefault(u)
                if isinstance(vs, (str, bytes)) or not isinstance(vs, Iterable):
                    raise InvalidArgumentTypeError(
                        f"graph[{u!r}] must be an iterable of downstream operators, got "
                        f"{type(vs).__name__}")
                for v in vs:
                    edges.append((u, v))
        else:
            for e in graph:
                if not isinstance(e, tuple) or len(e) != 2:
                    raise InvalidArgumentTypeError(
                        f"graph edges must be (upstream, downstream) pairs, got {e!r}")
                edges.append(e)
        for u, v in edges:
            if u == v:
                raise InvalidArgumentError(f"graph has a self-loop on {u!r}; a directed "
                                           "acyclic graph is required")
            nodes.setdefault(u)
            nodes.setdefault(v)
    except TypeError as err:
        if isinstance(err, InvalidArgumentTypeError):
            raise
        raise InvalidArgumentTypeError(
            f"graph must be a mapping {{operator: downstream}} or an iterable of (upstream, "
            f"downstream) edges of hashable operators: {err}") from err
    up: dict[Hashable, list[Hashable]] = {n: [] for n in nodes}
    down: dict[Hashable, list[Hashable]] = {n: [] for n in nodes}
    for u, v in dict.fromkeys(edges):
        down[u].append(v)
        up[v].append(u)
    indeg = {n: len(up[n]) for n in nodes}
    ready = deque(n for n in nodes if indeg[n] == 0)
    order: list[Hashable] = []
    while ready:
        n = ready.popleft()
        order.append(n)
        for v in down[n]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    if len(order) != len(nodes):
        cyclic = [n for n in nodes if indeg[n] > 0]
        raise InvalidArgumentError(f"graph has a cycle through {cyclic[:5]!r}; a directed "
                                   "acyclic graph is required")
    if not order:
        raise InvalidArgumentError("graph is empty; at least one operator is required")
    return Topology(tuple(order), {n: tuple(up[n]) for n in nodes},
                     {n: tuple(down[n]) for n in nodes})


# ----------------------------------------------------------------------------- DS2
@dataclass(frozen=True)
class TrueRate:
    """An operator's true rates per instance, records per second of useful time.

    Attributes
    ----------
    processing : float
        ``lambda_p``: records processed per useful second, per instance (> 0).
    output : float or None
        ``lambda_o``: records emitted per useful second, per instance (>= 0); ``None`` means
        one record out per record in.

    Examples
    --------
    >>> r = TrueRate.from_counts(records_in=50_000, useful_seconds=10.0, records_out=5_000)
    >>> r.processing, r.output, r.selectivity
    (5000.0, 500.0, 0.1)
    """

    processing: float
    output: float | None = None

    def __post_init__(self) -> None:
        check_real(self.processing, "TrueRate.processing", positive=True)
        if self.output is not None:
            check_real(self.output, "TrueRate.output")

    @property
    def selectivity(self) -> float:
        """``lambda_o / lambda_p``: records out per record in."""
        return 1.0 if self.output is None else self.output / self.processing

    @classmethod
    def from_counts(cls, records_in: float, useful_seconds: float,
                    records_out: float | None = None) -> TrueRate:
        """True rates from counts over a window: records in (and out) divided by useful time.

        ``useful_seconds`` is the time the instances spent processing, summed over the
        instances (so the rate is the per-instance mean, weighted by work). Cost O(1).
        """
        n_in = check_real(records_in, "records_in", positive=True)
        useful = check_real(useful_seconds, "useful_seconds", positive=True)
        out = None if records_out is None else check_real(records_out, "records_out") / useful
        return cls(processing=n_in / useful, output=out)


@dataclass(frozen=True)
class Ds2Plan:
    """DS2's decision: per operator, the parallelism and the target rates it was sized for
    (records/s, all instances together), with the topological order used."""

    parallelism: dict[Hashable, int]
    target_input: dict[Hashable, float]
    target_output: dict[Hashable, float]
    order: tuple[Hashable, ...]


def _as_rate(value: object, what: str) -> TrueRate:
    if isinstance(value, TrueRate):
        return value
    return TrueRate(processing=check_real(value, what, positive=True))


def ds2_plan(graph: Graph, true_rates: Mapping[Hashable, TrueRate | float],
             source_rates: Mapping[Hashable, float], *, min_parallelism: int = 1,
             max_parallelism: int | None = None) -> Ds2Plan:
    """DS2's one-pass sizing (DS2 Eq. 7-8), with the target rates behind it.

    Parameters
    ----------
    graph : Graph
        The dataflow, a DAG. Operators without upstream are sources.
    true_rates : mapping operator -> TrueRate or float
        Per-instance true rates of every non-source operator (a float is ``lambda_p`` with
        one record out per record in). A source listed here is sized too.
    source_rates : mapping source -> float
        Target output rate of every source (records/s), >= 0.
    min_parallelism, max_parallelism : int
        Bounds of every decision (``max_parallelism`` unbounded by default).

    Returns
    -------
    Ds2Plan

    Raises
    ------
    InvalidArgumentError
        A cycle, a source without a target rate, a target rate for an operator that is not a
        source, an operator without true rates, unknown operators, bad bounds; without
        ``max_parallelism``, an operator whose target rate over its true rate leaves the float
        range (with it, that operator gets ``max_parallelism``).
    InvalidArgumentTypeError
        Values that are not numbers or :class:`TrueRate`.

    Notes
    -----
    Cost O(|V| + |E|).

    Examples
    --------
    >>> plan = ds2_plan([("src", "parse"), ("parse", "join")],
    ...                 {"parse": TrueRate(2000.0, 600.0), "join": 250.0}, {"src": 5000.0})
    >>> plan.parallelism, plan.target_input["join"]
    ({'parse': 3, 'join': 6}, 1500.0)
    """
    topo = topology(graph)
    lo = count(min_parallelism, "min_parallelism", plain=True)
    hi = (None if max_parallelism is None
          else count(max_parallelism, "max_parallelism", lo, plain=True))
    if not isinstance(true_rates, Mapping) or not isinstance(source_rates, Mapping):
        raise InvalidArgumentTypeError("true_rates and source_rates must be mappings keyed by "
                                       "operator")
    known = set(topo.order)
    for what, table in (("true_rates", true_rates), ("source_rates", source_rates)):
        unknown = [k for k in table if k not in known]
        if unknown:
            raise InvalidArgumentError(f"{what} names operators not in the graph: "
                                       f"{unknown[:5]!r}; allowed: {list(topo.order)!r}")
    sources = set(topo.sources)
    not_sources = [k for k in source_rates if k not in sources]
    if not_sources:
        raise InvalidArgumentError(
            f"source_rates names operators that have upstream operators: {not_sources!r}; "
            f"allowed: the sources {sorted(map(repr, sources))}")
    missing = [s for s in topo.order if s in sources and s not in source_rates]
    if missing:
        raise InvalidArgumentError(f"source_rates lacks the sources {missing!r}; every "
                                   "source needs a target rate")
    rates = {k: _as_rate(v, f"true_rates[{k!r}]") for k, v in true_rates.items()}
    lacking = [n for n in topo.order if n not in sources and n not in rates]
    if lacking:
        raise InvalidArgumentError(f"true_rates lacks the operators {lacking!r}; every "
                                   "non-source operator needs its true rates")
    target_in: dict[Hashable, float] = {}
    target_out: dict[Hashable, float] = {}
    parallelism: dict[Hashable, int] = {}
    for n in topo.order:
        rate = rates.get(n)
        if n in sources:
            out = check_real(source_rates[n], f"source_rates[{n!r}]")
            sel = rate.selectivity if rate is not None else 1.0
            target_out[n] = out
            target_in[n] = out / sel if sel > 0 else out
        else:
            rate = rates[n]  # present: checked above
            target_in[n] = total_rate(target_out[u] for u in topo.upstream[n])  # Eq. 8
            target_out[n] = target_in[n] * rate.selectivity
        if rate is not None:
            p = max(lo, _instances(target_in[n], rate.processing, f"operator {n!r}", hi))  # Eq. 7
            parallelism[n] = p if hi is None else min(hi, p)
    logger.debug("ds2: %r", parallelism)
    return Ds2Plan(parallelism, target_in, target_out, topo.order)


def ds2_parallelism(graph: Graph, true_rates: Mapping[Hashable, TrueRate | float],
                    source_rates: Mapping[Hashable, float], *, min_parallelism: int = 1,
                    max_parallelism: int | None = None) -> dict[Hashable, int]:
    """DS2's optimal parallelism per operator (DS2 Eq. 7-8), in topological order.

    ``pi_i = ceil(sum_j A[j, i] * o_j[lambda_o]* / lambda_p(i))``: the target input rate
    (the true output rates of its upstream operators scaled to the target source rates)
    over the true processing rate of one instance. See :func:`ds2_plan` for the parameters
    and errors, and for the target rates.

    Returns
    -------
    dict operator -> int
        Every non-source operator, and the sources listed in ``true_rates``.

    Notes
    -----
    Cost O(|V| + |E|).

    Examples
    --------
    >>> ds2_parallelism({"s": ["a", "b"], "a": [], "b": []}, {"a": 100.0, "b": 300.0},
    ...                 {"s": 1000.0})
    {'a': 10, 'b': 4}
    """
    return ds2_plan(graph, true_rates, source_rates, min_parallelism=min_parallelism,
                    max_parallelism=max_parallelism).parallelism


def fit_exponent(samples: Iterable[tuple[int, float]]) -> float:
    """The scaling exponent ``a`` of ``capacity(p) ~ p ** a`` from per-instance true rates.

    Per-instance rates measured at several parallelisms follow ``r(p) = r(1) * p ** (a - 1)``
    for power-law scaling: the exponent is one plus the least-squares slope of ``log r``
    against ``log p``, clipped to ``[0.1, 1]`` (1: linear, below 1: sublinear). Fewer than
    two distinct parallelisms give 1.0 (DS2's linear assumption).

    Parameters
    ----------
    samples : iterable of (int, float)
        ``(parallelism, per-instance true processing rate)`` pairs.

    Returns
    -------
    float

    Notes
    -----
    Cost O(n).

    Examples
    --------
    >>> round(fit_exponent([(1, 1000.0), (4, 1000.0 * 4 ** -0.2)]), 6)
    0.8
    >>> fit_exponent([(3, 500.0)])
    1.0
    """
    ps: list[float] = []
    rs: list[float] = []
    for p, r in samples:
        ps.append(float(count(p, "parallelism", plain=True)))
        rs.append(check_real(r, "rate", positive=True))
    if len(set(ps)) < 2:
        return 1.0
    x, y = np.log(np.asarray(ps)), np.log(np.asarray(rs))
    slope = float(np.polyfit(x, y, 1)[0])
    return float(min(1.0, max(0.1, 1.0 + slope)))


def scaled_parallelism(required: float, parallelism: int, instance_rate: float,
                       exponent: float = 1.0, *, max_parallelism: int | None = None) -> int:
    """The fewest instances whose capacity reaches ``required``, DS2-style with an exponent.

    At ``parallelism`` instances of ``instance_rate`` each, the capacity at ``q`` instances
    is taken as ``instance_rate * parallelism * (q / parallelism) ** exponent``; with
    ``exponent=1`` this is DS2 Eq. 7, ``ceil(required / instance_rate)``.

    Parameters
    ----------
    required : float
        Target input rate of the operator, records/s, >= 0.
    parallelism : int
        Instances the rate was measured at, >= 1.
    instance_rate : float
        True processing rate per instance at that parallelism, > 0.
    exponent : float
        Scaling exponent in (0, 1] (:func:`fit_exponent`).
    max_parallelism : int, optional
        Cap of the answer.

    Returns
    -------
    int
        At least 1.

    Raises
    ------
    InvalidArgumentError
        Bad arguments; without ``max_parallelism``, a count of instances beyond the float
        range.

    Notes
    -----
    Cost O(1): the closed form, refined by a step or two below ``2**53`` instances (above, the
    closed form is the answer).

    Examples
    --------
    >>> scaled_parallelism(4000.0, 2, 1000.0), scaled_parallelism(4000.0, 2, 1000.0, 0.8)
    (4, 5)
    """
    need = check_real(required, "required")
    p0 = count(parallelism, "parallelism", plain=True)
    rate = check_real(instance_rate, "instance_rate", positive=True)
    a = check_real(exponent, "exponent", positive=True)
    if a > 1:
        raise InvalidArgumentError(f"exponent must be in (0, 1], got {a!r}")
    hi = None if max_parallelism is None else count(max_parallelism, "max_parallelism", plain=True)
    cap0 = rate * p0
    if need <= 0:
        q = 1
    else:
        try:
            estimate = p0 * (need / cap0) ** (1.0 / a)
        except OverflowError:
            estimate = math.inf
        if math.isfinite(estimate):
            q = max(1, _ceil(estimate))
            if q < EXACT_INSTANCES:  # refine: a step or two off; beyond 2**53 q - 1 == q in floats
                for _ in range(64):
                    if q > 1 and cap0 * ((q - 1) / p0) ** a >= need * (1 - _CEIL_SLACK):
                        q -= 1
                    elif cap0 * (q / p0) ** a < need * (1 - _CEIL_SLACK):
                        q += 1
                    else:
                        break
        elif hi is not None:
            q = hi
        else:
            raise InvalidArgumentError(
                f"{need:.3g} records/s at {rate:.3g} per instance (exponent {a:g}) needs more "
                "instances than a float counts; pass max_parallelism=, or rates in other units")
    if hi is not None:
        q = min(q, hi)
    return q
