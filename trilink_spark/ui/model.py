"""The dashboard's bounded in-memory model: the last batches of each run, the events beside
them, and the column data every chart and table of the page draws.

The feed calls :meth:`DashboardModel.add_record` with each history record (one per
micro-batch) and :meth:`DashboardModel.add_event` with each swap request, advice or query
progress. The model checks each (:mod:`trilink_spark.ui.records`), computes the figures of a
batch once as it arrives (balance degree, extra compute time, keyed bound, and for the newest
batch what every candidate strategy would give on its sample), and keeps at most ``history``
batches per run, at most ``max_runs`` runs and at most ``history`` events of each kind,
however long the runs go on. :meth:`DashboardModel.snapshot` assembles the column data of one
run's page (:data:`SOURCE_COLUMNS`) once per model version; the server sends its JSON
(:meth:`DashboardModel.snapshot_json`), encoded once per version.

All methods are thread-safe (one lock; the candidates are evaluated outside it).

Examples
--------
>>> model = DashboardModel(history=50)
>>> model.add_record({"v": 1, "batch": 0, "time": 1795000000.0, "seconds": 0.2,
...                   "strategy": "hash", "partitions": 2, "rows": [30, 10],
...                   "sample": {"keys": ["a", "b"], "weights": [30, 10]}})
True
>>> model.snapshot()["balance"]["balance_degree"]
[0.3333333333333333]
>>> model.add_record({"v": 1, "batch": "zero"})
False
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .._internal.validation import count
from ..errors import TrilinkError
from ..partitioners import (balance_degree, evaluate_strategies, extra_compute_time,
                            keyed_bound, resolve_strategy_name)
from .records import (AdviceEvent, BatchRecord, ProgressEvent, RequestEvent, key_text,
                      parse_batch_record, parse_event)

logger = logging.getLogger(__name__)

__all__ = ["SOURCE_COLUMNS", "HOT_KEYS_SHOWN", "HEATMAP_CELLS", "TIMELINE_LANES", "Candidate",
           "BatchFigures", "figures_of", "DashboardModel"]

#: The column data of the page: one entry per data source, with its columns.
SOURCE_COLUMNS: dict[str, tuple[str, ...]] = {
    "headline": ("run", "batch", "partitions", "strategy", "balance_degree", "batches",
                 "shown"),
    "cells": ("batch", "partition", "rows", "task_ms", "executor", "sync"),
    "latest_rows": ("partition", "rows"),
    "balance": ("batch", "balance_degree", "extra_compute_time"),
    "bound": ("batch", "keyed_bound"),
    "latest": ("figure", "value"),
    "candidates": ("strategy", "balance_degree", "extra_compute_time", "keyed_bound",
                   "in_force"),
    "hot_keys": ("rank", "key", "rows", "partition"),
    "timeline": ("time_ms", "lane", "kind", "batch", "what", "moved_keys", "moved_bytes",
                 "pause_s", "refused"),
    "late_key": ("batch", "rows"),
    "late_partition": ("batch", "rows"),
    "advice": ("time_ms", "source", "batch", "advice", "reason", "run"),
    "progress": ("time_ms", "batch", "query", "input_rows", "duration_ms"),
}
#: How many of the latest batch's hot keys the page lists.
HOT_KEYS_SHOWN = 10
#: The most heat-map cells (batches x partitions) a snapshot holds: the newest batches that
#: fit are drawn.
HEATMAP_CELLS = 20_000
#: The timeline's lanes (y of its glyphs), by kind.
TIMELINE_LANES = {"rebalance": 0, "swap": 1, "refused": 1, "request": 2}

Columns = dict[str, list[Any]]
Snapshot = dict[str, Columns]


@dataclass(frozen=True)
class Candidate:
    """What one candidate strategy would give on a batch's sample."""

    strategy: str
    balance_degree: float
    extra_compute_time: float
    keyed_bound: float


