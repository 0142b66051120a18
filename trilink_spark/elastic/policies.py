"""The three allocation policies compared in the paper: TA, KPA and CRAA.

All three respect the same limits (at least one unit; an operator with an adjustment still in
flight takes no new decision) and the same thresholds. They differ in what the paper says they
differ in:

- **TA** (threshold algorithm): reacts to the buffer it *measures*. Scale up at
  ``RBO(n) >= beta``; down at ``RBO(n) < gamma`` when a unit is idle (utilisation
  ``I / P < alpha = (PN - 1) / PN``); either way to the fewest units that carry the input rate it
  last saw, ``ceil(I(n) / (e P_unit))``.
- **KPA** (Kalman prediction algorithm, the paper's ref. 24): one Kalman filter per operator
  predicts its own input; the same thresholds apply to the *predicted* buffer (Eq. 9), and it
  scales to the units that carry the predicted rate.
- **CRAA** (Algorithm 2): a Kalman filter at the head operator only; every other operator's
  input is predicted from its upstream's state (Eq. 2-4, exact one window ahead), the
  upstream's planned rate is fed forward (Eq. 8), an operator whose predicted buffer lies
  between ``delta`` and ``beta`` asks its upstream to slow down (Algorithm 1) instead of
  scaling, and an adjustment against the input trend is refused unless the buffer would
  overflow (Eq. 12-13).

Choices the paper leaves open, made here:

- The paper gives TA and KPA no sizing rule; they scale to the units that carry the input
  rate (observed, or predicted), the usual rule of threshold autoscalers. (Sizing them with
  CRAA's Eq. 10-11 instead, which aims at a buffer level rather than a rate, makes TA cycle
  even under a constant load, and flatters CRAA.)
- Algorithm 2 line 16 prints the scale-down test as ``I / (alpha P) < alpha``; §6 states it
  as "utilisation below alpha", read here as ``I(n+1) / P(n) < alpha``.
- With an adjustment delay of ``d`` windows, a decision taken at the end of window ``n``
  takes effect in window ``n + d``; CRAA and KPA then predict window ``n + d`` (CRAA with
  Eq. 4, ``k = d``), TA still looks at window ``n``. The feedback of Algorithm 1 changes a
  rate, not resources, and acts at once.

Examples
--------
>>> CRAA().name, TA(beta=0.9).beta
('CRAA', 0.9)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from .._internal.validation import fraction
from .kalman import KalmanFilter
from .model import (MAX_UNITS, Operator, Upstream, admission_limit, cooperative_judgement,
                    feedback_adjustment, unit_change)

__all__ = ["Policy", "TA", "KPA", "CRAA", "ChainState", "Plan", "Controller"]


@dataclass
class ChainState:
    """What a policy sees at the end of window ``n`` (arrays hold one entry per operator).

    Attributes
    ----------
    window : int
        ``n``.
    window_s : float
        ``dt``.
    delay : int
        Adjustment delay in windows.
    input_rate : ndarray
        ``I(n)``, tuples/s.
    buffer : ndarray
        ``BO(n)``, tuples.
    processed : ndarray
        Tuples processed in window ``n``.
    transit : ndarray
        Output tuples of window ``n``; entry ``i`` reaches operator ``i + 1`` in window
        ``n + 1`` (the last operator's go to the sink).
    units : ndarray
        Units in effect in window ``n``.
    pending : list
        Per operator ``(window, units)`` of an adjustment still in flight, or ``None``.
    """

    window: int
    window_s: float
    delay: int
    input_rate: npt.NDArray[np.float64]
    buffer: npt.NDArray[np.float64]
    processed: npt.NDArray[np.float64]
    transit: npt.NDArray[np.float64]
    units: npt.NDArray[np.int64]
    pending: list[tuple[int, int] | None]


@dataclass
class Plan:
    """A policy's decisions for one window: unit targets and feedback hold-backs.

    Attributes
    ----------
    targets : dict
        Operator index -> units from window ``n + delay`` on.
    held_back : dict
        Upstream operator index -> input tuples it keeps back (Algorithm 1).
    """

    targets: dict[int, int] = field(default_factory=dict)
    held_back: dict[int, float] = field(default_factory=dict)


class Controller:
    """A policy's running state in one simulation (built by :meth:`Policy.controller`)."""

    def __init__(self, policy: Policy, operators: tuple[Operator, ...]) -> None:
        self.policy = policy
        self.ops = operators
        self.bs = np.array([o.buffer_size for o in operators])
        self.unit_cap = np.array([o.efficiency * o.unit_rate for o in operators])
        self.cr = np.array([o.consumption_ratio for o in operators])

    def decide(self, state: ChainState) -> Plan:  # pragma: no cover - abstract
        """The plan for the end of ``state.window``. Cost: see the policy."""
        raise NotImplementedError

    # helpers shared by the policies
    def committed(self, state: ChainState, i: int) -> int:
        """Units operator ``i`` will have once what is in flight lands."""
        p = state.pending[i]
        return int(p[1]) if p is not None else int(state.units[i])

    def schedule(self, state: ChainState) -> npt.NDArray[np.float64]:
        """Capacity (tuples/s) of each operator in windows ``n .. n + delay + 1``."""
        d = state.delay
        units = np.repeat(state.units[:, None].astype(np.float64), d + 2, axis=1)
        for i, p in enumerate(state.pending):
            if p is not None:
                units[i, max(0, p[0] - state.window):] = p[1]
        out: npt.NDArray[np.float64] = units * self.unit_cap[:, None]
        return out

    def size(self, state: ChainState, i: int, ratio: float, buffer_next: float,
             utilisation: float, trend: float | None) -> int | None:
        """Scale operator ``i`` if its buffer ratio and utilisation call for it.

        ``ratio`` triggers (scale up at ``>= beta``, down below ``gamma`` with an idle unit),
        ``buffer_next`` (tuples, Eq. 9) sizes (Eq. 10-11), ``trend`` (``IT``, CRAA only) is
        judged (Eq. 12-13). Returns the new unit count, or ``None``.
        """
        pol = self.policy
        units = self.committed(state, i)
        alpha = (units - 1) / units
        up = ratio >= pol.beta
        down = ratio < pol.gamma and utilisation < alpha
        if not (up or down):
            return None
        bs = float(self.bs[i])
        change = unit_change(buffer_next, bs, pol.delta, float(self.unit_cap[i]),
                             state.window_s)
        if change == 0 or (change > 0) != up:
            return None
        if trend is not None and not cooperative_judgement(1 if change > 0 else -1, trend,
                                                           buffer_next, bs):
            return None
        target = min(MAX_UNITS, max(1, units + change))
        return target if target != units else None

    def match(self, state: ChainState, i: int, ratio: float, rate: float,
              utilisation: float) -> int | None:
        """TA's and KPA's rule: when ``ratio`` triggers (as in :meth:`size`), the fewest units
        that carry ``rate``, if that is a change in the triggered direction; else ``None``."""
        pol = self.policy
        units = self.committed(state, i)
        carried = rate / float(self.unit_cap[i])
        need = MAX_UNITS if not carried <= MAX_UNITS else max(1, math.ceil(carried - 1e-9))
        if ratio >= pol.beta:
            return need if need > units else None
        if ratio < pol.gamma and utilisation < (units - 1) / units:
            return need if need < units else None
        return None


@dataclass(frozen=True)
class Policy:
    """Thresholds shared by the policies (see the subclasses).

    Parameters
    ----------
    beta : float
        Upper buffer threshold (scale up at or above), in ``(0, 1]``.
    gamma : float
        Lower buffer threshold (scale down below), in ``[0, beta)``.
    delta : float
        Warning threshold: Eq. 10 sizes adjustments so the buffer ends at ``delta * BS``;
        in ``[gamma, beta]``.
    """

    beta: float = 0.8
    gamma: float = 0.2
    delta: float = 0.7

    #: Shown in results.
    name = "policy"

    def __post_init__(self) -> None:
        beta = fraction(self.beta, "beta")
        gamma = fraction(self.gamma, "gamma", open_low=False)
        delta = fraction(self.delta, "delta")
        if not gamma < beta:
            raise InvalidArgumentError(f"gamma must be < beta ({beta:g}), got {gamma:g}")
        if not gamma <= delta <= beta:
            raise InvalidArgumentError(
                f"delta must lie in [gamma, beta] = [{gamma:g}, {beta:g}], got {delta:g}")
        object.__setattr__(self, "beta", beta)
        object.__setattr__(self, "gamma", gamma)
        object.__setattr__(self, "delta", delta)

    def controller(self, operators: tuple[Operator, ...]) -> Controller:
        """A fresh controller for one run over ``operators`` (chain order). O(operators)."""
        raise NotImplementedError  # pragma: no cover


def _kalman(template: Any) -> KalmanFilter:
    if template is None:
        return KalmanFilter()
    if not isinstance(template, KalmanFilter):
        raise InvalidArgumentTypeError(
            f"kalman must be a KalmanFilter or None, got {type(template).__name__}")
    out = template.copy()
    out.reset()
    return out


@dataclass(frozen=True)
class TA(Policy):
    """Threshold autoscaling on the measured buffer (the paper's baseline TA).

    Parameters
    ----------
    beta, gamma : float
        Scale up at ``RBO(n) >= beta``; down at ``RBO(n) < gamma`` with an idle unit, to the
        units that carry the last input rate.
    delta : float
        Unused by TA (kept so every policy carries the same thresholds).

    Notes
    -----
    O(operators) per window.

    Examples
    --------
    >>> TA()
    TA(beta=0.8, gamma=0.2, delta=0.7)
    """

    name = "TA"

    def controller(self, operators: tuple[Operator, ...]) -> Controller:
        return _TAController(self, operators)


class _TAController(Controller):
    def decide(self, state: ChainState) -> Plan:
        plan = Plan()
        cap = self.schedule(state)
        for i in range(len(self.ops)):
            if state.pending[i] is not None:
                continue
            # trigger: the measured buffer; size: the input rate last seen
            ratio_now = float(state.buffer[i] / self.bs[i])
            util = float(state.input_rate[i] / cap[i, 1])
            target = self.match(state, i, ratio_now, float(state.input_rate[i]), util)
            if target is not None:
                plan.targets[i] = target
        return plan


@dataclass(frozen=True)
class KPA(Policy):
    """Kalman prediction, then thresholds: one filter per operator predicts its own input.

    Parameters
    ----------
    beta, gamma, delta : float
        As :class:`TA`, applied to the buffer Eq. 9 predicts from the filtered input; scales to
        the units that carry the predicted rate.
    kalman : KalmanFilter, optional
        Template of the filters (copied per operator and run; default ``KalmanFilter()``).

    Notes
    -----
    O(operators * delay) per window.

    Examples
    --------
    >>> KPA().name
    'KPA'
    """

    kalman: KalmanFilter | None = field(default=None, compare=False)
    name = "KPA"

    def controller(self, operators: tuple[Operator, ...]) -> Controller:
        _kalman(self.kalman)
        return _KPAController(self, operators)


class _KPAController(Controller):
    def __init__(self, policy: KPA, operators: tuple[Operator, ...]) -> None:
        super().__init__(policy, operators)
        self.filters = [_kalman(policy.kalman) for _ in operators]

    def decide(self, state: ChainState) -> Plan:
        plan = Plan()
        cap = self.schedule(state)
        dt, d = state.window_s, state.delay
        for i, kf in enumerate(self.filters):
            kf.update(float(state.input_rate[i]))
            if state.pending[i] is not None:
                continue
            guess = [max(0.0, kf.predict(k)) for k in range(1, d + 1)]
            buf = float(state.buffer[i])
            for k in range(1, d):  # buffer at the start of window n + d
                buf = min(max(buf + (guess[k - 1] - cap[i, k]) * dt, 0.0), float(self.bs[i]))
            ratio = float(((guess[d - 1] - cap[i, d]) * dt + buf) / self.bs[i])
            target = self.match(state, i, ratio, guess[d - 1], float(guess[d - 1] / cap[i, d]))
            if target is not None:
                plan.targets[i] = target
        return plan


@dataclass(frozen=True)
class CRAA(Policy):
    """Cooperative resource allocation (Algorithm 2 of the paper).

    Parameters
    ----------
    beta, gamma : float
        Scale-up and scale-down thresholds of the predicted buffer.
    delta : float
        Warning threshold: between ``delta`` and ``beta`` an operator asks its upstream to
        slow down (Algorithm 1) instead of scaling; also Eq. 10's target.
    tau : float
        Most an upstream's buffer may hold after slowing down, in ``(0, 1]``.
    kalman : KalmanFilter, optional
        Template of the head operator's filter (default ``KalmanFilter()``).

    Notes
    -----
    O(operators**2 * delay) per window (each operator's prediction runs Eq. 2-4 along the
    chain before it; the paper's O(K m log m) counts the feedback only).

    Examples
    --------
    >>> CRAA(tau=0.7).tau
    0.7
    """

    tau: float = 0.8
    kalman: KalmanFilter | None = field(default=None, compare=False)
    name = "CRAA"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "tau", fraction(self.tau, "tau"))

    def controller(self, operators: tuple[Operator, ...]) -> Controller:
        _kalman(self.kalman)
        return _CRAAController(self, operators)


