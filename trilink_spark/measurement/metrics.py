"""Per-task figures of finished Spark stages, read from Spark's status store.

Spark keeps every task's metrics in its application status store (``AppStatusStore``), fed by
a listener that runs whether or not the web UI is enabled. The REST API serves the same data
but needs the UI; :func:`task_metrics` reads the store directly through the driver's JVM, so
it works with ``spark.ui.enabled=false``, as the test suite and most batch jobs run.

What a figure means:

- ``duration_ms``: the task's wall time, launch to finish (scheduling delay and result fetch
  included);
- ``run_ms``: ``executorRunTime``, the time the executor spent running the task;
- ``shuffle_read_records`` and ``input_records``: rows read from a shuffle and from a source;
- ``rows``: the two summed, the rows the task processed.

Spark keeps a bounded history (``spark.ui.retainedStages``, ``spark.ui.retainedTasks``,
defaults 1,000 and 100,000): figures of stages it has dropped are no longer there.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .._internal.spark.compat import is_connect
from ..errors import InvalidArgumentError, InvalidArgumentTypeError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["TASK_METRIC_COLUMNS", "task_metrics"]

logger = logging.getLogger(__name__)

#: Columns of :func:`task_metrics`' result, in order.
TASK_METRIC_COLUMNS: tuple[str, ...] = (
    "stage_id", "stage_attempt", "partition", "attempt", "status", "rows", "duration_ms",
    "run_ms", "shuffle_read_records", "input_records", "shuffle_write_records",
    "shuffle_write_ms", "fetch_wait_ms",
)
_INT_COLUMNS = ("stage_id", "stage_attempt", "partition", "attempt", "rows", "duration_ms",
                "run_ms", "shuffle_read_records", "input_records", "shuffle_write_records",
                "shuffle_write_ms", "fetch_wait_ms")
#: At most this many tasks are read per stage attempt.
MAX_TASKS_PER_STAGE = 1_000_000


def _empty(reason: str | None) -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series([], dtype="int64" if c in _INT_COLUMNS else "object")
                          for c in TASK_METRIC_COLUMNS})
    frame.attrs["unavailable"] = reason
    return frame


def _stage_ids(spark: SparkSession, job_group: str | None,
               stage_ids: Iterable[int] | None) -> list[int]:
    if stage_ids is not None:
        return sorted({int(s) for s in stage_ids})
    tracker = spark.sparkContext.statusTracker()
    jobs = (tracker.getJobIdsForGroup(job_group) if job_group is not None
            else _all_jobs(spark))
    found: set[int] = set()
    for job in jobs:
        info = tracker.getJobInfo(job)
        if info is not None:
            found.update(int(s) for s in info.stageIds)
    return sorted(found)


def _all_jobs(spark: SparkSession) -> list[int]:
    store = spark.sparkContext._jsc.sc().statusStore()
    jobs = store.jobsList(None)
    out = []
    it = jobs.iterator()
    while it.hasNext():
        out.append(int(it.next().jobId()))
    return out


def _option(value: Any) -> Any:
    """A Scala ``Option``'s value, or None."""
    return value.get() if value.isDefined() else None


def _stage_rows(store: Any, stage: int) -> list[tuple[Any, ...]]:
    try:
        data = store.lastStageAttempt(stage)
    except Exception:  # noqa: BLE001 - a stage Spark has dropped or never ran
        return []
    if str(data.status()) == "SKIPPED":
        return []
    attempt = int(data.attemptId())
    rows = []
    it = store.taskList(stage, attempt, MAX_TASKS_PER_STAGE).iterator()
    while it.hasNext():
        task = it.next()
        metrics = _option(task.taskMetrics())
        duration = _option(task.duration())
        if metrics is None:
            run = shuffled = read = written = write_ms = fetch_ms = -1
        else:
            run = int(metrics.executorRunTime())
            shuffled = int(metrics.shuffleReadMetrics().recordsRead())
            read = int(metrics.inputMetrics().recordsRead())
            written = int(metrics.shuffleWriteMetrics().recordsWritten())
            write_ms = int(metrics.shuffleWriteMetrics().writeTime()) // 1_000_000  # ns
            fetch_ms = int(metrics.shuffleReadMetrics().fetchWaitTime())
        total = -1 if metrics is None else shuffled + read
        rows.append((stage, attempt, int(task.partitionId()), int(task.attempt()),
                     str(task.status()), total, -1 if duration is None else int(duration),
                     run, shuffled, read, written, write_ms, fetch_ms))
    return rows


