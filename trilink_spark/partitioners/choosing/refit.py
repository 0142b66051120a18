"""Minimal-move rebalancing: reach a target balance by moving as few keys (or blocks) as it can.

A fresh fit of a table strategy places every key anew, so on ``n`` partitions about
``(n - 1) / n`` of the keys change partition, and each move costs a state migration. When the
current placement is only somewhat off, :func:`rebalance_minimal` keeps every unit (a key of a
table strategy, a block of a :class:`~trilink_spark.partitioners.core.block.BlockPartitioner`) where
it is and moves only what balance needs:

1. units on partitions that no longer exist (a rescale to fewer partitions) must move: heaviest
   first, each onto the least-loaded partition (longest processing time first);
2. then, while the balance degree (least load over greatest,
   :func:`~trilink_spark.partitioners.balance_degree`) is below the target, the most-loaded
   partition that can still give gives one of its own units to the least-loaded one: the unit whose
   load is closest to half their gap, among those that keep the receiver under the target's top
   load and leave the pair closer than before. Every move lowers the spread of the loads, so the
   loop ends; it stops at the target, when no move helps, or at ``max_moved_fraction``.

Partitions are found with lazy binary heaps and a donor's units with a binary search over its
units sorted by load, skipping units already moved through union-find pointers:
O(u log u) for ``u`` units, one Python step per move.
"""

from __future__ import annotations

import bisect
import heapq
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from ..._internal.validation import check_num_partitions, choice
from ..._internal.validation import loads as check_loads
from ...errors import InvalidArgumentError, InvalidArgumentTypeError, InvalidKeyTypeError
from ..core.keys import Key, key_index, null_partition, to_key_array
from ..core.balance import balance_degree, keyed_bound
from ..core.base import Partitioner, encode_key
from ..core.block import DEFAULT_BLOCKS, BlockPartitioner
from ..core.hash import HashPartitioner
from ..tables.least import LeastCountPartitioner, LeastKeyPartitioner
from ..tables.table import TablePartitioner

__all__ = ["rebalance_minimal", "moved_units", "UNITS"]

logger = logging.getLogger(__name__)

#: What ``counts`` are counted per in :func:`rebalance_minimal`.
UNITS: tuple[str, ...] = ("key", "block")

_FAMILY = {"int": "int", "long": "int", "string": "string", "binary": "binary"}


# ---------------------------------------------------------------------- arguments
def _check_fraction(value: Any, name: str, *, zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidArgumentTypeError(f"{name} must be a number, got {type(value).__name__}")
    v = float(value)
    low_ok = v >= 0.0 if zero else v > 0.0
    if not (low_ok and v <= 1.0):
        interval = "[0, 1]" if zero else "(0, 1]"
        raise InvalidArgumentError(f"{name} must be in {interval}, got {value!r}")
    return v


def _key_counts(
    counts: Any, null_policy: str, python_keys: bool = True
) -> tuple[pa.Array, list[Key], npt.NDArray[np.float64], float]:
    """Distinct non-null keys (Arrow, and as Python objects when ``python_keys``), their summed
    loads (duplicates of a Series add up) and the load of null keys."""
    if isinstance(counts, pd.Series):
        raw_keys: Any = counts.index.to_numpy()
        raw_values: Any = counts.to_numpy()
    elif isinstance(counts, Mapping):
        raw_keys, raw_values = list(counts.keys()), list(counts.values())
    else:
        raise InvalidArgumentTypeError(
            f"counts must be a mapping {{key: load}} or a pandas Series indexed by key, got "
            f"{type(counts).__name__}"
        )
    values = check_loads(raw_values)
    karr = to_key_array(raw_keys, null_policy)
    null_load = 0.0
    arrow = karr.arrow
    if karr.null_mask is not None:
        null_load = float(values[karr.null_mask].sum())
        keep = ~karr.null_mask
        values = values[keep]
        arrow = arrow.filter(pa.array(keep))
    objs = to_key_array(arrow).objects()
    codes, uniques = pd.factorize(objs)
    loads = np.bincount(codes, weights=values, minlength=len(uniques)).astype(np.float64)
    first = np.full(len(uniques), -1, dtype=np.int64)
    first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)
    distinct = arrow.take(pa.array(first)) if len(uniques) != len(objs) else arrow
    # validated keys of one kind: int64 values or Python str/bytes objects, as they are
    keys: list[Key] = np.asarray(uniques).tolist() if python_keys else []
    return distinct, keys, loads, null_load


