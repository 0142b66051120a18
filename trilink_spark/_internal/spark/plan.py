"""Reading Spark physical plans: how many shuffles a DataFrame costs."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .compat import plan_text

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["physical_plan", "shuffle_exchanges", "hash_partitions_of"]

# A shuffle is a plan node named "Exchange" (BroadcastExchange and ReusedExchange are not).
_SHUFFLE_NODE = re.compile(r"^[\s:|+\-]*Exchange\s", re.MULTILINE)


_HEADER = "== Physical Plan =="


def physical_plan(df: DataFrame) -> str:
    """The physical plan of a DataFrame as text (classic PySpark and Spark Connect).

    It is what ``df.explain()`` prints, without its header. Once a classic DataFrame has run
    with adaptive execution, the plan shows the final plan, then the initial one; on Spark
    Connect every call plans the query afresh, so it is always the plan before execution.

    Notes
    -----
    Cost: Spark analyses and plans the query (on Spark Connect, one round trip to the server);
    no Spark job runs (see :func:`trilink_spark._internal.spark.compat.plan_text`).

    Examples
    --------
    >>> from trilink_spark.placement import physical_plan
    >>> print(physical_plan(spark.range(3)))  # doctest: +SKIP
    *(1) Range (0, 3, step=1, splits=2)
    """
    text = plan_text(df, "simple").strip("\n")
    if text.startswith(_HEADER):
        text = text[len(_HEADER):].lstrip("\n")
    return text + "\n"


def shuffle_exchanges(df: DataFrame) -> int:
    """Number of shuffle exchanges Spark plans for ``df`` (broadcasts are not counted).

    Once ``df`` has run with adaptive execution, its plan shows a final and an initial plan;
    only the final one is counted. Works on classic PySpark and on Spark Connect.

    Notes
    -----
    Cost: that of :func:`physical_plan` (the query is planned; no Spark job runs).

    Examples
    --------
    >>> import trilink_spark as tl  # doctest: +SKIP
    >>> from trilink_spark.placement import shuffle_exchanges
    >>> shuffle_exchanges(tl.keyed_agg(df, "k", F.count("*")))  # doctest: +SKIP
    1
    """
    plan = physical_plan(df)
    # after an adaptive query ran, its plan prints the final plan, then the initial one
    final = plan.split("== Initial Plan ==", 1)[0]
    return len(_SHUFFLE_NODE.findall(final))


# one node of a plan printed in "simple" mode: tree marks, a codegen stage mark, the name
_NODE_LINE = re.compile(r"^[\s:|+\-]*(?:\*\(\d+\)\s+)?(?P<name>\w+)(?P<rest>.*)$")
# nodes that keep their child's partitioning, row for row, whatever their arguments
_KEEPS_PARTITIONING = frozenset({"AdaptiveSparkPlan", "Project", "Filter", "ColumnarToRow"})


def _local_sort(node: str, args: str) -> bool:
    """Whether a plan node is a sort within partitions (``Sort [...], false, n``)."""
    return node == "Sort" and re.search(r"\], false, \d+$", args) is not None


def hash_partitions_of(df: DataFrame, key: str) -> int | None:
    """The partition count ``n`` when ``df`` is laid out by ``repartition(n, key)``, else None.

    That is: the last shuffle of ``df``'s physical plan is Spark's hash partitioning of the
    column ``key`` alone into ``n`` partitions asked for by number (``repartition(n, key)``,
    ``REPARTITION_BY_NUM``, which adaptive execution never coalesces), and everything above
    it keeps each row in its partition and ``key`` as the same attribute (``repartition(1,
    ...)``, Spark's single partition, is ``n = 1`` whatever the column): projections that do
    not rename another column to ``key``, filters, and sorts within partitions. Row ``r`` of
    such a frame is in Spark partition ``pmod(hash(r[key]), n)`` (Murmur3, seed 42; a null key
    in ``pmod(42, n)``), exactly where :class:`~trilink_spark.HashPartitioner` puts it.

    Anything else gives None, a layout that may well be the same included (a join, a
    window, a cached frame, a bucketed scan, ``groupBy``'s exchange, which adaptive execution
    may coalesce, or a key cast before hashing): the caller places the rows again, as it
    would have without this check.

    Notes
    -----
    Cost: that of :func:`physical_plan` (the query is planned; no Spark job runs);
    O(plan lines).

    Examples
    --------
    >>> hash_partitions_of(df.repartition(8, "user").sortWithinPartitions("ts"), "user")  # doctest: +SKIP
    8
    >>> hash_partitions_of(df.repartition(8), "user") is None  # doctest: +SKIP
    True
    """
    final = physical_plan(df).split("== Initial Plan ==", 1)[0]
    name = re.escape(key)
    exchange = re.compile(rf"^hashpartitioning\({name}#(?P<id>\d+)L?, (?P<n>\d+)\), "
                          r"REPARTITION_BY_NUM\b")
    renamed = re.compile(rf" AS {name}#\d+")
    single = re.compile(r"^SinglePartition, REPARTITION_BY_NUM\b")
    above: list[tuple[str, str]] = []
    for line in final.splitlines():
        match = _NODE_LINE.match(line)
        if match is None:
            continue
        node, rest = match.group("name"), match.group("rest").strip()
        if node != "Exchange":
            above.append((node, rest))
            continue
        if single.match(rest):  # repartition(1, ...): every row in partition 0
            return 1 if all(n in _KEEPS_PARTITIONING or _local_sort(n, r)
                            for n, r in above) else None
        found = exchange.match(rest)
        if found is None:
            return None
        attribute = re.compile(rf"(?:^\[|, ){name}#{found.group('id')}L?(?=[,\]])")
        projects = [r for n, r in above if n == "Project"]
        for node_name, args in above:
            if node_name not in _KEEPS_PARTITIONING and not _local_sort(node_name, args):
                return None
            if renamed.search(args):
                return None
        if projects and not attribute.search(projects[0]):
            return None  # the key of the output is not the attribute the rows were hashed by
        return int(found.group("n"))
    return None