@dataclass(frozen=True)
class BatchFigures:
    """The figures of one batch, computed once as its record arrives (``None``: no figure,
    as when every partition's rows are -1 or the record has no sample)."""

    balance_degree: float | None
    extra_compute_time: float | None
    keyed_bound: float | None
    candidates: tuple[Candidate, ...]


def _append(out: Columns, **values: Any) -> None:
    """Append one row (a value per column) to column data."""
    for column, value in values.items():
        out[column].append(value)


def _finite(value: Any) -> Any:
    """A column value as JSON holds it: a float that is not finite becomes null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _json(columns: Columns) -> bytes:
    """One source's column data as strict JSON. A figure that overflowed (a record's finite
    but huge rows summing to ``inf``, a time of ``1e308`` seconds in milliseconds) is sent as
    null, drawn as no figure: one such record never leaves the page without data. O(cells)."""
    try:
        return json.dumps(columns, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:
        clean = {name: [_finite(v) for v in values] for name, values in columns.items()}
        return json.dumps(clean, separators=(",", ":"), allow_nan=False).encode()


def _known(figures: npt.NDArray[np.float64] | None) -> npt.NDArray[np.float64]:
    """The figures that are not -1 (none for a list the record left out)."""
    if figures is None:
        return np.empty(0, dtype=np.float64)
    return figures[figures >= 0]


def _sum_known(figures: npt.NDArray[np.float64] | None) -> float | None:
    known = _known(figures)
    return float(known.sum()) if known.size else None


def _candidates(record: BatchRecord) -> tuple[Candidate, ...]:
    """Every default candidate scored on the record's sample; none when it cannot be (mixed
    key types, no keys: logged at debug)."""
    if not record.sample:
        return ()
    try:
        scores = evaluate_strategies(record.sample, record.partitions)
    except (TrilinkError, ValueError, TypeError) as err:
        logger.debug("no candidates for batch %d of run %r: %s", record.batch, record.run, err)
        return ()
    return tuple(Candidate(s.name, s.balance_degree, s.extra_compute_time, s.keyed_bound)
                 for s in scores)


def figures_of(record: BatchRecord, *, with_candidates: bool = True) -> BatchFigures:
    """The figures of one checked record. Partitions without a figure (-1) are left out.

    Notes
    -----
    Cost: O(partitions + sample keys); with the candidates, one
    :func:`~trilink_spark.partitioners.evaluate_strategies` on the sample (O(keys * log n)
    per table strategy).

    Examples
    --------
    >>> from trilink_spark.ui.records import parse_batch_record
    >>> r = parse_batch_record({"v": 1, "batch": 0, "time": 0, "seconds": 0,
    ...                         "strategy": "hash", "partitions": 3, "rows": [50, -1, 100]})
    >>> figures_of(r).balance_degree
    0.5
    """
    rows = _known(record.rows)
    with np.errstate(over="ignore", invalid="ignore"):  # huge figures: sent as null
        degree = balance_degree(rows) if rows.size else None
        extra = extra_compute_time(rows) if rows.size else None
        bound = (keyed_bound(list(record.sample.values()), record.partitions)
                 if record.sample else None)
        candidates = _candidates(record) if with_candidates else ()
    return BatchFigures(degree, extra, bound, candidates)


def _strategy_name(name: str) -> str:
    try:
        return resolve_strategy_name(name)
    except (TrilinkError, ValueError, TypeError):
        return name


class _Run:
    """The held batches of one run, by batch id (at most ``history``)."""

    def __init__(self) -> None:
        self.batches: dict[int, tuple[BatchRecord, BatchFigures]] = {}
        self.touched = 0  # the model version of its last change

    def latest(self) -> tuple[BatchRecord, BatchFigures] | None:
        return self.batches[max(self.batches)] if self.batches else None


class DashboardModel:
    """The bounded, thread-safe model behind the dashboard page and report.

    Parameters
    ----------
    history : int
        Batches held per run (the oldest go first), and events held per kind (requests,
        advice, progress). Default 200.
    max_runs : int
        Runs held; a new run beyond it drops the run that changed least recently. Default 16.

    Notes
    -----
    Memory: O(max_runs * history * partitions) floats, plus ``3 * history`` events. A
    record's sample is not kept: only the figures computed from it.

    Examples
    --------
    >>> model = DashboardModel(history=10)
    >>> for b in range(50):
    ...     _ = model.add_record({"v": 1, "batch": b, "time": b, "seconds": 0.1,
    ...                           "strategy": "hash", "partitions": 1, "rows": [b]})
    >>> model.batches()
    [40, 41, 42, 43, 44, 45, 46, 47, 48, 49]
    """

    def __init__(self, history: int = 200, *, max_runs: int = 16) -> None:
        self._history = count(history, "history", 1)
        self._max_runs = count(max_runs, "max_runs", 1)
        self._lock = threading.Lock()
        self._runs: OrderedDict[str, _Run] = OrderedDict()
        self._requests: deque[RequestEvent] = deque(maxlen=self._history)
        self._advice: deque[AdviceEvent] = deque(maxlen=self._history)
        self._progress: deque[ProgressEvent] = deque(maxlen=self._history)
        self._version = 0
        self._cache: dict[str | None, tuple[int, Snapshot, dict[str, bytes]]] = {}

    @property
    def history(self) -> int:
        """Batches held per run (and events per kind)."""
        return self._history

    @property
    def version(self) -> int:
        """Bumps on every accepted record or event."""
        with self._lock:
            return self._version

    @property
    def runs(self) -> list[str]:
        """The runs held, in the order they first came."""
        with self._lock:
            return list(self._runs)

    def batches(self, run: str | None = None) -> list[int]:
        """The batch ids held for ``run`` (default: the first run held), oldest first. O(h)."""
        with self._lock:
            held = self._run(run)
            return sorted(held.batches) if held else []

    def figures(self, batch: int, run: str | None = None) -> BatchFigures | None:
        """The figures of one held batch, or ``None``. O(1)."""
        with self._lock:
            held = self._run(run)
            entry = held.batches.get(batch) if held else None
            return entry[1] if entry else None

    def events(self) -> dict[str, int]:
        """How many events of each kind are held. O(1)."""
        with self._lock:
            return {"request": len(self._requests), "advice": len(self._advice),
                    "progress": len(self._progress)}

    def _run(self, run: str | None) -> _Run | None:
        if run is None:
            return next(iter(self._runs.values()), None)
        return self._runs.get(run)

    def add_record(self, record: Mapping[str, Any] | BatchRecord) -> bool:
        """Hold one history record; one for a batch already held replaces it.

        Parameters
        ----------
        record : mapping or BatchRecord
            A history record, checked here
            (:func:`~trilink_spark.ui.records.parse_batch_record`), ``run`` naming its run
            (default ``"run"``); or a record checked already
            (:func:`~trilink_spark.ui.records.read_batch_record`), held as it is.

        Returns
        -------
        bool
            ``False`` (and a logged warning) for a malformed record, which is not held.

        Notes
        -----
        Cost: O(partitions + sample keys), plus, for a record that is its run's newest, one
        :func:`~trilink_spark.partitioners.evaluate_strategies` on its sample (outside the
        lock).

        Examples
        --------
        >>> m = DashboardModel()
        >>> m.add_record({"v": 1, "batch": 0, "time": 0, "seconds": 0, "strategy": "hash",
        ...               "partitions": 2, "rows": [1, 2, 3]})
        False
        """
        try:
            checked = record if isinstance(record, BatchRecord) else parse_batch_record(record)
        except TrilinkError as err:
            logger.warning("dashboard: history record refused: %s", err)
            return False
        with self._lock:
            held = self._runs.get(checked.run)
            newest = not held or not held.batches or checked.batch >= max(held.batches)
        figures = figures_of(checked, with_candidates=newest)
        with self._lock:
            held = self._runs.get(checked.run)
            if held is None:
                if len(self._runs) >= self._max_runs:
                    stale = min(self._runs, key=lambda name: self._runs[name].touched)
                    del self._runs[stale]
                    logger.info("dashboard: run %r dropped (at most %d runs are held)",
                                stale, self._max_runs)
                held = self._runs[checked.run] = _Run()
            held.batches[checked.batch] = (checked, figures)
            while len(held.batches) > self._history:
                del held.batches[min(held.batches)]
            self._bump(held)
        return True

    def add_records(self, records: Iterable[Mapping[str, Any] | BatchRecord]) -> int:
        """:meth:`add_record` for each record; returns how many were held. O(records)."""
        return sum(self.add_record(r) for r in records)

    def add_event(self, event: Mapping[str, Any]) -> bool:
        """Hold one event: a pending swap request, advice, or query progress.

        Returns ``False`` (and a logged warning) for a malformed event. Each kind keeps its
        newest ``history`` events. O(1).

        Examples
        --------
        >>> m = DashboardModel()
        >>> m.add_event({"kind": "advice", "time": 1.0, "batch": None, "source": "ds2",
        ...              "advice": "scale to 4", "reason": "true rate 3.2k/s"})
        True
        >>> m.add_event({"kind": "gossip", "time": 1.0})
        False
        """
        try:
            checked = parse_event(event)
        except TrilinkError as err:
            logger.warning("dashboard: event refused: %s", err)
            return False
        with self._lock:
            if isinstance(checked, RequestEvent):
                self._requests.append(checked)
            elif isinstance(checked, AdviceEvent):
                self._advice.append(checked)
            else:
                self._progress.append(checked)
            self._bump(None)
        return True

    def _bump(self, run: _Run | None) -> None:
        self._version += 1
        if run is not None:
            run.touched = self._version
        self._cache.clear()

    def snapshot(self, run: str | None = None) -> Snapshot:
        """The column data of one run's page: ``{source: {column: list}}``
        (:data:`SOURCE_COLUMNS`); a run not held gives empty run columns.

        Parameters
        ----------
        run : str, optional
            The run; default: the first run held.

        Notes
        -----
        Cost: O(held batches * partitions + events) once per model version and run held; a
        repeat call returns the cached dict (treat it as read-only). For a run not held:
        O(events) each call.
        """
        return self._cached(run)[0]

    def snapshot_json(self, run: str | None = None) -> dict[str, bytes]:
        """:meth:`snapshot` as JSON bytes, one document per source, encoded once per
        version (what the server sends). O(1) when cached.

        Examples
        --------
        >>> DashboardModel().snapshot_json()["late_key"]
        b'{"batch":[],"rows":[]}'
        """
        return self._cached(run)[1]

    def document_json(self, run: str | None = None, since: int | None = None) -> bytes:
        """What the live page asks for: ``{"version": v}`` when ``since`` is the model's
        version (nothing changed), else ``{"version": v, "sources": {name: columns}}``.
        O(1) when nothing changed; else the cached sources joined (O(their size)).

        Examples
        --------
        >>> model = DashboardModel()
        >>> model.document_json(since=model.version)
        b'{"version":0}'
        """
        with self._lock:
            version = self._version
        if since == version:
            return b'{"version":%d}' % version
        _, encoded, version = self._cached_versioned(run)
        parts = b",".join(b'"%s":%s' % (name.encode(), body) for name, body in encoded.items())
        return b'{"version":%d,"sources":{%s}}' % (version, parts)

    def _cached(self, run: str | None) -> tuple[Snapshot, dict[str, bytes]]:
        snap, encoded, _ = self._cached_versioned(run)
        return snap, encoded

    def _cached_versioned(self, run: str | None) -> tuple[Snapshot, dict[str, bytes], int]:
        with self._lock:
            cached = self._cache.get(run)
            if cached is not None and cached[0] == self._version:
                return cached[1], cached[2], self._version
            with np.errstate(over="ignore", invalid="ignore"):  # overflows: sent as null
                snap = self._build(run)
            encoded = {name: _json(columns) for name, columns in snap.items()}
            if run is None or run in self._runs:  # a run not held is not cached: bounded
                self._cache[run] = (self._version, snap, encoded)
            return snap, encoded, self._version

    def _build(self, run: str | None) -> Snapshot:
        snap: Snapshot = {name: {c: [] for c in cols} for name, cols in SOURCE_COLUMNS.items()}
        held = self._run(run)
        shown = (next(iter(self._runs), None) if run is None else run)
        self._headline(snap["headline"], shown)
        self._events(snap)
        if held is None or not held.batches:
            self._timeline(snap["timeline"], shown, [])
            return snap
        entries = [held.batches[b] for b in sorted(held.batches)]
        self._series(snap, entries)
        self._cells(snap["cells"], entries)
        self._latest(snap, entries[-1])
        self._timeline(snap["timeline"], shown, entries)
        return snap

    def _headline(self, out: Columns, shown: str | None) -> None:
        for name, held in self._runs.items():
            latest = held.latest()
            if latest is None:
                continue
            record, figures = latest
            _append(out, run=name, batch=record.batch, partitions=record.partitions,
                    strategy=record.strategy, balance_degree=figures.balance_degree,
                    batches=len(held.batches), shown="shown" if name == shown else "")

    def _events(self, snap: Snapshot) -> None:
        newest: dict[str, AdviceEvent] = {}
        for advice in self._advice:
            if advice.source not in newest or advice.time >= newest[advice.source].time:
                newest[advice.source] = advice
        out = snap["advice"]
        for advice in sorted(newest.values(), key=lambda a: a.time, reverse=True):
            _append(out, time_ms=advice.time * 1000, source=advice.source, batch=advice.batch,
                    advice=advice.advice, reason=advice.reason, run=advice.run or "")
        out = snap["progress"]
        for progress in sorted(self._progress, key=lambda p: (p.query, p.batch)):
            _append(out, time_ms=progress.time * 1000, batch=progress.batch,
                    query=progress.query, input_rows=progress.input_rows,
                    duration_ms=progress.duration_ms)

    @staticmethod
    def _series(snap: Snapshot,
                entries: list[tuple[BatchRecord, BatchFigures]]) -> None:
        for record, figures in entries:
            if figures.balance_degree is not None:
                snap["balance"]["batch"].append(record.batch)
                snap["balance"]["balance_degree"].append(figures.balance_degree)
                snap["balance"]["extra_compute_time"].append(figures.extra_compute_time)
            if figures.keyed_bound is not None:
                snap["bound"]["batch"].append(record.batch)
                snap["bound"]["keyed_bound"].append(figures.keyed_bound)
            for name, late in (("late_key", record.late),
                               ("late_partition", record.late_partition)):
                total = _sum_known(late)
                if total is not None:
                    snap[name]["batch"].append(record.batch)
                    snap[name]["rows"].append(total)

    @staticmethod
    def _cells(out: Columns, entries: list[tuple[BatchRecord, BatchFigures]]) -> None:
        drawn: list[BatchRecord] = []
        cells = 0
        for record, _ in reversed(entries):
            cells += record.partitions
            if drawn and cells > HEATMAP_CELLS:
                break
            drawn.append(record)
        for record in reversed(drawn):
            task = (record.task_ms if record.task_ms is not None
                    else np.full(record.partitions, -1.0))
            out["batch"].extend([record.batch] * record.partitions)
            out["partition"].extend(range(record.partitions))
            out["rows"].extend(record.rows.tolist())
            out["task_ms"].extend(task.tolist())
            none = ("",) * record.partitions
            out["executor"].extend(record.executor or none)
            out["sync"].extend(record.sync or none)

    @staticmethod
    def _latest(snap: Snapshot, entry: tuple[BatchRecord, BatchFigures]) -> None:
        record, figures = entry
        out = snap["latest_rows"]
        for partition, rows in enumerate(record.rows.tolist()):
            if rows >= 0:
                out["partition"].append(partition)
                out["rows"].append(rows)

        def shown(value: float | None) -> str:
            return "-" if value is None else f"{value:.3f}"

        rows_total = _sum_known(record.rows)
        for figure, value in (
                ("batch", str(record.batch)), ("strategy", record.strategy),
                ("partitions", str(record.partitions)),
                ("rows", "-" if rows_total is None else f"{rows_total:,.0f}"),
                ("seconds", f"{record.seconds:.3f}"),
                ("balance degree", shown(figures.balance_degree)),
                ("keyed bound", shown(figures.keyed_bound)),
                ("extra compute time", shown(figures.extra_compute_time))):
            snap["latest"]["figure"].append(figure)
            snap["latest"]["value"].append(value)
        in_force = _strategy_name(record.strategy)
        out = snap["candidates"]
        for c in figures.candidates:
            _append(out, strategy=c.strategy, balance_degree=c.balance_degree,
                    extra_compute_time=c.extra_compute_time, keyed_bound=c.keyed_bound,
                    in_force="in force" if c.strategy == in_force else "")
        hot = sorted(record.hot_keys, key=lambda h: h[1], reverse=True)[:HOT_KEYS_SHOWN]
        out = snap["hot_keys"]
        for rank, (key, rows, partition) in enumerate(hot, start=1):
            _append(out, rank=rank, key=key_text(key), rows=rows, partition=partition)

    def _timeline(self, out: Columns, shown: str | None,
                  entries: list[tuple[BatchRecord, BatchFigures]]) -> None:
        done: dict[str, int] = {}
        for held in self._runs.values():
            for record, _ in held.batches.values():
                if record.request is not None:
                    done[record.request.request_id] = record.batch
        rows: list[dict[str, Any]] = []
        for event in self._requests:
            if event.run is not None and event.run != shown:
                continue
            req = event.request
            carried = done.get(req.request_id)
            what = ", ".join(part for part in (
                f"request {req.request_id}",
                f"strategy {req.strategy}" if req.strategy else "",
                f"{req.num_partitions} partitions" if req.num_partitions else "",
                f"mode {req.mode}" if req.mode else "",
                "pending" if carried is None else f"carried out in batch {carried}") if part)
            rows.append({"time_ms": event.time * 1000, "kind": "request", "batch": carried,
                         "what": what})
        for record, _ in entries:
            swap, carried_out = record.swap, record.request
            if swap is not None or carried_out is not None:
                refused = swap.refused if swap is not None else None
                parts = [f"request {carried_out.request_id}" if carried_out else "",
                         (f"to {carried_out.strategy}"
                          if carried_out and carried_out.strategy else ""),
                         (f"{swap.partitions_before} -> {swap.partitions_after} partitions"
                          if swap and swap.partitions_before and swap.partitions_after
                          else ""),
                         f"mode {swap.mode}" if swap and swap.mode else "",
                         "incomplete" if swap and swap.complete is False else ""]
                rows.append({
                    "time_ms": record.time * 1000,
                    "kind": "refused" if refused else "swap", "batch": record.batch,
                    "what": ", ".join(p for p in parts if p) or "swap",
                    "moved_keys": swap.moved_keys if swap else None,
                    "moved_bytes": swap.moved_bytes if swap else None,
                    "pause_s": swap.seconds if swap else None, "refused": refused or ""})
            if record.rebalance is not None:
                moves = record.rebalance.moves
                what = record.rebalance.reason + (f" ({moves} moves)" if moves else "")
                rows.append({"time_ms": record.time * 1000, "kind": "rebalance",
                             "batch": record.batch, "what": what})
        rows.sort(key=lambda r: r["time_ms"], reverse=True)
        for row in rows:
            row["lane"] = TIMELINE_LANES[row["kind"]]
            for column in SOURCE_COLUMNS["timeline"]:
                out[column].append(row.get(column, "" if column == "refused" else None))
