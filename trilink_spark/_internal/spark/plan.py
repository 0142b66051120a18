"""Reading Spark physical plans: how many shuffles a DataFrame costs."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .compat import plan_text

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["physical_plan", "shuffle_exchanges"]

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
