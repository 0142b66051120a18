"""Bottleneck analysis: the operators to scale, FAR-Flink's Algorithm 2 with the
lambda-saturated cut test (Eq. 10).

The flow is first redistributed along augmenting paths toward the demand
(:func:`~trilink_spark.advice.network.max_flow`); when the demand stays unmet, the cuts that
keep every operator whole (:mod:`trilink_spark.advice.cuts`) and whose flow reaches
``lambda x`` their capacity name the operators to scale.

Examples
--------
>>> from trilink_spark.advice.network import FlowNetwork
>>> net = FlowNetwork({("src", ("map", 0)): 50, (("map", 0), "sink"): 10})
>>> find_bottlenecks(net, "src", "sink", demand=30.0).operators
('sink',)
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Literal

from .._internal.validation import check_real
from ..errors import InvalidArgumentError
from .cuts import OperatorCut, constrained_cut, operator_groups
from .network import FlowNetwork, FlowResult, OperatorMap, max_flow

__all__ = ["LAMBDA_RANGE", "BottleneckAnalysis", "find_bottlenecks"]

logger = logging.getLogger(__name__)

#: Lambda's range in the saturated-cut test (Eq. 10).
LAMBDA_RANGE = (0.85, 1.0)


# ----------------------------------------------------------------------------- Algorithm 2
@dataclass(frozen=True)
class BottleneckAnalysis:
    """What :func:`find_bottlenecks` concluded.

    Attributes
    ----------
    flow : FlowResult
        The flow after redistribution along augmenting paths toward the demand.
    demand : float or None
        The rate the source must push (current input plus backlog to drain), or ``None``
        for "as much as the network carries".
    unmet : float
        ``demand - flow.value`` (>= 0); with ``demand=None``, 0.
    saturated : bool
        The demand is not met and no augmenting path is left (or ``demand=None``): the
        network is at its maximum flow and the cuts below name its bottleneck.
    lambda_ : float
        The threshold of Eq. 10.
    cuts : tuple of OperatorCut
        Operator-respecting cuts with ``f >= lambda x c``, one per operator edge ``P -> O``
        where it exists (the cheapest cut with ``P`` on the source side and ``O`` on the sink
        side), fullest first; empty when not ``saturated``.
    operators : tuple
        The operators to scale, fullest cut first: each ``O`` with such a cut.
    """

    flow: FlowResult
    demand: float | None
    unmet: float
    saturated: bool
    lambda_: float
    cuts: tuple[OperatorCut, ...] = field(default=())
    operators: tuple[Hashable, ...] = field(default=())


def find_bottlenecks(net: FlowNetwork, source: Hashable, sink: Hashable, *,
                     lambda_: float = 0.85, demand: float | None = None,
                     operator_of: OperatorMap = None,
                     start: Literal["current", "zero"] = "current") -> BottleneckAnalysis:
    """The operators to scale: Algorithm 2 of FAR-Flink (Li et al., 2019).

    1. Redistribute: augment the current flow along shortest paths of the residual network
       until the source pushes ``demand`` or no path is left (Algorithm 2, lines 1-10).
    2. If the demand is still unmet (backlog keeps growing), take the cuts ``(X, Y)`` that
       keep every operator whole (Def. 4) with ``f(X, Y) >= lambda x c(X, Y)`` (Eq. 10) and
       name the first operator of each ``Y`` (lines 11-17).

    All cuts of one flow carry the same net flow ``|f|`` (Eq. 6 and conservation), so
    Eq. 10 reads ``c(X, Y) <= |f| / lambda``: the cuts within ``1 / lambda`` of the minimum.
    Instead of enumerating the exponentially many cuts, for every operator edge ``P -> O``
    the cheapest cut with ``P``'s instances on the source side and ``O``'s on the sink side
    is computed (one tied max flow each); ``O`` is named when that cut passes Eq. 10. That
    names exactly the operators that head some passing cut through one of their inputs.

    Parameters
    ----------
    net : FlowNetwork
        Capacities (learnt, :func:`learn_capacity`) and current flows (measured rates).
    source, sink : hashable
        Distinct nodes of different operators.
    lambda_ : float
        Eq. 10's threshold, ``0.85 <= lambda_ <= 1``.
    demand : float, optional
        Rate the source must push (tuples/s): current input rate plus the backlog to drain
        over the next interval (backlog counts as unmet flow). ``None``: find the bottleneck
        of the full network regardless of load.
    operator_of : mapping, callable or None
        Node -> operator, as in :func:`operator_min_cut`.
    start : {"current", "zero"}
        Redistribute from the network's current flows (Algorithm 2) or from zero, as in
        :func:`max_flow`.

    Returns
    -------
    BottleneckAnalysis

    Raises
    ------
    InvalidArgumentError
        ``lambda_`` outside [0.85, 1], a negative or non-finite demand, bad terminals or
        current flows (see :func:`max_flow`).

    Notes
    -----
    Cost O(|E_op| |V| |E'|^2) for |E_op| operator-level edges (one tied Edmonds-Karp each),
    plus one :func:`max_flow`.

    Examples
    --------
    >>> cap = {("src", ("parse", 0)): 100, (("parse", 0), ("count", 0)): 40,
    ...        (("parse", 0), ("count", 1)): 40, (("count", 0), "sink"): 100,
    ...        (("count", 1), "sink"): 100}
    >>> net = FlowNetwork(cap)
    >>> a = find_bottlenecks(net, "src", "sink", demand=120.0)
    >>> a.flow.value, a.unmet, a.operators
    (80.0, 40.0, ('count',))
    >>> find_bottlenecks(net, "src", "sink", demand=60.0).operators
    ()
    """
    lam = check_real(lambda_, "lambda_")
    if not LAMBDA_RANGE[0] <= lam <= LAMBDA_RANGE[1]:
        raise InvalidArgumentError(f"lambda_ must be within [0.85, 1] (Eq. 10), got {lam!r}")
    dem = None if demand is None else check_real(demand, "demand")
    op, groups = operator_groups(net, source, sink, operator_of)
    flow = max_flow(net, source, sink, start=start, limit=dem)
    tol = 1e-9 * max(1.0, dem or 0.0, flow.value)
    unmet = 0.0 if dem is None else max(0.0, dem - flow.value)
    saturated = flow.saturated and (dem is None or unmet > tol)
    if not saturated:
        logger.info("bottlenecks: demand %.6g met (flow %.6g); nothing to scale", dem or 0.0,
                    flow.value)
        return BottleneckAnalysis(flow=flow, demand=dem, unmet=unmet if unmet > tol else 0.0,
                                  saturated=False, lambda_=lam)
    pairs: dict[tuple[Hashable, Hashable], None] = {}
    for u, v in net.edges:
        pu, pv = op(u), op(v)
        if pu != pv and pu != op(sink) and pv != op(source):
            pairs.setdefault((pu, pv))
    best: dict[Hashable, OperatorCut] = {}
    found: dict[frozenset[Hashable], OperatorCut] = {}
    for pu, pv in pairs:
        cut = constrained_cut(net, source, sink, groups, op, flow.flows,
                               force_x=groups[pu], force_y=groups[pv])
        if not cut.saturated(lam):
            continue
        found.setdefault(cut.source_side, cut)
        if pv not in best or cut.ratio > best[pv].ratio:
            best[pv] = cut
    cuts = tuple(sorted(found.values(), key=lambda c: (-c.ratio, c.capacity)))
    names = tuple(sorted(best, key=lambda o: -best[o].ratio))
    logger.info("bottlenecks: flow %.6g of demand %s, %d cuts with f >= %.2f c, scale %r",
                flow.value, "unbounded" if dem is None else f"{dem:.6g}", len(cuts), lam,
                list(names))
    return BottleneckAnalysis(flow=flow, demand=dem, unmet=unmet, saturated=True,
                              lambda_=lam, cuts=cuts, operators=names)
