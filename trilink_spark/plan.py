"""Reading Spark physical plans: how many shuffles a DataFrame costs."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["physical_plan", "shuffle_exchanges"]

# A shuffle is a plan node named "Exchange" (BroadcastExchange and ReusedExchange are not).
_SHUFFLE_NODE = re.compile(r"^[\s:|+\-]*Exchange\s", re.MULTILINE)


def physical_plan(df: DataFrame) -> str:
    """The executed physical plan of a (classic, non-Connect) DataFrame as text."""
    return str(df._jdf.queryExecution().executedPlan().toString())


def shuffle_exchanges(df: DataFrame) -> int:
    """Number of shuffle exchanges Spark plans for ``df`` (broadcasts are not counted).

    Once ``df`` has run with adaptive execution, its plan shows a final and an initial plan;
    only the final one is counted.

    Examples
    --------
    >>> import trilink_spark as tl  # doctest: +SKIP
    >>> tl.shuffle_exchanges(tl.keyed_agg(df, "k", F.count("*")))  # doctest: +SKIP
    1
    """
    plan = physical_plan(df)
    # after an adaptive query ran, its plan prints the final plan, then the initial one
    final = plan.split("== Initial Plan ==", 1)[0]
    return len(_SHUFFLE_NODE.findall(final))
