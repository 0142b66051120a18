"""Flow networks for bottleneck detection: maximum flow, cuts that never split an operator,
capacity learning from latency feedback, and the lambda-saturated cut test.

The model is the one of "Flow-network based auto rescale strategy for Flink" (FAR-Flink;
Li Ziyang, Yu Jiong, Bian Chen, Zhang Yitian, Pu Yonglin, Wang Yuefei, Lu Liang, Journal on
Communications, 2019):

- a job is a directed graph whose nodes are operator *instances* (plus a source and a sink);
- the **capacity** ``c(u, v)`` of an edge is the largest rate (tuples/s) it sustains, and is
  learnt from latency feedback (:func:`learn_capacity`, the paper's Algorithm 1, Eq. 13-17);
- the **flow** ``f(u, v)`` is the rate the edge carries now, with ``0 <= f <= c``;
- an **augmenting path** in the residual network (Eq. 2-4) shows where spare capacity lets the
  source push more (:func:`max_flow`);
- a **cut** ``(X, Y)`` never splits the instances of one operator (Def. 4, Eq. 5-6), and a cut
  whose flow reaches ``lambda x`` its capacity (``0.85 <= lambda <= 1``, Eq. 10) names the first
  operators of its sink side as the ones to scale (:func:`find_bottlenecks`, Algorithm 2).

Operators and instances
-----------------------
A node is any hashable value. A node written ``(name, index)`` with an ``int`` index is taken
as instance ``index`` of operator ``name`` (:func:`operator_of`); any other node is an operator
of its own. A mapping or a function passed as ``operator_of=`` overrides that naming.

Two functions answer the two questions, on purpose: :func:`max_flow` is the plain maximum
flow, whose value is a property of the network whatever the operators, and whose ``min_cut``
may split an operator; :func:`operator_min_cut` is the minimum over the cuts that keep every
operator's instances on one side (the paper's Eq. 5-6), whose capacity is at least the
maximum-flow value and may exceed it.

Examples
--------
>>> from trilink_spark.control.flow import FlowNetwork, max_flow, operator_min_cut
>>> net = FlowNetwork({("s", ("map", 0)): 5, ("s", ("map", 1)): 5,
...                    (("map", 0), "t"): 2, (("map", 1), "t"): 4})
>>> res = max_flow(net, "s", "t")
>>> res.value
6.0
>>> sorted(map(str, res.min_cut[0]))
["('map', 0)", "('map', 1)", 's']
>>> operator_min_cut(net, "s", "t").heads
('t',)
"""

from __future__ import annotations

import logging
import math
import numbers
import sys
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from .._internal.validation import check_real
from ..errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = [
    "Node",
    "Edge",
    "OperatorMap",
    "LAMBDA_RANGE",
    "FlowNetwork",
    "FlowResult",
    "OperatorCut",
    "BottleneckAnalysis",
    "CapacityObservation",
    "CapacityStep",
    "CapacityTrace",
    "operator_of",
    "max_flow",
    "operator_min_cut",
    "find_bottlenecks",
    "capacity_step",
    "learn_capacity",
]

logger = logging.getLogger(__name__)

_FLOAT_MAX = sys.float_info.max

Node: TypeAlias = Hashable
Edge: TypeAlias = tuple[Hashable, Hashable]
#: How nodes map to operators: a mapping (nodes it lacks are operators of their own), a
#: function, or ``None`` for the ``(name, index)`` naming of :func:`operator_of`.
OperatorMap: TypeAlias = Mapping[Hashable, Hashable] | Callable[[Hashable], Hashable] | None

#: Lambda's range in the saturated-cut test (Eq. 10).
LAMBDA_RANGE = (0.85, 1.0)
#: Largest sum of a network's capacities: the algorithms add capacities (cuts, the ties of
#: :func:`operator_min_cut`, which weigh the sum of all capacities, a few per node), and every
#: such sum must stay a finite float.
MAX_TOTAL_CAPACITY = 1e300


# ----------------------------------------------------------------------------- validation
def _number(value: object, what: str, *, positive: bool = False,
            allow_zero: bool = True) -> float:
    """A finite real >= 0 (or > 0), else an error that says what is allowed."""
    return check_real(value, what, positive=positive or not allow_zero)


def _edge(key: object, what: str) -> Edge:
    if not isinstance(key, tuple) or len(key) != 2:
        raise InvalidArgumentTypeError(
            f"{what} keys must be (u, v) pairs of nodes, got {key!r}")
    u, v = key
    try:
        hash(u), hash(v)
    except TypeError as err:
        raise InvalidArgumentTypeError(f"{what} nodes must be hashable, got {key!r}") from err
    if u == v:
        raise InvalidArgumentError(f"{what}: self-loop {key!r} is not allowed (u must differ "
                                   "from v)")
    return (u, v)


