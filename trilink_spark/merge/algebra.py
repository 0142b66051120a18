"""Partial aggregates that merge exactly: the common language of Local Merge and Global Merge.

An aggregate is named and applied to a column: ``{"total": ("sum", "amount")}``. Each has a
*partial* form, a few columns that two partials of the same group combine into one, and a
*final* form. :func:`partial_frame` computes partials of raw rows (pandas, vectorised per
group); :func:`merge_partial_frames` combines partials (pandas); :func:`merge_partials`
combines them with Spark. Aggregating partials of any split of the rows gives exactly what
aggregating the rows gives.

=============== =========================================== ===============================
aggregate       partial columns                             final
=============== =========================================== ===============================
count           ``name`` (rows)                             sum
sum             ``name``, ``name__n`` (non-null values)     sum, null when no values
min / max       ``name``                                    min / max
mean            ``name__sum``, ``name__n``                  sum / n
first / last    ``name``, ``name__t`` (event time),         the value at the smallest /
                ``name__p`` (arrival position)              largest (time, position)
:class:`Combine` ``name``                                   the combine over the partials
=============== =========================================== ===============================

Nulls in the value column are skipped, as Spark skips them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..errors import InvalidArgumentError, InvalidArgumentTypeError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["AGGREGATES", "AggSpec", "Combine", "parse_aggs", "merge_partials"]

#: Built-in aggregates.
AGGREGATES: tuple[str, ...] = ("count", "sum", "min", "max", "mean", "first", "last")
TIME = "__t"
POS = "__p"


@dataclass(frozen=True)
class Combine:
    """A user-defined associative, commutative combine, e.g. ``Combine(np.bitwise_or.reduce)``.

    ``func`` receives a numpy array of a group's non-null values (or partial results) and
    returns one value of ``dtype`` (a Spark type name). Applied once per group, in Python.
    """

    func: Callable[[np.ndarray], Any]
    dtype: str = "double"

    def __post_init__(self) -> None:
        if not callable(self.func):
            raise InvalidArgumentTypeError("Combine.func must be callable")


@dataclass(frozen=True)
class AggSpec:
    """One aggregate: output ``name``, ``func`` (a name or a Combine), input ``column``."""

    name: str
    func: str | Combine
    column: str | None

    @property
    def partial_columns(self) -> list[str]:
        if self.func == "sum":
            return [self.name, f"{self.name}__n"]
        if self.func == "mean":
            return [f"{self.name}__sum", f"{self.name}__n"]
        if self.func in ("first", "last"):
            return [self.name, self.name + TIME, self.name + POS]
        return [self.name]

    def final_type(self, value_type: str) -> str:
        """Spark type of the final value, given the Spark type of the aggregated column."""
        if isinstance(self.func, Combine):
            return self.func.dtype
        if self.func == "count":
            return "bigint"
        if self.func in ("sum", "mean"):
            return "double"
        return value_type

    def partial_types(self, value_type: str) -> list[str]:
        if isinstance(self.func, Combine):
            return [self.func.dtype]
        return {
            "count": ["bigint"],
            "sum": ["double", "bigint"],
            "min": [value_type],
            "max": [value_type],
            "mean": ["double", "bigint"],
            "first": [value_type, "double", "bigint"],
            "last": [value_type, "double", "bigint"],
        }[self.func]


def _agg_items(aggs: Any) -> list[tuple[Any, ...]]:
    """``aggs`` as ``(name, func, column)`` tuples (a mapping or a sequence of tuples)."""
    if isinstance(aggs, Mapping):
        return [(name, *spec) if isinstance(spec, tuple) else (name, spec, None)
                for name, spec in aggs.items()]
    if isinstance(aggs, Sequence) and not isinstance(aggs, str):
        return [tuple(a) for a in aggs]
    raise InvalidArgumentTypeError("aggs must be {name: (func, column)} or [(name, func, column)]")


def parse_aggs(aggs: Any, columns: Sequence[str]) -> list[AggSpec]:
    """Validate ``aggs``: a mapping ``{name: (func, column)}`` (``column`` may be None for
    count) or a sequence of ``(name, func, column)``."""
    items = _agg_items(aggs)
    if not items:
        raise InvalidArgumentError("aggs is empty; give at least one aggregate")
    out = []
    for item in items:
        if len(item) != 3:
            raise InvalidArgumentError(f"aggregate {item!r} must be (name, func, column)")
        name, func, column = item
        if not isinstance(name, str) or not name or "__" in name:
            raise InvalidArgumentError(f"aggregate name {name!r} must be a str without '__'")
        if not isinstance(func, Combine) and func not in AGGREGATES:
            raise InvalidArgumentError(
                f"unknown aggregate {func!r} for {name!r}; choose from {AGGREGATES} or a Combine"
            )
        if column is None and func != "count":
            raise InvalidArgumentError(f"aggregate {name!r} ({func}) needs a column")
        if column is not None and column not in columns:
            raise InvalidArgumentError(f"column {column!r} of aggregate {name!r} is not in {list(columns)}")
        out.append(AggSpec(name, func, column))
    names = [a.name for a in out]
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"aggregate names repeat: {names}")
    return out


# ---------------------------------------------------------------------- pandas side
def partial_frame(
    rows: pd.DataFrame, groups: list[str], specs: list[AggSpec], time_col: str, pos_col: str
) -> pd.DataFrame:
    """Partials of raw rows grouped by ``groups`` (vectorised: one group-by per aggregate)."""
    grouped = rows.groupby(groups, sort=False, dropna=False)
    out = pd.DataFrame({time_col: grouped[time_col].max()})
    for spec in specs:
        if spec.func == "count":
            out[spec.name] = grouped.size()
            continue
        col = grouped[str(spec.column)]
        if spec.func == "sum":
            out[spec.name] = col.sum(min_count=1)
            out[f"{spec.name}__n"] = col.count()
        elif spec.func == "mean":
            out[f"{spec.name}__sum"] = col.sum(min_count=1)
            out[f"{spec.name}__n"] = col.count()
        elif spec.func in ("min", "max"):
            out[spec.name] = getattr(col, spec.func)()
        elif spec.func in ("first", "last"):
            _first_last(rows, groups, spec, time_col, pos_col, out)
        else:
            func = spec.func.func  # type: ignore[union-attr]
            out[spec.name] = col.agg(_combine_group(func))
    return out.reset_index()


def _combine_group(func: Callable[[np.ndarray], Any]) -> Callable[[pd.Series], Any]:
    def run(values: pd.Series) -> Any:
        present = values.dropna()
        return func(present.to_numpy()) if len(present) else np.nan

    return run


def _first_last(rows: pd.DataFrame, groups: list[str], spec: AggSpec, time_col: str,
                pos_col: str, out: pd.DataFrame) -> None:
    present = rows[rows[spec.column].notna()]
    ascending = spec.func == "first"
    ordered = present.sort_values([time_col, pos_col], ascending=ascending, kind="stable")
    picked = ordered.drop_duplicates(groups, keep="first").set_index(groups)
    out[spec.name] = picked[spec.column]
    out[spec.name + TIME] = picked[time_col].astype(np.float64)
    out[spec.name + POS] = picked[pos_col]


def merge_partial_frames(
    parts: pd.DataFrame, groups: list[str], specs: list[AggSpec], time_col: str | None
) -> pd.DataFrame:
    """Combine partial rows of the same group into one (pandas)."""
    grouped = parts.groupby(groups, sort=False, dropna=False)
    out = pd.DataFrame(index=grouped.size().index)
    if time_col is not None:
        out[time_col] = grouped[time_col].max()
    for spec in specs:
        if spec.func == "count":
            out[spec.name] = grouped[spec.name].sum()
        elif spec.func == "sum":
            out[spec.name] = grouped[spec.name].sum(min_count=1)
            out[f"{spec.name}__n"] = grouped[f"{spec.name}__n"].sum()
        elif spec.func == "mean":
            out[f"{spec.name}__sum"] = grouped[f"{spec.name}__sum"].sum(min_count=1)
            out[f"{spec.name}__n"] = grouped[f"{spec.name}__n"].sum()
        elif spec.func in ("min", "max"):
            out[spec.name] = getattr(grouped[spec.name], spec.func)()
        elif spec.func in ("first", "last"):
            present = parts[parts[spec.name + TIME].notna()]
            ordered = present.sort_values([spec.name + TIME, spec.name + POS],
                                          ascending=spec.func == "first", kind="stable")
            picked = ordered.drop_duplicates(groups, keep="first").set_index(groups)
            for suffix in ("", TIME, POS):
                out[spec.name + suffix] = picked[spec.name + suffix]
        else:
            func = spec.func.func  # type: ignore[union-attr]
            out[spec.name] = grouped[spec.name].agg(_combine_group(func))
    return out.reset_index()


def finalize_frame(merged: pd.DataFrame, groups: list[str], specs: list[AggSpec]) -> pd.DataFrame:
    """Final values from fully merged partials (pandas)."""
    out = merged[groups].copy()
    for spec in specs:
        if spec.func == "mean":
            n = merged[f"{spec.name}__n"]
            out[spec.name] = (merged[f"{spec.name}__sum"] / n).where(n > 0)
        elif spec.func == "sum":
            out[spec.name] = merged[spec.name].where(merged[f"{spec.name}__n"] > 0)
        else:
            out[spec.name] = merged[spec.name]
    return out


# ---------------------------------------------------------------------- Spark side
def merge_partials(
    df: DataFrame, key: str | Sequence[str], aggs: Any, *, keep_partials: bool = False
) -> DataFrame:
    """Final aggregates from partial rows (output of local_merge), grouped by ``key``.

    Parameters
    ----------
    df : pyspark.sql.DataFrame
        Partial rows, e.g. from :func:`~trilink_spark.local_merge`.
    key : str or sequence of str
        Grouping columns (add ``"slot_start"`` to keep time slots apart).
    aggs
        The same aggregates given to ``local_merge``.

    Returns
    -------
    pyspark.sql.DataFrame
        One row per group: the keys, then one column per aggregate.

    Notes
    -----
    Cost: one ``groupBy`` (Spark's hash aggregation, map-side combined). Built-in aggregates
    merge in the JVM; a :class:`Combine` runs in Python per group (``applyInPandas``).

    Examples
    --------
    >>> totals = tl.merge_partials(tl.local_merge(df, "k", "ts", 60, aggs), "k", aggs)  # doctest: +SKIP
    """
    from pyspark.sql import functions as F

    keys = [key] if isinstance(key, str) else list(key)
    specs = _specs_for_partials(aggs)
    if any(isinstance(spec.func, Combine) for spec in specs):
        return _merge_with_pandas(df, keys, specs)
    exprs = []
    for spec in specs:
        n = spec.name
        if spec.func == "count":
            exprs.append(F.sum(n).cast("bigint").alias(n))
        elif spec.func == "sum":
            total = F.sum(n)
            exprs.append(F.when(F.sum(f"{n}__n") > 0, total).alias(n))
        elif spec.func == "mean":
            exprs.append((F.sum(f"{n}__sum") / F.sum(f"{n}__n")).alias(n))
        elif spec.func in ("min", "max"):
            exprs.append(getattr(F, spec.func)(n).alias(n))
        elif spec.func in ("first", "last"):
            order = F.struct(F.col(n + TIME), F.col(n + POS))
            pick = F.min_by if spec.func == "first" else F.max_by
            exprs.append(pick(F.col(n), F.when(F.col(n + TIME).isNotNull(), order)).alias(n))
    return df.groupBy(*keys).agg(*exprs)


def _specs_for_partials(aggs: Any) -> list[AggSpec]:
    """Parse aggregates without checking input columns (partials carry other names)."""
    items = _agg_items(aggs)
    return parse_aggs([(n, f, None if f == "count" else "_") for n, f, _c in items], ["_"])


def _merge_with_pandas(df: DataFrame, keys: list[str], specs: list[AggSpec]) -> DataFrame:
    """The same merge in pandas per group, for aggregates with a Python Combine."""
    # the partial column of min/max/first/last has the input column's type
    fields = [f"`{k}` {df.schema[k].dataType.simpleString()}" for k in keys]
    for spec in specs:
        value_type = (df.schema[spec.name].dataType.simpleString()
                      if spec.name in df.columns else "double")
        fields.append(f"`{spec.name}` {spec.final_type(value_type)}")

    def merge(pdf: pd.DataFrame) -> pd.DataFrame:
        merged = merge_partial_frames(pdf, keys, specs, None)
        return finalize_frame(merged, keys, specs)

    return df.groupBy(*keys).applyInPandas(merge, ", ".join(fields))
