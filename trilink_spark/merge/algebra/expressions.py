"""Aggregates as users write them (the forms of ``aggs``), read into :class:`AggSpec`.

:func:`parse_aggs` validates ``{name: (func, column)}``, ``(name, func, column)`` tuples,
Spark's dict form ``{column: "func"}`` and Spark Column aggregates (``F.sum("v").alias("s")``,
read from their text and, with the input at hand, confirmed by Spark's analysis), refusing
what has no exact partial form; :func:`specs_for_partials` reads them for partial rows, whose
columns carry other names. :func:`combinable` says whether Spark's own partial aggregation
bounds what a hot key costs, and :func:`spark_aggregate` is the Spark aggregate the algebra
computes for ``(func, column)``. Each :class:`AggSpec` holds its aggregate object
(:mod:`~trilink_spark.merge.algebra.aggregates`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from ...columns import column_of
from ...errors import InvalidArgumentError, InvalidArgumentTypeError
from .aggregates import AGGREGATE_CLASSES, AGGREGATES, Aggregate, Combine, make_aggregate

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "AggSpec",
    "SPARK_COMBINABLE",
    "SPARK_SKETCHES",
    "UNMERGEABLE_SPARK",
    "combinable",
    "parse_aggs",
    "spark_aggregate",
    "specs_for_partials",
]

#: The Spark names of the mergeable aggregates, for messages.
_SPARK_NAMES = ", ".join(n for c in AGGREGATE_CLASSES.values() if c.mergeable
                         for n in c.spark_names)


@dataclass(frozen=True)
class AggSpec:
    """One aggregate: output ``name``, ``func`` (a name or a Combine), input ``column``.

    Its :attr:`aggregate` (from :func:`~trilink_spark.merge.algebra.aggregates.make_aggregate`) does
    the work.

    Examples
    --------
    >>> AggSpec("s", "sum", "v").partial_columns
    ['s', 's__n']
    """

    name: str
    func: str | Combine
    column: str | None
    aggregate: Aggregate = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "aggregate", make_aggregate(self.func, self.name, self.column))

    @property
    def partial_columns(self) -> list[str]:
        return self.aggregate.partial_columns

    def final_type(self, value_type: str) -> str:
        """Spark type of the final value, given the Spark type of the aggregated column."""
        return self.aggregate.final_type(value_type)

    def partial_types(self, value_type: str) -> list[str]:
        return self.aggregate.partial_types(value_type)


#: Spark aggregate functions with no exact partial form, refused by name.
UNMERGEABLE_SPARK: tuple[str, ...] = (
    "collect_list", "collect_set", "array_agg", "percentile", "percentile_approx",
    "approx_percentile", "percentile_cont", "percentile_disc", "median", "mode",
    "approx_count_distinct", "count_distinct", "count_min_sketch", "hll_sketch_agg",
    "stddev", "std", "stddev_samp", "stddev_pop", "variance", "var_samp", "var_pop",
    "skewness", "kurtosis", "corr", "covar_pop", "covar_samp", "listagg", "string_agg",
)
_COUNT_ALL = ("*", "1", "unresolvedstar()")


def _spark_func(spark_name: str) -> str | None:
    """The algebra's ``func`` computing Spark function ``spark_name`` (None: none does)."""
    for cls in AGGREGATE_CLASSES.values():
        if cls.mergeable and spark_name in cls.spark_names:
            return cls.func
    return None


def _top_level(text: str, sep: str) -> list[int]:
    """Positions of ``sep`` (case-insensitive) in ``text`` outside parentheses and backticks."""
    out, depth, quoted, lowered, i = [], 0, False, text.lower(), 0
    while i < len(text):
        ch = text[i]
        if ch == "`":
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
        elif not quoted and depth == 0 and lowered.startswith(sep, i):
            out.append(i)
            i += len(sep)
            continue
        i += 1
    return out


def _unquote(name: str) -> str:
    name = name.strip()
    if len(name) >= 2 and name[0] == name[-1] == "`":
        return name[1:-1].replace("``", "`")
    return name