def _block_counts(counts: Any, num_blocks: int) -> tuple[npt.NDArray[np.float64], float]:
    """Per-block loads given per block (a sequence of ``num_blocks`` loads or ``{block: load}``)
    and the null keys' load (a mapping's ``None`` entry)."""
    null_load = 0.0
    if isinstance(counts, Mapping) and None in counts:
        counts = dict(counts)
        null_load = float(check_loads([counts.pop(None)])[0])
    if isinstance(counts, (pd.Series, Mapping)):
        if isinstance(counts, pd.Series):
            blocks, values = counts.index.to_numpy(), check_loads(counts.to_numpy())
        else:
            blocks, values = np.asarray(list(counts.keys())), check_loads(list(counts.values()))
        if blocks.size and blocks.dtype.kind not in "iu":
            raise InvalidArgumentTypeError(
                f"with unit='block' counts are keyed by block id (ints), got {blocks.dtype}"
            )
        blocks = blocks.astype(np.int64)
        if blocks.size and (blocks.min() < 0 or blocks.max() >= num_blocks):
            raise InvalidArgumentError(f"block ids must be in [0, {num_blocks})")
        out = np.zeros(num_blocks, dtype=np.float64)
        np.add.at(out, blocks, values)
        return out, null_load
    if isinstance(counts, (str, bytes)) or not isinstance(counts, (Sequence, np.ndarray)):
        raise InvalidArgumentTypeError(
            "with unit='block' counts are {block: load}, a Series indexed by block, or one "
            f"load per block; got {type(counts).__name__}"
        )
    values = check_loads(counts)
    if values.size != num_blocks:
        raise InvalidArgumentError(
            f"with unit='block' counts must list {num_blocks} loads (one per block), "
            f"got {values.size}"
        )
    return values, null_load


# ---------------------------------------------------------------------- the algorithm
class _Units:
    """Each partition's movable units, sorted by load; units leave and never come back."""

    def __init__(self, pids: npt.NDArray[np.int64], loads: npt.NDArray[np.float64],
                 movable: npt.NDArray[np.bool_], n: int) -> None:
        idx = np.flatnonzero(movable)
        order = idx[np.lexsort((loads[idx], pids[idx]))]
        sorted_pids = pids[order]
        self.ids: list[int] = order.tolist()
        self.loads: list[float] = loads[order].tolist()
        self.start: list[int] = np.searchsorted(sorted_pids, np.arange(n), "left").tolist()
        self.end: list[int] = np.searchsorted(sorted_pids, np.arange(n), "right").tolist()
        m = len(self.ids)
        self._prev = list(range(m))  # _prev[j] == j: position j is still there
        self._next = list(range(m))

    def _find(self, ptr: list[int], j: int, stop: int) -> int:
        root = j
        while root != stop and ptr[root] != root:
            root = ptr[root]
        while j != stop and ptr[j] != j and ptr[j] != root:
            ptr[j], j = root, ptr[j]
        return root

    def remove(self, j: int) -> None:
        self._prev[j] = j - 1
        self._next[j] = j + 1

    def best(self, p: int, target: float, cap: float, below: float) -> int | None:
        """Position of the unit of ``p`` whose load is closest to ``target`` among those with
        ``0 < load <= cap`` and ``load < below``; None when there is none."""
        lo_end, hi_end = self.start[p], self.end[p]
        if lo_end == hi_end:
            return None
        limit = min(bisect.bisect_right(self.loads, cap, lo_end, hi_end),
                    bisect.bisect_left(self.loads, below, lo_end, hi_end))
        if limit == lo_end:
            return None
        split = min(bisect.bisect_left(self.loads, target, lo_end, hi_end), limit)
        under = self._find(self._prev, split - 1, -1) if split > lo_end else -1
        if under < lo_end:
            under = -1
        over = self._find(self._next, split, len(self.ids)) if split < limit else -1
        if over >= limit:
            over = -1
        if under >= 0 and self.loads[under] <= 0.0:
            under = -1
        if over < 0:
            return under if under >= 0 else None
        if under < 0:
            return over
        return under if target - self.loads[under] <= self.loads[over] - target else over


