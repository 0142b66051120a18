"""Elasticity advice for a Spark Structured Streaming query, after CRAA.

:class:`ElasticityAdvisor` treats a running query as one operator of the CRAA model
(:mod:`trilink_spark.elastic`) and reads its state from each ``StreamingQueryProgress``:

==================================  ==============================================================
CRAA (the paper)                    Spark
==================================  ==============================================================
window ``dt``                       the trigger interval (``trigger_interval_s``)
parallel unit, ``PN``               an executor, the executor count
``P_unit``                          rows/s one executor processes: ``unit_rate``, or estimated
                                    as ``numInputRows / triggerExecution`` per executor
                                    (smoothed over batches)
input rate ``I(n)``                 ``inputRowsPerSecond`` (the Kalman filter predicts ``I(n+1)``)
input buffer occupancy ``BO(n)``    rows waiting: the source's lag (``latestOffset`` minus
                                    ``endOffset``, summed over partitions) when the source
                                    reports both, else the rows that arrived while the batch
                                    overran the interval, ``max(0, D - dt) * I``
buffer size ``BS``                  the rows the query clears within the latency bound:
                                    ``latency_bound_s * P``
data loss ``DL``                    rows over the latency bound: ``max(0, BO(n) - BS)`` per
                                    batch (:attr:`ElasticityAdvisor.rows_over_bound`); with
                                    Kafka nothing is dropped, so the cost also shows as lag x
                                    seconds (:attr:`ElasticityAdvisor.lag_row_seconds`)
feedback to the upstream (Alg. 1)   admission control: ``maxOffsetsPerTrigger``, so the source
                                    (Kafka) keeps what the query cannot take
==================================  ==============================================================

Each observation runs Eq. 9-13 once: predict the buffer (Eq. 9), size the executor change
(Eq. 10-11), refuse a change against the input trend unless the bound would be exceeded
(Eq. 12-13, policy ``"craa"``), and, when the predicted buffer passes the warning level
``delta``, cap the rows per trigger at Eq. 5's bound for a batch boundary (where the query holds
no admitted rows): ``UI = P dt + delta BS``. Policy ``"ta"`` reacts to the measured backlog
alone and ``"kpa"`` reacts to the predicted one; both scale to the executors that carry the
input rate (as in the simulator) and neither judges the trend nor caps admission.

:func:`apply_advice` applies what the deployment allows and never raises: the cap through a
config center (the field ``max_offsets_per_trigger``; the center's validator must accept it),
executors through the cluster manager (``requestTotalExecutors``). Local mode and Spark Connect
have no cluster manager to ask: the executor part returns False and logs why.

Examples
--------
>>> advisor = ElasticityAdvisor("craa", trigger_interval_s="1 second", unit_rate=100)
>>> calm = {"batchId": 0, "numInputRows": 50, "inputRowsPerSecond": 50.0,
...         "durationMs": {"triggerExecution": 500}}
>>> advisor.observe_progress(calm).target_executors
1
>>> burst = {"batchId": 1, "numInputRows": 400, "inputRowsPerSecond": 400.0,
...          "durationMs": {"triggerExecution": 4000}}
>>> advice = advisor.observe_progress(burst)
>>> advice.target_executors > 1, advice.max_offsets_per_trigger
(True, 170)
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from .._internal.validation import INT64_MAX, count, positive, seconds
from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from ..kafka.admission import write_trigger_cap
from ..measurement.progress import clip_rate, parse_progress
from .kalman import KalmanFilter
from .model import MAX_UNITS, admission_limit, cooperative_judgement, unit_change
from .policies import CRAA, KPA, TA, Policy

__all__ = ["Advice", "ElasticityAdvisor", "apply_advice", "follow_trigger_cap",
           "ADVISOR_POLICIES"]

logger = logging.getLogger(__name__)

#: Policy names :class:`ElasticityAdvisor` takes.
ADVISOR_POLICIES: tuple[str, ...] = ("craa", "kpa", "ta")
#: Weight of the newest batch in the smoothed per-executor rate.
RATE_SMOOTHING = 0.5
#: Largest rows-per-trigger cap (``maxOffsetsPerTrigger`` is a ``Long``).
_LONG_MAX = INT64_MAX


def _ratio(rows: float, bound: float) -> float:
    """``rows / bound``; with a bound that underflowed to 0, +-inf (0 for no rows)."""
    if bound > 0:
        return rows / bound
    return math.copysign(math.inf, rows) if rows else 0.0


@dataclass(frozen=True)
class Advice:
    """What :meth:`ElasticityAdvisor.observe_progress` advises after one batch.

    Attributes
    ----------
    target_executors : int
        Executors to run (equal to ``current_executors``: no change).
    max_offsets_per_trigger : int or None
        Cap of rows per trigger (admission control), or ``None``: no cap needed.
    reason : str
        Why, in words, with the figures that decided.
    current_executors : int
        Executors the advisor assumed were running.
    batch_id : int or None
        The batch observed.
    predicted_input_rate : float
        ``I(n+1)``, rows/s.
    buffer_ratio : float
        Predicted backlog over the latency bound's rows (Eq. 9, unclipped).
    rows_over_bound : float
        This batch's "data loss": backlog rows beyond what clears within the latency bound.
    """

    target_executors: int
    max_offsets_per_trigger: int | None
    reason: str
    current_executors: int = 1
    batch_id: int | None = None
    predicted_input_rate: float = 0.0
    buffer_ratio: float = 0.0
    rows_over_bound: float = 0.0

    @property
    def changes_executors(self) -> bool:
        """Whether the advice asks for another executor count."""
        return self.target_executors != self.current_executors


def _policy(policy: Any) -> Policy:
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, str):
        name = policy.strip().lower()
        if name == "craa":
            return CRAA()
        if name == "kpa":
            return KPA()
        if name == "ta":
            return TA()
        raise InvalidArgumentError(
            f"unknown policy {policy!r}; choose from {', '.join(ADVISOR_POLICIES)} "
            "or pass TA(...), KPA(...) or CRAA(...)")
    raise InvalidArgumentTypeError(
        f"policy must be a name ({', '.join(ADVISOR_POLICIES)}) or a Policy, "
        f"got {type(policy).__name__}")


class ElasticityAdvisor:
    """Advise executors and admission for a streaming query from its progress (CRAA on Spark).

    Parameters
    ----------
    policy : str or Policy
        ``"craa"`` (default), ``"kpa"``, ``"ta"``, or a
        :class:`~trilink_spark.elastic.CRAA` / ``KPA`` / ``TA`` carrying its thresholds.
    trigger_interval_s : float, str or timedelta
        The query's processing-time trigger interval (``"10 seconds"`` works): the window.
    min_units, max_units : int
        Bounds of the advised executor count (``max_units=None``: no upper bound).
    latency_bound_s : float, str or timedelta, optional
        Rows waiting longer than this count as lost; default one trigger interval.
    unit_rate : float, optional
        Rows/s one executor processes, when known; default: estimated from the batches.
    units : int, optional
        Executors running at the start (default ``min_units``); see :attr:`units`.
    kalman : KalmanFilter, optional
        Template of the input-rate filter (default the policy's, else ``KalmanFilter()``).

    Notes
    -----
    :meth:`observe_progress` costs O(partitions of the progress) plus O(1) for the model;
    the state is a Kalman filter and a few floats. Not thread-safe: feed it from one thread
    (a ``StreamingQueryListener`` or the loop that reads ``query.lastProgress``).

    Examples
    --------
    >>> ElasticityAdvisor("ta", trigger_interval_s=5, max_units=8).max_units
    8
    """

    def __init__(self, policy: str | Policy = "craa",
                 trigger_interval_s: float | str | timedelta | None = None,
                 min_units: int = 1, max_units: int | None = None, *,
                 latency_bound_s: float | str | timedelta | None = None,
                 unit_rate: float | None = None, units: int | None = None,
                 kalman: KalmanFilter | None = None) -> None:
        self.policy = _policy(policy)
        if trigger_interval_s is None:
            raise InvalidArgumentError(
                "trigger_interval_s is required: the query's processing-time trigger interval "
                "(a number of seconds, a timedelta or a string such as '10 seconds')")
        self.trigger_interval_s = seconds(trigger_interval_s, "trigger_interval_s")
        self.min_units = count(min_units, "min_units")
        self.max_units = None if max_units is None else count(max_units, "max_units")
        if self.max_units is not None and self.max_units < self.min_units:
            raise InvalidArgumentError(
                f"max_units must be >= min_units ({self.min_units}), got {self.max_units}")
        self.latency_bound_s = (self.trigger_interval_s if latency_bound_s is None
                                else seconds(latency_bound_s, "latency_bound_s"))
        self.unit_rate = None if unit_rate is None else positive(unit_rate, "unit_rate")
        self._units = self._clip(self.min_units if units is None else count(units, "units"))
        template = kalman if kalman is not None else getattr(self.policy, "kalman", None)
        if template is not None and not isinstance(template, KalmanFilter):
            raise InvalidArgumentTypeError(
                f"kalman must be a KalmanFilter, got {type(template).__name__}")
        self._filter = template.copy() if template is not None else KalmanFilter()
        self._filter.reset()
        self._rate_estimate: float | None = None
        self._last_seen: tuple[int, str] | None = None
        #: Batches observed.
        self.batches = 0
        #: Rows over the latency bound, summed over the batches observed ("data loss").
        self.rows_over_bound = 0.0
        #: Backlog rows times seconds, summed over the batches observed.
        self.lag_row_seconds = 0.0
        #: The latest advice (``None`` before the first batch).
        self.last_advice: Advice | None = None

    def _clip(self, n: int) -> int:
        n = min(max(self.min_units, n), MAX_UNITS)
        return n if self.max_units is None else min(self.max_units, n)

    @property
    def units(self) -> int:
        """Executors the advisor assumes are running. Set it after a successful
        :func:`apply_advice` (or pass ``executors=`` to :meth:`observe_progress`); the advisor
        never assumes its advice was applied."""
        return self._units

    @units.setter
    def units(self, value: int) -> None:
        self._units = count(value, "units")

    @property
    def estimated_unit_rate(self) -> float | None:
        """Rows/s per executor in use: ``unit_rate``, else the smoothed estimate (None yet)."""
        return self.unit_rate if self.unit_rate is not None else self._rate_estimate

    def observe_progress(self, progress: Any, *, executors: int | None = None) -> Advice:
        """Take one batch's progress and advise.

        Parameters
        ----------
        progress : StreamingQueryProgress, dict or str
            ``query.lastProgress``, an event's ``progress`` in a ``StreamingQueryListener``,
            or its JSON.
        executors : int, optional
            Executors running now (updates :attr:`units`).

        Returns
        -------
        Advice

        Raises
        ------
        InvalidArgumentTypeError, InvalidArgumentError
            ``progress`` is none of the accepted forms, or not JSON.

        Notes
        -----
        O(partitions reported in the progress). The latest event again (same ``batchId`` and
        ``timestamp``: a duplicated line, a replayed listener event) changes nothing and
        returns :attr:`last_advice`: the filter, the rate estimate and the loss counters see
        each event once. Rates are
        clipped to :data:`~trilink_spark.measurement.progress.RATE_CAP`, the advised executors to
        :data:`~trilink_spark.elastic.model.MAX_UNITS`.
        """
        if executors is not None:
            self.units = executors
        parsed = parse_progress(progress)
        seen = self._last_seen
        if self.last_advice is not None and (parsed.batch_id, parsed.timestamp) == seen:
            logger.info("progress of batch %d (%s) seen already: ignored", parsed.batch_id,
                        parsed.timestamp or "no timestamp")
            return self.last_advice
        self._last_seen = (parsed.batch_id, parsed.timestamp)
        pol = self.policy
        dt = self.trigger_interval_s
        units = self._units
        batch_id: int | None = parsed.batch_id
        rows = float(parsed.input_rows)
        rate_in = clip_rate(parsed.input_rate)
        if rate_in == 0 and rows > 0:
            rate_in = clip_rate(rows / dt)
        busy_ms: float | None = parsed.duration_ms or None
        if busy_ms is None:
            done = parsed.processed_rate
            busy_ms = 1000.0 * rows / done if done else None
        busy = (busy_ms or 0.0) / 1000.0
        if rows > 0 and busy > 0 and self.unit_rate is None:
            sample = clip_rate(rows / busy / units)
            old = self._rate_estimate
            self._rate_estimate = sample if old is None else (
                RATE_SMOOTHING * sample + (1 - RATE_SMOOTHING) * old)
        self.batches += 1
        self._filter.update(rate_in)
        per_unit = self.estimated_unit_rate
        if per_unit is None:
            advice = Advice(units, None, "no rows processed yet: no estimate of the rate per "
                            "executor (pass unit_rate= to give one)", units, batch_id,
                            rate_in, 0.0, 0.0)
            self.last_advice = advice
            return advice
        capacity = clip_rate(per_unit * units)
        lag = parsed.backlog_rows
        backlog = float(lag) if lag is not None else max(0.0, busy - dt) * rate_in
        bound_rows = self.latency_bound_s * capacity
        over = max(0.0, backlog - bound_rows)
        self.rows_over_bound += over
        self.lag_row_seconds += backlog * dt
        if isinstance(pol, TA):
            predicted = rate_in
            trigger = _ratio(backlog, bound_rows)
            buffer_next = backlog + (rate_in - capacity) * dt
            trend = None
        else:
            predicted = max(0.0, self._filter.predict(1))
            after = max(0.0, self._filter.predict(2))
            buffer_next = backlog + (predicted - capacity) * dt  # Eq. 9
            trigger = _ratio(buffer_next, bound_rows)
            trend = ((after / predicted if predicted > 0 else (math.inf if after > 0 else 1.0))
                     if isinstance(pol, CRAA) else None)
        target, why = self._decide(trigger, buffer_next, bound_rows, predicted, capacity,
                                   per_unit, trend)
        cap: int | None = None
        if isinstance(pol, CRAA) and trigger > pol.delta:
            limit = admission_limit(capacity, 0.0, bound_rows, pol.delta, dt)  # Eq. 5
            cap = max(1, min(_LONG_MAX, int(math.floor(limit))))
            why += f"; admission capped at {cap} rows per trigger (Eq. 5, delta {pol.delta:g})"
        advice = Advice(target, cap, why, units, batch_id, predicted, trigger, over)
        self.last_advice = advice
        logger.debug("batch %s: %s", batch_id, why)
        return advice

    def _decide(self, ratio: float, buffer_next: float, bound_rows: float, predicted: float,
                capacity: float, per_unit: float, trend: float | None) -> tuple[int, str]:
        pol = self.policy
        units = self._units
        alpha = (units - 1) / units
        util = predicted / capacity if capacity > 0 else math.inf
        head = (f"input {predicted:.4g} rows/s for {capacity:.4g} rows/s on {units} "
                f"executor(s); backlog {ratio:.2f} of the latency bound")
        up = ratio >= pol.beta
        down = ratio < pol.gamma and util < alpha
        if not (up or down):
            return units, f"{head}: within [gamma {pol.gamma:g}, beta {pol.beta:g}), no change"
        if isinstance(pol, CRAA):
            change = unit_change(buffer_next, bound_rows, pol.delta, per_unit,
                                 self.trigger_interval_s)
        else:  # TA and KPA: the executors that carry the (observed or predicted) input rate
            carried = predicted / per_unit
            change = (MAX_UNITS if not carried <= MAX_UNITS
                      else max(1, math.ceil(carried - 1e-9))) - units
        if change == 0 or (change > 0) != up:
            return units, f"{head}: no whole executor to change"
        if trend is not None and not cooperative_judgement(1 if change > 0 else -1, trend,
                                                           buffer_next, bound_rows):
            return units, (f"{head}: {'+' if change > 0 else ''}{change} executor(s) refused, "
                           f"against the input trend {trend:.2f} (Eq. 12-13)")
        target = self._clip(units + change)
        if target == units:
            return units, f"{head}: {change:+d} executor(s) needed, bounded by " \
                          f"[{self.min_units}, {self.max_units}]"
        note = "" if target == units + change else f" (bounded from {units + change})"
        return target, f"{head}: {target - units:+d} executor(s) to {target}{note} (Eq. 9-11)"


def _spark_context(spark: Any) -> Any:
    try:
        return spark.sparkContext
    except Exception as err:  # noqa: BLE001 - Spark Connect raises on sparkContext
        logger.warning("cannot reach a SparkContext (%s: %s): Spark Connect clients cannot "
                       "request executors", type(err).__name__, err)
        return None


def _apply_executors(spark: Any, target: int, dry_run: bool) -> bool:
    sc = _spark_context(spark)
    if sc is None:
        return False
    master = str(sc.master)
    if master.startswith("local"):
        logger.warning("executors not changed to %d: master %r is local mode, which has no "
                       "cluster manager to request executors from", target, master)
        return False
    dynamic = str(sc.getConf().get("spark.dynamicAllocation.enabled", "false")).lower() == "true"
    if dry_run:
        logger.info("dry run: would request %d executors in total from %s%s", target, master,
                    " (dynamic allocation on)" if dynamic else "")
        return True
    jvm = sc._jvm
    hosts = jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(jvm.java.util.HashMap())
    ok = bool(sc._jsc.sc().requestTotalExecutors(target, 0, hosts))
    if not ok:
        logger.warning("the cluster manager of %s refused a total of %d executors", master,
                       target)
    elif dynamic:
        logger.info("requested %d executors; dynamic allocation is on and may revise the total",
                    target)
    return ok


def _apply_cap(advice: Advice, dry_run: bool, center: Any, field: str) -> bool:
    cap = advice.max_offsets_per_trigger
    if center is None:
        if cap is None:
            return True
        logger.warning("maxOffsetsPerTrigger not capped at %d: no config center was given "
                       "(apply_advice(..., config_center=...))", cap)
        return False
    if cap is None:
        current = center.current() if callable(getattr(center, "current", None)) else {}
        if current.get(field) is None:
            return True
    update = {field: cap}
    if dry_run:
        logger.info("dry run: would publish %s", update)
        return True
    if center.publish(update) is None:
        logger.warning("the config center refused %s: %s", update,
                       getattr(center, "last_rejection", "no reason given"))
        return False
    return True


def apply_advice(spark: Any, advice: Advice, dry_run: bool = True, *,
                 config_center: Any = None, field: str = "max_offsets_per_trigger") -> bool:
    """Apply what the deployment allows of ``advice``; never raises.

    Parameters
    ----------
    spark : SparkSession
        The query's session.
    advice : Advice
        From :meth:`ElasticityAdvisor.observe_progress`.
    dry_run : bool
        Log what would be done, change nothing (default). The result still says whether it
        could be done: local mode and Spark Connect give False.
    config_center : ConfigCenter, optional
        Where the rows-per-trigger cap is published (``{field: cap}``, or ``{field: None}``
        to lift a cap). :func:`follow_trigger_cap` carries it to a ``trilink-kafka`` stream
        read with ``max_records_per_trigger_path``, which applies it at its next batch.
    field : str
        The configuration field of the cap.

    Returns
    -------
    bool
        True when every part of the advice was (or, in a dry run, would be) applied: the cap
        (when the advice has one or one must be lifted) and the executor count (when it
        changes). False otherwise, with the reason logged at WARNING.

    Notes
    -----
    Executors are requested with ``SparkContext.requestTotalExecutors`` (through py4j), which
    needs a cluster manager (standalone, YARN, Kubernetes); with dynamic allocation on, its
    manager may revise the total later. Cost: one driver call per part applied.

    Examples
    --------
    >>> apply_advice(None, "not an advice")
    False
    """
    try:
        if not isinstance(advice, Advice):
            logger.error("apply_advice needs an Advice, got %s", type(advice).__name__)
            return False
        ok = _apply_cap(advice, bool(dry_run), config_center, field)
        if advice.changes_executors:
            ok = _apply_executors(spark, advice.target_executors, bool(dry_run)) and ok
        return ok
    except Exception as err:  # noqa: BLE001 - the contract: log, return False, never raise
        logger.warning("advice not applied: %s: %s", type(err).__name__, err)
        return False


def follow_trigger_cap(center: Any, path: str,
                       field: str = "max_offsets_per_trigger") -> Callable[[], None]:
    """Carry a config center's rows-per-trigger cap to a running ``trilink-kafka`` stream.

    Subscribes to ``center``: every accepted snapshot writes its ``field`` to the cap file
    ``path`` (:func:`~trilink_spark.kafka.admission.write_trigger_cap`), which a stream read
    with ``read_kafka(..., max_records_per_trigger_path=path)`` applies from its next
    micro-batch. With :func:`apply_advice` publishing the advice's cap to the same center, the
    elasticity advisor's admission control reaches the running query.

    Parameters
    ----------
    center : ConfigCenter
        An in-process or Redis config center (its validator must accept ``field``; the default
        one does, as :data:`~trilink_spark.switching.CONFIG_FIELDS` holds
        ``max_offsets_per_trigger``).
    path : str
        The cap file (local path, or a ``pyarrow.fs`` URI the driver reaches).
    field : str
        The configuration field holding the cap.

    Returns
    -------
    callable
        Stops following (the file is left as it is).

    Notes
    -----
    Each accepted snapshot writes the cap of the center's *current* snapshot (``current()``),
    so one arriving late (two publishers at once) never overwrites a newer cap, and a Redis
    center that lost its data and resynchronised (versions starting again at 1) is still
    followed. A center without ``current()`` is followed in version order. A snapshot whose
    ``field`` is not a valid cap is logged and skipped; a write that fails is logged by the
    center (the next snapshot writes again). Cost: one small atomic file write per accepted
    snapshot.

    Examples
    --------
    >>> import os, tempfile
    >>> from trilink_spark.switching.config_center import ConfigCenter
    >>> from trilink_spark.kafka.admission import read_trigger_cap
    >>> center, path = ConfigCenter(), os.path.join(tempfile.mkdtemp(), "cap.json")
    >>> stop = follow_trigger_cap(center, path)
    >>> center.publish({"max_offsets_per_trigger": 2000})["version"]
    1
    >>> read_trigger_cap(path)
    (True, 2000)
    >>> stop()
    """
    if not callable(getattr(center, "subscribe", None)):
        raise InvalidArgumentTypeError(
            f"center must be a ConfigCenter, got {type(center).__name__}")
    if not isinstance(path, str) or not path:
        raise InvalidArgumentTypeError(f"path must be a non-empty str, got {path!r:.80}")
    if not isinstance(field, str) or not field:
        raise InvalidArgumentTypeError(f"field must be a non-empty str, got {field!r:.80}")
    lock = threading.Lock()
    written = [0]  # the version last written (a center without current() only)
    current = getattr(center, "current", None)

    def on_snapshot(snapshot: Mapping[str, Any]) -> None:
        with lock:
            if callable(current):  # what the center holds now: late or resynced alike
                held = current()
                if isinstance(held, Mapping) and held:
                    snapshot = held
            version = snapshot.get("version", 0)
            version = version if isinstance(version, int) and not isinstance(version, bool) \
                else 0
            if not callable(current) and version and version <= written[0]:
                return  # an older snapshot arriving late
            try:
                write_trigger_cap(path, snapshot.get(field))
            except (InvalidArgumentError, InvalidArgumentTypeError) as err:
                logger.warning("config version %s: %s not written to the cap file (%s); "
                               "the file keeps its cap", version, field, err)
                return
            written[0] = max(written[0], version)
        logger.info("config version %s: rows per trigger cap %s written to %s", version,
                    snapshot.get(field), path)

    return cast(Callable[[], None], center.subscribe(on_snapshot))
