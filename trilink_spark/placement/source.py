"""Ahead KeyBy, reading side: keyed processing on rows the source already grouped by key.

When producers placed every key on one Kafka partition
(:func:`~trilink_spark.placement.ahead_key_by`) and the job reads one Spark partition per Kafka
partition (``trilink-kafka``), every key is already whole on one input partition.
:func:`keyed_by_source` declares that; :func:`~trilink_spark.keyed_agg`,
:func:`~trilink_spark.keyed_apply` and :func:`~trilink_spark.keyed_process` then work inside each
input partition, with **no shuffle exchange** (Trilink paper, §4.3 (3), Figure 11 (d)).

Spark cannot be told that an input is grouped by a column (its Python data sources report no
partitioning), so a ``groupBy`` would always add an exchange. Here the work is done per
partition instead: the aggregate arguments are computed in the JVM, then Arrow's hash
aggregation groups the partition (:func:`source_agg`); ``keyed_apply`` groups it with pandas.

The declaration is kept in the key column's metadata, so it survives ``select``, ``filter`` and
``withColumn``. A shuffle after it (e.g. a ``repartition``) voids it: the keyed operators refuse
such a frame instead of returning wrong results.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..columns import ARG_COL, PARTITION_COL, column_of, python_input, require_columns
from .._internal.spark.compat import is_connect
from .._internal.spark.executors import ensure_executors
from ..errors import InvalidArgumentError, InvalidArgumentTypeError, KeysNotGroupedError
from .._internal.validation import refuse_streaming
from ..merge.algebra.aggregates import arrow_aggregates
from ..merge.algebra.kernels import decimal_means, decimal_sums, join_halves
from .._internal.spark.plan import shuffle_exchanges

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

__all__ = [
    "in_place",
    "keyed_by_source",
    "is_keyed_by_source",
    "check_source_layout",
    "source_agg",
    "source_apply",
    "SOURCE_AGGREGATES",
]

_MARK = "trilink_spark.keyed_by_source"
#: The row numbers of a partition, for the aggregates computed outside Arrow.
_ROW = f"{ARG_COL}row"
#: :func:`source_apply`'s exact grouping of a numeric key: whether it is null, and its value.
_KEY_NULL = f"{ARG_COL}key_null"
_KEY_VALUE = f"{ARG_COL}key_value"

#: Spark aggregate functions :func:`source_agg` computes per partition (Arrow hash aggregates),
#: as the aggregate classes of :mod:`~trilink_spark.merge.algebra.aggregates` name them.
SOURCE_AGGREGATES: dict[str, str] = arrow_aggregates()


def keyed_by_source(df: DataFrame, key: str, *, verify: bool = False,
                    max_examples: int = 10) -> DataFrame:
    """Declare that every key of ``df`` is whole on one input partition.

    Parameters
    ----------
    df : pyspark.sql.DataFrame
        Typically a ``trilink-kafka`` read of a topic written with
        :func:`~trilink_spark.placement.ahead_key_by`, after parsing key and value.
    key : str
        The key column the producers placed by.
    verify : bool
        Check the claim first: one Spark job finds keys present in two input partitions and
        raises :class:`~trilink_spark.errors.KeysNotGroupedError` naming them (up to
        ``max_examples``). Batch DataFrames only (inside ``foreachBatch`` for streams).

    Returns
    -------
    pyspark.sql.DataFrame
        ``df`` with the declaration on the key column's metadata; the rows are untouched.

    Notes
    -----
    Cost: nothing without ``verify``. With it, one extra read of ``df`` and a shuffle of the
    distinct ``(key, partition)`` pairs (map-side combined: about one row per key and
    partition). An unverified false claim gives wrong keyed results: a key split over two
    partitions comes out as two rows.

    Examples
    --------
    >>> from trilink_spark.kafka import read_kafka
    >>> events = read_kafka(spark, "127.0.0.1:9092", "events")  # doctest: +SKIP
    >>> parsed = events.selectExpr("CAST(key AS STRING) AS user", "value")  # doctest: +SKIP
    >>> from trilink_spark.placement import keyed_by_source
    >>> keyed = keyed_by_source(parsed, "user", verify=True)  # doctest: +SKIP
    >>> from trilink_spark.placement import shuffle_exchanges
    >>> shuffle_exchanges(tl.keyed_agg(keyed, "user", F.count("*")))  # doctest: +SKIP
    0
    """
    from pyspark.sql import DataFrame

    if not isinstance(df, DataFrame):
        raise InvalidArgumentTypeError(f"expected a DataFrame, got {type(df).__name__}")
    require_columns(df, [key], "key column")
    if df.isStreaming:
        if verify:
            refuse_streaming(df, "keyed_by_source(verify=True)", "the check reads every row's "
                             "input partition with a job", "Declare the stream with verify=False,"
                             " and verify on a micro-batch inside writeStream.foreachBatch: "
                             "keyed_by_source(batch_df, key, verify=True)")
        exchanges = 0
    else:
        exchanges = shuffle_exchanges(df)
        if verify:
            _verify(df, key, max_examples)
    field = df.schema[key]
    metadata = dict(field.metadata or {})
    metadata[_MARK] = {"exchanges": exchanges}
    columns = [column_of(c).alias(c, metadata=metadata) if c == key else column_of(c)
               for c in df.columns]
    marked: DataFrame = df.select(*columns)
    return marked


def _verify(df: DataFrame, key: str, max_examples: int) -> None:
    from pyspark.sql import functions as F

    pairs = df.select(column_of(key).alias("k"), F.spark_partition_id().alias("p")).distinct()
    split = pairs.groupBy("k").agg(F.sort_array(F.collect_list("p")).alias("parts"))
    split = split.where(F.size("parts") > 1)
    examples = split.limit(max_examples).collect()
    if not examples:
        return
    total = split.count()
    shown = ", ".join(f"{row['k']!r} in partitions {list(row['parts'])}" for row in examples)
    raise KeysNotGroupedError(
        f"{total} key(s) of column {key!r} are in more than one input partition ({shown}"
        f"{', ...' if total > len(examples) else ''}); the source did not place keys whole. "
        "Write the topic with ahead_key_by, or place the rows with key_by instead"
    )


def is_keyed_by_source(df: DataFrame, key: str) -> bool:
    """Whether ``df``'s key column carries the :func:`keyed_by_source` declaration."""
    if key not in df.columns:
        return False
    return _MARK in (df.schema[key].metadata or {})


