"""Keyed event time: per-key watermarks, timers, keyed process functions and their runners."""

from typing import Any

from .. import columns
from .._internal.deprecation import warn_moved
from .timers import TimerService
from .watermark import keyed_watermark
from .process import KeyedBatch, KeyedContext, KeyedRuntime, KeyedWatermarkProcessFunction
from .process import KeyWatermarks
from .windows import WINDOW_AGGS, KeyedWindowAggregate
from .batch import keyed_process
from .window_plan import KeyedProcessPlan, explain_keyed_process
from .streaming import KeyedBatchFunction, keyed_foreach_batch
from .swap import SwapReport
from .state_reader import read_state, state_summary
from .history import read_history

__all__ = [
    "TimerService",
    "keyed_watermark",
    "KeyedBatch",
    "KeyWatermarks",
    "KeyedContext",
    "KeyedRuntime",
    "KeyedWatermarkProcessFunction",
    "WINDOW_AGGS",
    "KeyedWindowAggregate",
    "KeyedBatchFunction",
    "keyed_foreach_batch",
    "keyed_process",
    "explain_keyed_process",
    "KeyedProcessPlan",
    "SwapReport",
    "read_state",
    "state_summary",
    "read_history",
]


def __getattr__(name: str) -> Any:
    """``EVENT_TIME_COL`` left this package for :mod:`trilink_spark.columns` (it was in this
    package's ``__all__`` in 0.1): it still resolves here, with a :class:`DeprecationWarning`
    naming its home, until the next minor release removes it."""
    if name != "EVENT_TIME_COL":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warn_moved(f"{__name__}.{name}", f"{columns.__name__}.{name}")
    return columns.EVENT_TIME_COL