def _column_text(col: Any) -> str:
    """The text of a Spark Column (``sum(v) AS s``), the same on classic and Connect."""
    text = str(col)
    if text.startswith("Column<'") and text.endswith("'>"):
        text = text[len("Column<'"):-2]
    return text


_NULLS_CLAUSES = {" ignore nulls": "true", " respect nulls": "false"}


class _Reading(NamedTuple):
    """One way to read a Column aggregate's text: the call, its arguments, the nulls clause
    (``first(v) ignore nulls``) and the alias text, if any."""

    spark_name: str
    args: list[str]
    nulls: str | None
    alias: str | None


def _readings(text: str) -> list[_Reading]:
    """Every way to split ``text`` into ``func(args) [ignore nulls] [AS alias]``, the shortest
    call first. Names are printed unquoted (``sum(x as y)``, ``sum(v) AS a as b``), so the
    text alone can be ambiguous: the caller picks the reading that names input columns, or
    that Spark's analysis confirms."""
    lowered = text.lower()
    ends = [i for i in range(len(text)) if lowered.startswith(" as ", i)] + [len(text)]
    out = []
    for end in ends:
        call, alias = text[:end], (text[end + 4:] if end < len(text) else None)
        nulls = None
        for clause, flag in _NULLS_CLAUSES.items():
            if call.lower().endswith(clause):
                call, nulls = call[: -len(clause)], flag
        head, paren, rest = call.partition("(")
        spark_name = head.strip().lower()
        if not paren or not rest.endswith(")") or not spark_name.replace("_", "").isalnum():
            continue
        body = rest[:-1]
        commas = _top_level(body, ",")
        args = [body[i + 1:j].strip() for i, j in zip([-1, *commas], [*commas, len(body)])]
        out.append(_Reading(spark_name, args, nulls, alias))
    return out


def _alias_names(alias: str) -> tuple[list[str], str]:
    """The names an alias text may stand for, and the one read without other evidence.

    Aliases are printed unquoted, so ``AS a as b`` is ``alias("a as b")`` or
    ``alias("a").alias("b")``: the options are all of it, or what follows each inner
    `` AS `` (each also unquoted); the default is what follows the last `` AS `` outside
    backticks (a nested alias, Spark's name for it), unquoted."""
    lowered = alias.lower()
    tails = [alias] + [alias[i + 4:] for i in range(len(alias)) if lowered.startswith(" as ", i)]
    options: list[str] = []
    for tail in tails:
        for name in (tail, _unquote(tail)):
            if name and name not in options:
                options.append(name)
    nested = _top_level(alias, " as ")
    return options, _unquote(alias[nested[-1] + 4:] if nested else alias)


