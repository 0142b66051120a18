"""Flush bounds and per-partition partials stay linear and equal to the plain definitions."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from trilink_spark.columns import ET_COL, POS_COL, PUNCT_COL, SLOT_COL
from trilink_spark.errors import InvalidArgumentError
from trilink_spark.merge.algebra.aggregates import Combine
from trilink_spark.merge.algebra.expressions import parse_aggs
from trilink_spark.merge.algebra.partials import partial_frame
from trilink_spark.merge.engines.bounds import flush_bounds
from trilink_spark.merge.engines.pandas_engine import partition_flushes, partition_partials
from trilink_spark.merge.engines.plan import MergePlan


def rescanning_bounds(et: np.ndarray, delay: float) -> list[int]:
    """The former periodic algorithm: rescan the rest of the rows at every flush (quadratic)."""
    n = len(et)
    bounds, start = [], 0
    filled = np.where(np.isnan(et), -np.inf, et)
    with np.errstate(invalid="ignore"):
        while start < n:
            seg = filled[start:]
            spread = np.maximum.accumulate(seg) - np.minimum.accumulate(
                np.where(np.isinf(seg), np.inf, seg))
            over = np.flatnonzero(spread > delay)
            if not len(over):
                break
            start += int(over[0])
            bounds.append(start)
    return bounds + [n] if n else []


def row_by_row_bounds(et: np.ndarray, delay: float) -> list[int]:
    """The definition, one row at a time: a flush ends before the row that makes its spread of
    event times exceed ``delay`` (rows without a time are ignored)."""
    bounds: list[int] = []
    hi, lo = -np.inf, np.inf
    for i, t in enumerate(et.tolist()):
        if t != t:  # NaN
            continue
        new_hi, new_lo = max(hi, t), min(lo, t)
        if new_hi - new_lo > delay:
            bounds.append(i)
            new_hi = new_lo = t
        hi, lo = new_hi, new_lo
    return bounds + [len(et)] if len(et) else []


@pytest.mark.parametrize("delay", [0.0, 0.001, 0.05, 1.0, 50.0])
def test_periodic_bounds_equal_the_rescanning_reference(delay: float) -> None:
    rng = np.random.default_rng(7)
    et = rng.random(2_000) * 100.0  # shuffled: the case that used to be quadratic
    et[rng.random(2_000) < 0.05] = np.nan
    for times in (et, np.sort(et), np.full(2_000, np.nan), et[:1], et[:0]):
        assert flush_bounds(times, "periodic", 0, delay, None) == rescanning_bounds(times, delay)


def test_periodic_bounds_of_300k_shuffled_rows() -> None:
    rng = np.random.default_rng(11)
    et = rng.permutation(300_000).astype(np.float64) / 1000.0  # shuffled float event times
    bounds = flush_bounds(et, "periodic", 0, 0.5, None)
    assert bounds == row_by_row_bounds(et, 0.5)
    assert bounds[-1] == len(et) and len(bounds) > 100_000  # a flush every few rows
    # and the long-flush path (galloping scans): nearly sorted times, few flushes
    nearly = np.sort(et)
    swaps = rng.integers(0, len(et), 1_000)
    nearly[swaps] = nearly[swaps[::-1]]
    assert flush_bounds(nearly, "periodic", 0, 7.5, None) == row_by_row_bounds(nearly, 7.5)


def test_other_modes_and_bad_arguments() -> None:
    et = np.arange(10.0)
    punct = np.zeros(10, dtype=bool)
    punct[[3, 9]] = True
    assert flush_bounds(et, "punctuation", 0, 0.0, punct) == [4, 10]
    assert flush_bounds(et, "punctuation", 0, 0.0, None) == [10]
    assert flush_bounds(et, "quantity", 3, 0.0, None) == [3, 6, 9, 10]
    with pytest.raises(InvalidArgumentError):
        flush_bounds(et, "periodic", 0, -1.0, None)
    with pytest.raises(InvalidArgumentError):
        flush_bounds(et, "sometimes", 0, 0.0, None)


AGGS = {"n": ("count", None), "s": ("sum", "v"), "lo": ("min", "v"), "hi": ("max", "v"),
        "m": ("mean", "v"), "f": ("first", "v"), "l": ("last", "v"),
        "c": (Combine(np.bitwise_or.reduce, "bigint"), "b")}


def partition(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    et = rng.integers(0, 400, n).astype(np.float64)
    et[rng.random(n) < 0.05] = np.nan
    keys = rng.integers(0, 6, n).astype(np.float64)
    keys[rng.random(n) < 0.03] = np.nan  # a null key is a group too
    v = rng.normal(size=n)
    v[rng.random(n) < 0.2] = np.nan
    return pd.DataFrame({"k": keys, "v": v, "b": rng.integers(0, 64, n),
                         POS_COL: np.arange(n, dtype=np.int64), ET_COL: et,
                         SLOT_COL: np.floor(et / 50.0) * 50.0, PUNCT_COL: rng.random(n) < 0.02})


def plan_of(mode: str, quantity: int = 1, delay: float = 0.0) -> MergePlan:
    specs = parse_aggs(AGGS, ["k", "v", "b"])
    names = ["k", "slot_start", "t"] + [c for s in specs for c in s.partial_columns]
    return MergePlan("k", specs, mode, quantity, delay, "integral", "t", names, None, None)


def ends_of(rows: pd.DataFrame, plan: MergePlan, keep_tail: bool) -> list[int]:
    punct = rows[PUNCT_COL].to_numpy(dtype=bool)
    ends = flush_bounds(rows[ET_COL].to_numpy(), plan.mode, plan.quantity, plan.delay, punct)
    if keep_tail:
        ends = ends[:-1] + ([len(rows)] if plan.mode == "punctuation" and punct[-1] else [])
    return ends


def per_flush(rows: pd.DataFrame, plan: MergePlan, keep_tail: bool) -> list[pd.DataFrame]:
    """The definition: one group-by per flush, its groups in slot order."""
    ends = ends_of(rows, plan, keep_tail)
    out = []
    for start, end in zip([0, *ends[:-1]], ends):
        part = rows.iloc[start:end]
        part = part[part[ET_COL].notna()].assign(slot_start=lambda p: p[SLOT_COL])
        if not len(part):
            continue
        frame = partial_frame(part, ["k", "slot_start"], plan.specs, ET_COL, POS_COL)
        frame = frame.sort_values("slot_start", kind="stable").rename(columns={ET_COL: "t"})
        out.append(frame[plan.names].astype({"t": np.int64, "slot_start": np.int64}))
    return out


@pytest.mark.parametrize("mode, quantity, delay", [
    ("periodic", 1, 0.0), ("periodic", 1, 30.0), ("quantity", 1, 0.0), ("quantity", 97, 0.0),
    ("punctuation", 1, 0.0),
])
@pytest.mark.parametrize("keep_tail", [False, True])
def test_one_group_by_gives_the_flushes_of_one_group_by_each(
    mode: str, quantity: int, delay: float, keep_tail: bool
) -> None:
    rows = partition(300, 3)
    plan = plan_of(mode, quantity, delay)
    want = per_flush(rows, plan, keep_tail)
    got = list(partition_flushes(rows, plan, keep_tail))
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        pd.testing.assert_frame_equal(g.reset_index(drop=True), w.reset_index(drop=True),
                                      check_dtype=False)
    flushed = partition_partials(rows, plan, keep_tail)
    assert flushed.flush.tolist() == [i for i, w in enumerate(want) for _ in range(len(w))]
    assert flushed.consumed == (ends_of(rows, plan, keep_tail) or [0])[-1]


def test_no_rows_and_no_event_times_give_no_flush() -> None:
    plan = plan_of("periodic", delay=5.0)
    assert list(partition_flushes(pd.DataFrame(), plan)) == []
    rows = partition(50, 4).assign(**{ET_COL: np.nan})
    flushed = partition_partials(rows, plan)
    assert len(flushed.frame) == 0 and list(flushed.frame.columns) == plan.names
    assert flushed.consumed == 50