def check_source_layout(df: DataFrame, key: str) -> None:
    """Refuse a declared frame whose rows were shuffled after the declaration."""
    declared = int(df.schema[key].metadata[_MARK].get("exchanges", 0))
    refuse_streaming(df, "keyed operators on a keyed_by_source frame", "they run inside each "
                     "input partition, so on a stream each micro-batch alone", "Use them on each "
                     "micro-batch inside writeStream.foreachBatch, or keyed_foreach_batch")
    now = shuffle_exchanges(df)
    if now > declared:
        raise KeysNotGroupedError(
            f"the rows were shuffled after keyed_by_source ({now} exchanges now, {declared} "
            "when declared), so keys may no longer be whole per partition; declare it again "
            "after the shuffle, or use key_by"
        )


@dataclass(frozen=True)
class _Agg:
    """One parsed aggregate: Arrow function, its options (class name and keyword arguments,
    built in the task), argument column index (None: count rows)."""

    arrow: str
    options: tuple[str, dict[str, Any]] | None
    arg: int | None

    def arrow_options(self) -> Any:
        import pyarrow.compute as pc

        if self.options is None:
            return None
        name, kwargs = self.options
        return getattr(pc, name)(**kwargs)


@dataclass(frozen=True)
class _Call:
    """An aggregate call read from a Column: function name, DISTINCT, and per argument
    whether it is ``*``, whether it is the literal ``true`` (read for the second argument on,
    as ``first(v, true)`` has it), and the argument as a Column."""

    name: str
    distinct: bool
    stars: tuple[bool, ...]
    trues: tuple[bool, ...]
    columns: tuple[Callable[[], Column], ...]