def _rebalance(
    start: npt.NDArray[np.int64],
    weights: npt.NDArray[np.float64],
    fixed: npt.NDArray[np.float64],
    target: float,
    max_moves: int | None,
) -> npt.NDArray[np.int64]:
    """New partition of every unit (see the module docstring). ``fixed``: load per partition
    that cannot move (the null key on its partition); its length is the new partition
    count."""
    n = fixed.size
    pids = start.copy()
    removed = start >= n
    forced = np.flatnonzero(removed)
    if max_moves is not None and forced.size > max_moves:
        raise InvalidArgumentError(
            f"{forced.size} units sit on removed partitions and must move, more than "
            f"max_moved_fraction allows ({max_moves}); raise it to at least "
            f"{forced.size / max(start.size, 1):.4f}"
        )
    loads = fixed + np.bincount(start[~removed], weights=weights[~removed], minlength=n)
    if forced.size:
        heavy = forced[weights[forced] > 0]
        heavy = heavy[np.argsort(-weights[heavy], kind="stable")]
        heap = [(load, p) for p, load in enumerate(loads.tolist())]
        heapq.heapify(heap)
        lo = loads.tolist()
        for i, w in zip(heavy.tolist(), weights[heavy].tolist()):
            _, p = heapq.heappop(heap)
            pids[i] = p
            lo[p] += w
            heapq.heappush(heap, (lo[p], p))
        loads = np.asarray(lo, dtype=np.float64)
        empty = forced[weights[forced] <= 0]
        pids[empty] = np.argsort(loads, kind="stable")[np.arange(empty.size) % n]
    moved = int(forced.size)
    total = float(loads.sum())
    if n == 1 or total <= 0.0 or balance_degree(loads) >= target:
        return pids
    top = max(2.0 * total / n / (1.0 + target), float(weights.max(initial=0.0)))
    units = _Units(pids, weights, (~removed) & (weights > 0), n)
    load = loads.tolist()
    high = [(-x, p) for p, x in enumerate(load)]
    low = [(x, p) for p, x in enumerate(load)]
    donors = list(high)
    for h in (high, low, donors):
        heapq.heapify(h)
    stuck = [False] * n
    while True:
        while -high[0][0] != load[high[0][1]]:
            heapq.heappop(high)
        while low[0][0] != load[low[0][1]]:
            heapq.heappop(low)
        most, q = -high[0][0], low[0][1]
        if load[q] >= target * most:
            break
        if max_moves is not None and moved >= max_moves:
            logger.info("rebalance stopped at max_moved_fraction (%d units moved) with balance "
                        "%.4f, below the target %.4f", moved, load[q] / most, target)
            break
        found: tuple[int, int] | None = None
        skipped = []
        while donors:
            neg, p = donors[0]
            if stuck[p] or -neg != load[p]:
                heapq.heappop(donors)
                continue
            if p == q:
                skipped.append(heapq.heappop(donors))
                continue
            gap = load[p] - load[q]
            j = units.best(p, gap / 2.0, top - load[q], gap)
            if j is None:
                stuck[p] = True
                heapq.heappop(donors)
                continue
            found = (p, j)
            break
        for entry in skipped:
            heapq.heappush(donors, entry)
        if found is None:
            break
        p, j = found
        w, unit = units.loads[j], units.ids[j]
        units.remove(j)
        pids[unit] = q
        moved += 1
        load[p] -= w
        load[q] += w
        stuck[q] = False
        for r in (p, q):
            heapq.heappush(high, (-load[r], r))
            heapq.heappush(low, (load[r], r))
            if not stuck[r]:
                heapq.heappush(donors, (-load[r], r))
    return pids