def _flow_values(flows: object) -> dict[Edge, float]:
    """A flows mapping whose keys are pairs and values real numbers (NaN, out-of-range and
    unknown edges are left to :meth:`FlowNetwork.violations` to report)."""
    if not isinstance(flows, Mapping):
        raise InvalidArgumentTypeError(
            f"flows must be a mapping {{(u, v): flow}}, got {type(flows).__name__}")
    out: dict[Edge, float] = {}
    for key, value in flows.items():
        e = _edge(key, "flows")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise InvalidArgumentTypeError(
                f"flow of edge {e!r} must be a real number (int or float), got "
                f"{type(value).__name__}")
        try:
            out[e] = float(value)
        except OverflowError:
            out[e] = math.inf if isinstance(value, int) and value > 0 else -math.inf
    return out


def operator_of(node: Hashable) -> Hashable:
    """The operator a node belongs to under the default naming.

    ``(name, index)`` with an ``int`` index (not a ``bool``) is instance ``index`` of operator
    ``name``; any other node is an operator of its own.

    Parameters
    ----------
    node : hashable
        A node of a :class:`FlowNetwork`.

    Returns
    -------
    hashable
        The operator's name. Cost O(1).

    Examples
    --------
    >>> operator_of(("map", 3)), operator_of("source")
    ('map', 'source')
    """
    if (isinstance(node, tuple) and len(node) == 2 and isinstance(node[1], int)
            and not isinstance(node[1], bool)):
        return node[0]  # type: ignore[no-any-return]
    return node


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


