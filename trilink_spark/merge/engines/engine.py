"""Which engine computes a merge: Spark's aggregation in the JVM, or Python in each partition.

One rule, :func:`choose_local_engine`, decides for :func:`~trilink_spark.local_merge` and
:func:`~trilink_spark.merge.explain_local_merge`, and (for the partials it merges)
for :func:`~trilink_spark.global_merge`. Every input row that crosses from the JVM into a
Python worker costs about what Spark's whole native aggregation costs (benches/RESULTS.md,
§18), so the default, ``"auto"``, takes the Spark engine wherever it computes the same
partial rows: a batch DataFrame in the groups mode, without ``order_by``, whose aggregates all
have a Spark form (count, sum, min, max and mean, decimals included:
:meth:`~trilink_spark.merge.algebra.aggregates.Aggregate.spark_init`). Everything else (a streaming
frame, the quantity, periodic and punctuation modes, ``order_by``, first, last, a Combine)
needs the Python engine, which runs every mode.

The conf ``spark.trilink.mergeEngine`` (``auto``, ``python`` or ``spark``; default ``auto``)
applies when a call gives no engine (``engine="auto"`` or None): ``python`` forces the Python
engine, ``spark`` takes the Spark engine where the call allows it, as ``auto`` does. An
explicit ``engine="spark"`` the call cannot use is refused with the reason; an explicit
``engine="python"`` always runs in Python.

This is the engine ladder every operator with engines walks
(:func:`~trilink_spark._internal.engines.resolve_engine`), with Local Merge's candidates
(:data:`MERGE_LADDER`); its answer is an :class:`~trilink_spark._internal.engines.EnginePlan`
(``merge.EnginePlan``, also named ``merge.MergeEnginePlan``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..._internal.engines import AUTO, EngineLadder, EnginePlan, EngineRequest
from ..._internal.engines import request_engine, resolve_engine
from ..._internal.validation import refuse_streaming
from .plan import MergePlan
from .spark_engine import spark_partials

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["EnginePlan", "MergeEnginePlan", "EngineRequest", "MERGE_ENGINES", "AUTO_ENGINE",
           "ENGINE_CONF", "SPARK_ENGINE_SCOPE", "MERGE_LADDER", "engine_request",
           "choose_local_engine"]

#: ``engine="auto"``: the Spark engine where the call can run there, else the Python engine.
AUTO_ENGINE = AUTO
#: Engines of :func:`~trilink_spark.local_merge` and :func:`~trilink_spark.global_merge`:
#: ``"auto"`` (default), ``"python"`` (inside each input partition, no exchange, every mode)
#: and ``"spark"`` (Spark's own partial aggregation in the JVM; one exchange of the partial
#: rows).
MERGE_ENGINES: tuple[str, ...] = (AUTO_ENGINE, "python", "spark")
#: ``spark.trilink.mergeEngine``: the engine when a call gives none (``auto``, ``python`` or
#: ``spark``; default ``auto``).
ENGINE_CONF = "mergeEngine"
#: What the Spark engine of Local Merge runs, in words (reasons and refusals say it).
SPARK_ENGINE_SCOPE = ("batch DataFrames in the groups mode without order_by, with count, sum, "
                      "min, max and mean")
#: The plan a merge runs on: :class:`~trilink_spark._internal.engines.EnginePlan`, under the
#: name it had (``merge.MergeEnginePlan(engine, reason)``).
MergeEnginePlan = EnginePlan

#: Local Merge's candidates on the engine ladder
#: (:func:`~trilink_spark._internal.engines.resolve_engine`).
MERGE_LADDER = EngineLadder(
    operator="local_merge", argument="engine", choices=MERGE_ENGINES,
    engines={"python": "python", "spark": "spark"}, preferred="spark", fallback="python",
    runs={"python": "the Python engine merges inside each input partition (no exchange)",
          "spark": ("Spark's partial aggregation in the JVM, no row crosses into Python (one "
                    "exchange of the partial rows)")},
    scope=SPARK_ENGINE_SCOPE, conf=ENGINE_CONF, none_is_auto=True)
#: Why the Spark engine runs a call it allows, in words.
_SPARK_RUNS = ("a batch DataFrame in the groups mode, without order_by, whose aggregates all "
               "have a Spark form (count, sum, min, max, mean): Spark's partial aggregation "
               "in the JVM, no row crosses into Python (one exchange of the partial rows)")


def engine_request(spark: Any, engine: Any) -> EngineRequest:
    """The engine asked for: ``engine`` when it is ``"python"`` or ``"spark"``; for
    ``"auto"`` or None the conf ``spark.trilink.mergeEngine`` (default ``"auto"``): the
    first rung of the ladder (:func:`~trilink_spark._internal.engines.request_engine` with
    :data:`MERGE_LADDER`).

    Raises
    ------
    InvalidArgumentError
        ``engine`` or the conf is a string outside :data:`MERGE_ENGINES` (the message names
        which and what is allowed).
    InvalidArgumentTypeError
        ``engine`` is not a string.

    Notes
    -----
    Cost: one conf read when ``engine`` is ``"auto"`` or None (a round trip on Spark Connect).

    Examples
    --------
    >>> engine_request(None, "python")
    EngineRequest(engine='python', explicit=True, source="engine='python'")
    """
    return request_engine(MERGE_LADDER, spark, engine)


def choose_local_engine(df: DataFrame, plan: MergePlan, engine: str | EngineRequest | None,
                        order_by: str | None) -> tuple[EnginePlan, DataFrame | None]:
    """The engine of a Local Merge of ``df`` by the validated ``plan``, and why; with the
    Spark engine's frame of partial rows
    (:func:`~trilink_spark.merge.engines.spark_engine.spark_partials`) when it is ``"spark"``, else
    None. The one rule for ``local_merge``, ``explain_local_merge`` and the partials of
    ``global_merge``: the engine ladder
    (:func:`~trilink_spark._internal.engines.resolve_engine`) with :data:`MERGE_LADDER`.

    Parameters
    ----------
    df : pyspark.sql.DataFrame
        The input of the merge.
    plan : MergePlan
        Its plan (:func:`~trilink_spark.merge.engines.local.plan_merge`: the mode resolved).
    engine : {"auto", "python", "spark"}, None or EngineRequest
        As the call gave it, or already read (:func:`engine_request`).
    order_by : str or None
        The call's ``order_by``.

    Raises
    ------
    InvalidArgumentError
        An explicit ``engine="spark"`` the call cannot use (the message says why), or a bad
        engine or conf value.
    StreamingNotSupportedError
        An explicit ``engine="spark"`` on a streaming DataFrame.

    Notes
    -----
    Cost: O(aggregates) plus building the Spark engine's query (no job); a conf read.

    Examples
    --------
    >>> choice, frame = choose_local_engine(df, plan, "auto", None)  # doctest: +SKIP
    >>> choice.engine  # doctest: +SKIP
    'spark'
    """
    request = (engine if isinstance(engine, EngineRequest)
               else engine_request(df.sparkSession, engine))
    built: list[DataFrame] = []

    def allows() -> tuple[bool, str]:
        if df.isStreaming:
            if request.explicit:
                refuse_streaming(df, "local_merge(engine='spark')", "Spark's partial "
                                 "aggregation cannot feed later stages of a stream", "Use "
                                 "engine='auto' (the default) or engine='python', which run "
                                 "on a stream in the quantity mode")
            return False, ("a streaming DataFrame (Spark's partial aggregation cannot feed "
                           "later stages)")
        if plan.mode != "groups":
            return False, f"the {plan.mode} mode (its flushes are Python's)"
        if order_by is not None:
            return False, "order_by (Spark's aggregation keeps no arrival order)"
        native, lacking = spark_partials(df, plan)
        if lacking is not None or native is None:
            return False, (f"aggregate {lacking!r} (no Spark form: first and last need "
                           "arrival order, a Combine runs in Python)")
        built.append(native)
        return True, _SPARK_RUNS

    choice = resolve_engine(MERGE_LADDER, request, allows)
    return choice, (built[0] if choice.engine == "spark" and built else None)
