"""What feeds the live view: runs' history records, Spark's query progress, advisors.

A :class:`Feed` owns one daemon thread. It wakes after each batch (a
``StreamingQueryListener`` posts every ``onQueryProgress`` to it) or every ``poll_s`` seconds,
and then reads, off the query's own thread:

- each run's new history records (after the last batch seen: one listing and one small
  read per new batch; a damaged record is logged once and passed over) and its stored swap
  request (a request made with ``run.request_swap`` shows on the timeline before its batch);
- each :class:`~trilink_spark.switching.AdaptivePartitioner`'s new decisions;
- the advisors' latest conclusions: a :class:`~trilink_spark.advice.BottleneckAdvisor` is fed
  as :class:`~trilink_spark.advice.BottleneckListener` feeds it (progress, task metrics,
  operator timings), an :class:`~trilink_spark.elastic.ElasticityAdvisor` with each progress.

The listener does no work of its own beside queueing the progress (bounded), so the query's
batches never wait for the view.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
import time
from collections.abc import Iterable, Mapping
from types import SimpleNamespace
from typing import Any

from ..advice import BottleneckAdvisor, BottleneckListener
from ..elastic import ElasticityAdvisor
from ..errors import InvalidArgumentTypeError, StateCorruptError, TrilinkError
from ..measurement import parse_progress
from ..keyed.records.history import history_batches
from ..keyed.swaps.replanner import SWAP_RECORD
from ..state import KeyedStateStore
from ..switching import AdaptivePartitioner
from .records import read_batch_record

__all__ = ["Feed", "RunSource", "pending_request"]

logger = logging.getLogger(__name__)

#: Progress events queued for the feed's thread at most (the oldest are dropped beyond).
MAX_QUEUED = 256
#: Every this many polls a run's records are listed (else the next batch ids are read).
LIST_EVERY = 30


class RunSource:
    """One run the view follows: its store, a name, and the last batch read."""

    def __init__(self, name: str, store: KeyedStateStore) -> None:
        self.name = name
        self.store = store
        self.last: int | None = None
        self.request: str | None = None  # id of the stored request shown already
        self.polls = 0

    @classmethod
    def of(cls, item: Any, name: str | None = None) -> RunSource:
        """A run (``keyed_foreach_batch``'s result), a :class:`KeyedStateStore` or a state
        path, named ``name`` (default: the state path's last part).

        Raises
        ------
        InvalidArgumentTypeError
            ``item`` is none of these.
        """
        store = getattr(item, "store", item)
        if isinstance(store, str):
            store = KeyedStateStore(store)
        if not isinstance(store, KeyedStateStore):
            raise InvalidArgumentTypeError(
                "runs must be keyed_foreach_batch runs, KeyedStateStores or state paths, got "
                f"{type(item).__name__}")
        label = name or store.path.rstrip("/").rsplit("/", 1)[-1] or store.path
        return cls(label, store)


def _progress_event(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """A progress event of the view from a progress's parsed JSON, read by
    :func:`~trilink_spark.measurement.parse_progress`; None (logged) for one it refuses."""
    try:
        parsed = parse_progress(data)
    except TrilinkError as err:
        logger.warning("dashboard: progress left out: %s", err)
        return None
    return {"kind": "progress", "time": time.time(), "batch": parsed.batch_id,
            "query": str(data.get("name") or data.get("id") or "query"),
            "input_rows": parsed.input_rows, "duration_ms": parsed.duration_ms}


class Feed:
    """Reads what the view shows and hands it to a model (module docs).

    Parameters
    ----------
    model : object
        Has ``add_record(record)`` and ``add_event(event)``.
    runs : iterable of RunSource
    partitioners : iterable of AdaptivePartitioner
    advisors : iterable of BottleneckAdvisor or ElasticityAdvisor
    spark : SparkSession, optional
        For a bottleneck advisor's task metrics and operator timings (classic sessions).
    poll_s : float
        The longest wait between two reads when no batch ends.
    """

    def __init__(self, model: Any, runs: Iterable[RunSource], partitioners: Iterable[Any],
                 advisors: Iterable[Any], spark: Any = None, poll_s: float = 2.0) -> None:
        self.model = model
        self.runs = list(runs)
        self.partitioners = list(partitioners)
        for p in self.partitioners:
            if not isinstance(p, AdaptivePartitioner):
                raise InvalidArgumentTypeError(
                    f"partitioners must be AdaptivePartitioners, got {type(p).__name__}")
        self.seen_decisions = [len(p.decisions) for p in self.partitioners]
        self.bottleneck: list[Any] = []  # a BottleneckListener per bottleneck advisor
        self.elastic: list[ElasticityAdvisor] = []
        for a in advisors:
            if isinstance(a, BottleneckAdvisor):
                self.bottleneck.append(BottleneckListener(a, spark))
            elif isinstance(a, ElasticityAdvisor):
                self.elastic.append(a)
            else:
                raise InvalidArgumentTypeError(
                    "advisors must be BottleneckAdvisors or ElasticityAdvisors, got "
                    f"{type(a).__name__}")
        self.poll_s = poll_s
        self.events: queue.Queue[Any] = queue.Queue(MAX_QUEUED)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="trilink-dashboard-feed",
                                       daemon=True)

    # ------------------------------------------------------------------ the listener side
    def on_progress(self, event: Any) -> None:
        """Queue a batch's progress (its JSON text, a ``StreamingQueryProgress`` or a
        ``QueryProgressEvent``; None: a query ended) for the feed's thread. O(1); when the
        queue is full the oldest is dropped (the view skips a batch's progress)."""
        while True:
            try:
                self.events.put_nowait(event)
                return
            except queue.Full:
                try:
                    self.events.get_nowait()
                except queue.Empty:
                    pass

    # ------------------------------------------------------------------ the feed's thread
    def start(self) -> None:
        """Read what is there already, then follow in the background."""
        self.poll()
        self.thread.start()

    def stop(self) -> None:
        """Stop the thread (idempotent); waits for it at most a few seconds."""
        self.stopped.set()
        self.on_progress(None)
        if self.thread.is_alive():
            self.thread.join(timeout=5)

    def _loop(self) -> None:
        while not self.stopped.is_set():
            try:
                event = self.events.get(timeout=self.poll_s)
            except queue.Empty:
                event = None
            if self.stopped.is_set():
                return
            try:
                if event is not None:
                    self.progress(event)
                self.poll()
            except Exception as err:  # noqa: BLE001 - the view never stops on bad input
                logger.warning("dashboard feed: %s: %s", type(err).__name__, err)

    def progress(self, event: Any) -> None:
        """One batch's progress (its JSON text, a ``StreamingQueryProgress`` or a listener
        event): to the model and the advisors."""
        progress = getattr(event, "progress", event)
        data = json.loads(progress if isinstance(progress, str) else progress.json)
        # the advisors read the parsed JSON (they take a dict), not the text again
        event = SimpleNamespace(progress=SimpleNamespace(
            json=data, runId=data.get("runId"), batchId=data.get("batchId")))
        found = _progress_event(data)
        if found is not None:
            self.model.add_event(found)
        batch = None if found is None else found["batch"]
        for listener in self.bottleneck:
            listener.onQueryProgress(event)  # logs its own errors
            if listener.reports:
                self._bottleneck_advice(listener.reports[-1], batch)
        for elastic in self.elastic:
            try:
                advice = elastic.observe_progress(data)
            except TrilinkError as err:
                logger.warning("dashboard: elasticity advisor: %s", err)
                continue
            target = advice.target_executors
            words = ("keep " if target == advice.current_executors else "run ") + \
                f"{target} executor{'s' if target != 1 else ''}"
            if advice.max_offsets_per_trigger is not None:
                words += f", admit at most {advice.max_offsets_per_trigger} rows per trigger"
            self.model.add_event({"kind": "advice", "time": time.time(), "batch": batch,
                                  "source": "elasticity", "advice": words,
                                  "reason": advice.reason})

    def _bottleneck_advice(self, report: Any, batch: int | None) -> None:
        first = report.actions[0] if report.actions else None
        words = "no bottleneck" if not report.bottleneck else \
            f"bottleneck at {', '.join(report.bottleneck)}"
        if first is not None:
            words += f": {first['action']} ({first['setting']})"
        now = time.time()
        self.model.add_event({"kind": "advice", "time": now, "batch": batch,
                              "source": "bottleneck", "advice": words, "reason": report.reason})
        if report.nodes:
            ds2 = ", ".join(f"{n.name} {n.ds2_parallelism}" for n in report.nodes)
            rates = ", ".join(f"{n.name} {n.true_rate:.0f}/s" for n in report.nodes
                              if math.isfinite(n.true_rate))
            self.model.add_event({"kind": "advice", "time": now, "batch": batch,
                                  "source": "ds2", "advice": f"parallelism: {ds2}",
                                  "reason": f"true processing rates: {rates or 'not measured'}; "
                                            f"offered {report.offered_rate:.0f} rows/s"})

    def poll(self) -> None:
        """Read the runs' new records and stored requests, and the partitioners' new
        decisions. Errors of one source are logged; the others are still read."""
        for source in self.runs:
            try:
                self._poll_run(source)
            except (TrilinkError, OSError) as err:
                logger.warning("dashboard: %s not read (%s: %s)", source.name,
                               type(err).__name__, err)
        for i, p in enumerate(self.partitioners):
            decisions = p.decisions
            for d in decisions[self.seen_decisions[i]:]:
                if d.triggered:
                    self.model.add_event({
                        "kind": "advice", "time": time.time(), "batch": None,
                        "source": "switching",
                        "advice": (f"switch {d.previous} -> {d.chosen}" if d.switched
                                   else f"keep {d.chosen}"), "reason": d.reason})
            self.seen_decisions[i] = len(decisions)

    def _poll_run(self, source: RunSource) -> None:
        source.polls += 1
        if source.last is not None and source.polls % LIST_EVERY:
            # the next batches' records, one read each: no listing while batches follow on
            batch = source.last + 1
            while self._read_record(source, batch):
                batch += 1
        else:  # the first read (only what the model holds), and now and then a listing:
            # batch ids that skipped (a record not written) are found again
            batches = [b for b in history_batches(source.store)
                       if source.last is None or b > source.last]
            if source.last is None:
                batches = batches[-getattr(self.model, "history", len(batches) or 1):]
            for batch in batches:
                self._read_record(source, batch)
        event = pending_request(source, time.time())
        if event is not None and event["request_id"] != source.request:
            source.request = event["request_id"]
            self.model.add_event(event)


    def _read_record(self, source: RunSource, batch: int) -> bool:
        """Hand batch ``batch``'s record to the model, checked once as it is read
        (:func:`~trilink_spark.ui.records.read_batch_record`); False when there is none yet. A
        damaged record is logged once and passed over (never read again)."""
        try:
            record = read_batch_record(source.store, batch, source.name)
        except StateCorruptError as err:
            logger.warning("dashboard: %s; left out", err)
        else:
            if record is None:
                return False
            self.model.add_record(record)
        source.last = batch
        return True


def pending_request(source: RunSource, at: float) -> dict[str, Any] | None:
    """The swap request stored on ``source``'s state path and not yet carried out, as a
    ``request`` event of the view stamped ``at`` (None: there is none). One small read.

    Raises
    ------
    StateCorruptError
        The stored request is damaged (the store names it).
    """
    stored = source.store.load_record(SWAP_RECORD)
    if stored is None or stored.get("request_id") is None:
        return None
    strategy = stored.get("strategy")
    return {"kind": "request", "time": at, "run": source.name,
            "request_id": str(stored["request_id"]),
            "strategy": stored.get("strategy_name") or (
                strategy.get("strategy") if isinstance(strategy, dict) else None),
            "num_partitions": stored.get("num_partitions"), "mode": stored.get("mode")}
