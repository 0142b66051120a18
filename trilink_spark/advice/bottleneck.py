"""Bottleneck detection and rescale advice for a running query, as a flow network.

"Flow-network based auto rescale strategy for Flink" (FAR-Flink, Li et al., 2019) models a job
as a flow network: an edge's capacity is the largest rate it sustains, its flow the current
rate, and a minimum cut whose flow reaches ``lambda`` x its capacity names the operators to
scale. DS2 (Kalavri et al., OSDI 2018) measures each operator's *true* processing rate (records
over useful time, not over wall time) and sizes every operator in one pass.

Here the operators are the stages Spark runs for each micro-batch, named by their position
(``"stage 0"`` reads the source, later stages read a shuffle), and any operator that times
itself (:meth:`BottleneckAdvisor.observe_operator`, e.g. the keyed runtime's
``run.task_timings()``). For each node, over the last ``window_batches`` batches:

- **true rate** (DS2): rows processed per second of the tasks' own run time, per task;
- **capacity**: true rate x the tasks that can run at once (``min(tasks, slots)``);
- **selectivity**: rows into the node per source row, so every node's figures convert to
  source rows per second and the nodes form one flow network from the source to the sink;
- **offered flow**: the source's input rate (``inputRowsPerSecond``) plus the backlog (rows
  the sources have and the query has not read, as a rate over one batch), x selectivity;
- **utilisation**: offered flow / capacity.

The minimum cut of the network (:func:`~trilink_spark.advice.network.max_flow`, which never
splits one operator's tasks) is the bottleneck when the offered flow reaches ``lambda_`` x
its capacity; DS2's parallelism (:func:`~trilink_spark.advice.ds2.ds2_parallelism`) says how
many tasks each node needs for the offered flow. The report turns that into actions: more
partitions through a swap, ``local_merge`` or Ahead KeyBy when the shuffle is the cut,
``maxOffsetsPerTrigger`` when the whole query cannot keep up, more executors when the slots
run out.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import numpy as np
import pandas as pd

from .._internal.validation import INT64_MAX, count, number
from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from .ds2 import TrueRate, ds2_parallelism
from .analysis import LAMBDA_RANGE, find_bottlenecks
from .network import FlowNetwork, max_flow
from .._internal.optiming import OPERATOR_TIMING_COLUMNS, OperatorTimingReader, is_operator_name
from .._internal.optiming import timing_root
from ..measurement.metrics import TASK_METRIC_COLUMNS, task_metrics
from ..measurement.progress import BatchProgress, clip_rate, parse_progress
from ..eventtime import parse_interval

__all__ = ["NodeReport", "BottleneckReport", "BottleneckAdvisor", "BottleneckListener",
           "MAX_ADVISED_TASKS"]

logger = logging.getLogger(__name__)

SOURCE = "source"
SINK = "sink"
#: True rate (rows/s) of a node that spent no measurable time: never the cut.
_FAST = 1e12
_MAX = sys.float_info.max
#: Largest row count and busy time (ms) of one observation: Spark's ``Long``.
_LONG_MAX = float(INT64_MAX)  # 2**63: the nearest double
#: Most tasks a report advises for one node (DS2's parallelism is capped here): more than any
#: Spark stage runs well. A node at the cap needs at least that many; figures that ask for
#: more (a phase of a year for one row) come from a corrupt or absurd measurement.
MAX_ADVISED_TASKS = 1_000_000
#: Largest ``maxOffsetsPerTrigger`` advised: Spark's ``Long``.
_MAX_OFFSETS = INT64_MAX
#: The phases of a micro-batch in ``durationMs``, in order (``triggerExecution`` is their
#: total): the nodes of a report built from progress events alone.
PHASES = ("latestOffset", "getOffset", "walCommit", "getBatch", "queryPlanning", "addBatch",
          "commitOffsets")


@dataclass(frozen=True)
class NodeReport:
    """One operator of the flow network, with its figures over the window.

    Attributes
    ----------
    name : str
        ``"stage 0"``, ``"stage 1"``, ... (by position in the batch), or an operator's own name.
    kind : str
        ``"source read"``, ``"shuffle read"`` or ``"operator"``.
    rows_per_batch : float
    selectivity : float
        Rows into this node per source row.
    tasks : int
        Tasks per batch (its parallelism).
    true_rate : float
        Rows per second of useful (run) time, per task.
    capacity : float
        Rows per second the node sustains with ``min(tasks, slots)`` tasks at once.
    offered : float
        Rows per second offered to it (input rate plus backlog, x selectivity).
    utilisation : float
        ``offered / capacity``.
    ds2_parallelism : int
        Tasks DS2 says the node needs for the offered flow, at most :data:`MAX_ADVISED_TASKS`.
    """

    name: str
    kind: str
    rows_per_batch: float
    selectivity: float
    tasks: int
    true_rate: float
    capacity: float
    offered: float
    utilisation: float
    ds2_parallelism: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (strict JSON: an infinite or NaN figure is ``None``). O(1)."""
        return {k: _json_number(getattr(self, k)) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class BottleneckReport:
    """What :meth:`BottleneckAdvisor.report` concluded.

    Attributes
    ----------
    nodes : list of NodeReport
        In flow order, source side first.
    bottleneck : list of str
        The nodes of the minimum cut when its flow reaches ``lambda_`` x its capacity; empty
        when the query has headroom.
    cut : tuple of (list of str, list of str)
        The minimum cut's source side and sink side (the network's node names).
    max_flow : float
        The most source rows per second the query sustains (the cut's capacity); ``inf``
        when no node of the cut spent measurable time (nothing bounds the query). Rates
        are clipped to :data:`~trilink_spark.measurement.progress.RATE_CAP`.
    source_rate, backlog_rate, offered_rate : float
        Input rate, backlog as a rate, and their sum, in source rows per second.
    utilisation : float
        ``offered_rate / max_flow``.
    actions : list of dict
        ``{"action", "node", "setting", "expected"}``, most useful first.
    batches : int
        Batches the figures cover.
    reason : str
    """

    nodes: list[NodeReport]
    bottleneck: list[str]
    cut: tuple[list[str], list[str]]
    max_flow: float
    source_rate: float
    backlog_rate: float
    offered_rate: float
    utilisation: float
    actions: list[dict[str, str]]
    batches: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``trilink-spark advise --json``; strict JSON: an infinite or NaN
        figure is ``None``). O(nodes)."""
        return {
            "nodes": [n.to_dict() for n in self.nodes], "bottleneck": list(self.bottleneck),
            "cut": [list(self.cut[0]), list(self.cut[1])],
            "max_flow": _json_number(self.max_flow),
            "source_rate": _json_number(self.source_rate),
            "backlog_rate": _json_number(self.backlog_rate),
            "offered_rate": _json_number(self.offered_rate),
            "utilisation": _json_number(self.utilisation),
            "actions": [dict(a) for a in self.actions], "batches": self.batches,
            "reason": self.reason,
        }

    def __str__(self) -> str:
        lines = [self.reason, "",
                 f"{'node':<14} {'kind':<13} {'tasks':>5} {'true rate/s':>12} "
                 f"{'capacity/s':>11} {'offered/s':>10} {'util':>6} {'DS2':>4}"]
        for n in self.nodes:
            mark = " <- bottleneck" if n.name in self.bottleneck else ""
            lines.append(f"{n.name:<14} {n.kind:<13} {n.tasks:>5} {n.true_rate:>12.1f} "
                         f"{n.capacity:>11.1f} {n.offered:>10.1f} {n.utilisation:>6.2f} "
                         f"{n.ds2_parallelism:>4}{mark}")
        if self.actions:
            lines.append("")
            lines.extend(f"- {a['action']} ({a['setting']}): {a['expected']}"
                         for a in self.actions)
        return "\n".join(lines)


def _json_number(value: Any) -> Any:
    """``value``, or ``None`` for a float that strict JSON cannot carry (inf, NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@dataclass
class _Batch:
    progress: BatchProgress | None = None
    nodes: dict[str, dict[str, float]] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    seconds: float | None = None
    #: stage id -> its node ("stage i"), and the exchange each stage's shuffle write feeds
    stages: dict[int, str] = field(default_factory=dict)
    exchanges: dict[int, str] = field(default_factory=dict)
    #: operator node -> {stage id: busy ms} (from operator timings)
    in_stage: dict[str, dict[int, float]] = field(default_factory=dict)


#: The columns of a task-metrics frame :meth:`BottleneckAdvisor.observe_stages` needs.
STAGE_COLUMNS = tuple(TASK_METRIC_COLUMNS[:10])
#: Optional columns: with them, each shuffle becomes an ``"exchange"`` node.
EXCHANGE_COLUMNS = ("shuffle_write_records", "shuffle_write_ms", "fetch_wait_ms")
_FIGURES = ("stage_id", "rows", "duration_ms", "run_ms", "shuffle_read_records",
            "input_records")


def _successful_tasks(metrics: pd.DataFrame) -> pd.DataFrame:
    """The successful tasks of a task-metrics frame, figures as floats (NaN -> -1)."""
    done = metrics[metrics["status"] == "SUCCESS"]
    out: dict[str, Any] = {}
    extra = tuple(c for c in EXCHANGE_COLUMNS if c in metrics.columns)
    for column in _FIGURES + extra:
        raw = done[column]
        if raw.dtype == bool or not (pd.api.types.is_numeric_dtype(raw)
                                     or raw.dtype == object):
            raise InvalidArgumentTypeError(
                f"metrics column {column!r} must hold numbers, got dtype {raw.dtype}")
        values = pd.to_numeric(raw, errors="coerce") if raw.dtype == object else raw
        if raw.dtype == object and bool((values.isna() & raw.notna()).any()):
            bad = raw[values.isna() & raw.notna()].iloc[0]
            raise InvalidArgumentTypeError(
                f"metrics column {column!r} must hold numbers, got {bad!r:.40}")
        out[column] = values.astype("float64")
    frame = pd.DataFrame(out, index=done.index)
    if bool(frame["stage_id"].isna().any()) or not bool(
            np.isfinite(frame["stage_id"]).all()):
        raise InvalidArgumentError("metrics has a successful task without a (finite) stage_id; "
                                   "every task row needs its stage's id")
    return frame.fillna(-1.0)


def _unique_columns(frame: pd.DataFrame, what: str) -> None:
    duplicated = sorted({str(c) for c in frame.columns[frame.columns.duplicated()]})
    if duplicated:
        raise InvalidArgumentTypeError(
            f"{what} has duplicate columns: {', '.join(duplicated)}"[:200])


class BottleneckAdvisor:
    """Find the bottleneck of a running query and say what to change.

    Parameters
    ----------
    lambda_ : float
        FAR-Flink's Eq. 10 threshold, in [0.85, 1] (default 0.85): when a stream is offered
        more than it carries (input plus backlog), the cuts whose flow reaches ``lambda_`` x
        their capacity name the nodes to scale; for a bounded job (no progress observed),
        the cuts within ``1 / lambda_`` of the minimum.
    window_batches : int
        Batches the figures are summed over (default 5).
    warmup_batches : int
        First batches ignored (the JVM warming up, state being created; default 2).
    slots : int, optional
        Tasks that can run at once (default: each node's own task count).
    trigger_interval : float, timedelta or str, optional
        The query's trigger interval (``"10 seconds"``). A batch must then be processed
        within it: the offered rate is at least the batch's rows over the interval, so a
        query whose batches outgrow their trigger shows its unmet flow even when its source
        reports no backlog (a file source).

    Notes
    -----
    Thread-safe: a listener feeds it from Spark's listener thread while another thread asks
    for a report. Cost: ``observe_*`` O(tasks of the batch); :meth:`report` O(nodes^2) for the
    flow network. Memory: ``window_batches`` batches of per-node sums.

    Examples
    --------
    >>> adv = BottleneckAdvisor(warmup_batches=0)
    >>> adv.observe_operator("parse", rows=1000, busy_ms=100, tasks=2)
    >>> adv.observe_operator("count", rows=1000, busy_ms=1000, tasks=2)
    >>> adv.observe_progress({"batchId": 0, "numInputRows": 1000, "inputRowsPerSecond": 2100.0,
    ...                       "durationMs": {"triggerExecution": 600}})
    >>> r = adv.report()
    >>> r.bottleneck, round(r.max_flow), r.nodes[1].ds2_parallelism
    (['count'], 2000, 3)
    """

    def __init__(self, lambda_: float = 0.85, window_batches: int = 5, warmup_batches: int = 2,
                 *, slots: int | None = None, trigger_interval: Any = None) -> None:
        self.lambda_ = number(lambda_, "lambda_", low=LAMBDA_RANGE[0], high=LAMBDA_RANGE[1])
        self.window_batches = count(window_batches, "window_batches", 1, plain=True)
        self.warmup_batches = count(warmup_batches, "warmup_batches", 0, plain=True)
        self.slots = None if slots is None else count(slots, "slots", 1, plain=True)
        self.trigger_s: float | None = None
        if trigger_interval is not None:
            value = trigger_interval
            if isinstance(value, str):
                value = parse_interval(value, "trigger_interval")
            if isinstance(value, timedelta):
                value = value.total_seconds()
            self.trigger_s = number(value, "trigger_interval", low=1e-6, high=_MAX)
        self._lock = threading.Lock()
        self._batches: deque[_Batch] = deque(maxlen=self.window_batches)
        self._current = _Batch()
        self._seen = 0
        self._last_id: int | None = None
        self.last_progress: BatchProgress | None = None

    # ------------------------------------------------------------------ observations
    def observe_progress(self, progress: Any) -> None:
        """Take one batch's ``StreamingQueryProgress`` (or its dict or JSON); it closes the
        batch: stage and operator figures observed since the previous progress belong to it.

        A progress with the latest ``batchId`` again (a batch replayed after a failure, the
        repeated event of an idle trigger, a duplicated line) replaces that batch in the
        window instead of counting twice; any other ``batchId`` is a new batch (a lower one:
        the query was restarted). Without stage or
        operator figures, the trigger's ``durationMs`` phases (else ``triggerExecution``)
        are the nodes.

        Raises
        ------
        InvalidArgumentTypeError, InvalidArgumentError
            As :func:`~trilink_spark.measurement.progress.parse_progress`; nothing is recorded.
        """
        parsed = parse_progress(progress)
        with self._lock:
            batch, self._current = self._current, _Batch()
            self.last_progress = parsed
            batch.progress = parsed
            if not batch.nodes and parsed.input_rows > 0:
                # progress alone: the trigger's phases, one after another on the driver
                for phase in PHASES:
                    ms = parsed.durations_ms.get(phase, 0.0)
                    if ms > 0:
                        batch.nodes[f"phase {phase}"] = {
                            "rows": float(parsed.input_rows), "busy_ms": ms, "tasks": 1}
                        batch.kinds[f"phase {phase}"] = "phase"
                if not batch.nodes and parsed.duration_ms > 0:  # the total alone
                    batch.nodes["phase triggerExecution"] = {
                        "rows": float(parsed.input_rows), "busy_ms": parsed.duration_ms,
                        "tasks": 1}
                    batch.kinds["phase triggerExecution"] = "phase"
            if parsed.batch_id == self._last_id:
                # the same batch again (replayed after a failure, an idle trigger's event, a
                # duplicated line): it supersedes the one in the window, never counts twice
                kept = [b for b in self._batches
                        if b.progress is None or b.progress.batch_id != parsed.batch_id]
                if len(kept) < len(self._batches):
                    self._batches.clear()
                    self._batches.extend(kept)
                    self._batches.append(batch)
                return  # else a warm-up batch again: still warm-up
            self._last_id = parsed.batch_id
            self._close(batch)

    def observe_stages(self, metrics: pd.DataFrame, *, seconds: float | None = None,
                       close: bool = False) -> None:
        """Take the tasks of one batch's stages (:func:`~trilink_spark.measurement.task_metrics`).

        Parameters
        ----------
        metrics : pandas.DataFrame
            :func:`~trilink_spark.measurement.task_metrics` rows of the batch's stages; each stage
            becomes node ``"stage i"`` by its position (lowest stage id first). Failed attempts are
            ignored; an empty frame records nothing. With :data:`EXCHANGE_COLUMNS`, each shuffle
            becomes an ``"exchange"`` node: ``"exchange after stage i"`` for what stage ``i`` wrote
            (and the fetch wait of the stages reading it), ``"exchange before stage i"`` for the
            fetch wait of a stage whose writer is not in ``metrics``; that time is taken out of the
            stage's own.
        seconds : float, optional
            The batch's wall time, for a bounded job without a progress event (default: the
            sum of each stage's longest task, as the stages of a chain run one after another).
        close : bool
            Close the batch now (a bounded job, no progress event follows).

        Raises
        ------
        InvalidArgumentTypeError
            ``metrics`` is not a frame with :data:`~trilink_spark.measurement.TASK_METRIC_COLUMNS`,
            or a figure column holds something other than numbers, duplicate column names, or only
            some of :data:`EXCHANGE_COLUMNS` (give all three or none).
        InvalidArgumentError
            A successful task without a stage id. Missing figures (NaN) count as ``-1``
            (not recorded), as :func:`~trilink_spark.measurement.task_metrics` writes them.
        """
        if not isinstance(metrics, pd.DataFrame) or not set(STAGE_COLUMNS) <= set(
                metrics.columns):
            raise InvalidArgumentTypeError(
                "metrics must be a measurement.task_metrics frame (columns "
                f"{', '.join(STAGE_COLUMNS)})")
        _unique_columns(metrics, "metrics")
        present = [c for c in EXCHANGE_COLUMNS if c in metrics.columns]
        if present and len(present) < len(EXCHANGE_COLUMNS):
            missing = [c for c in EXCHANGE_COLUMNS if c not in metrics.columns]
            raise InvalidArgumentTypeError(
                f"metrics has {', '.join(present)} but not {', '.join(missing)}: give all of "
                f"{', '.join(EXCHANGE_COLUMNS)} (exchange nodes) or none of them")
        done = _successful_tasks(metrics)
        if seconds is not None:
            seconds = number(seconds, "seconds", low=1e-9, high=_MAX)
        with self._lock:
            wall = 0.0
            stages = sorted(int(v) for v in done["stage_id"].unique())
            exchange = "shuffle_write_records" in done.columns
            writer: str | None = None  # the exchange the latest shuffle write fed
            for i, stage in enumerate(stages):
                tasks = done[done["stage_id"] == stage]
                kind = ("source read" if int(tasks["input_records"].sum()) > 0 else
                        "shuffle read" if int(tasks["shuffle_read_records"].sum()) > 0
                        else "operator")
                busy = float(tasks["run_ms"].clip(lower=0).sum())
                if exchange:  # the shuffle's own time belongs to the exchange node
                    write_ms = float(tasks["shuffle_write_ms"].clip(lower=0).sum())
                    fetch_ms = float(tasks["fetch_wait_ms"].clip(lower=0).sum())
                    busy = max(busy - write_ms - fetch_ms, 0.0)
                    if writer is not None and fetch_ms > 0:
                        self._add(writer, "exchange", 0.0, fetch_ms, int(len(tasks)))
                    elif fetch_ms > 0:  # its writer was not observed: the wait is not lost
                        self._add(f"exchange before stage {i}", "exchange",
                                  float(tasks["shuffle_read_records"].clip(lower=0).sum()),
                                  fetch_ms, int(len(tasks)))
                name = f"stage {i}"
                self._add(name, kind, float(tasks["rows"].clip(lower=0).sum()), busy,
                          int(len(tasks)))
                self._current.stages[stage] = name
                if exchange and float(tasks["shuffle_write_records"].clip(lower=0).sum()) > 0:
                    writer = f"exchange after stage {i}"
                    self._add(writer, "exchange",
                              float(tasks["shuffle_write_records"].clip(lower=0).sum()),
                              float(tasks["shuffle_write_ms"].clip(lower=0).sum()),
                              int(len(tasks)))
                    self._current.exchanges[stage] = writer
                wall += float(tasks["duration_ms"].clip(lower=0).max()) / 1000.0
            if seconds is not None or wall > 0:
                self._current.seconds = seconds if seconds is not None else wall
            if close:
                batch, self._current = self._current, _Batch()
                self._close(batch)

    def observe_operator(self, name: str, rows: float, busy_ms: float, tasks: int, *,
                         kind: str = "operator") -> None:
        """Take one batch's figures of an operator that times itself (e.g. the keyed
        runtime: ``t = run.task_timings(); adv.observe_operator("keyed", t.rows.sum(),
        t.process_ms.sum(), len(t))``). Nodes are kept in the order first seen.

        Raises
        ------
        InvalidArgumentError, InvalidArgumentTypeError
            A name that is not a str, empty or reserved (``"source"``, ``"sink"``), a kind
            that is not a non-empty str, negative figures or figures above ``2**63``, fewer
            than one task.
        """
        if not isinstance(name, str):
            raise InvalidArgumentTypeError(
                f"operator name must be a str, got {type(name).__name__}")
        if not name or name in (SOURCE, SINK):
            raise InvalidArgumentError(
                f"operator name must be a non-empty str other than {SOURCE!r} and {SINK!r}, "
                f"got {name!r:.80}")
        if not isinstance(kind, str) or not kind:
            raise InvalidArgumentTypeError(
                f"kind must be a non-empty str (e.g. 'operator'), got {kind!r:.40}")
        rows_f = number(rows, "rows", low=0.0, high=_LONG_MAX)
        busy = number(busy_ms, "busy_ms", low=0.0, high=_LONG_MAX)
        n_tasks = count(tasks, "tasks", 1, plain=True)
        with self._lock:
            self._add(name, kind, rows_f, busy, n_tasks)

    def observe_timings(self, timings: pd.DataFrame) -> None:
        """Take the records trilink operators wrote of their own work
        (:func:`~trilink_spark.measurement.read_operator_timings`, or an
        :class:`~trilink_spark.measurement.OperatorTimingReader`'s ``new()``) for the current
        batch.

        Each operator (``local_merge``, ``global_merge``, ``keyed``) becomes a node: rows in,
        its own busy milliseconds, tasks. When the stage it ran in was observed
        (:meth:`observe_stages`), its time is taken out of that stage's node and it is
        placed right after it in the chain, so no time counts twice.

        Raises
        ------
        InvalidArgumentTypeError
            ``timings`` is not a frame with
            :data:`~trilink_spark._internal.optiming.OPERATOR_TIMING_COLUMNS`, duplicate column
            names, or a figure column of booleans or other non-numbers.
        InvalidArgumentError
            An operator name that is missing, reserved or not 1-64 letters, digits, ``_``,
            ``.`` or ``-`` (so never a stage or exchange node's name); figures that are
            negative or not finite; stage ids or partitions that are not integers below 2**63.
        """
        if not isinstance(timings, pd.DataFrame) or not set(OPERATOR_TIMING_COLUMNS) <= set(
                timings.columns):
            raise InvalidArgumentTypeError(
                "timings must be a measurement.read_operator_timings frame (columns "
                f"{', '.join(OPERATOR_TIMING_COLUMNS)})")
        _unique_columns(timings, "timings")
        if not len(timings):
            return
        checked = timings[["operator", "stage_id", "partition", "rows_in", "busy_ms"]].copy()
        for column in ("stage_id", "partition", "rows_in", "busy_ms"):
            raw = checked[column]
            if raw.dtype == bool or not (pd.api.types.is_numeric_dtype(raw)
                                         or raw.dtype == object):
                raise InvalidArgumentTypeError(
                    f"timings column {column!r} must hold numbers, got dtype {raw.dtype}")
            if raw.dtype == object and any(isinstance(v, (bool, np.bool_)) for v in raw):
                raise InvalidArgumentTypeError(
                    f"timings column {column!r} must hold numbers, not booleans")
            values = pd.to_numeric(raw, errors="coerce").astype("float64")
            if (bool(values.isna().any()) or bool((values < 0).any())
                    or not bool(np.isfinite(values).all())):
                raise InvalidArgumentError(
                    f"timings column {column!r} must hold finite numbers >= 0")
            if column in ("stage_id", "partition") and (
                    bool((values >= _LONG_MAX).any()) or bool((values % 1 != 0).any())):
                raise InvalidArgumentError(
                    f"timings column {column!r} must hold integers in [0, 2**63)")
            checked[column] = values.astype("int64" if column == "stage_id" else "float64")
        groups: list[tuple[str, float, float, int, dict[int, float]]] = []
        for name, rows in checked.groupby("operator", sort=False, dropna=False):
            if not is_operator_name(name) or name in (SOURCE, SINK):
                raise InvalidArgumentError(
                    "operator name must be 1-64 letters, digits, '_', '.' or '-', other than "
                    f"{SOURCE!r} and {SINK!r} (node names such as 'stage 0' are taken), got "
                    f"{name!r:.80}")
            sums = rows.groupby("stage_id")["busy_ms"].sum()
            groups.append((name, float(rows["rows_in"].sum()), float(rows["busy_ms"].sum()),
                           int(rows.groupby("stage_id")["partition"].nunique().max()),
                           {int(k): float(v)
                            for k, v in zip(sums.index.to_numpy(), sums.to_numpy())}))
        with self._lock:
            for name, rows_in, busy, tasks, per_stage in groups:
                self._add(name, "trilink operator", rows_in, busy, tasks)
                held = self._current.in_stage.setdefault(name, {})
                for stage, ms in per_stage.items():
                    held[stage] = held.get(stage, 0.0) + ms

    def _add(self, name: str, kind: str, rows: float, busy_ms: float, tasks: int) -> None:
        entry = self._current.nodes.setdefault(name, {"rows": 0.0, "busy_ms": 0.0, "tasks": 0})
        entry["rows"] += rows
        entry["busy_ms"] += busy_ms
        entry["tasks"] = max(entry["tasks"], tasks)
        self._current.kinds[name] = kind

    @staticmethod
    def _place_operators(batch: _Batch) -> None:
        """Take each timed operator's time out of the stage it ran in, and order the chain:
        a stage, the operators inside it, then the exchange its shuffle write feeds."""
        if not batch.in_stage or not batch.stages:
            return
        after: dict[str, list[str]] = {}
        for op, per_stage in batch.in_stage.items():
            placed = False
            for stage, ms in per_stage.items():
                name = batch.stages.get(stage)
                if name is None:
                    continue
                entry = batch.nodes[name]
                entry["busy_ms"] = max(entry["busy_ms"] - ms, 0.0)
                if not placed:
                    after.setdefault(name, []).append(op)
                    placed = True
        order: list[str] = []
        moved = {op for ops in after.values() for op in ops}
        exchange_of = {batch.stages[s]: x for s, x in batch.exchanges.items() if s in batch.stages}
        exchanges = set(exchange_of.values())
        for name in batch.nodes:
            if name in moved or name in exchanges:
                continue
            order.append(name)
            order.extend(after.get(name, []))
            if name in exchange_of:
                order.append(exchange_of[name])
        order.extend(x for x in batch.nodes if x not in order)
        batch.nodes = {n: batch.nodes[n] for n in order}

    def _close(self, batch: _Batch) -> None:
        self._place_operators(batch)
        self._seen += 1
        if self._seen <= self.warmup_batches:
            return
        if batch.nodes or batch.progress is not None:
            self._batches.append(batch)

    # ------------------------------------------------------------------ the report
    def report(self) -> BottleneckReport:
        """The flow network over the window, its minimum cut, and what to do.

        Returns
        -------
        BottleneckReport
            With no node observed yet, a report without nodes that says so.
        """
        with self._lock:
            batches = list(self._batches)
        names: list[str] = []
        kinds: dict[str, str] = {}
        for b in batches:
            for name in b.nodes:
                if name not in names:
                    names.append(name)
                kinds.update(b.kinds)
        if not names:
            return BottleneckReport([], [], ([], []), 0.0, 0.0, 0.0, 0.0, 0.0, [], len(batches),
                                    "no operator observed yet (after the warm-up of "
                                    f"{self.warmup_batches} batches)")
        progress = [b.progress for b in batches if b.progress is not None]
        sums = {n: {"rows": sum(b.nodes[n]["rows"] for b in batches if n in b.nodes),
                    "busy_ms": sum(b.nodes[n]["busy_ms"] for b in batches if n in b.nodes),
                    "tasks": max(b.nodes[n]["tasks"] for b in batches if n in b.nodes),
                    "batches": sum(1 for b in batches if n in b.nodes)} for n in names}
        first = names[0]
        if progress:
            source_rows = float(sum(p.input_rows for p in progress))
            source_rate = clip_rate(float(np.mean([clip_rate(p.input_rate) for p in progress])))
            if self.trigger_s is not None:  # each batch is due within its trigger
                source_rate = max(source_rate, clip_rate(float(np.mean(
                    [float(p.input_rows) for p in progress])) / self.trigger_s))
            durations = [p.duration_ms / 1000.0 for p in progress if p.duration_ms > 0]
            backlogs = [p.backlog_rows for p in progress if p.backlog_rows is not None]
            horizon = float(np.mean(durations)) if durations else 1.0
            backlog_rate = clip_rate(float(backlogs[-1]) / horizon) if backlogs else 0.0
        else:  # a bounded job: what flowed is what was offered
            source_rows = sums[first]["rows"]
            seconds = sum(b.seconds or 0.0 for b in batches)
            source_rate = clip_rate(source_rows / seconds) if seconds > 0 else 0.0
            backlog_rate = 0.0
        if source_rows <= 0:
            source_rows = max(sums[first]["rows"], 1.0)
        offered_rate = source_rate + backlog_rate
        nodes: list[NodeReport] = []
        true_rates: dict[str, float] = {}
        selectivity: dict[str, float] = {}
        capacity_src: dict[str, float] = {}
        for n in names:
            s = sums[n]
            per_batch = s["rows"] / max(s["batches"], 1)
            sel = s["rows"] / source_rows if source_rows > 0 else 1.0
            busy_s = s["busy_ms"] / 1000.0
            true_rate = clip_rate(s["rows"] / busy_s) if busy_s > 0 else math.inf
            tasks = int(s["tasks"])
            slots = tasks if self.slots is None else min(tasks, self.slots)
            capacity = true_rate * max(slots, 1) if math.isinf(true_rate) else clip_rate(
                true_rate * max(slots, 1))
            true_rates[n] = true_rate
            selectivity[n] = sel
            capacity_src[n] = (clip_rate(capacity / sel) if math.isfinite(capacity) else math.inf
                               ) if sel > 0 else math.inf
            nodes.append(NodeReport(
                name=n, kind=kinds.get(n, "operator"), rows_per_batch=per_batch,
                selectivity=sel, tasks=tasks, true_rate=true_rate, capacity=capacity,
                offered=offered_rate * sel,
                utilisation=(offered_rate * sel / capacity) if capacity > 0 else math.inf,
                ds2_parallelism=0))
        rates: dict[Hashable, TrueRate | float] = {}
        for i, n in enumerate(names):
            proc = true_rates[n] if 0 < true_rates[n] < math.inf else _FAST
            after = (selectivity[names[i + 1]] / selectivity[n]
                     if i + 1 < len(names) and selectivity[n] > 0 else None)
            rates[n] = TrueRate(proc, None if after is None else proc * after)
        graph: list[tuple[Hashable, Hashable]] = [(SOURCE, names[0])]
        graph += list(zip(names, names[1:]))
        wanted = ds2_parallelism(graph, rates, {SOURCE: offered_rate * selectivity[names[0]]},
                                 max_parallelism=MAX_ADVISED_TASKS)
        # replace, not a to_dict round trip: to_dict writes an unmeasured (infinite) rate as None
        nodes = [replace(n, ds2_parallelism=int(wanted.get(n.name, 1))) for n in nodes]
        net, unbounded = self._network(names, capacity_src, offered_rate)
        full = max_flow(net, SOURCE, SINK, start="zero")
        flow_value = float(full.value)
        if flow_value >= unbounded * (1 - 1e-9):  # no node on the cut spent measurable time
            flow_value = math.inf
        cut_in = {str(v) for v in full.min_cut[0]}
        cut_out = {str(v) for v in full.min_cut[1]}
        cut_nodes = [n for n in names if n in cut_out and (
            names.index(n) == 0 and SOURCE in cut_in or names[names.index(n) - 1] in cut_in)]
        # a stream's demand is what is offered (backlog included); a bounded job's is "all
        # it can": the cuts within 1 / lambda of the minimum then name its bottleneck
        analysis = find_bottlenecks(net, SOURCE, SINK, lambda_=self.lambda_,
                                    demand=offered_rate if progress else None,
                                    start="zero")
        bottleneck = [str(o) for o in analysis.operators if o in sums]
        utilisation = (offered_rate / flow_value if flow_value > 0
                       else 0.0 if offered_rate <= 0 else math.inf)
        actions = self._actions(nodes, bottleneck, flow_value, offered_rate, progress)
        if bottleneck:
            reason = (f"bottleneck: {', '.join(bottleneck)}; the query is offered "
                      f"{offered_rate:.1f} source rows/s ({source_rate:.1f} arriving + "
                      f"{backlog_rate:.1f} backlog), {utilisation:.0%} of the "
                      f"{flow_value:.1f} rows/s its minimum cut sustains (lambda "
                      f"{self.lambda_:g})")
        else:
            reason = (f"no bottleneck: the {offered_rate:.1f} source rows/s offered are "
                      f"{utilisation:.0%} of the {flow_value:.1f} rows/s the minimum cut "
                      f"({', '.join(cut_nodes) or 'none'}) sustains")
        return BottleneckReport(nodes, bottleneck, (sorted(cut_in), sorted(cut_out)),
                                flow_value, source_rate, backlog_rate, offered_rate,
                                utilisation, actions, len(batches), reason)

    @staticmethod
    def _network(names: list[str], capacity_src: Mapping[str, float],
                 offered: float) -> tuple[FlowNetwork, float]:
        """The chain ``source -> n0 -> n1 -> ... -> sink``: the edge into a node carries at
        most the node's capacity (in source rows/s), the edge to the sink never binds. A node
        that spent no measurable time (infinite capacity) gets a capacity above every finite
        one and the offered rate, returned too: a cut of that capacity is no bottleneck."""
        finite = [c for c in capacity_src.values() if math.isfinite(c)]
        big = 10.0 * (sum(finite) + offered + 1.0)
        edges: dict[tuple[Hashable, Hashable], float] = {}
        previous: str = SOURCE
        for n in names:
            cap = capacity_src[n]
            edges[(previous, n)] = cap if math.isfinite(cap) else big
            previous = n
        edges[(previous, SINK)] = big
        return FlowNetwork(edges), big

    def _actions(self, nodes: list[NodeReport], bottleneck: list[str], flow_value: float,
                 offered: float, progress: list[BatchProgress]) -> list[dict[str, str]]:
        actions: list[dict[str, str]] = []
        by_name = {n.name: n for n in nodes}
        for name in bottleneck:
            n = by_name[name]
            gain = f"capacity x{n.ds2_parallelism / max(n.tasks, 1):.2f}"
            if n.kind == "shuffle read":
                actions.append({
                    "action": "more partitions after the exchange", "node": name,
                    "setting": (f"run.request_swap(num_partitions={n.ds2_parallelism}) for "
                                f"keyed state, else spark.sql.shuffle.partitions="
                                f"{n.ds2_parallelism}"),
                    "expected": f"{n.tasks} -> {n.ds2_parallelism} tasks, {gain}"})
                upstream = nodes[nodes.index(n) - 1] if nodes.index(n) > 0 else None
                if upstream is not None and n.rows_per_batch >= 0.5 * upstream.rows_per_batch:
                    actions.append({
                        "action": "shrink what crosses the exchange", "node": name,
                        "setting": "tl.local_merge before the keyed stage, or Ahead KeyBy "
                                   "(placement.ahead_key_by + placement.keyed_by_source: no exchange)",
                        "expected": f"{n.rows_per_batch:.0f} rows per batch cross the "
                                    "shuffle; pre-aggregation sends one row per key and slot"})
            elif n.kind == "exchange":
                actions.append({
                    "action": "shrink what crosses the exchange", "node": name,
                    "setting": "tl.local_merge before the keyed stage, or Ahead KeyBy "
                               "(placement.ahead_key_by + placement.keyed_by_source: no exchange)",
                    "expected": f"{n.rows_per_batch:.0f} rows per batch are written to and "
                                "fetched from the shuffle; pre-aggregation sends one row per "
                                "key and slot, Ahead KeyBy none"})
            elif n.kind == "trilink operator" and name == "keyed":
                actions.append({
                    "action": "more partitions for keyed state", "node": name,
                    "setting": f"run.request_swap(num_partitions={n.ds2_parallelism})",
                    "expected": f"{n.tasks} -> {n.ds2_parallelism} tasks at the next batch "
                                f"barrier, state moved by the swap, {gain}"})
            elif n.kind == "source read":
                actions.append({
                    "action": "more input partitions", "node": name,
                    "setting": f"{n.ds2_parallelism} source partitions (Kafka partitions, or "
                               "minPartitions)",
                    "expected": f"{n.tasks} -> {n.ds2_parallelism} reading tasks, {gain}"})
            else:
                actions.append({
                    "action": "more parallelism for the operator", "node": name,
                    "setting": f"{n.ds2_parallelism} tasks",
                    "expected": gain})
        needed = max((by_name[b].ds2_parallelism for b in bottleneck), default=0)
        slots = self.slots
        if slots is not None and needed > slots:
            actions.append({
                "action": "more executors", "node": ", ".join(bottleneck),
                "setting": f"at least {needed} cores (spark.dynamicAllocation.maxExecutors or "
                           "spark.executor.instances)",
                "expected": f"{slots} slots cannot run the {needed} tasks DS2 asks for at once"})
        if bottleneck and offered > flow_value and progress:
            seconds = float(np.mean([p.duration_ms for p in progress])) / 1000.0 or 1.0
            rows = self.lambda_ * flow_value * seconds
            limit = max(1, min(int(min(rows, _MAX_OFFSETS)), _MAX_OFFSETS)) if rows >= 1 else 1
            actions.append({
                "action": "admit what the query sustains until it is rescaled", "node": "source",
                "setting": f"maxOffsetsPerTrigger={limit}",
                "expected": f"batches of at most {limit} rows finish within the trigger; the "
                            "rest waits in the source instead of growing the batch time"})
        return actions


class BottleneckListener:
    """A ``StreamingQueryListener`` that feeds a :class:`BottleneckAdvisor` and logs its
    report at INFO after every batch.

    Parameters
    ----------
    advisor : BottleneckAdvisor
    spark : pyspark.sql.SparkSession, optional
        Classic session: each batch's stages are read with
        :func:`~trilink_spark.measurement.task_metrics` (the query's run id is the job group of its
        batches). Without it only progress is used.
    timings : str, optional
        The operator timing directory (default: ``spark.trilink.operatorTiming`` of
        ``spark``, when set): each batch's new records go to
        :meth:`BottleneckAdvisor.observe_timings`, so ``local_merge``, ``global_merge`` and
        the keyed runtime are nodes of their own. The names of the records read are kept
        (O(tasks run) memory); records are not deleted.

    Notes
    -----
    Register with ``spark.streams.addListener(advice.BottleneckListener(advisor, spark))``.
    Errors inside the callbacks are logged, never raised into Spark's listener bus.

    Examples
    --------
    >>> from trilink_spark.advice import BottleneckAdvisor
    >>> advisor = BottleneckAdvisor()  # doctest: +SKIP
    >>> from trilink_spark.advice import BottleneckListener
    >>> spark.streams.addListener(BottleneckListener(advisor, spark))  # doctest: +SKIP
    >>> print(advisor.report())  # doctest: +SKIP
    """

    def __new__(cls, advisor: BottleneckAdvisor, spark: Any = None,
                timings: str | None = None) -> Any:
        from pyspark.sql.streaming.listener import StreamingQueryListener

        if not isinstance(advisor, BottleneckAdvisor):
            raise InvalidArgumentTypeError(
                f"advisor must be a BottleneckAdvisor, got {type(advisor).__name__}")
        if timings is None and spark is not None:
            timings = timing_root(spark)  # as the operators read it (stripped)
        reader = None if timings is None else OperatorTimingReader(timings)

        class _Listener(StreamingQueryListener):  # type: ignore[misc]
            def __init__(self) -> None:
                self.advisor = advisor
                self.spark = spark
                self.last_stage = -1
                self.timings = reader
                self.reports: list[BottleneckReport] = []

            def onQueryStarted(self, event: Any) -> None:
                return None

            def onQueryIdle(self, event: Any) -> None:
                return None

            def onQueryTerminated(self, event: Any) -> None:
                return None

            def onQueryProgress(self, event: Any) -> None:
                try:
                    progress = event.progress
                    if self.spark is not None:
                        metrics = task_metrics(self.spark, job_group=str(progress.runId))
                        fresh = metrics[metrics["stage_id"] > self.last_stage]
                        if len(fresh):
                            self.last_stage = int(fresh["stage_id"].max())
                            self.advisor.observe_stages(fresh)
                    if self.timings is not None:
                        try:  # a timing directory that fails never stops the batch closing
                            self.advisor.observe_timings(self.timings.new())
                        except Exception as err:  # noqa: BLE001
                            logger.warning("BottleneckListener: operator timings not read "
                                           "(%s: %s)", type(err).__name__, err)
                    self.advisor.observe_progress(progress.json)
                    report = self.advisor.report()
                    self.reports.append(report)
                    del self.reports[:-16]
                    logger.info("batch %s: %s", progress.batchId, report.reason)
                except Exception as err:  # noqa: BLE001 - never break Spark's listener bus
                    logger.warning("BottleneckListener: %s: %s", type(err).__name__, err)

        return _Listener()