# ---------------------------------------------------------------------- the entry point
def rebalance_minimal(
    current: Partitioner,
    counts: Any,
    num_partitions: int | None = None,
    target_balance: float = 0.97,
    max_moved_fraction: float | None = None,
    *,
    unit: str = "key",
) -> Partitioner:
    """A placement of balance ``target_balance`` that moves as few units of ``current`` as it can.

    Parameters
    ----------
    current : Partitioner
        The placement now. A :class:`~trilink_spark.LeastKeyPartitioner` or
        :class:`~trilink_spark.LeastCountPartitioner` (units: the keys of its table and of
        ``counts``; a key ``counts`` lists and the table does not starts where the hash
        fallback puts it); a :class:`~trilink_spark.partitioners.core.block.BlockPartitioner`
        (units: its blocks); or any stateless strategy, such as
        :class:`~trilink_spark.HashPartitioner` (units: the keys of ``counts``, starting where
        ``current`` places them). An adaptive partitioner stands for its current strategy.
    counts : mapping of key to number, or pandas.Series indexed by key
        Load of each key (records, or state size). With ``unit="block"``: load per block
        instead, as ``{block: load}``, a Series indexed by block or ``num_blocks`` loads; a
        ``None`` entry of the mapping is the null keys' load (they have no block).
        The null key (null policies ``"group"`` and ``"partition0"``) is a fixed load on its
        partition under the result's partition count (``pmod(42, n)``, or 0; see
        :func:`~trilink_spark.partitioners.core.keys.null_partition`): the other units are
        balanced around it, and it is never counted as a moved unit.
    num_partitions : int, optional
        Partitions of the result (default: ``current``'s). Fewer: the units of the removed
        partitions move. More: the new partitions start empty and receive units.
    target_balance : float
        Balance degree (least load over greatest) to reach, in (0, 1]. Above the best that
        whole units allow (:func:`~trilink_spark.partitioners.keyed_bound` over the units) it gets
        as close as it can and logs so at INFO.
    max_moved_fraction : float, optional
        Most units (not load) that may move, as a share of all units, in [0, 1]. Units on
        removed partitions count; if they alone exceed it, :class:`InvalidArgumentError`.
    unit : {"key", "block"}
        What ``counts`` are per; ``"block"`` only for a BlockPartitioner.

    Returns
    -------
    Partitioner
        Of ``current``'s kind with the new placement: the same table strategy with a new table
        (loads recomputed), a BlockPartitioner with a new table, or, from a stateless strategy,
        a :class:`~trilink_spark.LeastCountPartitioner` whose table holds every key of
        ``counts`` (its unknown keys fall back to Spark's hash, as ever). ``current`` is
        unchanged.

    Raises
    ------
    InvalidArgumentTypeError
        ``current`` is not a strategy or is one it cannot rebalance (WeightPartitioner: its
        partitions have unequal capacities), or ``counts`` is not a mapping or Series.
    InvalidArgumentError
        An argument out of range, or units on removed partitions above ``max_moved_fraction``.

    Notes
    -----
    Cost: O(u log u) for ``u`` units (one sort, then O(log u) per move on heaps and binary
    searches), plus hashing the keys of ``counts`` once (stateless and block strategies) and,
    for a table strategy, building the new table, O(u). Moves only units that balance or a
    removed partition needs: on 400 Zipf (s = 0.8) keys over 8 partitions placed by Spark's
    hash it reaches 0.97 moving about 4 % of the keys (at most 6 % over ten seeds), where a
    fresh LeastCount fit moves 87 % (``benches/RESULTS.md``).

    Examples
    --------
    >>> import trilink_spark as tl
    >>> from trilink_spark.partitioners import rebalance_minimal
    >>> counts = {"a": 50, "b": 30, "c": 20, "d": 20, "e": 10, "f": 10, "g": 5, "h": 5}
    >>> start = tl.HashPartitioner(2)
    >>> start.assign(list(counts)).tolist()
    [0, 1, 0, 0, 0, 0, 1, 0]
    >>> p = rebalance_minimal(start, counts)  # moves c and d, nothing else
    >>> p.assign(list(counts)).tolist(), p.loads.tolist()
    ([0, 1, 1, 1, 0, 0, 1, 0], [75.0, 75.0])
    """
    if not isinstance(current, Partitioner):
        raise InvalidArgumentTypeError(
            f"current must be a Partitioner, got {type(current).__name__}"
        )
    tau = _check_fraction(target_balance, "target_balance", zero=False)
    cap = (None if max_moved_fraction is None
           else _check_fraction(max_moved_fraction, "max_moved_fraction", zero=True))
    choice(unit, "unit", UNITS)
    p = current.unwrap()
    n = p.num_partitions if num_partitions is None else check_num_partitions(num_partitions)
    if isinstance(p, BlockPartitioner):
        if n > p.num_blocks:
            raise InvalidArgumentError(
                f"num_partitions={n} exceeds the strategy's {p.num_blocks} blocks; every "
                "partition needs a block"
            )
        return _rebalance_blocks(p, counts, n, tau, cap, unit)
    if unit == "block":
        raise InvalidArgumentError(
            f"unit='block' needs a BlockPartitioner, got {type(p).__name__}"
        )
    if isinstance(p, (LeastKeyPartitioner, LeastCountPartitioner)):
        return _rebalance_table(p, counts, n, tau, cap)
    if isinstance(p, TablePartitioner) or p.is_stateful:
        raise InvalidArgumentTypeError(
            f"rebalance_minimal balances equal partitions of LeastKey, LeastCount, Block or "
            f"stateless strategies; {type(p).__name__} is not one (a WeightPartitioner's "
            "partitions have unequal capacities: fit a new one instead)"
        )
    return _rebalance_stateless(p, counts, n, tau, cap)


