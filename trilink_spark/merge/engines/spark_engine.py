"""The Spark engine of Local Merge: the same partial rows from Spark's own partial aggregation.

:func:`spark_partials` builds, for Local Merge's Spark engine, a ``groupBy(
spark_partition_id(), key, slot)`` whose aggregates are each aggregate's Spark form of its
partials (:meth:`~trilink_spark.merge.algebra.aggregates.Aggregate.spark_init`): no row crosses into
Python, at the price of one exchange of the partial rows. Batch DataFrames in the groups mode
with count, sum, min, max and mean; :mod:`~trilink_spark.merge.engines.engine` chooses the engine
(the default, ``"auto"``, takes this one wherever it runs the call).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...columns import ET_COL, GROUP_COL, SLOT_COL, column_of
from ...eventtime import MAX_EXACT, event_time_micros, event_time_whole
from .plan import MergePlan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["spark_partials"]


def _value_types(df: DataFrame, plan: MergePlan) -> dict[str, str]:
    """Each aggregate's input column type (Spark's simple string), by aggregate name."""
    return {spec.name: df.schema[spec.column].dataType.simpleString()
            for spec in plan.specs if spec.column is not None}


def spark_partials(df: DataFrame, plan: MergePlan) -> tuple[DataFrame | None, str | None]:
    """:func:`~trilink_spark.local_merge` by Spark's partial aggregation, ``(frame, None)``;
    or ``(None, name)`` of the first aggregate without a Spark form. The frame is ``groupBy(
    spark_partition_id(), key, slot)`` over the key, the aggregated columns and the event
    time, each slot
    ``et - pmod(et, slot)`` as the Python engine computes it (in longs for a timestamp or
    integral event time and a whole slot, which is exact there; else in doubles), rows
    without a finite event time in the null slot; the output has the Python engine's schema
    (``plan.out_schema``). A plan, no job."""
    from pyspark.sql import functions as F

    types = _value_types(df, plan)
    size = float(plan.slot_units)
    exact = size.is_integer() and size <= MAX_EXACT
    whole = event_time_whole(df, plan.time_name) if exact else None
    if whole is not None:
        et = whole
        # the exact start, a long (grouped faster than a double); below -2**53 (the first
        # slot of the most negative times) rounded as the Python engine's pmod in doubles
        # rounds it (-2**53 - 1 is no double); a slot longer than 2**53: in doubles
        start = et - F.pmod(et, F.lit(int(size)))
        slot = F.when(start < F.lit(-MAX_EXACT), start.cast("double").cast("long")) \
            .otherwise(start)
    else:
        et = event_time_micros(df, plan.time_name)[0]
        et = F.when(~F.isnan(et) & (F.abs(et) < F.lit(float("inf"))), et)  # finite, else null
        slot = et - F.pmod(et, F.lit(size))
    exprs: list[Any] = [F.max(F.col(ET_COL)).alias(ET_COL)]
    for spec in plan.specs:
        value = None if spec.column is None else column_of(spec.column)
        parts = spec.aggregate.spark_init(value, types.get(spec.name, "bigint"))
        if parts is None:
            return None, spec.name
        exprs += parts
    values = [column_of(c) for c in dict.fromkeys(
        [plan.key, *(s.column for s in plan.specs if s.column is not None)])]
    source = df.select(*values, et.alias(ET_COL), slot.alias(SLOT_COL))
    grouped = source.groupBy(F.spark_partition_id().alias(GROUP_COL), column_of(plan.key),
                             F.col(SLOT_COL)).agg(*exprs)
    # the key, the slot and the event time by position: a key may be named like the others
    leading = [column_of(plan.key), _spark_times(F.col(SLOT_COL), plan.time_kind),
               _spark_times(F.col(ET_COL), plan.time_kind)]
    out = []
    for i, field_ in enumerate(plan.out_schema.fields):
        column = leading[i] if i < len(leading) else column_of(field_.name)
        out.append(column.cast(field_.dataType).alias(field_.name, metadata=field_.metadata))
    return grouped.select(*out), None


def _spark_times(units: Any, kind: str) -> Any:
    """A Spark column of event-time units (longs, or doubles; null for none) as the column's
    kind, as the Arrow engine makes them: doubles, integers rounded half to even,
    timestamps from whole microseconds."""
    from pyspark.sql import functions as F

    if kind == "fractional":
        return units
    whole = F.bround(units, 0).cast("bigint")
    return F.timestamp_micros(whole) if kind == "timestamp" else whole