def _column_item(col: Any, columns: Sequence[str] | None,
                 available: Sequence[str] | None = None) -> tuple[str, str, str | None]:
    """``(name, func, column)`` of a Spark Column aggregate such as ``F.sum("v").alias("s")``,
    read from its text (the same on classic and Spark Connect sessions); refuses what the
    algebra cannot merge exactly, naming it.

    Of several readings of the text, the first whose argument is a column of ``columns`` (or a
    count of rows) wins; of several alias readings, the one whose partial columns are in
    ``available`` (the partial rows' columns, for
    :func:`~trilink_spark.merge.algebra.partials.merge_partials`), else the last (a nested alias). With
    the input at hand, :func:`parse_aggs` has Spark confirm both."""
    text = _column_text(col)
    readings = _readings(text)
    if not readings:
        raise InvalidArgumentError(
            f"aggregate {text!r} is not a call of an aggregate function on a column; give "
            f"F.<func>(column) with func one of {_SPARK_NAMES}, or (name, func, column)")

    def names_a_column(reading: _Reading) -> bool:
        first = reading.args[0]
        return (columns is None or _unquote(first) in columns
                or (reading.spark_name == "count" and first.lower() in _COUNT_ALL))

    reading = next((r for r in readings if names_a_column(r)), readings[0])
    spark_name, args, nulls, alias_text = reading
    first = args[0]
    alias: str | None = None
    if alias_text is not None:
        options, alias = _alias_names(alias_text)
        if available is not None:
            alias = next((n for n in options if n in available or f"{n}__n" in available),
                         alias)
    shown = alias or text
    if spark_name in UNMERGEABLE_SPARK or first.lower().startswith("distinct "):
        what = f"{spark_name}(DISTINCT ...)" if first.lower().startswith("distinct ") \
            else spark_name
        raise InvalidArgumentError(
            f"aggregate {shown!r} ({what}) cannot be merged exactly from partials: local_merge "
            f"and global_merge merge {_SPARK_NAMES}; compute {what} with keyed_agg (exact "
            "placement) instead")
    func = _spark_func(spark_name)
    if func is None:
        raise InvalidArgumentError(
            f"aggregate {shown!r} uses {spark_name!r}, which the merge algebra does not know; "
            f"it merges {_SPARK_NAMES} (or a Combine in the (name, func, column) form)")
    column: str | None = _unquote(first)
    if func == "count" and first.lower() in _COUNT_ALL and (
            columns is None or column not in columns):
        column, spark_arg = None, "1"
    else:
        spark_arg = column or ""
        if columns is not None and column not in columns:
            lowered = text.lower()
            clause = ("over a window" if " over (" in lowered or "windowexpression(" in lowered
                      else "with a FILTER clause" if " filter (" in lowered else "")
            if clause:
                raise InvalidArgumentError(
                    f"aggregate {shown!r} is computed {clause}, which the merge cannot do; "
                    f"give a plain F.<func>(column) with func one of {_SPARK_NAMES}")
            raise InvalidArgumentError(
                f"aggregate {shown!r}: {first!r} is not a column of the input ({list(columns)})"
                "; an aggregate of an expression needs the expression as a column first "
                "(df.withColumn)")
    if func in ("first", "last"):
        flag = args[1].strip().lower() if len(args) > 1 else (nulls or "false")
        if flag != "true":
            raise InvalidArgumentError(
                f"aggregate {shown!r}: the merge keeps the {func} non-null value by event time; "
                f"write F.{func}({spark_arg!r}, ignorenulls=True) (Spark's {func} without it "
                "depends on row order)")
    elif len(args) > 1 or nulls is not None:
        raise InvalidArgumentError(f"aggregate {shown!r} has extra arguments {args[1:]}")
    output = "avg" if func == "mean" else spark_name
    return (alias if alias is not None else f"{output}({spark_arg})", func, column)


def _dict_item(column: Any, spark_name: Any, columns: Sequence[str] | None
               ) -> tuple[str, str, str | None]:
    """``(name, func, column)`` of Spark's dict form ``{column: "sum"}``, named as Spark
    names it (``sum(v)``, ``avg(v)`` for mean, ``count(1)`` for ``{"*": "count"}``)."""
    if not isinstance(column, str) or not isinstance(spark_name, str):
        raise InvalidArgumentTypeError(
            f"Spark's dict form maps column names to function names ({{'v': 'sum'}}); got "
            f"{column!r}: {spark_name!r}")
    func = _spark_func(spark_name.lower())
    if func is None:
        raise InvalidArgumentError(
            f"aggregate {{{column!r}: {spark_name!r}}}: {spark_name!r} "
            + ("cannot be merged exactly from partials; compute it with keyed_agg"
               if spark_name.lower() in UNMERGEABLE_SPARK or spark_name in AGGREGATE_CLASSES
               else "is not an aggregate the merge algebra knows")
            + f" (it merges {_SPARK_NAMES})")
    if column == "*":
        if func != "count":
            raise InvalidArgumentError(f"'*' takes only count, got {spark_name!r}")
        return ("count(1)", "count", None)
    if columns is not None and column not in columns:
        raise InvalidArgumentError(
            f"column {column!r} of aggregate {{{column!r}: {spark_name!r}}} is not in "
            f"{list(columns)}")
    output = "avg" if func == "mean" else spark_name.lower()
    return (f"{output}({column})", func, column)


