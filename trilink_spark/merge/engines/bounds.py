"""Where Local Merge flushes its buffers: the flush bounds of one partition's rows.

:func:`flush_bounds` cuts a partition's rows, in arrival order, into flushes by the mode
(:data:`MERGE_MODES`, Trilink paper, §4.3, Table 7): every ``quantity`` rows, before the row
whose (key, slot) group would make a flush hold more than ``max_groups`` groups
(:func:`group_bounds`), before the row that makes a flush's event times spread more than
``delay``, or after each punctuation row. The pandas engine cuts its rows there; the Arrow
engine flushes batch by batch and cuts a batch that alone passes ``max_groups`` with
:func:`group_bounds`. O(n) numpy work in every mode.
"""

from __future__ import annotations

import numpy as np

from ..._internal.validation import choice, count
from ...errors import InvalidArgumentError

__all__ = ["MERGE_MODES", "DEFAULT_MAX_GROUPS", "DEFAULT_QUANTITY", "flush_bounds",
           "group_bounds"]

#: Flush modes (Trilink paper, §4.3, Table 7).
MERGE_MODES: tuple[str, ...] = ("groups", "quantity", "periodic", "punctuation")
#: Quantity mode's rows per flush when ``quantity`` is not given.
DEFAULT_QUANTITY = 10_000
#: Default bound of the ``"groups"`` mode: buffered (key, slot) groups per partition.
DEFAULT_MAX_GROUPS = 1_000_000

#: Periodic mode: rows ahead of every position checked by one vectorised sweep; a flush that
#: turns out longer is found by a galloping scan from its start (a tuning constant).
_SHORT_REACH = 16
#: First chunk of a galloping scan, in rows (doubled at each step).
_FIRST_CHUNK = 64



def flush_bounds(
    et: np.ndarray, mode: str, quantity: int, delay: float, punct: np.ndarray | None,
    groups: np.ndarray | None = None, max_groups: int = DEFAULT_MAX_GROUPS,
) -> list[int]:
    """End positions (exclusive) of the flushes of one partition's rows, in arrival order.

    Parameters
    ----------
    et : numpy.ndarray
        Event times (float, NaN for none) in arrival order.
    mode : {"quantity", "periodic", "punctuation"}
    quantity : int
        Quantity mode: rows per flush.
    delay : float
        Periodic mode: a flush ends before the first row that makes the largest minus the
        smallest event time of the flush exceed ``delay`` (rows without a time never do).
    punct : numpy.ndarray of bool, optional
        Punctuation mode: a flush ends after each row where it is true.
    groups : numpy.ndarray of int, optional
        Groups mode: each row's (key, slot) group code.
    max_groups : int
        Groups mode: a flush ends before the row that would make it hold more groups.

    Returns
    -------
    list of int
        Increasing ends; the last is ``len(et)`` (none for no rows).

    Notes
    -----
    Cost: O(n) numpy work in every mode, with no Python step per row. Periodic mode makes one
    vectorised sweep that finds, for every row, where a flush starting there ends when that is
    within a few rows; a walk over the flushes (one Python step each) then takes those, and
    scans ahead of a longer flush's start in chunks that double (a galloping search), so each
    row is scanned O(1) times whatever the order of the event times.

    Examples
    --------
    >>> flush_bounds(np.arange(5.0), "quantity", 2, 0.0, None)
    [2, 4, 5]
    >>> flush_bounds(np.array([0.0, 1, 5, 6, 20]), "periodic", 0, 4.0, None)
    [2, 4, 5]
    >>> flush_bounds(np.zeros(6), "groups", 0, 0.0, None, np.array([0, 1, 0, 2, 1, 0]), 2)
    [3, 5, 6]
    """
    choice(mode, "mode", MERGE_MODES)
    if mode == "quantity":
        count(quantity, "quantity")
    if mode == "groups":
        count(max_groups, "max_groups")
    n = len(et)
    if n == 0:
        return []
    if mode == "quantity":
        bounds = list(range(quantity, n, quantity))
    elif mode == "groups":
        if groups is None or len(groups) != n:
            raise InvalidArgumentError("groups mode needs a group code per row")
        bounds = group_bounds(np.asarray(groups, dtype=np.int64), max_groups)
    elif mode == "punctuation":
        ends = np.flatnonzero(punct) + 1 if punct is not None else np.zeros(0, dtype=np.int64)
        bounds = [int(e) for e in ends[ends < n]]
    else:  # periodic
        if not delay >= 0:
            raise InvalidArgumentError(f"delay must be >= 0, got {delay!r}")
        bounds = _periodic_bounds(np.asarray(et, dtype=np.float64), float(delay))
    return bounds + [n]


