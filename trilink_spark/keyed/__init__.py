"""Keyed event time: per-key watermarks, timers, keyed process functions and their runners.

The rooms, bottom to top (each imports only the rooms below it):

- :mod:`.semantics`: the process-function contract, the runtime's lateness, idle and TTL
  rules, timers, windows, the key identities; no I/O, no Spark;
- :mod:`.durable`: the state table codec, the manifest, snapshots, the executor-local copy;
- :mod:`.swaps`: swap plans, block plans, and the replanner that owns a batch's placement;
- :mod:`.records`: the history record and the committed-state reader;
- :mod:`.run`: the runners on Spark (``keyed_watermark``, ``keyed_process``,
  ``keyed_foreach_batch``), their tasks and the JVM window plan.

The names below are this package's public ones; the module paths of 0.x (``keyed.process``,
``keyed.snapshot``, ``keyed.streaming``, ...) still resolve, each name with a
:class:`DeprecationWarning` naming its home, until the next minor release.
"""

from typing import Any

from .. import columns
from .._internal.deprecation import ModuleShims, warn_moved
from .semantics.timers import TimerService
from .run.watermark import keyed_watermark
from .semantics.process import (KeyedContext, KeyedRows, KeyedRuntime,
                                KeyedWatermarkProcessFunction)
from .semantics.process import KeyWatermarks
from .semantics.windows import WINDOW_AGGS, KeyedWindowAggregate
from .run.bounded import keyed_process
from .run.window_plan import KeyedProcessPlan, explain_keyed_process
from .run.streaming import KeyedBatchFunction, keyed_foreach_batch
from .swaps.plan import SwapReport
from .records.state_reader import read_state, state_summary
from .records.history import read_history

__all__ = [
    "TimerService",
    "keyed_watermark",
    "KeyedRows",
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


from .. import placement as _placement  # noqa: E402  (homes of the shims below)
from ..state import store as _store  # noqa: E402
from . import durable, records, run, semantics, swaps  # noqa: E402

#: The module paths this package had before its rooms, and the modules now holding their
#: names (searched in order).
MOVED_MODULES = {f"{__name__}.{old}": homes for old, homes in {
    "process": (semantics.process,),
    "timers": (semantics.timers,),
    "windows": (semantics.windows,),
    "snapshot": (semantics.keys, durable.codec, _store),
    "snapshots": (durable.snapshot_writer,),
    "manifest": (durable.manifest,),
    "incremental": (durable.local_sync,),
    "swap": (swaps.plan,),
    "swap_blocks": (swaps.block_plan,),
    "replan": (swaps.placement, swaps.replanner),
    "history": (records.history,),
    "state_reader": (records.state_reader,),
    "batch": (run.bounded,),
    "streaming": (run.streaming, swaps.replanner),
    "task": (run.task,),
    "prepare": (run.prepare, _placement.source),
    "window_plan": (run.window_plan,),
    "watermark": (run.watermark,),
}.items()}
SHIMS = ModuleShims(MOVED_MODULES, {f"{__name__}.process": {
    "KeyedBatch": ("KeyedRows", semantics.process)}}).install()


def __getattr__(name: str) -> Any:
    """Names that left this package. ``EVENT_TIME_COL`` left for
    :mod:`trilink_spark.columns` (it was in this package's ``__all__`` in 0.1), and the module
    paths of :data:`MOVED_MODULES` for the rooms, and ``KeyedBatch`` became
    :class:`KeyedRows` (four things were called "batch"): each still resolves here, with a
    :class:`DeprecationWarning` naming its home, until the next minor release removes it."""
    if f"{__name__}.{name}" in MOVED_MODULES:
        return SHIMS.module(f"{__name__}.{name}")
    if name == "KeyedBatch":  # one partition's judged rows, not a batch function
        warn_moved(f"{__name__}.{name}", f"{__name__}.KeyedRows", what="the old name")
        return KeyedRows
    if name != "EVENT_TIME_COL":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warn_moved(f"{__name__}.{name}", f"{columns.__name__}.{name}")
    return columns.EVENT_TIME_COL