def in_place(declared: DataFrame, key: str, tagged: DataFrame) -> DataFrame:
    """``tagged`` where Ahead KeyBy placed ``declared``: each row stays in the partition it was
    read in, and that partition's id is its :data:`~trilink_spark.PARTITION_COL`. No shuffle;
    :func:`check_source_layout` refuses a frame the source did not place.
    """
    from pyspark.sql import functions as F

    check_source_layout(declared, key)
    placed: DataFrame = tagged.withColumn(PARTITION_COL, F.spark_partition_id())
    return placed


def _not_plain(column: Column) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{column} is not a plain aggregate call; per-partition keyed_agg takes calls of "
        f"{', '.join(sorted(SOURCE_AGGREGATES))} (arguments may be any expression) written "
        "with pyspark.sql.functions (SQL text from F.expr is not read). Use keyed_apply, or "
        "place the rows with key_by"
    )


def _classic_call(column: Column, spark: Any) -> _Call:
    """Read the call from the JVM expression behind a classic Column."""
    from pyspark.sql.classic.column import Column as ClassicColumn

    jc: Any = getattr(column, "_jc")
    node = jc.node()
    if node.getClass().getSimpleName() == "Alias":
        node = node.child()
    if node.getClass().getSimpleName() != "UnresolvedFunction":
        raise _not_plain(column)
    jargs = node.arguments()
    args = [jargs.apply(i) for i in range(jargs.size())]
    jvm = spark._jvm
    wrap: Any = ClassicColumn

    def as_column(arg: Any) -> Callable[[], Column]:
        return lambda: wrap(jvm.org.apache.spark.sql.Column(arg))

    return _Call(
        str(node.functionName()).lower(), bool(node.isDistinct()),
        tuple(a.getClass().getSimpleName() == "UnresolvedStar" for a in args),
        tuple(i > 0 and str(a.sql()).lower() == "true" for i, a in enumerate(args)),
        tuple(as_column(a) for a in args),
    )


def _connect_call(column: Column) -> _Call:
    """Read the call from the expression tree a Spark Connect Column holds in the client."""
    from pyspark.sql.connect.column import Column as ConnectColumn
    from pyspark.sql.connect.expressions import (
        ColumnAlias,
        LiteralExpression,
        UnresolvedFunction,
        UnresolvedStar,
    )

    node: Any = getattr(column, "_expr")
    if isinstance(node, ColumnAlias):
        node = getattr(node, "_child")
    if not isinstance(node, UnresolvedFunction):
        raise _not_plain(column)
    args = list(getattr(node, "_args"))
    wrap: Any = ConnectColumn

    def as_column(arg: Any) -> Callable[[], Column]:
        return lambda: wrap(arg)

    return _Call(
        str(getattr(node, "_name")).lower(), bool(getattr(node, "_is_distinct")),
        tuple(isinstance(a, UnresolvedStar) for a in args),
        tuple(isinstance(a, LiteralExpression) and getattr(a, "_value") is True for a in args),
        tuple(as_column(a) for a in args),
    )