# ----------------------------------------------------------------------------- the network
class FlowNetwork:
    """A directed graph with edge capacities and, optionally, the flows it carries now.

    Parameters
    ----------
    capacities : mapping of (u, v) -> float
        Capacity of each edge (tuples/s): finite and ``>= 0``. Nodes are any hashable values
        (``(name, index)`` names an operator's instance, see :func:`operator_of`); no
        self-loops. Node order is the order of first appearance, which makes every algorithm
        here deterministic.
    flows : mapping of (u, v) -> float, optional
        The current flow of edges (missing edges carry 0): finite, ``0 <= f(u, v) <= c(u, v)``
        (a measured rate above the capacity must be clipped, or the capacity raised, first).
        Conservation is checked by :func:`max_flow`, which needs the source and sink.

    Raises
    ------
    InvalidArgumentTypeError
        A key that is not a pair, an unhashable node, a value that is not a real number.
    InvalidArgumentError
        A negative, NaN or infinite capacity or flow, capacities that sum to more than
        :data:`MAX_TOTAL_CAPACITY`, a self-loop, a flow on an edge that is not in
        ``capacities``, or a flow above its capacity.

    Notes
    -----
    Cost O(|E|) to build; the network is immutable (``with_flows`` and ``with_capacities``
    return new ones).

    Examples
    --------
    >>> net = FlowNetwork({("s", "a"): 3, ("a", "t"): 2}, flows={("s", "a"): 1, ("a", "t"): 1})
    >>> net.nodes, net.capacity("s", "a"), net.flow("a", "t")
    (('s', 'a', 't'), 3.0, 1.0)
    >>> net.residual("a", "s")  # Eq. 2: a reverse edge may undo the flow
    1.0
    """

    __slots__ = ("_cap", "_flow", "_nodes", "_succ", "_pred", "_has_flows")

    def __init__(self, capacities: Mapping[Edge, float],
                 flows: Mapping[Edge, float] | None = None) -> None:
        if not isinstance(capacities, Mapping):
            raise InvalidArgumentTypeError(
                "capacities must be a mapping {(u, v): capacity}, got "
                f"{type(capacities).__name__}")
        cap: dict[Edge, float] = {}
        nodes: dict[Hashable, None] = {}
        for key, value in capacities.items():
            e = _edge(key, "capacities")
            cap[e] = _number(value, f"capacity of edge {e!r}")
            nodes.setdefault(e[0])
            nodes.setdefault(e[1])
        try:
            total = math.fsum(cap.values())
        except OverflowError:
            total = math.inf
        if not total <= MAX_TOTAL_CAPACITY:
            raise InvalidArgumentError(
                f"capacities sum to {total:.3g}; at most {MAX_TOTAL_CAPACITY:g} is allowed (the "
                "cuts and ties add capacities up): express them in larger units")
        flow: dict[Edge, float] = {e: 0.0 for e in cap}
        if flows is not None:
            if not isinstance(flows, Mapping):
                raise InvalidArgumentTypeError(
                    f"flows must be a mapping {{(u, v): flow}} or None, got "
                    f"{type(flows).__name__}")
            for key, value in flows.items():
                e = _edge(key, "flows")
                if e not in cap:
                    raise InvalidArgumentError(
                        f"flows names edge {e!r}, which is not in capacities; allowed: the "
                        "edges of capacities")
                f = _number(value, f"flow of edge {e!r}")
                if f > cap[e]:
                    raise InvalidArgumentError(
                        f"flow {f!r} of edge {e!r} exceeds its capacity {cap[e]!r}; allowed: "
                        "0 <= flow <= capacity (clip measured rates, or raise the capacity)")
                flow[e] = f
        self._cap = cap
        self._flow = flow
        self._has_flows = flows is not None
        self._nodes = tuple(nodes)
        succ: dict[Hashable, list[Hashable]] = {n: [] for n in self._nodes}
        pred: dict[Hashable, list[Hashable]] = {n: [] for n in self._nodes}
        for u, v in cap:
            succ[u].append(v)
            pred[v].append(u)
        self._succ = {n: tuple(vs) for n, vs in succ.items()}
        self._pred = {n: tuple(us) for n, us in pred.items()}

    # -- read access
    @property
    def nodes(self) -> tuple[Hashable, ...]:
        """The nodes, in order of first appearance in ``capacities``."""
        return self._nodes

    @property
    def edges(self) -> tuple[Edge, ...]:
        """The edges, in the order of ``capacities``."""
        return tuple(self._cap)

    @property
    def capacities(self) -> dict[Edge, float]:
        """A copy of the capacities."""
        return dict(self._cap)

    @property
    def flows(self) -> dict[Edge, float]:
        """A copy of the current flows (0 on every edge when none were given)."""
        return dict(self._flow)

    @property
    def has_flows(self) -> bool:
        """Whether current flows were given."""
        return self._has_flows

    def __contains__(self, node: object) -> bool:
        return node in self._succ

    def __repr__(self) -> str:
        return f"FlowNetwork({len(self._nodes)} nodes, {len(self._cap)} edges)"

    def _check_node(self, node: Hashable, what: str) -> None:
        try:
            known = node in self._succ
        except TypeError as err:
            raise InvalidArgumentTypeError(f"{what} must be hashable, got {node!r}") from err
        if not known:
            raise InvalidArgumentError(
                f"{what} {node!r} is not a node of the network; allowed: one of "
                f"{list(self._nodes)[:8]!r}{' ...' if len(self._nodes) > 8 else ''}")

    def capacity(self, u: Hashable, v: Hashable) -> float:
        """``c(u, v)``, 0 when there is no such edge. Cost O(1)."""
        return self._cap.get((u, v), 0.0)

    def flow(self, u: Hashable, v: Hashable) -> float:
        """``f(u, v)``, 0 when there is no such edge. Cost O(1)."""
        return self._flow.get((u, v), 0.0)

    def residual(self, u: Hashable, v: Hashable) -> float:
        """Residual capacity ``c_f(u, v) = c(u, v) - f(u, v) + f(v, u)`` (Eq. 2). Cost O(1)."""
        return self.capacity(u, v) - self.flow(u, v) + self.flow(v, u)

    def successors(self, node: Hashable) -> tuple[Hashable, ...]:
        """Heads of the edges leaving ``node``. Cost O(1)."""
        self._check_node(node, "node")
        return self._succ[node]

    def predecessors(self, node: Hashable) -> tuple[Hashable, ...]:
        """Tails of the edges entering ``node``. Cost O(1)."""
        self._check_node(node, "node")
        return self._pred[node]

    def topological_order(self) -> tuple[Hashable, ...]:
        """The nodes in a topological order (Kahn's algorithm, ties in node order).

        Raises
        ------
        InvalidArgumentError
            The graph has a cycle (a DAG is required).

        Notes
        -----
        Cost O(|V| + |E|).
        """
        indeg = {n: len(self._pred[n]) for n in self._nodes}
        ready = deque(n for n in self._nodes if indeg[n] == 0)
        out: list[Hashable] = []
        while ready:
            n = ready.popleft()
            out.append(n)
            for v in self._succ[n]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    ready.append(v)
        if len(out) != len(self._nodes):
            cyclic = [n for n in self._nodes if indeg[n] > 0]
            raise InvalidArgumentError(
                f"the graph has a cycle through {cyclic[:5]!r}; a directed acyclic graph is "
                "required")
        return tuple(out)

    def is_acyclic(self) -> bool:
        """Whether the graph is a DAG. Cost O(|V| + |E|)."""
        try:
            self.topological_order()
        except InvalidArgumentError:
            return False
        return True

    def cut_capacity(self, source_side: Iterable[Hashable]) -> float:
        """``c(X, Y)``: capacity of the edges from ``X`` to the rest (Eq. 5). Cost O(|E|)."""
        x = set(source_side)
        return math.fsum(c for (u, v), c in self._cap.items() if u in x and v not in x)

    def _checked_flows(self, flows: Mapping[Edge, float] | None) -> dict[Edge, float]:
        """``flows`` checked as the ``flows`` of the constructor (the network's own when None).

        Raises
        ------
        InvalidArgumentTypeError, InvalidArgumentError
            As :class:`FlowNetwork` for its ``flows``.
        """
        if flows is None:
            return self._flow
        return FlowNetwork(self._cap, flows)._flow

    def cut_flow(self, source_side: Iterable[Hashable],
                 flows: Mapping[Edge, float] | None = None) -> float:
        """``f(X, Y)``: flow from ``X`` to the rest minus flow back (Eq. 6). ``flows`` are
        checked as the constructor's (typed errors). Cost O(|E|)."""
        x = set(source_side)
        fl = self._checked_flows(flows)
        return math.fsum(f if u in x else -f for (u, v), f in fl.items()
                         if (u in x) != (v in x))

    def with_flows(self, flows: Mapping[Edge, float] | None) -> FlowNetwork:
        """The same capacities with other flows. Cost O(|E|)."""
        return FlowNetwork(self._cap, flows)

    def with_capacities(self, updates: Mapping[Edge, float]) -> FlowNetwork:
        """Capacities changed (or edges added) by ``updates``; flows kept. Cost O(|E|)."""
        cap = dict(self._cap)
        cap.update(updates)
        return FlowNetwork(cap, self._flow if self._has_flows else None)

    def violations(self, source: Hashable, sink: Hashable,
                   flows: Mapping[Edge, float] | None = None,
                   tolerance: float = 1e-9) -> list[str]:
        """The broken flow invariants, empty when ``flows`` is a feasible s-t flow.

        Checks capacity bounds ``0 <= f <= c`` on every edge, that no flow is on an edge
        outside the network, and conservation (inflow = outflow) at every node but the source
        and the sink. ``tolerance`` is relative to the largest capacity.

        Returns
        -------
        list of str
            One message per broken invariant. Cost O(|V| + |E|).

        Examples
        --------
        >>> net = FlowNetwork({("s", "a"): 3, ("a", "t"): 2})
        >>> net.violations("s", "t", {("s", "a"): 2, ("a", "t"): 2})
        []
        >>> net.violations("s", "t", {("s", "a"): 3, ("a", "t"): 2})
        ["conservation at 'a': in 3.0, out 2.0"]
        """
        self._check_node(source, "source")
        self._check_node(sink, "sink")
        fl = self._flow if flows is None else _flow_values(flows)
        scale = max(1.0, max(self._cap.values(), default=1.0))
        tol = tolerance * scale
        out: list[str] = []
        balance = {n: 0.0 for n in self._nodes}
        inflow = {n: 0.0 for n in self._nodes}
        for e, f in fl.items():
            if e not in self._cap:
                out.append(f"flow on {e!r}, which is not an edge")
                continue
            if not (-tol <= f <= self._cap[e] + tol) or math.isnan(f):
                out.append(f"flow {f!r} on {e!r} outside [0, {self._cap[e]!r}]")
            balance[e[0]] -= f
            balance[e[1]] += f
            inflow[e[1]] += f
        for n in self._nodes:
            if n not in (source, sink) and abs(balance[n]) > tol:
                out.append(f"conservation at {n!r}: in {inflow[n]!r}, out "
                           f"{inflow[n] - balance[n]!r}")
        return out

    def value(self, source: Hashable, flows: Mapping[Edge, float] | None = None) -> float:
        """``|f|``: net flow out of the source (Eq. 1). ``flows`` are checked as the
        constructor's (typed errors). Cost O(|E|)."""
        self._check_node(source, "source")
        fl = self._checked_flows(flows)
        return math.fsum(f if u == source else -f for (u, v), f in fl.items()
                         if source in (u, v))


