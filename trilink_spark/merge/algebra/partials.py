"""Partial frames: partials of raw rows and their merge, in pandas, Arrow and Spark.

:func:`partial_frame` (:func:`partial_groups`) computes partials of raw rows (pandas,
vectorised per group), :func:`arrow_partials` the same with Arrow's hash aggregation;
:func:`merge_partial_frames` combines partial rows of a group and :func:`finalize_frame` gives
the final values (pandas); :func:`merge_partials` combines them with Spark. Each aggregate
computes its own columns (its class in :mod:`~trilink_spark.merge.algebra.aggregates`, the table of
partial columns there); aggregating partials of any split of the rows gives exactly what
aggregating the rows gives.

Examples
--------
>>> import pandas as pd
>>> rows = pd.DataFrame({"k": [1, 1, 2], "v": [1.0, 3.0, None], "t": [0.0, 1.0, 2.0],
...                      "p": [0, 1, 2]})
>>> specs = parse_aggs({"s": ("sum", "v"), "m": ("mean", "v")}, rows.columns)
>>> parts = partial_frame(rows, ["k"], specs, "t", "p")
>>> finalize_frame(merge_partial_frames(parts, ["k"], specs, None), ["k"], specs)
   k    s    m
0  1  4.0  2.0
1  2  NaN  NaN
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from ...columns import INTERNAL_PREFIX, column_of, python_input, quoted
from ..._internal.spark.executors import ensure_executors
from .expressions import AggSpec, parse_aggs, specs_for_partials  # parse_aggs: the examples
from .kernels import Groups
from ..._internal.validation import refuse_streaming

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "arrow_partials",
    "finalize_frame",
    "merge_partial_frames",
    "merge_partials",
    "partial_frame",
    "partial_groups",
]


# ---------------------------------------------------------------------- pandas side
def partial_groups(
    rows: pd.DataFrame, by: Sequence[Any], specs: list[AggSpec], time_col: str, pos_col: str
) -> pd.DataFrame:
    """Partials of raw rows grouped by ``by`` (column names or arrays), indexed by group.

    Columns: ``time_col`` (the largest per group), then each aggregate's partial columns.
    Groups come in order of first appearance.

    Notes
    -----
    Cost: one hash group-by, then one vectorised reduction per partial column (first/last: one
    sort of the rows; a Combine: one Python call per group).

    Examples
    --------
    >>> rows = pd.DataFrame({"k": [1, 1], "t": [0.0, 5.0], "p": [0, 1]})
    >>> partial_groups(rows, ["k"], parse_aggs({"n": ("count", None)}, ["k"]), "t", "p")
         t  n
    k
    1  5.0  2
    """
    groups = Groups.of(rows, by)
    out = pd.DataFrame({time_col: groups.grouped[time_col].max()})
    for spec in specs:
        for column, values in spec.aggregate.init(groups, time_col, pos_col).items():
            out[column] = values
    return out


def partial_frame(
    rows: pd.DataFrame, groups: list[str], specs: list[AggSpec], time_col: str, pos_col: str
) -> pd.DataFrame:
    """Partials of raw rows grouped by the columns ``groups`` (:func:`partial_groups`, with
    the group columns first)."""
    return partial_groups(rows, groups, specs, time_col, pos_col).reset_index()


def merge_partial_frames(
    parts: pd.DataFrame, groups: list[str], specs: list[AggSpec], time_col: str | None
) -> pd.DataFrame:
    """Combine partial rows of the same group into one (pandas).

    Notes
    -----
    Cost: one hash group-by of ``parts``, one vectorised reduction per partial column.

    Examples
    --------
    >>> parts = pd.DataFrame({"k": [1, 1], "n": [2, 3]})
    >>> merge_partial_frames(parts, ["k"], parse_aggs({"n": ("count", None)}, []), None)
       k  n
    0  1  5
    """
    grouped = Groups.of(parts, groups)
    out = pd.DataFrame(index=grouped.index)
    if time_col is not None:
        out[time_col] = grouped.grouped[time_col].max()
    for spec in specs:
        for column, values in spec.aggregate.merge(grouped).items():
            out[column] = values
    return out.reset_index()


def finalize_frame(merged: pd.DataFrame, groups: list[str], specs: list[AggSpec]) -> pd.DataFrame:
    """Final values from fully merged partials (pandas; vectorised, O(rows))."""
    out = merged[groups].copy()
    for spec in specs:
        out[spec.name] = spec.aggregate.finalize(merged)
    return out


# ---------------------------------------------------------------------- Arrow side
def arrow_partials(
    table: Any, by: Sequence[str], specs: list[AggSpec], time_col: str, merging: bool = False
) -> Any:
    """Partials of ``table`` (raw rows, or partial rows when ``merging``) grouped by the
    columns ``by``, with Arrow's hash aggregation; None when an aggregate has no Arrow form
    for its input (first, last, a Combine, decimal sums: use :func:`partial_groups`).

    The result has the ``by`` columns, ``time_col`` (the largest per group) and each
    aggregate's partial columns; nulls are a group of their own. Groups come in no set order
    (Arrow keeps first appearance for one key column, not for several). Sums and means are
    over doubles (integral sums exactly, in int64).

    Notes
    -----
    Cost: one single-threaded Arrow hash aggregation, O(rows), plus O(groups) to finish;
    nothing per row in Python.

    Examples
    --------
    >>> import pyarrow as pa
    >>> rows = pa.table({"k": [1, 1, 2], "t": [0.0, 5.0, 1.0], "v": [2, 3, None]})
    >>> specs = parse_aggs({"s": ("sum", "v")}, ["k", "v"])
    >>> arrow_partials(rows, ["k"], specs, "t").to_pydict()
    {'k': [1, 2], 't': [5.0, 1.0], 's': [5, None], 's__n': [2, 0]}
    """
    import pyarrow as pa

    plans = []
    for spec in specs:
        steps = spec.aggregate.arrow_steps(table, merging)
        if steps is None:
            return None
        plans.append(steps)
    names = [*by, time_col]
    arrays = [table[c] for c in names]
    aggs: list[tuple[Any, ...]] = [(time_col, "max")]
    outputs: list[list[str]] = []
    for i, steps in enumerate(plans):
        outputs.append([])
        for j, step in enumerate(steps):
            name = f"{INTERNAL_PREFIX}a{i}_{j}"
            names.append(name)
            arrays.append(step.values)
            aggs.append((name, step.func) if step.options is None
                        else (name, step.func, step.options))
            outputs[-1].append(f"{name}_{step.func}")
    grouped = pa.Table.from_arrays(arrays, names=names).group_by(
        list(by), use_threads=False).aggregate(aggs)
    out = {c: grouped[c] for c in by}
    out[time_col] = grouped[f"{time_col}_max"]
    for spec, results in zip(specs, outputs):
        out.update(spec.aggregate.arrow_finish([grouped[r] for r in results], merging))
    return pa.table(out)


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
    merge in the JVM; a :class:`Combine` runs in Python per group (``applyInPandas``). A mean
    of decimals sums exactly in the JVM and divides as Spark's ``avg`` rounds in Python, one
    call per batch of merged groups (a scalar pandas UDF after the aggregation), typed as
    ``avg`` types it (the input's precision is read from the partial's field metadata, which
    ``local_merge`` writes; without it, the widest precision whose sum has that type).

    Examples
    --------
    >>> totals = tl.merge_partials(tl.local_merge(df, "k", "ts", 60, aggs), "k", aggs)  # doctest: +SKIP
    """
    keys = [key] if isinstance(key, str) else list(key)
    specs = specs_for_partials(aggs, df.columns)
    schema = df.schema
    exprs = [e for e in (spec.aggregate.spark_merge(schema) for spec in specs) if e is not None]
    if len(exprs) < len(specs):  # a Combine merges in Python
        refuse_streaming(df, "merge_partials", "an aggregate with a Python Combine merges each "
                         "micro-batch's partials alone, never with earlier batches' ones")
        return _merge_with_pandas(df, keys, specs)
    return df.groupBy(*[column_of(k) for k in keys]).agg(*exprs)


def _merge_with_pandas(df: DataFrame, keys: list[str], specs: list[AggSpec]) -> DataFrame:
    """The same merge in pandas per group, for aggregates with a Python Combine."""
    fields = [f"{quoted(k)} {df.schema[k].dataType.simpleString()}" for k in keys]
    fields += [f"{quoted(spec.name)} {spec.aggregate.merged_type(df.schema)}" for spec in specs]

    # columns named with a dot or a backtick cross into Python under aliases
    source, aliases = python_input(df)
    inside = {name: alias for alias, name in aliases.items()}

    def merge(pdf: pd.DataFrame) -> pd.DataFrame:
        if aliases:
            pdf = pdf.rename(columns=aliases)
        merged = merge_partial_frames(pdf, keys, specs, None)
        return finalize_frame(merged, keys, specs)

    ensure_executors(df.sparkSession)  # a cluster's executors must import the package
    by = [column_of(inside.get(k, k)) for k in keys]
    return source.groupBy(*by).applyInPandas(merge, ", ".join(fields))