def _agg_entries(aggs: Any, columns: Sequence[str] | None = None,
                 available: Sequence[str] | None = None) -> list[tuple[tuple[Any, ...], Any]]:
    """``aggs`` as ``(name, func, column)`` tuples, each with the Spark Column it was read
    from (None for the other forms): a mapping ``{name: (func, column)}``, Spark's dict form
    ``{column: "func"}``, a sequence of ``(name, func, column)``, or Spark Column aggregates
    (one or a sequence)."""
    from pyspark.sql import Column

    if isinstance(aggs, Column):
        aggs = [aggs]
    if isinstance(aggs, Mapping):
        if aggs and all(isinstance(v, str) for v in aggs.values()):
            return [(_dict_item(c, f, columns), None) for c, f in aggs.items()]
        out: list[tuple[tuple[Any, ...], Any]] = []
        for name, spec in aggs.items():
            if not isinstance(spec, tuple):
                raise InvalidArgumentTypeError(
                    f"aggregate {name!r}: give (func, column), or Spark's dict form "
                    f"{{column: 'func'}} for every entry; got {spec!r}")
            out.append(((name, *spec), None))
        return out
    if isinstance(aggs, Sequence) and not isinstance(aggs, str):
        entries: list[tuple[tuple[Any, ...], Any]] = []
        for a in aggs:
            if isinstance(a, Column):
                entries.append((_column_item(a, columns, available), a))
            elif isinstance(a, (tuple, list)):
                entries.append((tuple(a), None))
            else:
                raise InvalidArgumentTypeError(
                    f"aggregate {a!r} is a {type(a).__name__}; give Spark Column aggregates "
                    "(F.sum('v')) or (name, func, column) tuples")
        return entries
    raise InvalidArgumentTypeError(
        "aggs must be {name: (func, column)}, Spark's {column: 'func'}, [(name, func, column)] "
        f"or Spark Column aggregates (F.sum('v').alias('s')); got {type(aggs).__name__}")


def _agg_items(aggs: Any, columns: Sequence[str] | None = None,
               available: Sequence[str] | None = None) -> list[tuple[Any, ...]]:
    """``aggs`` as ``(name, func, column)`` tuples (see :func:`_agg_entries`)."""
    return [item for item, _ in _agg_entries(aggs, columns, available)]


def _needs_column(func: Any) -> bool:
    cls = AGGREGATE_CLASSES.get(func) if isinstance(func, str) else None
    return cls is None or cls.needs_column


#: Spark aggregate functions whose partial aggregation keeps a fixed-size buffer per key, so a
#: map-side combine bounds what a hot key costs (beyond the merge algebra's own set).
SPARK_COMBINABLE: tuple[str, ...] = (
    "count", "sum", "min", "max", "avg", "mean", "first", "first_value", "last", "last_value",
    "any_value", "stddev", "std", "stddev_samp", "stddev_pop", "variance", "var_samp",
    "var_pop", "skewness", "kurtosis", "corr", "covar_pop", "covar_samp", "count_if",
    "bool_and", "bool_or", "every", "some", "any", "bit_and", "bit_or", "bit_xor", "max_by",
    "min_by", "regr_count", "regr_avgx", "regr_avgy", "regr_slope", "regr_intercept",
    "regr_r2", "regr_sxx", "regr_sxy", "regr_syy", "try_sum", "try_avg",
)

#: Spark's sketch aggregates (the names of its function registry, Spark 4.1 and later): a
#: partial buffer bounded by the sketch's size, and a result (or the sketch's bytes) that can
#: depend on the order in which rows and partial buffers are merged, so only Spark's own
#: ``groupBy(key).agg`` plan gives ``groupBy``'s result. Names a Spark version lacks are
#: never met.
SPARK_SKETCHES: tuple[str, ...] = (
    "percentile_approx", "approx_percentile", "approx_count_distinct", "count_min_sketch",
    "histogram_numeric", "hll_sketch_agg", "hll_union_agg", "approx_top_k",
    "approx_top_k_accumulate", "approx_top_k_combine", "kll_sketch_agg_bigint",
    "kll_sketch_agg_float", "kll_sketch_agg_double", "kll_merge_agg_bigint",
    "kll_merge_agg_float", "kll_merge_agg_double", "theta_sketch_agg", "theta_union_agg",
    "theta_intersection_agg", "tuple_sketch_agg_double", "tuple_sketch_agg_integer",
    "tuple_union_agg_double", "tuple_union_agg_integer", "tuple_intersection_agg_double",
    "tuple_intersection_agg_integer",
)


