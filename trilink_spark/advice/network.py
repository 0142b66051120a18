"""Flow networks: the graph of operator instances with capacities and flows, and its maximum
flow.

The model is the one of "Flow-network based auto rescale strategy for Flink" (FAR-Flink;
Li Ziyang, Yu Jiong, Bian Chen, Zhang Yitian, Pu Yonglin, Wang Yuefei, Lu Liang, Journal on
Communications, 2019):

- a job is a directed graph whose nodes are operator *instances* (plus a source and a sink);
- the **capacity** ``c(u, v)`` of an edge is the largest rate (tuples/s) it sustains, and is
  learnt from latency feedback (:func:`~trilink_spark.advice.capacity.learn_capacity`, the
  paper's Algorithm 1, Eq. 13-17);
- the **flow** ``f(u, v)`` is the rate the edge carries now, with ``0 <= f <= c``;
- an **augmenting path** in the residual network (Eq. 2-4) shows where spare capacity lets the
  source push more (:func:`max_flow`);
- a **cut** ``(X, Y)`` never splits the instances of one operator (Def. 4, Eq. 5-6;
  :mod:`trilink_spark.advice.cuts`), and a cut whose flow reaches ``lambda x`` its capacity
  (``0.85 <= lambda <= 1``, Eq. 10) names the first operators of its sink side as the ones to
  scale (:func:`~trilink_spark.advice.analysis.find_bottlenecks`, Algorithm 2).

Operators and instances
-----------------------
A node is any hashable value. A node written ``(name, index)`` with an ``int`` index is taken
as instance ``index`` of operator ``name`` (:func:`operator_of`); any other node is an operator
of its own. A mapping or a function passed as ``operator_of=`` overrides that naming.

:func:`max_flow` is the plain maximum flow, whose value is a property of the network whatever
the operators, and whose ``min_cut`` may split an operator; the cuts that keep every operator
whole are :func:`~trilink_spark.advice.cuts.operator_min_cut`'s.

Examples
--------
>>> from trilink_spark.advice.network import FlowNetwork, max_flow
>>> net = FlowNetwork({("s", ("map", 0)): 5, ("s", ("map", 1)): 5,
...                    (("map", 0), "t"): 2, (("map", 1), "t"): 4})
>>> res = max_flow(net, "s", "t")
>>> res.value
6.0
>>> sorted(map(str, res.min_cut[0]))
["('map', 0)", "('map', 1)", 's']
"""

from __future__ import annotations

import logging
import math
import numbers
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from .._internal.validation import check_real
from ..errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = [
    "Node",
    "Edge",
    "OperatorMap",
    "MAX_TOTAL_CAPACITY",
    "FlowNetwork",
    "FlowResult",
    "operator_of",
    "max_flow",
]

logger = logging.getLogger(__name__)

Node: TypeAlias = Hashable
Edge: TypeAlias = tuple[Hashable, Hashable]
#: How nodes map to operators: a mapping (nodes it lacks are operators of their own), a
#: function, or ``None`` for the ``(name, index)`` naming of :func:`operator_of`.
OperatorMap: TypeAlias = Mapping[Hashable, Hashable] | Callable[[Hashable], Hashable] | None

#: Largest sum of a network's capacities: the algorithms add capacities (cuts, the ties of
#: :func:`~trilink_spark.advice.cuts.operator_min_cut`, which weigh the sum of all capacities,
#: a few per node), and every such sum must stay a finite float.
MAX_TOTAL_CAPACITY = 1e300


# ----------------------------------------------------------------------------- validation
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
            cap[e] = check_real(value, f"capacity of edge {e!r}")
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
                f = check_real(value, f"flow of edge {e!r}")
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

    def checked_flows(self, flows: Mapping[Edge, float] | None) -> dict[Edge, float]:
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
        fl = self.checked_flows(flows)
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
        fl = self.checked_flows(flows)
        return math.fsum(f if u == source else -f for (u, v), f in fl.items()
                         if source in (u, v))


# ----------------------------------------------------------------------------- max flow core
class ResidualNetwork:
    """Edmonds-Karp on a dense index space: ``cap`` and skew-symmetric net flow ``flow``.

    The working state of :func:`max_flow` and of the tied networks of
    :mod:`trilink_spark.advice.cuts`; not a user-facing network (see :class:`FlowNetwork`).

    Parameters
    ----------
    nodes : sequence of hashable
        The nodes; node ``nodes[i]`` is index ``i``.
    cap : mapping of (u, v) -> float
        Capacities (parallel entries add up).
    flow : mapping of (u, v) -> float, optional
        A starting flow.

    Notes
    -----
    Cost O(|V| + |E|) to build.
    """

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
        """Residual capacity ``i -> j`` (Eq. 2). Cost O(1)."""
        return self.cap[i].get(j, 0.0) - self.flow[i][j]

    def open(self, i: int, j: int) -> bool:
        """Whether ``i -> j`` has residual capacity beyond the tolerance."""
        return self.residual(i, j) > self.tol[i][j]

    def bfs(self, s: int, t: int | None) -> list[int | None]:
        """Breadth-first parents from ``s`` over open residual edges, stopping at ``t`` (all
        reachable nodes with ``None``); unreached nodes have parent ``None``. Cost O(|V| + |E|)."""
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
        """Push flow from ``s`` to ``t`` along shortest augmenting paths until none is left or
        ``limit`` is pushed; returns the amount and the paths with their amounts. Cost
        O(|V| |E|^2)."""
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
        """The nodes reachable from ``s`` in the residual network. Cost O(|V| + |E|)."""
        parent = self.bfs(s, None)
        return frozenset(self.nodes[k] for k, p in enumerate(parent) if p is not None)

    def edge_flows(self, edges: Iterable[Edge]) -> dict[Edge, float]:
        """The flow on each of ``edges``, within ``[0, c]``. Cost O(len(edges))."""
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


def check_terminals(net: FlowNetwork, source: Hashable, sink: Hashable) -> None:
    """Refuse a ``net`` that is not a :class:`FlowNetwork`, and terminals that are not two
    distinct nodes of it (typed errors that say what is allowed). Cost O(1)."""
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
    check_terminals(net, source, sink)
    if start not in ("current", "zero"):
        raise InvalidArgumentError(f"start must be 'current' or 'zero', got {start!r}")
    lim = None if limit is None else check_real(limit, "limit")
    initial: dict[Edge, float] | None = None
    if start == "current" and net.has_flows:
        broken = net.violations(source, sink)
        if broken:
            raise InvalidArgumentError(
                "the network's current flows are not a feasible flow from "
                f"{source!r} to {sink!r}: {'; '.join(broken[:3])}; pass start='zero', or "
                "flows that are conserved at every node but the source and the sink")
        initial = net.flows
    res = ResidualNetwork(net.nodes, net.capacities, initial)
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
