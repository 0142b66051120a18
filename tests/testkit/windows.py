"""Oracles of keyed tumbling windows, computed with pandas or plain Python from the rows
themselves."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np
import pandas as pd

from trilink_spark.keyed.semantics.keys import NULL_KEY

#: The window size of :func:`window_model`.
SIZE = 10.0


def window_oracle(rows: pd.DataFrame, size: int, value: str, key: str = "sensor") -> pd.DataFrame:
    """``count`` and ``sum`` of ``value`` per (``key``, ``window_start``) over tumbling windows
    of ``size`` on ``rows["t"]``, every window with a row (lateness not applied)."""
    start = (rows["t"] // size) * size
    grouped = rows.assign(window_start=start).groupby([key, "window_start"])[value]
    return grouped.agg(["count", "sum"]).reset_index()


def is_null_key(key: Any) -> bool:
    """The null key as a model or a result holds it (None, NULL_KEY or any NaN)."""
    return key is None or key is NULL_KEY or (isinstance(key, float) and math.isnan(key))


def window_model(frames: list[pd.DataFrame]) -> dict[tuple[Any, float], tuple[Any, ...]]:
    """Per (key, window start): rows, then sum, min, max and mean of the values that are
    neither null nor NaN; null and NaN keys are one null key; rows without a time dropped."""
    windows: dict[tuple[Any, float], list[Any]] = defaultdict(list)
    counts: dict[tuple[Any, float], int] = defaultdict(int)
    for frame in frames:
        for k, t, v in zip(frame["k"], frame["t"], frame["v"]):
            if t is None or (isinstance(t, float) and math.isnan(t)):
                continue
            start = math.floor(t / SIZE) * SIZE + 0.0 if math.isfinite(t) else t
            key = (None if is_null_key(k) else k, start)
            counts[key] += 1
            if v is not None and v is not pd.NA and not (isinstance(v, float) and math.isnan(v)):
                windows[key].append(float(v))
    out = {}
    for key, n in counts.items():
        vals = windows[key]
        with np.errstate(invalid="ignore"):
            row = (float(np.sum(vals)), min(vals), max(vals), float(np.mean(vals))) \
                if vals else (None,) * 4
        # the output has NaN for "no value" (inf - inf is NaN too)
        out[key] = (n, *[None if x is None or math.isnan(x) else x for x in row])
    return out


def emitted_windows(got: pd.DataFrame) -> dict[tuple[Any, float], tuple[Any, ...]]:
    """An output of KeyedWindowAggregate as window_model gives it; a window emitted twice
    or a -0.0 start fails."""
    out: dict[tuple[Any, float], tuple[Any, ...]] = {}
    for row in got.itertuples(index=False):
        key = (None if is_null_key(row.k) else row.k, float(row.window_start))
        assert key not in out, f"window {key} emitted twice"
        assert math.copysign(1.0, key[1]) == 1.0 or key[1] != 0.0, "a -0.0 window start"
        vals = [None if isinstance(x, float) and math.isnan(x) else float(x)
                for x in (row.sum, row.min, row.max, row.mean)]
        out[key] = (int(row.count), *vals)
    return out


def assert_same_windows(got: dict[Any, tuple[Any, ...]],
                        want: dict[Any, tuple[Any, ...]]) -> None:
    """Each window of ``want`` in ``got`` with the same values (floats to 1e-12)."""
    assert got.keys() == want.keys()
    for key, row in want.items():
        for a, b in zip(got[key], row):
            assert (a is None and b is None) or (a is not None and b is not None and (
                a == b or math.isclose(a, b, rel_tol=1e-12))), (key, got[key], row)


def hostile_window_frames(seed: int, batches: tuple[int, int] = (1, 5),
                          long_key: int = 1000) -> list[pd.DataFrame]:
    """Seeded batches of ``k``, ``t``, ``v`` rows for window_model: null, empty, emoji,
    ``long_key``-character and "NaN" string keys; event times at -0.0, window bounds, tiny,
    huge and NaN; values NaN, null, +-inf, 0 and 1e300. ``batches``: the range of their
    number (high exclusive)."""
    nan, inf = float("nan"), float("inf")
    rng = np.random.default_rng(seed)
    pool = [None, "", "😀", "a", "b" * long_key, "NaN"]
    frames = []
    for _ in range(int(rng.integers(*batches))):
        n = int(rng.integers(0, 40))
        t = rng.choice([-0.0, 0.0, 5.0, 9.999, 10.0, -10.0, -1e-300, 25.0, nan, 1e15], n)
        v = rng.choice([nan, 1.0, -2.5, inf, -inf, 0.0, 1e300], n).astype(object)
        v[rng.random(n) < 0.2] = None
        keys = [pool[i] for i in rng.integers(0, len(pool), n)]
        frames.append(pd.DataFrame({"k": keys, "t": t.astype(np.float64), "v": v}))
    return frames
