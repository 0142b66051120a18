"""A deterministic discrete-time simulator of a linear stream job under an allocation policy.

Time runs in windows of ``dt`` seconds. In window ``n`` each operator, in chain order:

1. takes the adjustment decided ``adjust_delay_windows`` windows earlier, if any (counted in
   ``adjustments``);
2. receives its input: the workload's mean rate for the head operator, the output its upstream
   emitted in window ``n - 1`` for the others (the paper's Eq. 3, bandwidth factor ``b = 1``);
3. processes up to its capacity ``e * P_unit * PN * dt`` from buffer plus input (a fluid
   model, exact for rates that are constant within a window); what is left beyond the buffer
   size ``BS`` is lost (``data_loss``), the rest stays buffered;
4. emits ``CR`` times what it processed (Eq. 2).

Then the policy sees every operator's state and decides: new unit counts (they take effect in
window ``n + adjust_delay_windows``) and, for CRAA, feedback: an upstream operator keeps back
part of what it processed in window ``n`` (the paper's ``UP_U(n)``), which returns to its buffer
and is taken off what its downstream receives next.

Metrics per operator: ``data_loss`` (tuples lost, summed over the run), ``utilisation``
(``RS``: processed over capacity, averaged over the windows), ``adjustments`` (``AC``: unit
changes applied) and ``throughput`` (tuples processed per second of the run).

Examples
--------
>>> from trilink_spark.elastic import CRAA, paper_workload
>>> res = simulate(paper_operators(), paper_workload("step"), CRAA(), duration_s=120)
>>> list(res.per_operator.columns)
['data_loss', 'utilisation', 'adjustments', 'throughput']
>>> res.per_operator.index.tolist()
['O1', 'O2', 'O3', 'O4', 'O5']
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import pandas as pd

from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from .._internal.validation import count, seconds
from .model import Operator
from .policies import ChainState, Policy
from .workloads import MAX_WINDOWS, Workload

__all__ = ["simulate", "SimResult", "paper_operators", "PAPER_OPERATORS"]

logger = logging.getLogger(__name__)

#: Table 2 of the paper: (name, buffer size in tuples, unit rate in tuples/s), CR = 1.
PAPER_OPERATORS: tuple[tuple[str, int, int], ...] = (
    ("O1", 50, 500), ("O2", 500, 400), ("O3", 1000, 300), ("O4", 2000, 200), ("O5", 5000, 100),
)


def paper_operators() -> list[Operator]:
    """Table 2's five operators, one unit each at the start (the paper's one thread each).

    Examples
    --------
    >>> [(o.name, o.buffer_size, o.unit_rate) for o in paper_operators()][:2]
    [('O1', 50.0, 500.0), ('O2', 500.0, 400.0)]

    Notes
    -----
    O(1).
    """
    return [Operator(name, bs, rate) for name, bs, rate in PAPER_OPERATORS]


@dataclass(frozen=True)
class SimResult:
    """What :func:`simulate` measured.

    Attributes
    ----------
    policy, workload : str
        Their names.
    window_s : float
        ``dt``.
    adjust_delay_windows : int
        The delay simulated.
    per_operator : pandas.DataFrame
        Indexed by operator name; columns ``data_loss`` (tuples), ``utilisation`` (0-1),
        ``adjustments`` (count) and ``throughput`` (tuples/s).
    timeline : pandas.DataFrame
        One row per window and operator, columns ``window``, ``time_s`` (window start),
        ``operator``, ``input_rate`` (tuples/s), ``processed`` (tuples), ``output_rate``
        (tuples/s), ``buffer`` (tuples at the window's end), ``buffer_ratio``, ``units``,
        ``capacity`` (tuples/s), ``lost`` (tuples), ``held_back`` (tuples kept back by
        feedback) and ``adjusted`` (a unit change took effect in this window).
    input_rates : numpy.ndarray
        The workload's mean rate per window.
    """

    policy: str
    workload: str
    window_s: float
    adjust_delay_windows: int
    per_operator: pd.DataFrame
    timeline: pd.DataFrame
    input_rates: np.ndarray[Any, np.dtype[np.float64]]

    def totals(self) -> dict[str, float]:
        """Whole-job figures: tuples offered and lost, adjustments, mean utilisation. O(ops)."""
        per = self.per_operator
        return {
            "offered": float(self.input_rates.sum() * self.window_s),
            "data_loss": float(per["data_loss"].sum()),
            "adjustments": float(per["adjustments"].sum()),
            "utilisation": float(per["utilisation"].mean()),
        }


def _operators(operators: Any) -> tuple[Operator, ...]:
    if isinstance(operators, Operator):
        operators = [operators]
    if isinstance(operators, (str, bytes)) or not isinstance(operators, Sequence):
        raise InvalidArgumentTypeError(
            f"operators must be a sequence of Operator, got {type(operators).__name__}")
    ops = tuple(operators)
    if not ops:
        raise InvalidArgumentError("operators must hold at least one Operator")
    bad = [type(o).__name__ for o in ops if not isinstance(o, Operator)]
    if bad:
        raise InvalidArgumentTypeError(f"operators must all be Operator, got {bad[:3]}")
    names = [o.name for o in ops]
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"operator names must be unique, got {names}")
    return ops


def simulate(operators: Sequence[Operator], workload: Workload, policy: Policy,
             window_s: float | str | timedelta = 5, duration_s: float | str | timedelta = 600,
             adjust_delay_windows: int = 1, seed: int = 0) -> SimResult:
    """Run ``workload`` through the chain ``operators`` under ``policy``.

    Parameters
    ----------
    operators : sequence of Operator
        The chain, head first.
    workload : Workload
        The head operator's input.
    policy : Policy
        :class:`~trilink_spark.elastic.TA`, :class:`~trilink_spark.elastic.KPA` or
        :class:`~trilink_spark.elastic.CRAA` (a fresh controller runs per call).
    window_s : float, str or timedelta
        ``dt`` (default 5 s, the paper's processing interval).
    duration_s : float, str or timedelta
        Length of the run (default 600 s: the paper runs each test at least 10 min); rounded
        up to whole windows.
    adjust_delay_windows : int
        Windows between a decision (at the end of window ``n``) and its effect (>= 1; 1: from
        the next window on). The paper does not state it.
    seed : int
        Seed of workloads that have none of their own (random draws, sine noise). The same
        arguments and seed give the same result.

    Returns
    -------
    SimResult

    Raises
    ------
    InvalidArgumentError, InvalidArgumentTypeError
        Bad arguments; more than :data:`~trilink_spark.elastic.workloads.MAX_WINDOWS`
        windows; rates that leave the float range.

    Notes
    -----
    Cost: O(windows * policy's cost per window); O(windows * operators**2 * delay) with CRAA
    (about 0.1 ms per window for the paper's five operators). Memory: O(windows * operators)
    for the timeline. Unit counts are capped at
    :data:`~trilink_spark.elastic.model.MAX_UNITS`.

    Examples
    --------
    >>> from trilink_spark.elastic import TA, paper_workload
    >>> res = simulate(paper_operators(), paper_workload("jitter"), TA(), duration_s=60)
    >>> int(res.per_operator.loc["O5", "adjustments"]) >= 0
    True
    """
    ops = _operators(operators)
    if not isinstance(workload, Workload):
        raise InvalidArgumentTypeError(
            f"workload must be a Workload (Workload.step(...), paper_workload(name)), "
            f"got {type(workload).__name__}")
    if not isinstance(policy, Policy):
        raise InvalidArgumentTypeError(
            f"policy must be TA(...), KPA(...) or CRAA(...), got {type(policy).__name__}")
    dt = seconds(window_s, "window_s")
    duration = seconds(duration_s, "duration_s")
    delay = count(adjust_delay_windows, "adjust_delay_windows")
    seed = count(seed, "seed", low=0)
    span = duration / dt
    if not span <= MAX_WINDOWS:
        raise InvalidArgumentError(
            f"duration_s {duration:g} s in windows of {dt:g} s is {span:.3g} windows; at most "
            f"{MAX_WINDOWS:,} are simulated (use longer windows or a shorter run)")
    n_win = max(1, math.ceil(span - 1e-9))
    rates = workload.rates(dt, n_win, seed)
    with np.errstate(over="ignore"):
        if not bool(np.isfinite(rates * dt).all()):
            raise InvalidArgumentError(
                f"workload {workload.name!r} offers more than 1.8e308 tuples in a window of "
                f"{dt:g} s; give lower rates or shorter windows")
    ctrl = policy.controller(ops)
    m = len(ops)
    bs = np.array([o.buffer_size for o in ops])
    unit_cap = np.array([o.efficiency * o.unit_rate for o in ops])
    cr = np.array([o.consumption_ratio for o in ops])
    units = np.array([o.units for o in ops], dtype=np.int64)
    buffer = np.zeros(m)
    transit = np.zeros(m)
    pending: list[tuple[int, int] | None] = [None] * m
    shape = (n_win, m)
    rec = {k: np.zeros(shape) for k in ("input_rate", "processed", "output_rate", "buffer",
                                         "capacity", "lost", "held_back")}
    rec_units = np.zeros(shape, dtype=np.int64)
    adjusted = np.zeros(shape, dtype=bool)
    for n in range(n_win):
        for i, p in enumerate(pending):
            if p is not None and p[0] <= n:
                adjusted[n, i] = p[1] != units[i]
                units[i] = p[1]
                pending[i] = None
        arrivals = np.empty(m)
        arrivals[0] = rates[n] * dt
        arrivals[1:] = transit[:-1]
        capacity = units * unit_cap
        avail = buffer + arrivals
        processed = np.minimum(avail, capacity * dt)
        rest = avail - processed
        lost = np.maximum(rest - bs, 0.0)
        buffer = np.minimum(rest, bs)
        transit = cr * processed
        state = ChainState(n, dt, delay, arrivals / dt, buffer.copy(), processed.copy(),
                           transit.copy(), units.copy(), list(pending))
        plan = ctrl.decide(state)
        held = np.zeros(m)
        for j, amount in plan.held_back.items():
            held[j] = amount
        buffer = buffer + held
        processed = processed - held
        transit = transit - cr * held
        for i, target in plan.targets.items():
            pending[i] = (n + delay, int(target))
        rec["input_rate"][n] = arrivals / dt
        rec["processed"][n] = processed
        rec["output_rate"][n] = transit / dt
        rec["buffer"][n] = buffer
        rec["capacity"][n] = capacity
        rec["lost"][n] = lost
        rec["held_back"][n] = held
        rec_units[n] = units
    names = [o.name for o in ops]
    with np.errstate(divide="ignore", invalid="ignore"):
        util = np.where(rec["capacity"] > 0, rec["processed"] / (rec["capacity"] * dt), 0.0)
    per = pd.DataFrame({
        "data_loss": rec["lost"].sum(axis=0),
        "utilisation": util.mean(axis=0),
        "adjustments": adjusted.sum(axis=0).astype(np.int64),
        "throughput": rec["processed"].sum(axis=0) / (n_win * dt),
    }, index=pd.Index(names, name="operator"))
    timeline = pd.DataFrame({
        "window": np.repeat(np.arange(n_win), m),
        "time_s": np.repeat(np.arange(n_win) * dt, m),
        "operator": np.tile(np.array(names, dtype=object), n_win),
        "input_rate": rec["input_rate"].ravel(),
        "processed": rec["processed"].ravel(),
        "output_rate": rec["output_rate"].ravel(),
        "buffer": rec["buffer"].ravel(),
        "buffer_ratio": (rec["buffer"] / bs).ravel(),
        "units": rec_units.ravel(),
        "capacity": rec["capacity"].ravel(),
        "lost": rec["lost"].ravel(),
        "held_back": rec["held_back"].ravel(),
        "adjusted": adjusted.ravel(),
    })
    logger.debug("simulated %s on %s: %d windows, %.0f tuples lost", policy.name, workload.name,
                 n_win, per["data_loss"].sum())
    return SimResult(policy.name, workload.name, dt, delay, per, timeline, rates)