class _CRAAController(Controller):
    policy: CRAA

    def __init__(self, policy: CRAA, operators: tuple[Operator, ...]) -> None:
        super().__init__(policy, operators)
        self.head = _kalman(policy.kalman)

    def forecast(self, state: ChainState, cap: npt.NDArray[np.float64],
                 buffer: npt.NDArray[np.float64], transit: npt.NDArray[np.float64],
                 head: list[float], i: int) -> tuple[list[float], list[float]]:
        """Eq. 2-4 (and Eq. 9 for the buffers on the way) along operators ``0..i``: operator
        ``i``'s input rate in windows ``n + 1 .. n + d + 1`` and its buffer at their ends
        (index 0: window ``n``)."""
        dt, d = state.window_s, state.delay
        buf = buffer[: i + 1].copy()
        out_prev = transit[: i + 1].copy()
        rates = [float(state.input_rate[i])]
        bufs = [float(buffer[i])]
        for k in range(1, d + 2):
            arrivals = np.empty(i + 1)
            arrivals[0] = head[k - 1] * dt
            arrivals[1:] = out_prev[:i]
            avail = buf + arrivals
            done = np.minimum(avail, cap[: i + 1, k] * dt)
            buf = np.minimum(avail - done, self.bs[: i + 1])
            out_prev = self.cr[: i + 1] * done
            rates.append(float(arrivals[i] / dt))
            bufs.append(float(buf[i]))
        return rates, bufs

    def decide(self, state: ChainState) -> Plan:
        pol = self.policy
        plan = Plan()
        dt, d = state.window_s, state.delay
        self.head.update(float(state.input_rate[0]))
        head = [max(0.0, self.head.predict(k)) for k in range(1, d + 2)]
        cap = self.schedule(state)
        buffer = state.buffer.astype(np.float64).copy()
        transit = state.transit.astype(np.float64).copy()
        processed = state.processed.astype(np.float64).copy()
        flags = [0] * len(self.ops)
        for i in range(len(self.ops)):
            pending = state.pending[i]
            if pending is not None:  # in flight: no new decision
                flags[i] = 1 if pending[1] > state.units[i] else -1
                continue
            rates, bufs = self.forecast(state, cap, buffer, transit, head, i)
            bs = float(self.bs[i])
            r1 = ((rates[1] - cap[i, 1]) * dt + bufs[0]) / bs          # Eq. 9, window n + 1
            rm = ((rates[d] - cap[i, d]) * dt + bufs[d - 1]) / bs      # Eq. 9, window n + d
            if i > 0 and pol.delta < r1 < pol.beta and rm < pol.beta:
                j = i - 1
                upstream = Upstream(
                    self.ops[j].name, flags[j], float(processed[j]), float(buffer[j]),
                    float(self.bs[j]), float((self._input_next(state, transit, head, j)
                                              - cap[j, 1]) * dt),
                    float(self.cr[j]), dt)
                limit = admission_limit(float(cap[i, 1]), float(buffer[i]), bs, pol.delta, dt)
                for fb in feedback_adjustment([upstream], rates[1] * dt, limit, pol.tau):
                    plan.held_back[j] = plan.held_back.get(j, 0.0) + fb.held_back
                    buffer[j] += fb.held_back
                    processed[j] -= fb.held_back
                    transit[j] -= fb.output_cut
                    flags[i] = 1  # in a feedback adjustment: cannot help its own downstream
                continue
            trend_den = rates[d]
            trend = (rates[d + 1] / trend_den if trend_den > 0
                     else (np.inf if rates[d + 1] > 0 else 1.0))
            target = self.size(state, i, rm, rm * bs, float(rates[d] / cap[i, d]), float(trend))
            if target is not None:
                plan.targets[i] = target
                flags[i] = 1 if target > state.units[i] else -1
                cap[i, d:] = target * self.unit_cap[i]  # Eq. 8: fed forward downstream
        return plan

    def _input_next(self, state: ChainState, transit: npt.NDArray[np.float64],
                    head: list[float], j: int) -> float:
        """Operator ``j``'s input rate in window ``n + 1``."""
        return head[0] if j == 0 else float(transit[j - 1] / state.window_s)
