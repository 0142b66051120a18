"""Cuts that never split an operator: the minimum cut among those that keep every operator's
instances on one side (FAR-Flink's Def. 4, Eq. 5-6).

:func:`~trilink_spark.advice.network.max_flow` answers the plain maximum flow, whose
``min_cut`` may split an operator; :func:`operator_min_cut` is the minimum over the cuts that
keep every operator's instances on one side, whose capacity is at least the maximum-flow value
and may exceed it. Both questions are answered on purpose: the first is a property of the
network whatever the operators, the second names operators to scale.

Examples
--------
>>> from trilink_spark.advice.network import FlowNetwork
>>> from trilink_spark.advice.cuts import operator_min_cut
>>> net = FlowNetwork({("s", ("map", 0)): 5, ("s", ("map", 1)): 5,
...                    (("map", 0), "t"): 2, (("map", 1), "t"): 4})
>>> operator_min_cut(net, "s", "t").heads
('t',)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from .network import (Edge, FlowNetwork, OperatorMap, ResidualNetwork, check_terminals,
                      max_flow, operator_of)

__all__ = ["OperatorCut", "operator_min_cut"]


def _operator_fn(nodes: Sequence[Hashable], mapping: OperatorMap) -> Callable[[Hashable],
                                                                               Hashable]:
    if mapping is None:
        return operator_of
    if isinstance(mapping, Mapping):
        known = set(nodes)
        unknown = [n for n in mapping if n not in known]
        if unknown:
            raise InvalidArgumentError(
                f"operator_of names nodes that are not in the network: {unknown[:5]!r}; "
                "allowed: the network's nodes")
        table = dict(mapping)
        return lambda n: table.get(n, n)
    if callable(mapping):
        user = mapping

        def checked(n: Hashable) -> Hashable:
            op = user(n)
            try:
                hash(op)
            except TypeError:
                raise InvalidArgumentTypeError(
                    f"operator_of({n!r}) returned {op!r:.60}, which is not hashable; an "
                    "operator name must be hashable (a str, an int, a tuple)") from None
            return op

        return checked
    raise InvalidArgumentTypeError(
        "operator_of must be a mapping node -> operator, a function, or None, got "
        f"{type(mapping).__name__}")


# ----------------------------------------------------------------------------- operator cuts
@dataclass(frozen=True)
class OperatorCut:
    """A cut ``(X, Y)`` that keeps every operator's instances on one side (Def. 4).

    Attributes
    ----------
    source_side, sink_side : frozenset
        ``X`` (holds the source) and ``Y`` (holds the sink).
    capacity : float
        ``c(X, Y)`` (Eq. 5).
    flow : float
        ``f(X, Y)`` (Eq. 6) under the flows it was computed with.
    edges : tuple of (u, v)
        The edges from ``X`` to ``Y``.
    heads : tuple
        The operators of ``Y`` entered by an edge of the cut, "the first operators of Y" that
        Algorithm 2 scales, in node order.
    """

    source_side: frozenset[Hashable]
    sink_side: frozenset[Hashable]
    capacity: float
    flow: float
    edges: tuple[Edge, ...]
    heads: tuple[Hashable, ...]

    @property
    def min_cut(self) -> tuple[frozenset[Hashable], frozenset[Hashable]]:
        """``(X, Y)``, as :attr:`FlowResult.min_cut`."""
        return (self.source_side, self.sink_side)

    @property
    def ratio(self) -> float:
        """``f(X, Y) / c(X, Y)`` (1.0 for a zero-capacity cut: it is full)."""
        return self.flow / self.capacity if self.capacity > 0 else 1.0

    def saturated(self, lambda_: float) -> bool:
        """Eq. 10: ``f(X, Y) >= lambda x c(X, Y)`` (with a 1e-9 relative tolerance)."""
        return self.flow >= lambda_ * self.capacity - 1e-9 * max(1.0, self.capacity)


def _groups(nodes: Sequence[Hashable], op: Callable[[Hashable], Hashable]
            ) -> dict[Hashable, list[Hashable]]:
    groups: dict[Hashable, list[Hashable]] = {}
    for n in nodes:
        groups.setdefault(op(n), []).append(n)
    return groups


def constrained_cut(net: FlowNetwork, source: Hashable, sink: Hashable,
                    groups: Mapping[Hashable, Sequence[Hashable]],
                    op: Callable[[Hashable], Hashable],
                    flows: Mapping[Edge, float] | None,
                    force_x: Sequence[Hashable] = (),
                    force_y: Sequence[Hashable] = ()) -> OperatorCut:
    """Minimum cut that keeps groups whole, with ``force_x`` on the source side and
    ``force_y`` on the sink side: max flow where ties carry a capacity above any cut.

    The building block of :func:`operator_min_cut` and of
    :func:`~trilink_spark.advice.analysis.find_bottlenecks` (one call per operator edge).

    Parameters
    ----------
    net : FlowNetwork
    source, sink : hashable
        Terminals already checked (:func:`operator_groups`).
    groups : mapping operator -> nodes
        The instances kept on one side, as :func:`operator_groups` returns them.
    op : callable
        Node -> operator, for the cut's ``heads``.
    flows : mapping, optional
        Checked flows for the cut's ``flow`` (Eq. 6); ``None``: the network's own.
    force_x, force_y : sequence of nodes
        Nodes tied to the source side and to the sink side.

    Returns
    -------
    OperatorCut

    Notes
    -----
    Cost O(|V| |E'|^2) with |E'| = |E| + 2|V| (Edmonds-Karp on the tied network).
    """
    cap = net.capacities
    big = math.fsum(cap.values()) + 1.0
    extra: dict[Edge, float] = {}

    def tie(a: Hashable, b: Hashable) -> None:
        extra[(a, b)] = extra.get((a, b), 0.0) + big

    for members in groups.values():
        for m in members[1:]:
            tie(members[0], m)
            tie(m, members[0])
    for n in force_x:
        if n != source:
            tie(source, n)
    for n in force_y:
        if n != sink:
            tie(n, sink)
    merged = dict(cap)
    for e, c in extra.items():
        merged[e] = merged.get(e, 0.0) + c
    res = ResidualNetwork(net.nodes, merged, None)
    s = res.index[source]
    res.augment(s, res.index[sink], None)
    x = res.reachable(s)
    y = frozenset(n for n in net.nodes if n not in x)
    edges = tuple(e for e in net.edges if e[0] in x and e[1] in y)
    heads: dict[Hashable, None] = {}
    for n in net.nodes:
        if n in y and any(u in x for u in net.predecessors(n)):
            heads.setdefault(op(n))
    flow = net.cut_flow(x, flows)
    return OperatorCut(source_side=x, sink_side=y, capacity=net.cut_capacity(x), flow=flow,
                       edges=edges, heads=tuple(heads))


def operator_groups(net: FlowNetwork, source: Hashable, sink: Hashable,
                    operators: OperatorMap
                    ) -> tuple[Callable[[Hashable], Hashable], dict[Hashable, list[Hashable]]]:
    """Check the terminals and group the network's nodes by operator.

    Parameters
    ----------
    net : FlowNetwork
    source, sink : hashable
        Distinct nodes of different operators.
    operators : mapping, callable or None
        Node -> operator (see :data:`~trilink_spark.advice.network.OperatorMap`).

    Returns
    -------
    (callable, dict)
        The node -> operator function and ``{operator: [nodes in node order]}``.

    Raises
    ------
    InvalidArgumentError
        Unknown or equal terminals, terminals of one operator, a mapping naming nodes the
        network lacks.
    InvalidArgumentTypeError
        ``net`` is not a :class:`FlowNetwork`, an ``operators`` of another kind.

    Notes
    -----
    Cost O(|V|) calls of the operator function.
    """
    check_terminals(net, source, sink)
    op = _operator_fn(net.nodes, operators)
    if op(source) == op(sink):
        raise InvalidArgumentError(
            f"source {source!r} and sink {sink!r} are instances of one operator "
            f"{op(source)!r}; no cut can keep that operator whole; allowed: terminals of "
            "different operators")
    return op, _groups(net.nodes, op)


def operator_min_cut(net: FlowNetwork, source: Hashable, sink: Hashable,
                     operator_of: OperatorMap = None,
                     flows: Mapping[Edge, float] | None = None) -> OperatorCut:
    """The minimum s-t cut among those that never split one operator's instances (Eq. 5-6).

    The cut of Def. 4 puts every instance of an operator on the same side. It is found as a
    minimum cut of the network where the instances of each operator are tied together by
    edges, both ways, whose capacity (the sum of all capacities plus one) exceeds every cut
    that keeps operators whole, so the minimum never crosses a tie. Ties are edges of finite
    capacity: no infinite values enter the arithmetic.

    Parameters
    ----------
    net : FlowNetwork
    source, sink : hashable
        Distinct nodes of different operators.
    operator_of : mapping, callable or None
        Node -> operator (see :data:`OperatorMap`); ``None`` reads ``(name, index)`` nodes as
        instances of ``name``.
    flows : mapping, optional
        Flows for the cut's ``flow`` (Eq. 6); the network's own flows by default.

    Returns
    -------
    OperatorCut
        Its ``capacity`` is the minimum; among minima, the one with the smallest source side.

    Raises
    ------
    InvalidArgumentError
        Unknown or equal terminals, terminals of the same operator, an ``operator_of`` mapping
        naming nodes the network lacks, ``flows`` that :class:`FlowNetwork` would refuse.
    InvalidArgumentTypeError
        ``flows`` that is not a mapping of pairs to numbers, an ``operator_of`` that returns
        an unhashable value.

    Notes
    -----
    Cost O(|V| |E'|^2) with |E'| = |E| + 2|V| (Edmonds-Karp on the tied network).

    Examples
    --------
    >>> net = FlowNetwork({("s", ("a", 0)): 1, ("s", ("a", 1)): 9,
    ...                    (("a", 0), "t"): 9, (("a", 1), "t"): 1})
    >>> max_flow(net, "s", "t").value  # the plain minimum cut splits operator a
    2.0
    >>> cut = operator_min_cut(net, "s", "t")
    >>> cut.capacity, cut.heads
    (10.0, ('a',))
    """
    op, groups = operator_groups(net, source, sink, operator_of)
    return constrained_cut(net, source, sink, groups, op, net.checked_flows(flows))
