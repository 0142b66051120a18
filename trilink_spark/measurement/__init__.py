"""Measurement: what the data plane reports about a running job, read once and checked.

The control plane's first job is to see: this package reads the figures the other control
subpackages decide from, and changes nothing itself.

- per-task figures of finished Spark stages, from Spark's status store
  (:func:`task_metrics`, :data:`TASK_METRIC_COLUMNS`);
- a micro-batch's ``StreamingQueryProgress``: rates, durations and the sources' backlog
  (:func:`parse_progress`, :class:`BatchProgress`), the longest phase it accepts
  (:data:`MAX_DURATION_MS`) and the largest rate the advisors work with (:data:`RATE_CAP`,
  :func:`clip_rate`);
- the records trilink operators write of their own work (:class:`OperatorTimer`,
  :func:`read_operator_timings`, :class:`OperatorTimingReader`). The data-plane tasks write
  them, so the module lives in the bottom layer (``trilink_spark._internal.optiming``); this
  package is their public home.

:mod:`trilink_spark.switching`, :mod:`trilink_spark.advice` and :mod:`trilink_spark.elastic`
read from it; it imports only the bottom layer.

Examples
--------
>>> from trilink_spark.measurement import parse_progress
>>> p = parse_progress({"batchId": 3, "numInputRows": 1200, "inputRowsPerSecond": 400.0,
...                     "durationMs": {"triggerExecution": 2500}})
>>> p.batch_id, p.input_rate, p.duration_ms
(3, 400.0, 2500.0)
"""

from .._internal.optiming import OPERATOR_TIMING_COLUMNS, OPERATOR_TIMING_CONF, OperatorTimer
from .._internal.optiming import OperatorTimingReader, read_operator_timings
from .metrics import TASK_METRIC_COLUMNS, task_metrics
from .progress import MAX_DURATION_MS, MAX_PROGRESS_BYTES, RATE_CAP, BatchProgress, clip_rate
from .progress import parse_progress

__all__ = [
    "TASK_METRIC_COLUMNS",
    "task_metrics",
    "BatchProgress",
    "parse_progress",
    "MAX_PROGRESS_BYTES",
    "MAX_DURATION_MS",
    "RATE_CAP",
    "clip_rate",
    "OPERATOR_TIMING_COLUMNS",
    "OPERATOR_TIMING_CONF",
    "OperatorTimer",
    "OperatorTimingReader",
    "read_operator_timings",
]