def combinable(exprs: Sequence[Any], df: DataFrame | None = None) -> tuple[bool, str]:
    """Whether ``keyed_agg`` should run ``exprs`` on Spark's own ``groupBy(key).agg`` plan
    (its map-side combine), and why.

    True when an aggregate is a sketch of :data:`SPARK_SKETCHES` (percentile_approx,
    approx_count_distinct, count_min_sketch, HLL, KLL, theta, ...), also inside an expression
    (``F.percentile_approx(...) + 0``, ``F.when(..., sketch)``, a cast): its buffer is bounded,
    and its result can depend on the order rows are merged, so only Spark's plan gives exactly
    ``groupBy``'s result (whatever the other aggregates). Else True when every aggregate is
    a function of :data:`SPARK_COMBINABLE` (one fixed-size buffer per key and input
    partition, over any argument expression); False for anything else: those whose buffer
    grows with the rows (collect_list, exact percentiles, DISTINCT aggregates), pandas UDAFs
    (no partial aggregation) and functions it does not know. ``df``: the input, whose
    physical plan of ``df.agg(*exprs)`` lists the aggregate functions apart from the
    expressions around them: there sketches inside expressions are found, Python UDAFs
    printed with a sketch's name told apart, and DISTINCT aggregates that a classic session
    prints without the word seen (one query plan, no job; one more per aggregate when a
    DISTINCT one is there, to name it). Without ``df`` only the printed text is read.

    Examples
    --------
    >>> from pyspark.sql import functions as F  # doctest: +SKIP
    >>> combinable([F.sum("v"), F.collect_list("v")])  # doctest: +SKIP
    (False, "collect_list(v) keeps every value of a key: exact placement bounds it instead")
    """
    unbounded: list[tuple[str, str]] = []  # (what, why) of the aggregates without a bound
    sketches: list[str] = []
    shown_all: list[str] = []  # each expression as the reasons show it
    for col in exprs:
        text = _column_text(col)
        aliases = _top_level(text, " as ")
        call = text[: aliases[0]] if aliases else text
        head, paren, rest = call.partition("(")
        name = head.strip().lower()
        shown = text if len(text) <= 80 else f"{name}(...)"  # a UDF prints its JVM tree
        shown_all.append(shown)
        if not paren or not name.replace("_", "").isalnum():
            unbounded.append((f"{shown} is not a call of a known aggregate function", ""))
        elif rest.lower().startswith("distinct "):
            unbounded.append((f"{shown} is a DISTINCT aggregate", "its buffer keeps every value"))
        elif name in SPARK_SKETCHES:
            sketches.append(call.strip() if len(call) <= 80 else f"{name}(...)")
        elif name not in SPARK_COMBINABLE:
            what = ("keeps every value of a key" if name in UNMERGEABLE_SPARK
                    else "is not an aggregate with a fixed-size partial buffer (a UDAF or "
                         "unknown function)")
            unbounded.append((f"{shown} {what}", "exact placement bounds it instead"))
    # Spark's plan lists the aggregate functions apart from the expressions around them: a
    # sketch under +, CASE WHEN, a cast... is found there, and a Python UDAF told apart
    node = _top_aggregate(df, list(exprs)) if df is not None else ""
    if node is None or any(python in node for python in _PYTHON_AGGREGATES):
        if sketches:
            unbounded.append((f"{sketches[0]} is a Python aggregate named like a sketch",
                              "exact placement bounds it instead"))
        sketches = []
    elif node:
        found = list(dict.fromkeys(m.group(1).lower() for m in _SKETCH_CALL.finditer(node)))
        sketches = [_sketch_label(name, sketches, shown_all) for name in found]
        # an expression around a sketch is not another aggregate
        unbounded = [u for u in unbounded if not any(f"{n}(" in u[0].lower() for n in found)]
    if sketches:
        others = (f"; the other aggregates run on that plan too ({unbounded[0][0]}: "
                  "combine='never' places the rows by the strategy instead)"
                  if unbounded else "")
        return True, (f"{sketches[0]} is a sketch: its buffer is bounded and its result can "
                      "depend on the order rows are merged, so Spark's own groupBy(key).agg "
                      f"plan (map-side combine) gives exactly groupBy's result{others}")
    if unbounded:
        what, why = unbounded[0]
        return False, f"{what}: {why}" if why else what
    if df is not None and (node is None or "(distinct " in node.lower()):
        distinct = _distinct_in_plan(df, list(exprs))
        if distinct:
            return False, f"{str(distinct[0])} is a DISTINCT aggregate: its buffer keeps every value"
    return True, "every aggregate has a fixed-size partial buffer: Spark's map-side combine " \
        "bounds what a hot key costs"