# ----------------------------------------------------------------------------- max flow core
class _Residual:
    """Edmonds-Karp on a dense index space: ``cap`` and skew-symmetric net flow ``flow``."""

    def __init__(self, nodes: Sequence[Hashable], cap: Mapping[Edge, float],
                 flow: Mapping[Edge, float] | None) -> None:
        self.nodes = list(nodes)
        self.index = {n: i for i, n in enumerate(self.nodes)}
        n = len(self.nodes)
        self.cap: list[dict[int, float]] = [{} for _ in range(n)]
        self.flow: list[dict[int, float]] = [{} for _ in range(n)]
        nbrs: list[set[int]] = [set() for _ in range(n)]
        for (u, v), c in cap.items():
            i, j = self.index[u], self.index[v]
            self.cap[i][j] = self.cap[i].get(j, 0.0) + c
            nbrs[i].add(j)
            nbrs[j].add(i)
        self.nbrs = [sorted(s) for s in nbrs]
        for i in range(n):
            for j in self.nbrs[i]:
                self.flow[i].setdefault(j, 0.0)
        if flow:
            for (u, v), f in flow.items():
                i, j = self.index[u], self.index[v]
                self.flow[i][j] += f
                self.flow[j][i] -= f
        # a residual counts when above 1e-12 of the capacity between the pair: relative to
        # the edge, so capacities twelve orders of magnitude apart (a tie next to an edge
        # of 1 tuple/s) never hide the small one
        self.tol: list[dict[int, float]] = [
            {j: 1e-12 * max(1.0, self.cap[i].get(j, 0.0) + self.cap[j].get(i, 0.0))
             for j in self.nbrs[i]} for i in range(n)]

    def residual(self, i: int, j: int) -> float:
        return self.cap[i].get(j, 0.0) - self.flow[i][j]

    def open(self, i: int, j: int) -> bool:
        """Whether ``i -> j`` has residual capacity beyond the tolerance."""
        return self.residual(i, j) > self.tol[i][j]

    def bfs(self, s: int, t: int | None) -> list[int | None]:
        parent: list[int | None] = [None] * len(self.nodes)
        parent[s] = s
        queue = deque([s])
        while queue:
            i = queue.popleft()
            for j in self.nbrs[i]:
                if parent[j] is None and self.open(i, j):
                    parent[j] = i
                    if j == t:
                        return parent
                    queue.append(j)
        return parent

    def augment(self, s: int, t: int, limit: float | None
                ) -> tuple[float, list[tuple[tuple[Hashable, ...], float]]]:
        pushed = 0.0
        paths: list[tuple[tuple[Hashable, ...], float]] = []
        while limit is None or pushed < limit - 1e-12 * max(1.0, limit):
            parent = self.bfs(s, t)
            if parent[t] is None:
                break
            path = [t]
            prev = parent[t]
            while path[-1] != s and prev is not None:
                path.append(prev)
                prev = parent[prev]
            path.reverse()
            amount = min(self.residual(a, b) for a, b in zip(path, path[1:]))
            if limit is not None:
                amount = min(amount, limit - pushed)
            for a, b in zip(path, path[1:]):
                self.flow[a][b] += amount
                self.flow[b][a] -= amount
            pushed += amount
            paths.append((tuple(self.nodes[k] for k in path), amount))
        return pushed, paths

    def reachable(self, s: int) -> frozenset[Hashable]:
        parent = self.bfs(s, None)
        return frozenset(self.nodes[k] for k, p in enumerate(parent) if p is not None)

    def edge_flows(self, edges: Iterable[Edge]) -> dict[Edge, float]:
        out: dict[Edge, float] = {}
        for u, v in edges:
            i, j = self.index[u], self.index[v]
            f = self.flow[i][j]
            # within [0, c]: rounding of many augmentations may pass c by an ulp
            out[(u, v)] = min(f, self.cap[i].get(j, 0.0)) if f > 0 else 0.0
        return out