def _run(start: npt.NDArray[np.int64], weights: npt.NDArray[np.float64], fixed_null: float,
         n: int, tau: float, cap: float | None, null_policy: str) -> npt.NDArray[np.int64]:
    bound = keyed_bound(weights, n) if weights.size else 1.0
    if tau > bound:
        logger.info("target balance %.4f is above the best whole units allow (%.4f over %d "
                    "units); getting as close as possible", tau, bound, weights.size)
    fixed = np.zeros(n, dtype=np.float64)
    # the null key never moves: its load is fixed on its partition under n (a counts' None
    # entry under the policy "error" too: it loads partition 0, as it always did)
    fixed[0 if null_policy == "error" else null_partition(null_policy, n)] = fixed_null
    max_moves = None if cap is None else int(np.floor(cap * weights.size + 1e-9))
    pids = _rebalance(start, weights, fixed, tau, max_moves)
    if logger.isEnabledFor(logging.DEBUG):
        loads = fixed + np.bincount(pids, weights=weights, minlength=n)
        logger.debug("rebalance: %d of %d units moved, balance %.4f", int((pids != start).sum()),
                     weights.size, balance_degree(loads))
    return pids


def _rebalance_blocks(p: BlockPartitioner, counts: Any, n: int, tau: float,
                      cap: float | None, unit: str) -> BlockPartitioner:
    null_load = 0.0
    if unit == "block":
        weights, null_load = _block_counts(counts, p.num_blocks)
    else:
        distinct, _keys, loads, null_load = _key_counts(counts, p.null_policy, False)
        blocks = p.blocks(distinct) if len(distinct) else np.zeros(0, dtype=np.int64)
        weights = np.bincount(blocks, weights=loads, minlength=p.num_blocks).astype(np.float64)
    start = p.table.astype(np.int64)
    return p.with_table(_run(start, weights, null_load, n, tau, cap, p.null_policy),
                        num_partitions=n)