#: Physical plan nodes of Python aggregates (pandas UDAFs: no partial aggregation).
_PYTHON_AGGREGATES = ("AggregateInPandas", "ArrowAggregatePython", "PythonUDAF")
#: The first aggregate node of a physical plan's text, top down (after ``+-``, ``:-``,
#: ``*(1)`` and ``!``).
_AGGREGATE_NODE = re.compile(r"^[\s+\-:!*()\d]*\w*Aggregate\w*\b")
#: A sketch's call in a plan, in any aggregation mode (``partial_``, ``merge_``).
_SKETCH_CALL = re.compile(
    r"(?<![\w`])(?:partial_|merge_)?("
    + "|".join(sorted(SPARK_SKETCHES, key=len, reverse=True)) + r")\(", re.IGNORECASE)


def _top_aggregate(df: DataFrame, cols: list[Any]) -> str | None:
    """The node of Spark's physical plan of ``df.agg(*cols)`` that computes ``cols`` (the
    first aggregate node, top down, so not one of ``df``'s own): its line, which lists the
    aggregate functions apart from the expressions around them; ``""`` when the plan has
    none. None when Spark refuses a pandas UDAF beside built-in aggregates (``groupBy``
    refuses it too); any other error of Spark's analysis (an unknown column) is raised, as
    ``groupBy(key).agg`` raises it. One query plan, no job."""
    from pyspark.errors import PySparkException

    from ..._internal.spark.compat import plan_text

    try:
        text = plan_text(df.agg(*cols))
    except PySparkException as err:
        if "PANDAS_UDF" in str(err).upper():
            return None
        raise
    return next((line.strip() for line in text.splitlines() if _AGGREGATE_NODE.match(line)), "")


def _sketch_label(name: str, calls: list[str], shown: list[str]) -> str:
    """How a reason names the sketch ``name`` Spark planned: its call where an expression is
    that call, else the name and the expression it sits in."""
    for call in calls:
        if call.lower().startswith(f"{name}("):
            return call
    inside = next((s for s in shown if f"{name}(" in s.lower()), None)
    return name if inside is None else f"{name} (inside {inside})"


def _distinct_in_plan(df: DataFrame, cols: list[Any]) -> list[Any]:
    """The Column aggregates of ``cols`` that Spark plans as DISTINCT aggregates (a classic
    session's ``F.count_distinct("v")`` prints as ``count(v)``): one plan, no job. The plan
    text is captured with :func:`~trilink_spark._internal.spark.compat.plan_text` (thread-safe:
    concurrent
    callers do not swap ``sys.stdout``)."""
    from ..._internal.spark.compat import plan_text

    def distinct(group: list[Any]) -> bool:
        return re.search(r"\(distinct ", plan_text(df.agg(*group))) is not None

    if not cols or not distinct(cols):
        return []
    return [c for c in cols if distinct([c])]