def _parse(column: Column, spark: Any, index: int) -> tuple[_Agg, list[Column]]:
    """An aggregate call as an Arrow hash aggregate, plus the argument columns it needs.

    The call is read from the Column itself: through the JVM expression on classic PySpark,
    from the client-side expression tree on Spark Connect.
    """
    if is_connect(column):
        call = _connect_call(column)
    elif hasattr(column, "_jc"):
        call = _classic_call(column, spark)
    else:
        raise InvalidArgumentTypeError(
            f"expected a pyspark.sql.Column aggregate, got {type(column).__name__}")
    name, distinct = call.name, call.distinct
    if name not in SOURCE_AGGREGATES:
        raise InvalidArgumentError(
            f"{column}: {name} is not computed per partition; supported: "
            f"{', '.join(sorted(SOURCE_AGGREGATES))}. Use keyed_apply, or key_by"
        )
    arrow = SOURCE_AGGREGATES[name]
    nargs = len(call.columns)
    star = nargs == 1 and call.stars[0]
    if distinct and name != "count":
        raise InvalidArgumentError(f"{column}: DISTINCT is supported for count only")
    if name == "count" and (star or not nargs):
        return _Agg("count_all", None, None), []
    most = 2 if arrow in ("first", "last") else 1
    if star or not 1 <= nargs <= most:
        raise InvalidArgumentError(f"{column}: expected one argument column")
    arg_col = call.columns[0]().alias(f"{ARG_COL}{index}")
    if name == "count":
        counting = ("CountOptions", {"mode": "only_valid"})
        return _Agg("count_distinct" if distinct else "count", counting, index), [arg_col]
    if arrow in ("first", "last"):
        ignore = nargs == 2 and call.trues[1]
        return _Agg(arrow, ("ScalarAggregateOptions", {"skip_nulls": ignore}), index), [arg_col]
    if arrow in ("stddev", "variance"):
        ddof = 0 if name.endswith("_pop") else 1
        return _Agg(arrow, ("VarianceOptions", {"ddof": ddof}), index), [arg_col]
    return _Agg(arrow, ("ScalarAggregateOptions", {"min_count": 1}), index), [arg_col]


def source_agg(df: DataFrame, key: str, exprs: tuple[Column, ...]) -> DataFrame:
    """``groupBy(key).agg(*exprs)`` computed inside each input partition: no exchange.

    The result has exactly the names and types of ``df.groupBy(key).agg(*exprs)`` (taken from
    Spark's analysis of that query, which is never run).

    Notes
    -----
    Cost: one pass over each partition. The aggregate arguments are computed in the JVM
    (``select``); each partition's key and argument columns are then held in memory as Arrow
    and grouped by Arrow's hash aggregation (C++): O(rows of the partition) memory. Sums and
    means of decimals are exact and rounded as Spark's (the merge algebra's kernels: one pandas
    group-by sum of Python decimals, in C), not Arrow's, and their first and last are read
    from each group's row numbers (Arrow has none); sums of integers are exact, as two sums
    of 32-bit halves (Arrow's wraps around), ArithmeticOverflowError beyond 64 bits.
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    check_source_layout(df, key)
    out_schema = df.groupBy(column_of(key)).agg(*exprs).schema
    parsed: list[_Agg] = []
    arguments: list[Column] = []
    for i, expr in enumerate(exprs):
        agg, cols = _parse(expr, df.sparkSession, i)
        parsed.append(agg)
        arguments += cols
    timezone = df.sparkSession.conf.get("spark.sql.session.timeZone")
    arrow_schema = to_arrow_schema(out_schema, timezone=timezone)
    # a key named with a dot or a backtick crosses into Python under an alias
    projected, aliases = python_input(df.select(column_of(key), *arguments))
    inside = next(iter(aliases), key)  # the arguments are named _tl_arg<i>: no alias
    ensure_executors(df.sparkSession)  # a cluster's executors must import the package
    return projected.mapInArrow(_aggregate_partition(inside, parsed, arrow_schema), out_schema)


def _aggregate_partition(key: str, aggs: list[_Agg],
                         arrow_schema: Any) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        received = [b for b in batches if b.num_rows]
        if not received:
            return
        table = pa.Table.from_batches(received)
        args = [None if a.arg is None else f"{ARG_COL}{a.arg}" for a in aggs]
        # where Arrow's hash aggregation is not Spark's: sums and means of decimals (Arrow's
        # sum wraps on overflow, its mean keeps the input's scale) and their first and last
        # (no Arrow kernel) come from each group's row numbers; sums of integers (Arrow's
        # wrap around) from their two 32-bit halves
        kinds = [_exact_kind(a.arrow, None if arg is None else table[arg].type)
                 for a, arg in zip(aggs, args)]
        specs: list[tuple[Any, ...]] = []
        slots: list[list[int]] = []  # each aggregate's results among the specs
        for i, (agg, arg, kind) in enumerate(zip(aggs, args, kinds)):
            if kind == "halves":
                for half, values in enumerate(_halves(table[str(arg)])):
                    table = table.append_column(f"{ARG_COL}half{i}_{half}", values)
                    # null for a group without a value, as Spark's sum
                    specs.append((f"{ARG_COL}half{i}_{half}", "sum",
                                  pc.ScalarAggregateOptions(min_count=1)))
                slots.append([len(specs) - 2, len(specs) - 1])
            elif kind == "rows":
                slots.append([])
            else:
                specs.append(([] if arg is None else arg, agg.arrow, agg.arrow_options()))
                slots.append([len(specs) - 1])
        if "rows" in kinds:
            table = table.append_column(_ROW, pa.array(np.arange(table.num_rows)))
            specs.append((_ROW, "list"))
        grouped = table.group_by(key, use_threads=False).aggregate(specs)
        # by position: two aggregates may have one Arrow name (count(*) twice)
        results = [grouped.column(i) for i, n in enumerate(grouped.column_names) if n != key]
        columns = [grouped.column(key)]
        for agg, arg, kind, slot, field in zip(aggs, args, kinds, slots, list(arrow_schema)[1:]):
            if kind == "halves":
                columns.append(_joined([results[j] for j in slot], f"sum {field.name!r}"))
            elif kind == "rows":
                columns.append(_by_rows(table[str(arg)], results[-1], agg, field))
            else:
                columns.append(results[slot[0]])
        result = pa.Table.from_arrays(
            [c.cast(f.type) for c, f in zip(columns, arrow_schema)], schema=arrow_schema
        )
        yield from result.to_batches()

    return run


def _exact_kind(func: str, arrow_type: Any) -> str:
    """How :func:`_aggregate_partition` computes an aggregate (Arrow function ``func``) of a
    column of ``arrow_type`` (None: no column): ``"rows"`` from each group's row numbers,
    ``"halves"`` as an exact integer sum, ``""`` by Arrow's hash aggregation."""
    import pyarrow as pa

    if arrow_type is None:
        return ""
    if pa.types.is_decimal(arrow_type) and func in ("sum", "mean", "first", "last"):
        return "rows"
    return "halves" if func == "sum" and pa.types.is_integer(arrow_type) else ""


