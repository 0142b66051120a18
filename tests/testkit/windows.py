"""Oracles of keyed tumbling windows, computed with pandas from the rows themselves."""

from __future__ import annotations

import pandas as pd


def window_oracle(rows: pd.DataFrame, size: int, value: str, key: str = "sensor") -> pd.DataFrame:
    """``count`` and ``sum`` of ``value`` per (``key``, ``window_start``) over tumbling windows
    of ``size`` on ``rows["t"]``, every window with a row (lateness not applied)."""
    start = (rows["t"] // size) * size
    grouped = rows.assign(window_start=start).groupby([key, "window_start"])[value]
    return grouped.agg(["count", "sum"]).reset_index()
