"""Which engine computes a merge: Spark's aggregation in the JVM, or Python in each partition.

One rule, :func:`choose_local_engine`, decides for :func:`~trilink_spark.local_merge` and
:func:`~trilink_spark.merge.explain_local_merge`, and (for the partials it merges)
for :func:`~trilink_spark.global_merge`. Every input row that crosses from the JVM into a
Python worker costs about what Spark's whole native aggregation costs (benches/RESULTS.md,
§18), so the default, ``"auto"``, takes the Spark engine wherever it computes the same
partial rows: a batch DataFrame in the groups mode, without ``order_by``, whose aggregates all
have a Spark form (count, sum, min, max and mean, decimals included:
:meth:`~trilink_spark.merge.aggregates.Aggregate.spark_init`). Everything else (a streaming
frame, the quantity, periodic and punctuation modes, ``order_by``, first, last, a Combine)
needs the Python engine, which runs every mode.

The conf ``spark.trilink.mergeEngine`` (``auto``, ``python`` or ``spark``; default ``auto``)
applies when a call gives no engine (``engine="auto"`` or None): ``python`` forces the Python
engine, ``spark`` takes the Spark engine where the call allows it, as ``auto`` does. An
explicit ``engine="spark"`` the call cannot use is refused with the reason; an explicit
``engine="python"`` always runs in Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from .._internal.validation import refuse_streaming
from .plan import MergePlan
from .spark_engine import spark_partials

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["MergeEnginePlan", "EngineRequest", "MERGE_ENGINES", "AUTO_ENGINE", "ENGINE_CONF",
           "SPARK_ENGINE_SCOPE", "engine_request", "choose_local_engine"]

#: ``engine="auto"``: the Spark engine where the call can run there, else the Python engine.
AUTO_ENGINE = "auto"
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


@dataclass(frozen=True)
class MergeEnginePlan:
    """The engine a merge runs on, and why (see :func:`~trilink_spark.merge.explain_local_merge`).

    Attributes
    ----------
    engine : str
        ``"spark"``: Spark's aggregation in the JVM, no row crosses into Python. ``"python"``:
        each input partition merged in a Python worker.
    reason : str
        Why, in words, naming what decided: an explicit engine, the conf, a streaming frame,
        the mode, ``order_by``, an aggregate, the store.

    Examples
    --------
    >>> MergeEnginePlan("python", "the quantity mode: its flushes are Python's").engine
    'python'
    """

    engine: str
    reason: str


@dataclass(frozen=True)
class EngineRequest:
    """The engine a call asks for: ``engine`` one of :data:`MERGE_ENGINES`; ``explicit``
    when the call named ``"python"`` or ``"spark"`` itself; ``source`` what asked, in words
    (``"engine='spark'"``, ``"spark.trilink.mergeEngine=python"``, ``"engine='auto'"``)."""

    engine: str
    explicit: bool
    source: str


def engine_request(spark: Any, engine: str | None) -> EngineRequest:
    """The engine asked for: ``engine`` when it is ``"python"`` or ``"spark"``; for
    ``"auto"`` or None the conf ``spark.trilink.mergeEngine`` (default ``"auto"``).

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
    from .._internal.spark.session import CONF_PREFIX, conf_get

    allowed = ", ".join(MERGE_ENGINES)
    if engine is not None and engine != AUTO_ENGINE:
        if not isinstance(engine, str):
            raise InvalidArgumentTypeError(
                f"engine must be one of {allowed} (a string), got {engine!r}")
        if engine not in MERGE_ENGINES:
            raise InvalidArgumentError(f"engine must be one of {allowed}, got {engine!r}")
        return EngineRequest(engine, True, f"engine={engine!r}")
    conf = CONF_PREFIX + ENGINE_CONF
    value = conf_get(spark, ENGINE_CONF, AUTO_ENGINE)
    if value not in MERGE_ENGINES:
        raise InvalidArgumentError(f"{conf} must be one of {allowed}, got {value!r}")
    if value == AUTO_ENGINE:  # unset, or set to the default
        return EngineRequest(AUTO_ENGINE, False, "engine='auto'")
    return EngineRequest(value, False, f"{conf}={value}")


def choose_local_engine(df: DataFrame, plan: MergePlan, engine: str | None,
                        order_by: str | None) -> tuple[MergeEnginePlan, DataFrame | None]:
    """The engine of a Local Merge of ``df`` by the validated ``plan``, and why; with the
    Spark engine's frame of partial rows
    (:func:`~trilink_spark.merge.spark_engine.spark_partials`) when it is ``"spark"``, else
    None. The one rule for ``local_merge``, ``explain_local_merge`` and the partials of
    ``global_merge``.

    Parameters
    ----------
    df : pyspark.sql.DataFrame
        The input of the merge.
    plan : MergePlan
        Its plan (:func:`~trilink_spark.merge.local.plan_merge`: the mode resolved).
    engine : {"auto", "python", "spark"} or None
        As the call gave it (:func:`engine_request`).
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
    request = engine_request(df.sparkSession, engine)
    if request.engine == "python":
        return MergeEnginePlan("python", f"{request.source}: the Python engine merges inside "
                                         "each input partition (no exchange)"), None
    why = None
    native = None
    if df.isStreaming:
        if request.explicit:
            refuse_streaming(df, "local_merge(engine='spark')", "Spark's partial aggregation "
                             "cannot feed later stages of a stream", "Use engine='auto' (the "
                             "default) or engine='python', which run on a stream in the "
                             "quantity mode")
        why = "a streaming DataFrame (Spark's partial aggregation cannot feed later stages)"
    elif plan.mode != "groups":
        why = f"the {plan.mode} mode (its flushes are Python's)"
    elif order_by is not None:
        why = "order_by (Spark's aggregation keeps no arrival order)"
    else:
        native, lacking = spark_partials(df, plan)
        if lacking is not None:
            why = (f"aggregate {lacking!r} (no Spark form: first and last need arrival "
                   "order, a Combine runs in Python)")
    if why is None:
        return MergeEnginePlan("spark", f"{request.source}: a batch DataFrame in the groups "
                                        "mode, without order_by, whose aggregates all have a "
                                        "Spark form (count, sum, min, max, mean): Spark's "
                                        "partial aggregation in the JVM, no row crosses into "
                                        "Python (one exchange of the partial rows)"), native
    if request.explicit:
        raise InvalidArgumentError(
            f"engine='spark' cannot run {why}; it runs {SPARK_ENGINE_SCOPE}: use "
            "engine='auto' or engine='python'")
    if request.engine == "spark":  # the conf asked
        return MergeEnginePlan("python", f"{request.source} does not apply to {why}: the "
                                         "Python engine runs"), None
    return MergeEnginePlan("python", f"{request.source}: {why}: the Python engine runs"), None
