"""Capacity learning from latency feedback: FAR-Flink's Algorithm 1 (Eq. 13-17).

An edge's capacity ``c(u, v)`` (tuples/s) is set in force, a window is run and measured, and
the capacity is lowered when latency passes the threshold ``theta`` or raised when the edge is
full yet fast, by a dynamic step (Eq. 17) that shrinks as the capacity nears the one the
per-tuple latency implies (:func:`capacity_step`, :func:`learn_capacity`). The learnt
capacities feed the flow network (:class:`~trilink_spark.advice.network.FlowNetwork`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeAlias

from .._internal.validation import check_real
from ..errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = ["CapacityObservation", "CapacityStep", "CapacityTrace", "StepRule", "capacity_step",
           "learn_capacity"]

logger = logging.getLogger(__name__)

_FLOAT_MAX = sys.float_info.max


# ----------------------------------------------------------------------------- Algorithm 1
@dataclass(frozen=True)
class CapacityObservation:
    """One measurement window of an edge, the inputs of Algorithm 1.

    Attributes
    ----------
    flow : float
        The rate the edge carried, tuples/s (``f(u, v)``).
    latency_ms : float
        The computation latency compared with the threshold ``theta`` (end-to-end, or of the
        node; ms).
    tuple_latency_ms : float or None
        ``l``, the mean time a tuple spends in the node (Eq. 13: completion minus arrival,
        averaged; ms). Its reciprocal ``1000 / l`` is the capacity it implies (Eq. 14).
        Required by the dynamic step.
    """

    flow: float
    latency_ms: float
    tuple_latency_ms: float | None = None


@dataclass(frozen=True)
class CapacityStep:
    """One feedback adjustment: the new capacity, the step ``eta`` and its direction
    (``-1`` lower, ``+1`` raise, ``0`` keep) with the reason."""

    capacity: float
    eta: float
    direction: int
    reason: str


#: A step rule of Algorithm 1: ``"dynamic"`` (Eq. 17) or a fixed step in tuples/s.
StepRule: TypeAlias = Literal["dynamic"] | float


def _step_rule(step: object) -> float | None:
    if isinstance(step, str):
        if step != "dynamic":
            raise InvalidArgumentError(
                f"step must be 'dynamic' (Eq. 17) or a fixed step > 0, got {step!r}")
        return None
    return check_real(step, "step", positive=True)


def capacity_step(capacity: float, observation: CapacityObservation, *, threshold_ms: float,
                  step: StepRule = "dynamic", low_fraction: float = 0.5,
                  full_fraction: float = 0.95, min_capacity: float = 1e-9) -> CapacityStep:
    """One feedback adjustment of an edge's capacity (Algorithm 1, lines 5-11).

    - latency ``> theta`` and ``f <= c``: the capacity is set too high, lower it by ``eta``;
    - latency ``<< theta`` (below ``low_fraction x theta``) and ``f ~ c`` (at least
      ``full_fraction x c``): the edge is full yet fast, raise it by ``eta``;
    - otherwise keep it.

    The dynamic step (Eq. 15-17) is ``eta = min(|1000/l - 1000/l'|, |-1000/l^2|)``: the gap
    between the capacity in force, ``c = 1000/l`` (Eq. 14), and the capacity implied by the
    fresh per-tuple latency ``l'`` (``observation.tuple_latency_ms``, Eq. 16), bounded by
    the derivative ``|dc/dl| = 1000/l^2`` (Eq. 15) so that a slow edge (``c`` below about
    1,000 tuples/s) never moves by more than ``c^2/1000`` at once. The step shrinks as the
    capacity nears the one the latency implies, which is why it converges without the
    oscillation of a large fixed step. A float ``step`` is a fixed ``eta``.

    Parameters
    ----------
    capacity : float
        ``c(u, v)`` in force, tuples/s, > 0.
    observation : CapacityObservation
        The window measured with that capacity.
    threshold_ms : float
        ``theta``, the latency bound (ms), > 0.
    step : "dynamic" or float
        Eq. 17, or a fixed step (tuples/s) to compare with.
    low_fraction : float
        "Latency much lower than theta" means below ``low_fraction x theta`` (0 < x < 1).
    full_fraction : float
        "Flow close to the capacity" means at least ``full_fraction x c`` (0 < x <= 1).
    min_capacity : float
        The capacity never goes below it (> 0).

    Returns
    -------
    CapacityStep

    Raises
    ------
    InvalidArgumentError
        A non-positive capacity or threshold, fractions out of range, NaN or infinite values,
        a dynamic step without ``tuple_latency_ms``.

    Notes
    -----
    Cost O(1).

    Examples
    --------
    >>> obs = CapacityObservation(flow=1000.0, latency_ms=20.0, tuple_latency_ms=0.8)
    >>> capacity_step(1000.0, obs, threshold_ms=100.0)  # full and fast: raise toward 1250
    CapacityStep(capacity=1250.0, eta=250.0, direction=1, reason='latency << theta and f ~ c')
    >>> capacity_step(1000.0, obs, threshold_ms=100.0, step=50.0).capacity
    1050.0
    """
    c = check_real(capacity, "capacity", positive=True)
    theta = check_real(threshold_ms, "threshold_ms", positive=True)
    rule = _step_rule(step)
    low = check_real(low_fraction, "low_fraction", positive=True)
    full = check_real(full_fraction, "full_fraction", positive=True)
    floor = check_real(min_capacity, "min_capacity", positive=True)
    if low >= 1:
        raise InvalidArgumentError(f"low_fraction must be in (0, 1), got {low!r}")
    if full > 1:
        raise InvalidArgumentError(f"full_fraction must be in (0, 1], got {full!r}")
    if not isinstance(observation, CapacityObservation):
        raise InvalidArgumentTypeError(
            f"observation must be a CapacityObservation, got {type(observation).__name__}")
    f = check_real(observation.flow, "observation.flow")
    latency = check_real(observation.latency_ms, "observation.latency_ms")
    if latency > theta and f <= c * (1 + 1e-12):
        direction, reason = -1, "latency > theta and f <= c"
    elif latency < low * theta and f >= full * c:
        direction, reason = 1, "latency << theta and f ~ c"
    else:
        return CapacityStep(capacity=c, eta=0.0, direction=0, reason="within bounds")
    if rule is None:
        if observation.tuple_latency_ms is None:
            raise InvalidArgumentError(
                "the dynamic step (Eq. 17) needs observation.tuple_latency_ms, the mean time "
                "a tuple spends in the node (ms); pass it, or a fixed step")
        l_new = check_real(observation.tuple_latency_ms, "observation.tuple_latency_ms",
                           positive=True)
        # Eq. 14: l_now = 1000 / c, the latency c stands for; written in c so that neither
        # 1000 / l_new nor 1000 / l_now ** 2 (= c ** 2 / 1000) can overflow
        reg = abs(c - min(1000.0 / l_new, _FLOAT_MAX))  # Eq. 16
        eta = min(reg, c * (c / 1000.0))                # Eq. 17 (|Eq. 15|)
    else:
        eta = rule
    new = min(max(floor, c + direction * eta), _FLOAT_MAX)
    return CapacityStep(capacity=new, eta=abs(new - c), direction=direction, reason=reason)


@dataclass(frozen=True)
class CapacityTrace:
    """The run of :func:`learn_capacity`: ``capacities[k]`` is the capacity in force during
    window ``k`` (``capacities[0]`` the initial one, the last one the result)."""

    capacities: tuple[float, ...]
    etas: tuple[float, ...]
    directions: tuple[int, ...]

    @property
    def capacity(self) -> float:
        """The learnt capacity (the last one)."""
        return self.capacities[-1]

    def steps_to_within(self, target: float, tolerance: float = 0.05) -> int | None:
        """The first step from which the capacity stays within ``tolerance x target`` of
        ``target`` to the end, or ``None``. Cost O(steps)."""
        t = check_real(target, "target", positive=True)
        tol = check_real(tolerance, "tolerance") * t
        first: int | None = None
        for k, c in enumerate(self.capacities):
            if abs(c - t) <= tol:
                if first is None:
                    first = k
            else:
                first = None
        return first

    def reversals(self) -> int:
        """How often the direction of adjustment flipped (oscillation). Cost O(steps)."""
        moves = [d for d, eta in zip(self.directions, self.etas) if d != 0 and eta > 0]
        return sum(1 for a, b in zip(moves, moves[1:]) if a != b)


def learn_capacity(initial: float, observe: Callable[[float], CapacityObservation], *,
                   threshold_ms: float, step: StepRule = "dynamic", steps: int = 50,
                   low_fraction: float = 0.5, full_fraction: float = 0.95,
                   min_capacity: float = 1e-9) -> CapacityTrace:
    """Learn an edge's capacity from latency feedback: Algorithm 1 of FAR-Flink.

    Starting from ``initial`` (the paper's Eq. 8-9 estimate from bandwidth, or the measured
    ``1000 / l`` of Eq. 14), repeat ``steps`` times: run a window with the capacity in
    force (``observe(c)`` returns what was measured), then adjust it with
    :func:`capacity_step`, by the dynamic step of Eq. 17 or a fixed one.

    Parameters
    ----------
    initial : float
        The first capacity, tuples/s, > 0.
    observe : callable
        ``observe(capacity) -> CapacityObservation``: the window run with that capacity (a
        running job's metrics, or a simulation).
    threshold_ms, step, low_fraction, full_fraction, min_capacity
        As in :func:`capacity_step`.
    steps : int
        Number of feedback windows, >= 1.

    Returns
    -------
    CapacityTrace

    Raises
    ------
    InvalidArgumentError, InvalidArgumentTypeError
        As in :func:`capacity_step`; ``steps < 1``; ``observe`` not callable.

    Notes
    -----
    Cost O(steps) calls of ``observe``.

    Examples
    --------
    An edge whose tuples take 0.5 ms (2,000 tuples/s): latency stays low below that rate and
    explodes above it.

    >>> def observe(c):
    ...     flow = min(c, 2000.0)
    ...     return CapacityObservation(flow, 10.0 if c <= 2000 else 500.0, 0.5)
    >>> trace = learn_capacity(5000.0, observe, threshold_ms=100.0, steps=5)
    >>> trace.capacities
    (5000.0, 2000.0, 2000.0, 2000.0, 2000.0, 2000.0)
    >>> learn_capacity(5000.0, observe, threshold_ms=100.0, step=100.0, steps=5).capacity
    4500.0
    """
    c = check_real(initial, "initial", positive=True)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InvalidArgumentError(f"steps must be an int >= 1, got {steps!r}")
    if not callable(observe):
        raise InvalidArgumentTypeError(
            f"observe must be a callable capacity -> CapacityObservation, got "
            f"{type(observe).__name__}")
    _step_rule(step)
    capacities = [c]
    etas: list[float] = []
    directions: list[int] = []
    for _ in range(steps):
        out = capacity_step(c, observe(c), threshold_ms=threshold_ms, step=step,
                            low_fraction=low_fraction, full_fraction=full_fraction,
                            min_capacity=min_capacity)
        c = out.capacity
        capacities.append(c)
        etas.append(out.eta)
        directions.append(out.direction)
    logger.debug("learn_capacity: %.6g -> %.6g in %d windows (%s step)", capacities[0], c,
                 steps, step)
    return CapacityTrace(tuple(capacities), tuple(etas), tuple(directions))