@dataclass(frozen=True)
class FlowResult:
    """What :func:`max_flow` found.

    Attributes
    ----------
    source, sink : hashable
        The terminals.
    value : float
        ``|f|`` of the final flow (Eq. 1), tuples/s.
    flows : dict of (u, v) -> float
        The final flow on every edge of the network.
    min_cut : (frozenset, frozenset)
        ``(X, Y)``: ``X`` the nodes reachable from the source in the final residual network,
        ``Y`` the others. When ``saturated``, a minimum cut: ``c(X, Y) == value``. It may split
        an operator's instances (see :func:`operator_min_cut`).
    cut_capacity : float
        ``c(X, Y)`` (Eq. 5).
    cut_edges : tuple of (u, v)
        The edges from ``X`` to ``Y``.
    paths : tuple of (tuple of nodes, float)
        The augmenting paths, in the order found, each with the amount pushed (Eq. 3). A path
        runs in the residual network: a step ``v -> u`` against an edge ``(u, v)`` undoes flow.
    initial_value : float
        ``|f|`` of the flow the search started from.
    saturated : bool
        No augmenting path is left: ``value`` is the maximum flow.
    """

    source: Hashable
    sink: Hashable
    value: float
    flows: dict[Edge, float]
    min_cut: tuple[frozenset[Hashable], frozenset[Hashable]]
    cut_capacity: float
    cut_edges: tuple[Edge, ...]
    paths: tuple[tuple[tuple[Hashable, ...], float], ...]
    initial_value: float = 0.0
    saturated: bool = True


def _terminals(net: FlowNetwork, source: Hashable, sink: Hashable) -> None:
    if not isinstance(net, FlowNetwork):
        raise InvalidArgumentTypeError(
            f"net must be a FlowNetwork, got {type(net).__name__}")
    net._check_node(source, "source")
    net._check_node(sink, "sink")
    if source == sink:
        raise InvalidArgumentError(f"source and sink must differ, both are {source!r}")


