"""Compare Spark results as plain rows: values made comparable, rows in a fixed order."""

from __future__ import annotations

import math
from typing import Any


def canon(value: Any) -> Any:
    """``value`` made comparable: a float rounded to 9 places (``-0.0`` as ``0.0``, NaN as
    ``"NaN"``), a list as its canonical values sorted (collect_set order is free), anything
    else as it is."""
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else round(value, 9) + 0.0
    if isinstance(value, list):
        return sorted((canon(v) for v in value), key=repr)
    return value


def rows(df: Any) -> list[tuple[Any, ...]]:
    """The rows of a Spark DataFrame, each value through :func:`canon`, sorted (by ``repr``):
    two results are equal as sets of rows whatever their order."""
    return sorted((tuple(canon(x) for x in row) for row in df.collect()), key=repr)


def sketch_values(spark: Any) -> Any:
    """6,000 rows ``(k, v)`` over 6 keys in 4 partitions (seed 7): a frame on which exact
    placement and Spark's combine give other ``percentile_approx`` results."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(7)
    frame = pd.DataFrame({"k": rng.integers(0, 6, 6000).astype(np.int64),
                          "v": rng.integers(0, 1000, 6000).astype(np.int64)})
    return spark.createDataFrame(frame).repartition(4)
