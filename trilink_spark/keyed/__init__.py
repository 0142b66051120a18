"""Keyed event time: per-key watermarks, timers, keyed process functions and their runners."""

from .timers import TimerService
from .watermark import keyed_watermark
from .process import KeyedBatch, KeyedContext, KeyedRuntime, KeyedWatermarkProcessFunction
from .process import KeyWatermarks
from .windows import WINDOW_AGGS, KeyedWindowAggregate
from .batch import keyed_process
from .streaming import KeyedBatchFunction, keyed_foreach_batch
from .swap import SwapReport

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
    "SwapReport",
]