def task_metrics(spark: SparkSession, job_group: str | None = None,
                 stage_ids: Iterable[int] | None = None) -> pd.DataFrame:
    """One row per task of finished stages: where each task's time went, and on how many rows.

    Parameters
    ----------
    spark : pyspark.sql.SparkSession
        A classic session (Spark Connect has no driver JVM here: the result is then empty and
        says so).
    job_group : str, optional
        Only the stages of the jobs run under this group (``sc.setJobGroup``; in a
        ``foreachBatch``, Spark runs each batch's jobs under the query's group).
    stage_ids : iterable of int, optional
        Only these stages (wins over ``job_group``). Default: every stage Spark still holds.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`TASK_METRIC_COLUMNS`: ``stage_id``, ``stage_attempt``, ``partition``,
        ``attempt``, ``status`` (``"SUCCESS"``, ``"FAILED"``, ``"KILLED"``, ``"RUNNING"``),
        ``rows`` (input plus shuffle records read), ``duration_ms``, ``run_ms``,
        ``shuffle_read_records``, ``input_records``, ``shuffle_write_records``,
        ``shuffle_write_ms`` (writing the shuffle files), ``fetch_wait_ms`` (blocked fetching
        shuffle blocks); sorted by stage, partition and attempt.
        Each stage's latest attempt only; skipped stages have no rows. A figure Spark has not
        recorded (a task still running) is ``-1``. When nothing can be read,
        ``result.attrs["unavailable"]`` holds the reason and the frame is empty; otherwise it
        is ``None``.

    Raises
    ------
    InvalidArgumentTypeError
        ``spark`` is not a SparkSession, ``job_group`` is not a str, or ``stage_ids`` is not
        an iterable of ints.
    InvalidArgumentError
        A stage id below 0.

    Notes
    -----
    Never raises for what Spark cannot provide: a Connect session, a stopped context or a
    failed JVM call give an empty result with the reason (and a warning in the log). Cost: one
    JVM call per stage and per task on the driver, O(tasks); no Spark job runs.

    Examples
    --------
    >>> spark.sparkContext.setJobGroup("wordcount", "wordcount")  # doctest: +SKIP
    >>> counts = tl.keyed_agg(words, "word", F.count("*").alias("n")).collect()  # doctest: +SKIP
    >>> from trilink_spark.measurement import task_metrics
    >>> m = task_metrics(spark, job_group="wordcount")  # doctest: +SKIP
    >>> m.groupby("stage_id").run_ms.max()  # doctest: +SKIP
    """
    from pyspark.sql import SparkSession

    if not is_connect(spark) and not isinstance(spark, SparkSession):
        raise InvalidArgumentTypeError(
            f"spark must be a SparkSession, got {type(spark).__name__}")
    if job_group is not None and not isinstance(job_group, str):
        raise InvalidArgumentTypeError(
            f"job_group must be a str or None, got {type(job_group).__name__}")
    wanted: list[int] | None = None
    if stage_ids is not None:
        if isinstance(stage_ids, (str, bytes)):
            raise InvalidArgumentTypeError("stage_ids must be an iterable of int, got a string")
        try:
            listed = list(stage_ids)
        except TypeError:
            raise InvalidArgumentTypeError(
                f"stage_ids must be an iterable of int, got {type(stage_ids).__name__}"
            ) from None
        wanted = []
        for s in listed:
            if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
                raise InvalidArgumentTypeError(
                    f"stage_ids must hold ints, got {type(s).__name__}")
            if s < 0:
                raise InvalidArgumentError(f"stage ids are >= 0, got {s}")
            wanted.append(int(s))
    if is_connect(spark):
        return _empty("Spark Connect: the client has no driver JVM to read the status store "
                      "from")
    try:
        store = spark.sparkContext._jsc.sc().statusStore()
        rows = [row for stage in _stage_ids(spark, job_group, wanted)
                for row in _stage_rows(store, stage)]
    except Exception as err:  # noqa: BLE001 - never crash the job for a metric
        reason = f"Spark's status store could not be read ({type(err).__name__}: {err})"
        logger.warning("task_metrics: %s", reason)
        return _empty(reason)
    if not rows:
        frame = _empty(None)
        return frame
    frame = pd.DataFrame(rows, columns=list(TASK_METRIC_COLUMNS))
    for column in _INT_COLUMNS:
        frame[column] = frame[column].astype("int64")
    frame = frame.sort_values(["stage_id", "partition", "attempt"], kind="stable")
    frame = frame.reset_index(drop=True)
    frame.attrs["unavailable"] = None
    return frame