def max_flow(net: FlowNetwork, source: Hashable, sink: Hashable, *,
             start: Literal["current", "zero"] = "current",
             limit: float | None = None) -> FlowResult:
    """Maximum s-t flow by Edmonds-Karp (shortest augmenting paths, breadth-first).

    Starting from the network's current flow (the paper's Algorithm 2, lines 1-10: the load
    is first redistributed along augmenting paths) or from zero, it pushes flow along the
    shortest path of the residual network (Eq. 2) by the path's bottleneck residual (Eq. 3)
    until no path is left (or ``limit`` is reached). Neighbours are visited in node order, so
    the result is deterministic.

    Parameters
    ----------
    net : FlowNetwork
        The network; its flows, when given and ``start="current"``, must be a feasible flow
        (capacity bounds and conservation at every node but ``source`` and ``sink``).
    source, sink : hashable
        Distinct nodes of ``net``.
    start : {"current", "zero"}
        Start from ``net``'s flows or from the zero flow.
    limit : float, optional
        Stop once ``value`` reaches it (a demand: the rate the source must push, Algorithm 2's
        "while too much accumulation"). ``saturated`` then says whether the network is full.

    Returns
    -------
    FlowResult

    Raises
    ------
    InvalidArgumentError
        Unknown or equal terminals, a current flow that is not conserved, a negative or
        non-finite ``limit``, an unknown ``start``.

    Notes
    -----
    Cost O(|V| |E|^2) time (Edmonds-Karp), O(|V| + |E|) memory. A residual capacity counts
    when it exceeds 1e-12 times its edge's capacity (at least 1e-12), and ``limit`` is met
    within 1e-12 of itself: capacities many orders of magnitude apart are all honoured.

    Examples
    --------
    >>> net = FlowNetwork({("s", "a"): 3, ("s", "b"): 2, ("a", "b"): 1, ("a", "t"): 2,
    ...                    ("b", "t"): 3})
    >>> res = max_flow(net, "s", "t")
    >>> res.value, res.cut_capacity, sorted(res.min_cut[0])
    (5.0, 5.0, ['s'])
    >>> [(list(p), amount) for p, amount in res.paths]
    [(['s', 'a', 't'], 2.0), (['s', 'b', 't'], 2.0), (['s', 'a', 'b', 't'], 1.0)]
    """
    _terminals(net, source, sink)
    if start not in ("current", "zero"):
        raise InvalidArgumentError(f"start must be 'current' or 'zero', got {start!r}")
    lim = None if limit is None else _number(limit, "limit")
    initial: dict[Edge, float] | None = None
    if start == "current" and net.has_flows:
        broken = net.violations(source, sink)
        if broken:
            raise InvalidArgumentError(
                "the network's current flows are not a feasible flow from "
                f"{source!r} to {sink!r}: {'; '.join(broken[:3])}; pass start='zero', or "
                "flows that are conserved at every node but the source and the sink")
        initial = net.flows
    res = _Residual(net.nodes, net.capacities, initial)
    s, t = res.index[source], res.index[sink]
    initial_value = net.value(source, initial) if initial is not None else 0.0
    remaining = None if lim is None else max(0.0, lim - initial_value)
    _, paths = res.augment(s, t, remaining)
    flows = res.edge_flows(net.edges)
    x = res.reachable(s)
    y = frozenset(n for n in net.nodes if n not in x)
    cut_edges = tuple(e for e in net.edges if e[0] in x and e[1] in y)
    value = net.value(source, flows)
    result = FlowResult(
        source=source, sink=sink, value=value, flows=flows, min_cut=(x, y),
        cut_capacity=net.cut_capacity(x), cut_edges=cut_edges, paths=tuple(paths),
        initial_value=initial_value, saturated=sink not in x)
    logger.debug("max_flow %r -> %r: %d paths, value %.6g (from %.6g), saturated %s",
                 source, sink, len(paths), value, initial_value, result.saturated)
    return result


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


def _constrained_cut(net: FlowNetwork, source: Hashable, sink: Hashable,
                     groups: Mapping[Hashable, Sequence[Hashable]],
                     op: Callable[[Hashable], Hashable],
                     flows: Mapping[Edge, float] | None,
                     force_x: Sequence[Hashable] = (),
                     force_y: Sequence[Hashable] = ()) -> OperatorCut:
    """Minimum cut that keeps groups whole, with ``force_x`` on the source side and
    ``force_y`` on the sink side: max flow where ties carry a capacity above any cut."""
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
    res = _Residual(net.nodes, merged, None)
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