def group_bounds(codes: np.ndarray, max_groups: int) -> list[int]:
    """Groups-mode flush starts after the first row: each flush is as long as it can be with
    at most ``max_groups`` distinct codes. O(n log n): one stable sort for each row's previous
    occurrence, then a galloping scan per flush (a window that doubles until it holds the
    first code beyond the bound), so each row is scanned O(1) times."""
    n = len(codes)
    order = np.argsort(codes, kind="stable")
    prev = np.full(n, -1, dtype=np.int64)
    same = codes[order[1:]] == codes[order[:-1]]
    prev[order[1:][same]] = order[:-1][same]
    bounds: list[int] = []
    start = 0
    while start < n:
        width = max(_FIRST_CHUNK, 2 * max_groups)
        while True:
            fresh = np.flatnonzero(prev[start:start + width] < start)
            if len(fresh) > max_groups:
                end = start + int(fresh[max_groups])
                break
            if start + width >= n:
                end = n
                break
            width *= 2
        if end < n:
            bounds.append(end)
        start = end
    return bounds


def _periodic_bounds(et: np.ndarray, delay: float) -> list[int]:
    """Periodic flush starts after the first row (see :func:`flush_bounds`)."""
    n = len(et)
    top = np.where(np.isnan(et), -np.inf, et)  # a row without a time never raises the max
    bottom = np.where(np.isinf(top), np.inf, top)  # nor lowers the min
    with np.errstate(invalid="ignore"):  # inf - inf: no spread, as NaN > delay is false
        short = _short_ends(top, bottom, delay)
        bounds: list[int] = []
        start = 0
        while start < n:
            step = short[start]
            start = start + step if step else _scan_end(top, bottom, start, delay)
            if start < n:
                bounds.append(start)
    return bounds


def _short_ends(top: np.ndarray, bottom: np.ndarray, delay: float) -> list[int]:
    """For every row i, the d <= _SHORT_REACH such that a flush starting at i ends before row
    i + d, or 0 when it does not end within that reach (one sweep per d, over the rows still
    open; O(n * _SHORT_REACH) at most)."""
    n = len(top)
    ends = np.zeros(n, dtype=np.int64)
    idx = np.arange(n)
    hi, lo = top.copy(), bottom.copy()
    still = np.ones(n, dtype=bool)  # aligned with idx: not ended yet
    contiguous = True  # idx is still 0..len-1, so row i + d is a slice
    for d in range(1, min(_SHORT_REACH, n - 1) + 1):
        k = n - d if contiguous else int(np.searchsorted(idx, n - d))
        idx, hi, lo, still = idx[:k], hi[:k], lo[:k], still[:k]
        ahead = slice(d, d + k) if contiguous else idx + d
        np.maximum(hi, top[ahead], out=hi)
        np.minimum(lo, bottom[ahead], out=lo)
        over = (hi - lo) > delay
        over &= still
        ends[idx[over]] = d
        still &= ~over
        left = int(np.count_nonzero(still))
        if not left:
            break
        if left < k // 2:  # drop the ended rows once they are most
            idx, hi, lo, still = idx[still], hi[still], lo[still], still[still]
            contiguous = False
    result: list[int] = ends.tolist()
    return result


def _scan_end(top: np.ndarray, bottom: np.ndarray, start: int, delay: float) -> int:
    """Where a flush starting at ``start`` ends: scans chunks of doubling size (galloping),
    O(length of the flush); ``len(top)`` when it runs to the end."""
    n = len(top)
    hi, lo = -np.inf, np.inf
    begin, size = start, _FIRST_CHUNK
    while begin < n:
        stop = min(n, begin + size)
        run_hi = np.maximum.accumulate(top[begin:stop])
        np.maximum(run_hi, hi, out=run_hi)
        run_lo = np.minimum.accumulate(bottom[begin:stop])
        np.minimum(run_lo, lo, out=run_lo)
        over = np.flatnonzero(run_hi - run_lo > delay)
        if len(over):
            return begin + int(over[0])
        hi, lo = float(run_hi[-1]), float(run_lo[-1])
        begin, size = stop, size * 2
    return n