def spark_aggregate(func: str, column: str | None) -> Column:
    """The Spark aggregate the algebra computes for ``(func, column)`` (``column`` None:
    ``count(1)``, the rows). O(1), no job.

    Examples
    --------
    >>> spark_aggregate("mean", "v")  # doctest: +SKIP
    Column<'avg(v)'>
    """
    from pyspark.sql import functions as F

    arg = F.lit(1) if column is None else column_of(column)
    if func in ("first", "last"):
        return F.first(arg, ignorenulls=True) if func == "first" else \
            F.last(arg, ignorenulls=True)
    call: Column = {"count": F.count, "sum": F.sum, "min": F.min, "max": F.max,
                    "mean": F.avg}[func](arg)
    return call


def _confirm_with_spark(df: DataFrame, entries: list[tuple[tuple[Any, ...], Any]]
                        ) -> list[tuple[Any, ...]]:
    """The items of ``entries`` with Spark's own output names for the Column aggregates, each
    confirmed to be the plain aggregate of a column that its text reads as (a column named
    like an expression, ``count(lit('v'))`` printed as ``count(v)``, a window or FILTER clause,
    a DISTINCT aggregate printed without the word are refused). Cost: Spark's analysis of
    three small plans (no job), more only to name a refused aggregate."""
    from pyspark.errors import PySparkException

    cols = [(i, col) for i, (_, col) in enumerate(entries) if col is not None]
    items = [item for item, _ in entries]
    if not cols:
        return items
    try:
        names = df.agg(*[c for _, c in cols]).columns
    except PySparkException as err:
        first = (str(err).strip().splitlines() or [""])[0][:300]
        raise InvalidArgumentError(
            f"Spark cannot compute the aggregates {[_column_text(c) for _, c in cols]} on "
            f"this DataFrame: {first}") from err

    def tagged(calls: list[Any]) -> DataFrame:
        return df.agg(*[c.alias(f"_tl_agg{i}") for i, c in enumerate(calls)])

    plains = [spark_aggregate(items[i][1], items[i][2]) for i, _ in cols]
    if not tagged([c for _, c in cols]).sameSemantics(tagged(plains)):
        for (i, col), plain in zip(cols, plains):
            if tagged([col]).sameSemantics(tagged([plain])):
                continue
            text, (_, func, column) = _column_text(col), items[i]
            if func == "count" and column is not None and \
                    tagged([col]).sameSemantics(tagged([spark_aggregate("count", None)])):
                items[i] = (items[i][0], "count", None)  # count(1) beside a column named 1
                continue
            if _distinct_in_plan(df, [col]):
                raise InvalidArgumentError(
                    f"aggregate {text!r} is a DISTINCT aggregate, which cannot be merged "
                    "exactly from partials; compute it with keyed_agg (exact placement) "
                    "instead")
            what = "count of rows" if column is None else f"{func} of column {column!r}"
            raise InvalidArgumentError(
                f"aggregate {text!r} is not the plain {what} that its text reads as: Spark "
                "computes it over an expression, a literal, a window or a FILTER clause, which "
                "the merge cannot; add the expression as a column first (df.withColumn) and "
                "aggregate that column, or use keyed_agg")
    for (i, _), name in zip(cols, names):
        items[i] = (name, *items[i][1:])
    return items