def _operator_setup(net: FlowNetwork, source: Hashable, sink: Hashable,
                    operators: OperatorMap
                    ) -> tuple[Callable[[Hashable], Hashable], dict[Hashable, list[Hashable]]]:
    _terminals(net, source, sink)
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
    op, groups = _operator_setup(net, source, sink, operator_of)
    return _constrained_cut(net, source, sink, groups, op, net._checked_flows(flows))


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
    lam = _number(lambda_, "lambda_")
    if not LAMBDA_RANGE[0] <= lam <= LAMBDA_RANGE[1]:
        raise InvalidArgumentError(f"lambda_ must be within [0.85, 1] (Eq. 10), got {lam!r}")
    dem = None if demand is None else _number(demand, "demand")
    op, groups = _operator_setup(net, source, sink, operator_of)
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
        cut = _constrained_cut(net, source, sink, groups, op, flow.flows,
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


# ----------------------------------------------------------------------------- Algorithm 1
@dataclass(frozen=True)
class CapacityObservation:
    """One measurement window of an edge, the inputs of Algorithm 1.

    Attributes
    ----------
    flow : float
        The rate the edge carried, tuples/s (``f(u, v)``).
    latency_ms : float
        The computation latency compared with the threshold ``theta`` (end-to-end, or of the
        node; ms).
    tuple_latency_ms : float or None
        ``l``, the mean time a tuple spends in the node (Eq. 13: completion minus arrival,
        averaged; ms). Its reciprocal ``1000 / l`` is the capacity it implies (Eq. 14).
        Required by the dynamic step.
    """

    flow: float
    latency_ms: float
    tuple_latency_ms: float | None = None


@dataclass(frozen=True)
class CapacityStep:
    """One feedback adjustment: the new capacity, the step ``eta`` and its direction
    (``-1`` lower, ``+1`` raise, ``0`` keep) with the reason."""

    capacity: float
    eta: float
    direction: int
    reason: str


#: A step rule of Algorithm 1: ``"dynamic"`` (Eq. 17) or a fixed step in tuples/s.
StepRule: TypeAlias = Literal["dynamic"] | float


def _step_rule(step: object) -> float | None:
    if isinstance(step, str):
        if step != "dynamic":
            raise InvalidArgumentError(
                f"step must be 'dynamic' (Eq. 17) or a fixed step > 0, got {step!r}")
        return None
    return _number(step, "step", positive=True)


def capacity_step(capacity: float, observation: CapacityObservation, *, threshold_ms: float,
                  step: StepRule = "dynamic", low_fraction: float = 0.5,
                  full_fraction: float = 0.95, min_capacity: float = 1e-9) -> CapacityStep:
    """One feedback adjustment of an edge's capacity (Algorithm 1, lines 5-11).

    - latency ``> theta`` and ``f <= c``: the capacity is set too high, lower it by ``eta``;
    - latency ``<< theta`` (below ``low_fraction x theta``) and ``f ~ c`` (at least
      ``full_fraction x c``): the edge is full yet fast, raise it by ``eta``;
    - otherwise keep it.

    The dynamic step (Eq. 15-17) is ``eta = min(|1000/l - 1000/l'|, |-1000/l^2|)``: the gap
    between the capacity in force, ``c = 1000/l`` (Eq. 14), and the capacity implied by the
    fresh per-tuple latency ``l'`` (``observation.tuple_latency_ms``, Eq. 16), bounded by
    the derivative ``|dc/dl| = 1000/l^2`` (Eq. 15) so that a slow edge (``c`` below about
    1,000 tuples/s) never moves by more than ``c^2/1000`` at once. The step shrinks as the
    capacity nears the one the latency implies, which is why it converges without the
    oscillation of a large fixed step. A float ``step`` is a fixed ``eta``.

    Parameters
    ----------
    capacity : float
        ``c(u, v)`` in force, tuples/s, > 0.
    observation : CapacityObservation
        The window measured with that capacity.
    threshold_ms : float
        ``theta``, the latency bound (ms), > 0.
    step : "dynamic" or float
        Eq. 17, or a fixed step (tuples/s) to compare with.
    low_fraction : float
        "Latency much lower than theta" means below ``low_fraction x theta`` (0 < x < 1).
    full_fraction : float
        "Flow close to the capacity" means at least ``full_fraction x c`` (0 < x <= 1).
    min_capacity : float
        The capacity never goes below it (> 0).

    Returns
    -------
    CapacityStep

    Raises
    ------
    InvalidArgumentError
        A non-positive capacity or threshold, fractions out of range, NaN or infinite values,
        a dynamic step without ``tuple_latency_ms``.

    Notes
    -----
    Cost O(1).

    Examples
    --------
    >>> obs = CapacityObservation(flow=1000.0, latency_ms=20.0, tuple_latency_ms=0.8)
    >>> capacity_step(1000.0, obs, threshold_ms=100.0)  # full and fast: raise toward 1250
    CapacityStep(capacity=1250.0, eta=250.0, direction=1, reason='latency << theta and f ~ c')
    >>> capacity_step(1000.0, obs, threshold_ms=100.0, step=50.0).capacity
    1050.0
    """
    c = _number(capacity, "capacity", positive=True)
    theta = _number(threshold_ms, "threshold_ms", positive=True)
    rule = _step_rule(step)
    low = _number(low_fraction, "low_fraction", positive=True)
    full = _number(full_fraction, "full_fraction", positive=True)
    floor = _number(min_capacity, "min_capacity", positive=True)
    if low >= 1:
        raise InvalidArgumentError(f"low_fraction must be in (0, 1), got {low!r}")
    if full > 1:
        raise InvalidArgumentError(f"full_fraction must be in (0, 1], got {full!r}")
    if not isinstance(observation, CapacityObservation):
        raise InvalidArgumentTypeError(
            f"observation must be a CapacityObservation, got {type(observation).__name__}")
    f = _number(observation.flow, "observation.flow")
    latency = _number(observation.latency_ms, "observation.latency_ms")
    if latency > theta and f <= c * (1 + 1e-12):
        direction, reason = -1, "latency > theta and f <= c"
    elif latency < low * theta and f >= full * c:
        direction, reason = 1, "latency << theta and f ~ c"
    else:
        return CapacityStep(capacity=c, eta=0.0, direction=0, reason="within bounds")
    if rule is None:
        if observation.tuple_latency_ms is None:
            raise InvalidArgumentError(
                "the dynamic step (Eq. 17) needs observation.tuple_latency_ms, the mean time "
                "a tuple spends in the node (ms); pass it, or a fixed step")
        l_new = _number(observation.tuple_latency_ms, "observation.tuple_latency_ms",
                        positive=True)
        # Eq. 14: l_now = 1000 / c, the latency c stands for; written in c so that neither
        # 1000 / l_new nor 1000 / l_now ** 2 (= c ** 2 / 1000) can overflow
        reg = abs(c - min(1000.0 / l_new, _FLOAT_MAX))  # Eq. 16
        eta = min(reg, c * (c / 1000.0))                # Eq. 17 (|Eq. 15|)
    else:
        eta = rule
    new = min(max(floor, c + direction * eta), _FLOAT_MAX)
    return CapacityStep(capacity=new, eta=abs(new - c), direction=direction, reason=reason)


@dataclass(frozen=True)
class CapacityTrace:
    """The run of :func:`learn_capacity`: ``capacities[k]`` is the capacity in force during
    window ``k`` (``capacities[0]`` the initial one, the last one the result)."""

    capacities: tuple[float, ...]
    etas: tuple[float, ...]
    directions: tuple[int, ...]

    @property
    def capacity(self) -> float:
        """The learnt capacity (the last one)."""
        return self.capacities[-1]

    def steps_to_within(self, target: float, tolerance: float = 0.05) -> int | None:
        """The first step from which the capacity stays within ``tolerance x target`` of
        ``target`` to the end, or ``None``. Cost O(steps)."""
        t = _number(target, "target", positive=True)
        tol = _number(tolerance, "tolerance") * t
        first: int | None = None
        for k, c in enumerate(self.capacities):
            if abs(c - t) <= tol:
                if first is None:
                    first = k
            else:
                first = None
        return first

    def reversals(self) -> int:
        """How often the direction of adjustment flipped (oscillation). Cost O(steps)."""
        moves = [d for d, eta in zip(self.directions, self.etas) if d != 0 and eta > 0]
        return sum(1 for a, b in zip(moves, moves[1:]) if a != b)


def learn_capacity(initial: float, observe: Callable[[float], CapacityObservation], *,
                   threshold_ms: float, step: StepRule = "dynamic", steps: int = 50,
                   low_fraction: float = 0.5, full_fraction: float = 0.95,
                   min_capacity: float = 1e-9) -> CapacityTrace:
    """Learn an edge's capacity from latency feedback: Algorithm 1 of FAR-Flink.

    Starting from ``initial`` (the paper's Eq. 8-9 estimate from bandwidth, or the measured
    ``1000 / l`` of Eq. 14), repeat ``steps`` times: run a window with the capacity in
    force (``observe(c)`` returns what was measured), then adjust it with
    :func:`capacity_step`, by the dynamic step of Eq. 17 or a fixed one.

    Parameters
    ----------
    initial : float
        The first capacity, tuples/s, > 0.
    observe : callable
        ``observe(capacity) -> CapacityObservation``: the window run with that capacity (a
        running job's metrics, or a simulation).
    threshold_ms, step, low_fraction, full_fraction, min_capacity
        As in :func:`capacity_step`.
    steps : int
        Number of feedback windows, >= 1.

    Returns
    -------
    CapacityTrace

    Raises
    ------
    InvalidArgumentError, InvalidArgumentTypeError
        As in :func:`capacity_step`; ``steps < 1``; ``observe`` not callable.

    Notes
    -----
    Cost O(steps) calls of ``observe``.

    Examples
    --------
    An edge whose tuples take 0.5 ms (2,000 tuples/s): latency stays low below that rate and
    explodes above it.

    >>> def observe(c):
    ...     flow = min(c, 2000.0)
    ...     return CapacityObservation(flow, 10.0 if c <= 2000 else 500.0, 0.5)
    >>> trace = learn_capacity(5000.0, observe, threshold_ms=100.0, steps=5)
    >>> trace.capacities
    (5000.0, 2000.0, 2000.0, 2000.0, 2000.0, 2000.0)
    >>> learn_capacity(5000.0, observe, threshold_ms=100.0, step=100.0, steps=5).capacity
    4500.0
    """
    c = _number(initial, "initial", positive=True)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InvalidArgumentError(f"steps must be an int >= 1, got {steps!r}")
    if not callable(observe):
        raise InvalidArgumentTypeError(
            f"observe must be a callable capacity -> CapacityObservation, got "
            f"{type(observe).__name__}")
    _step_rule(step)
    capacities = [c]
    etas: list[float] = []
    directions: list[int] = []
    for _ in range(steps):
        out = capacity_step(c, observe(c), threshold_ms=threshold_ms, step=step,
                            low_fraction=low_fraction, full_fraction=full_fraction,
                            min_capacity=min_capacity)
        c = out.capacity
        capacities.append(c)
        etas.append(out.eta)
        directions.append(out.direction)
    logger.debug("learn_capacity: %.6g -> %.6g in %d windows (%s step)", capacities[0], c,
                 steps, step)
    return CapacityTrace(tuple(capacities), tuple(etas), tuple(directions))