def _rebalance_table(p: LeastKeyPartitioner | LeastCountPartitioner, counts: Any, n: int,
                     tau: float, cap: float | None) -> Partitioner:
    distinct, keys, loads, null_load = _key_counts(counts, p.null_policy)
    if p.bounded or len(p) + len(keys) > p.max_keys and _over_bound(p, distinct):
        return _rebalance_bounded(p, distinct, loads, null_load, n, tau, cap)
    table_keys, table_pids = p.table_arrays()
    if table_keys and keys:
        have, got = _FAMILY[to_key_array(table_keys).kind], _FAMILY[to_key_array(distinct).kind]
        if have != got:
            raise InvalidKeyTypeError(f"counts have {got} keys but the table holds {have} keys")
    index = key_index(table_keys)
    objs = to_key_array(distinct).objects()
    pos = index.get_indexer(objs) if keys else np.zeros(0, np.intp)  # type: ignore[arg-type]
    known = pos >= 0
    weights = np.zeros(len(table_keys), dtype=np.float64)
    weights[pos[known]] = loads[known]
    unknown = np.flatnonzero(~known)
    if unknown.size:
        fallback = p.lookup(distinct.take(pa.array(unknown))).astype(np.int64)
    else:
        fallback = np.zeros(0, dtype=np.int64)
    unit_keys = table_keys + [keys[i] for i in unknown.tolist()]
    start = np.concatenate([table_pids.astype(np.int64), fallback])
    weights = np.concatenate([weights, loads[unknown]])
    pids = _run(start, weights, null_load, n, tau, cap, p.null_policy)
    return _table_strategy(type(p), p.key_type, p.null_policy, n, unit_keys, pids, weights)


def _over_bound(p: TablePartitioner, distinct: pa.Array) -> bool:
    """Whether the table's entries and the counted keys it does not hold pass its bound."""
    return len(p) + int((~p.lookup_known(distinct)).sum()) > p.max_keys