def parse_aggs(aggs: Any, columns: Sequence[str], df: DataFrame | None = None
               ) -> list[AggSpec]:
    """Validate ``aggs``, in any of these forms:

    - ``{name: (func, column)}`` (``column`` None for a count of rows), or a sequence of
      ``(name, func, column)``; ``func`` one of :data:`~trilink_spark.merge.AGGREGATES` or a
      :class:`~trilink_spark.merge.Combine`;
    - Spark's dict form ``{column: "func"}`` (``{"v": "sum", "*": "count"}``), named as Spark
      names it (``sum(v)``, ``avg(v)`` for mean, ``count(1)``);
    - Spark Column aggregates, one or a sequence: ``F.sum("v").alias("s")``, ``F.count("*")``,
      ``F.avg``/``F.mean``, ``F.min``, ``F.max``, ``F.first``/``F.last`` with
      ``ignorenulls=True`` (the first/last non-null value by event time); unaliased, named as
      Spark names them (``sum(v)``, ``count(1)``, ``first(v)``).

    ``df``: the input, when at hand: Spark then names the Column aggregates and confirms that
    each is the plain aggregate of the column its text reads as (a column named like an
    expression, a literal, a window or FILTER clause and DISTINCT aggregates are refused).

    Names may hold any character (``__`` too) but may not start with ``__``, and no two
    aggregates may write the same column (a name, or a partial column such as ``s__n``).

    Raises :class:`~trilink_spark.errors.InvalidArgumentError` for an unknown aggregate, one with
    no exact partial form (stddev, variance, collect_list, percentiles, DISTINCT aggregates: the
    message names it and points to ``keyed_agg``), an aggregate of an expression, a missing or
    unknown column, or repeated names; :class:`~trilink_spark.errors.InvalidArgumentTypeError` for
    another shape.

    Notes
    -----
    Cost: O(aggregates); with ``df`` and Column aggregates, Spark's analysis of three small
    plans (no job).

    Examples
    --------
    >>> parse_aggs({"n": ("count", None)}, ["v"])
    [AggSpec(name='n', func='count', column=None)]
    """
    entries = _agg_entries(aggs, columns)
    if not entries:
        raise InvalidArgumentError("aggs is empty; give at least one aggregate")
    for item, _ in entries:
        if len(item) != 3:
            raise InvalidArgumentError(f"aggregate {item!r} must be (name, func, column)")
    items = _confirm_with_spark(df, entries) if df is not None else \
        [item for item, _ in entries]
    out = []
    for name, func, column in items:
        if not isinstance(name, str) or not name or name.startswith("__"):
            raise InvalidArgumentError(
                f"aggregate name {name!r} must be a non-empty str not starting with '__'")
        if not isinstance(func, Combine) and not (isinstance(func, str) and func in AGGREGATES):
            known = isinstance(func, str) and func in AGGREGATE_CLASSES
            if known:
                raise make_aggregate(func, name, column).unmergeable()
            raise InvalidArgumentError(
                f"unknown aggregate {func!r} for {name!r}; choose from {AGGREGATES} or a Combine"
            )
        if column is None and _needs_column(func):
            raise InvalidArgumentError(f"aggregate {name!r} ({func}) needs a column")
        if column is not None and column not in columns:
            raise InvalidArgumentError(f"column {column!r} of aggregate {name!r} is not in {list(columns)}")
        out.append(AggSpec(name, func, column))
    names = [a.name for a in out]
    if len(set(names)) != len(names):
        raise InvalidArgumentError(
            f"aggregate names repeat: {names}; alias them apart (F.sum('v').alias('s2'))")
    written: dict[str, str] = {}  # Spark resolves names case-insensitively by default
    for spec in out:
        for column in spec.partial_columns:
            if column.lower() in written:
                raise InvalidArgumentError(
                    f"aggregates {written[column.lower()]!r} and {spec.name!r} would both "
                    f"write the partial column {column!r} (Spark compares names ignoring "
                    "case); rename one of them")
            written[column.lower()] = spec.name
    return out


def specs_for_partials(aggs: Any, available: Sequence[str] | None = None) -> list[AggSpec]:
    """Parse aggregates without checking input columns (partials carry other names).

    ``available``: the columns of the partial rows, to read an ambiguous alias of a Column
    aggregate (``AS a as b``) as the name that is there.

    Examples
    --------
    >>> [s.func for s in specs_for_partials({"n": ("count", None), "s": ("sum", "v")})]
    ['count', 'sum']
    """
    items = [(i[0], i[1], "_" if _needs_column(i[1]) else None) if len(i) == 3 else i
             for i in _agg_items(aggs, None, available)]
    return parse_aggs(items, ["_"])