def _halves(values: Any) -> list[Any]:
    """The low and the high 32 bits (arithmetic shift) of integer ``values`` as int64: their
    sums cannot overflow below 2**31 rows (Arrow's sum of int64 wraps around)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    wide = pc.cast(values, pa.int64())
    return [pc.bit_wise_and(wide, 0xFFFFFFFF), pc.shift_right(wide, 32)]


def _joined(sums: list[Any], what: str) -> Any:
    """Exact int64 sums from the sums of :func:`_halves` (null where a group has no value);
    ArithmeticOverflowError naming ``what`` beyond 64 bits, as Spark's ANSI mode fails."""
    import pyarrow as pa

    low, high = (s.combine_chunks() for s in sums)
    joined = join_halves(low.fill_null(0).to_numpy(), high.fill_null(0).to_numpy(), what)
    return pa.array(joined, pa.int64(), mask=low.is_null().to_numpy(zero_copy_only=False))


def _by_rows(values: Any, rows: Any, agg: _Agg, field: Any) -> Any:
    """Spark's ``sum``, ``avg``, ``first`` or ``last`` (``agg.arrow``) of the decimal
    ``values`` per group, the groups given as lists of row numbers in arrival order
    (``rows``), as an Arrow array of ``field``'s type: exact sums (ArithmeticOverflowError
    naming ``field`` beyond 38 digits) and Spark's rounding of the mean, by
    :mod:`~trilink_spark.merge.algebra.kernels`; the first or last row (non-null with
    ``ignorenulls``). Cost: one take, then one pandas group-by sum of the object column or
    one ``numpy.unique``; O(rows)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lists = rows.combine_chunks()
    taken = values.take(pc.list_flatten(lists))
    codes = pc.list_parent_indices(lists).to_numpy()
    if agg.arrow in ("first", "last"):
        skip = bool((agg.options or ("", {}))[1].get("skip_nulls"))
        keep = taken.is_valid().to_numpy(zero_copy_only=False) if skip else \
            np.ones(len(taken), dtype=bool)
        at, owners = np.flatnonzero(keep), codes[keep]
        if agg.arrow == "last":
            at, owners = at[::-1], owners[::-1]
        groups, first = np.unique(owners, return_index=True)
        pick = np.full(len(lists), -1, dtype=np.int64)
        pick[groups] = at[first]
        return taken.take(pa.array(pick, mask=pick < 0)).cast(field.type)
    what = f"{'avg' if agg.arrow == 'mean' else 'sum'} {field.name!r}"
    decimals = taken.to_pandas()
    sums = decimal_sums(decimals, codes, what)
    if agg.arrow == "mean":
        counts = pd.Series(decimals.notna().to_numpy()).groupby(codes, sort=True).sum()
        sums = decimal_means(sums, counts, what)
    return pa.array(sums.to_numpy(dtype=object), type=field.type, from_pandas=True)


def source_apply(df: DataFrame, key: str, func: Callable[..., Any],
                 schema: StructType | str) -> DataFrame:
    """``groupBy(key).applyInPandas(func, schema)`` inside each input partition: no exchange.

    ``func`` gets each key's rows as a pandas DataFrame (or ``(key_tuple, pdf)`` when it takes
    two arguments), as in PySpark; the null key is one group, ``key_tuple`` ``(None,)``. An
    integer or floating key column that may hold nulls is grouped exactly, as ``groupBy``
    groups it: pandas would make floats of its integers beside a null (merging keys beyond
    2**53) and take a NaN key for the null one; the key then comes as Spark gives it
    (``numpy.int64``, ``nan`` for the NaN key, ``0.0`` for ``-0.0``).

    Notes
    -----
    Cost: one pass; each partition is held in memory as pandas and split by key
    (``pandas.groupby``), one Python call per key; for such a key column, two more columns
    (the key's null flag and its value with nulls filled) cross into Python.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    check_source_layout(df, key)
    takes_key = len(inspect.signature(func).parameters) == 2
    field = df.schema[key]
    exact = field.nullable and isinstance(field.dataType,
                                          (T.IntegralType, T.FloatType, T.DoubleType))
    floating = isinstance(field.dataType, (T.FloatType, T.DoubleType))
    if exact:
        column = column_of(key)
        filled = F.coalesce(column, F.lit(0).cast(field.dataType))
        df = df.select("*", column.isNull().alias(_KEY_NULL), filled.alias(_KEY_VALUE))

    def groups(whole: pd.DataFrame) -> Iterator[tuple[Any, pd.DataFrame]]:
        if not exact:
            for value, group in whole.groupby(key, sort=False, dropna=False):
                yield (None if pd.isna(value) else value), group
            return
        null = whole.pop(_KEY_NULL).to_numpy(dtype=bool)
        values = whole.pop(_KEY_VALUE).to_numpy()
        for pair, group in whole.groupby([null, values], sort=False, dropna=False):
            is_null, found = pair  # type: ignore[misc]
            number: Any = found
            yield (None if is_null else number + 0.0 if floating else number), group

    # columns named with a dot or a backtick cross into Python under aliases
    source, aliases = python_input(df)

    def run(frames: Iterator[Any]) -> Iterator[Any]:
        parts = [f for f in frames if len(f)]
        if not parts:
            return
        whole = pd.concat(parts, ignore_index=True)
        if aliases:
            whole = whole.rename(columns=aliases)
        for value, group in groups(whole):
            group = group.reset_index(drop=True)
            out = func((value,), group) if takes_key else func(group)
            if out is not None and len(out):
                yield out

    return source.mapInPandas(run, schema)