def _rebalance_bounded(p: LeastKeyPartitioner | LeastCountPartitioner, distinct: pa.Array,
                       loads: npt.NDArray[np.float64], null_load: float, n: int, tau: float,
                       cap: float | None) -> Partitioner:
    """:func:`rebalance_minimal` of a bounded table (a per-key one past its bound: bounded),
    over named keys and groups. The heaviest counted keys get the entries (a key turned
    heavy gets one, from where its group is; one that lost its entry joins its group); a
    group starts where most of its load is. O(keys log keys + groups log groups)."""
    now = p.lookup(distinct).astype(np.int64) if len(distinct) else np.zeros(0, np.int64)
    known = p.lookup_known(distinct) if len(distinct) else np.zeros(0, bool)
    # the heaviest keys get the entries: by load, the table's own keys first among equals
    order = np.lexsort((~known, -loads))
    named = np.zeros(len(distinct), dtype=bool)
    named[order[: p.max_keys]] = True
    table_keys, table_pids = p.table_arrays()
    counted = set(to_key_array(distinct).objects().tolist()) if len(distinct) else set()
    room = p.max_keys - int(named.sum())
    kept = [(k, pid) for k, pid in zip(table_keys, table_pids.tolist()) if k not in counted]
    kept = kept[: max(0, room)]  # entries nobody counted, while there is room
    groups = p.key_groups(distinct) if len(distinct) else np.zeros(0, np.int64)
    b = p.num_groups
    rest = ~named
    if p.groups is not None:
        start_groups = p.groups.astype(np.int64)
    else:  # where most of each group's load is now
        cells = np.bincount(groups[rest] * n + np.minimum(now[rest], n - 1),
                            weights=loads[rest] + 1e-9, minlength=b * n).reshape(b, n)
        start_groups = np.where(cells.sum(axis=1) > 0, cells.argmax(axis=1),
                                np.arange(b) * n // b).astype(np.int64)
    start_groups = np.minimum(start_groups, max(n, p.num_partitions) - 1)
    group_loads = np.bincount(groups[rest], weights=loads[rest], minlength=b) * 1.0
    group_keys = np.bincount(groups[rest], minlength=b) * 1.0
    key_objs = to_key_array(distinct.filter(pa.array(named))).objects().tolist() \
        if named.any() else []
    unit_keys = key_objs + [k for k, _ in kept]
    start = np.concatenate([now[named], np.asarray([pid for _, pid in kept], np.int64),
                            start_groups])
    weights = np.concatenate([loads[named], np.zeros(len(kept)), group_loads])
    pids = _run(start, weights, null_load, n, tau, cap, p.null_policy)
    k_pids, g_pids = pids[: len(unit_keys)], pids[len(unit_keys):]
    by_keys = isinstance(p, LeastKeyPartitioner)
    unit = np.concatenate([np.ones(len(unit_keys)), group_keys]) if by_keys else weights
    out_group_loads = group_keys if by_keys else group_loads
    out_loads = np.bincount(pids, weights=unit, minlength=n).astype(np.float64)
    if max(DEFAULT_BLOCKS, n) != b:  # other groups on n partitions: fitted afresh there
        logger.info("rebalance: %d partitions have other key groups than %d; a fresh fit",
                    n, p.num_partitions)
        fresh = Partitioner.from_dict({**{k: v for k, v in p.to_dict().items()
                                          if k not in p.learned_fields}, "num_partitions": n})
        if isinstance(fresh, TablePartitioner):
            fresh.fit_loads(distinct, loads, None, null_load)
        return fresh
    return Partitioner.from_dict({
        "strategy": p.strategy_name, "num_partitions": n, "null_policy": p.null_policy,
        "key_type": p.key_type, "max_keys": p.max_keys, "num_groups": b,
        "table": [[encode_key(k), int(q)] for k, q in zip(unit_keys, k_pids.tolist())],
        "loads": out_loads.tolist(), "groups": g_pids.astype(int).tolist(),
        "group_loads": out_group_loads.tolist()})


def _rebalance_stateless(p: Partitioner, counts: Any, n: int, tau: float,
                         cap: float | None) -> Partitioner:
    distinct, keys, loads, null_load = _key_counts(counts, p.null_policy)
    start = (p.assign(distinct).astype(np.int64) if keys else np.zeros(0, dtype=np.int64))
    pids = _run(start, loads, null_load, n, tau, cap, p.null_policy)
    key_type = p.key_type if isinstance(p, (HashPartitioner, BlockPartitioner)) else "auto"
    return _table_strategy(LeastCountPartitioner, key_type, p.null_policy, n, keys, pids, loads)


def _table_strategy(cls: type[Partitioner], key_type: str, null_policy: str, n: int,
                    keys: list[Key], pids: npt.NDArray[np.int64],
                    weights: npt.NDArray[np.float64]) -> Partitioner:
    """A LeastKey/LeastCount strategy with this table, its loads recomputed."""
    if cls is LeastKeyPartitioner:
        loads = np.bincount(pids, minlength=n).astype(np.float64)
    else:
        loads = np.bincount(pids, weights=weights, minlength=n).astype(np.float64)
    return Partitioner.from_dict({
        "strategy": cls.strategy_name,
        "num_partitions": n,
        "null_policy": null_policy,
        "key_type": key_type,
        "table": [[encode_key(k), p] for k, p in zip(keys, pids.tolist())],
        "loads": loads.tolist(),
    })


# ---------------------------------------------------------------------- reporting
def moved_units(
    before: Partitioner, after: Partitioner, keys: Any = None
) -> npt.NDArray[np.bool_]:
    """Which units changed partition between two placements (vectorised).

    With ``keys``: one flag per key (a table strategy is asked with ``lookup``, so nothing is
    placed). Without: two BlockPartitioners of the same blocks, one flag per block.
    O(keys) or O(num_blocks).

    Examples
    --------
    >>> from trilink_spark.partitioners import BlockPartitioner
    >>> old = BlockPartitioner(2, num_blocks=4)
    >>> moved_units(old, old.with_table([0, 1, 1, 1])).tolist()
    [False, True, False, False]
    """
    if keys is None:
        if not (isinstance(before, BlockPartitioner) and isinstance(after, BlockPartitioner)
                and before.num_blocks == after.num_blocks):
            raise InvalidArgumentError(
                "without keys, moved_units compares two BlockPartitioners of the same blocks"
            )
        return np.asarray(before.table != after.table)
    return np.asarray(_placed(before, keys) != _placed(after, keys))


def _placed(p: Partitioner, keys: Any) -> npt.NDArray[np.int32]:
    q = p.unwrap()
    if isinstance(q, TablePartitioner) and q.is_stateful:
        return q.lookup(keys)
    return q.assign(keys)
