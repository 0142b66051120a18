"""The CRAA load model: operators, Eq. 2-13 and the feedback adjustment (Algorithm 1).

Li, Wei, Li and Wang, *Burstiness-aware elastic resource allocation in stream data processing*
(Chinese Journal of Computers, 2018, DOI 10.11897/SP.J.1016.2018.02193), model a stream job as
operators ``O_i``, each with an input buffer of ``BS`` tuples and ``PN`` parallel units of
``P_unit`` tuples/s, observed once per window of ``dt`` seconds. The functions here are the
paper's equations, one each, on plain numbers, so that the simulator
(:func:`~trilink_spark.elastic.simulate`) and the Spark advisor
(:class:`~trilink_spark.elastic.ElasticityAdvisor`) share them.

Rates are tuples per second; buffers, and the admission bounds of Eq. 5 and Algorithm 1, are
tuples (the paper mixes the two in Eq. 5; the units here make its terms add up).

Examples
--------
>>> output_rate(300.0, 200.0, 0.0, 5.0)  # input above capacity: the capacity comes out
200.0
>>> buffer_state(300.0, 200.0, 100.0, 1000, 5.0)  # Eq. 9: (100 * 5 + 100) / 1000
0.6
>>> unit_change(700.0, 1000, 0.7, 100.0, 5.0)  # Eq. 10-11: 0 tuples/s over delta -> no units
0
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from .._internal.validation import count, fraction, number, positive

__all__ = [
    "MAX_UNITS",
    "Operator",
    "Upstream",
    "Feedback",
    "output_rate",
    "buffer_state",
    "rate_change",
    "unit_change",
    "trend_relation",
    "cooperative_judgement",
    "admission_limit",
    "feedback_capacity",
    "feedback_adjustment",
]


#: Most parallel units an operator may have (Spark counts executors in an ``Int``): a unit
#: change or target beyond it (a unit rate of 1e-300 tuples/s) is capped there.
MAX_UNITS = 2 ** 31 - 1


@dataclass(frozen=True)
class Operator:
    """One operator of a linear stream job (a row of the paper's Table 2).

    Parameters
    ----------
    name : str
        Shown in results (``per_operator`` is indexed by it); unique within a job.
    buffer_size : float
        ``BS``: the input buffer, in tuples (> 0). What does not fit is lost.
    unit_rate : float
        ``P_unit``: tuples per second one parallel unit processes (> 0).
    consumption_ratio : float
        ``CR``: output tuples per processed tuple (> 0; 1 in the paper's experiments).
    efficiency : float
        ``e`` in ``(0, 1]``: the share of the units' rate actually available.
    units : int
        ``PN`` at the start (>= 1).

    Notes
    -----
    O(1) to build. The paper's first step of a basic adjustment changes ``e`` before it changes
    units; here ``e`` is a fixed property of the operator (the availability of its units), so
    adjustments change units only.

    Examples
    --------
    >>> Operator("O4", buffer_size=2000, unit_rate=200).capacity(3)
    600.0
    """

    name: str
    buffer_size: float
    unit_rate: float
    consumption_ratio: float = 1.0
    efficiency: float = 1.0
    units: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgumentTypeError(f"name must be a non-empty str, got {self.name!r}")
        object.__setattr__(self, "buffer_size", positive(self.buffer_size, "buffer_size"))
        object.__setattr__(self, "unit_rate", positive(self.unit_rate, "unit_rate"))
        object.__setattr__(self, "consumption_ratio",
                           positive(self.consumption_ratio, "consumption_ratio"))
        object.__setattr__(self, "efficiency", fraction(self.efficiency, "efficiency"))
        object.__setattr__(self, "units", count(self.units, "units"))

    def capacity(self, units: int) -> float:
        """``e * P_unit * PN``: the tuples per second ``units`` units process. O(1)."""
        return self.efficiency * self.unit_rate * units


def output_rate(input_rate: float, processing_rate: float, buffer_prev: float, window_s: float,
                consumption_ratio: float = 1.0, efficiency: float = 1.0) -> float:
    """Eq. 2, the transfer function ``f``: an operator's mean output rate over a window.

    ``CR * min(e * P, I + B / dt)``: with more input than capacity the capacity comes out
    (the paper's ``w1 = 1``); otherwise the input and what the buffer held (``w2 = 1``), never
    more than the capacity. The paper switches on ``I < e P`` alone; the ``min`` keeps its own
    rule "but not above the processing rate" when the buffer holds more than the spare capacity.

    Parameters
    ----------
    input_rate, processing_rate : float
        ``I(n)`` and ``P(n)`` in tuples/s (``P`` before ``e`` is applied).
    buffer_prev : float
        Tuples buffered at the start of the window (``B(n-1) * dt`` in the paper).
    window_s : float
        ``dt``.
    consumption_ratio, efficiency : float
        ``CR`` and ``e``.

    Returns
    -------
    float
        Tuples/s leaving the operator. Cost: O(1).

    Examples
    --------
    >>> output_rate(100.0, 500.0, 50.0, 5.0, consumption_ratio=2.0)
    220.0
    """
    return consumption_ratio * min(efficiency * processing_rate,
                                   max(0.0, input_rate + buffer_prev / window_s))


def buffer_state(input_rate: float, processing_rate: float, buffer_prev: float,
                 buffer_size: float, window_s: float) -> float:
    """Eq. 9: ``RBO(n) = ((I(n) - P(n)) dt + BO(n-1)) / BS``, the predicted buffer ratio.

    Not clipped: above 1 the buffer would overflow, below 0 it would run dry; both tell how far.

    Notes
    -----
    Cost: O(1).

    Examples
    --------
    >>> buffer_state(500.0, 200.0, 0.0, 1000, 5.0)
    1.5
    """
    return ((input_rate - processing_rate) * window_s + buffer_prev) / buffer_size


def rate_change(buffer_next: float, buffer_size: float, delta: float, window_s: float) -> float:
    """Eq. 10: ``CP(n+1) = (BO(n+1) - BS * delta) / dt``, the processing-rate change that
    brings the buffer back to the warning level ``delta`` over one window.

    ``buffer_next`` is the unclipped prediction of Eq. 9 in tuples. Positive: more rate.

    Notes
    -----
    Cost: O(1).

    Examples
    --------
    >>> rate_change(1500.0, 1000, 0.7, 5.0)
    160.0
    """
    return (buffer_next - buffer_size * delta) / window_s


def unit_change(buffer_next: float, buffer_size: float, delta: float, unit_capacity: float,
                window_s: float) -> int:
    """Eq. 10-11: the change of parallel units, ``CPN(n+1)``.

    Scaling up takes the fewest units whose rate covers ``CP`` (``ceil``); scaling down removes
    at least ``|CP|`` (``floor``), as the paper states.

    Parameters
    ----------
    buffer_next : float
        Eq. 9's predicted buffer (tuples, unclipped).
    buffer_size, delta : float
        ``BS`` and the warning threshold.
    unit_capacity : float
        Tuples/s one unit adds (``e * P_unit``).
    window_s : float
        ``dt``.

    Returns
    -------
    int
        Units to add (> 0) or remove (< 0), at most :data:`MAX_UNITS` either way. Cost: O(1).

    Examples
    --------
    >>> unit_change(1500.0, 1000, 0.7, 100.0, 5.0)
    2
    >>> unit_change(-500.0, 1000, 0.7, 100.0, 5.0)
    -3
    """
    cp = rate_change(buffer_next, buffer_size, delta, window_s) / unit_capacity
    if cp > 0:
        return MAX_UNITS if cp > MAX_UNITS else int(math.ceil(cp - 1e-9))
    if cp < 0:
        return -MAX_UNITS if cp < -MAX_UNITS else int(math.floor(cp + 1e-9))
    return 0


def trend_relation(direction: int, trend: float) -> int:
    """Eq. 12: ``T`` from the adjustment's direction ``AT`` and the input trend ``IT``.

    ``0`` when both go the same way, ``1`` when the operator would scale up against a falling
    input, ``-1`` when it would scale down against a rising one.

    Parameters
    ----------
    direction : int
        ``AT``: > 0 scale up, < 0 scale down.
    trend : float
        ``IT = I(n+2) / I(n+1)``: >= 1 rising.

    Returns
    -------
    int
        Cost: O(1).

    Raises
    ------
    InvalidArgumentError
        ``direction`` is 0 (no adjustment to judge).

    Examples
    --------
    >>> trend_relation(1, 0.5), trend_relation(-1, 2.0), trend_relation(-1, 1.0)
    (1, -1, 0)
    """
    if direction == 0:
        raise InvalidArgumentError("direction must be > 0 (scale up) or < 0 (scale down), got 0")
    if (direction > 0 and trend >= 1) or (direction < 0 and trend <= 1):
        return 0
    return 1 if direction > 0 else -1


def cooperative_judgement(direction: int, trend: float, buffer_next: float,
                          buffer_size: float) -> bool:
    """Eq. 13: carry out a basic adjustment (``CJ = 1``, True) or refuse it (False).

    An adjustment along the input trend goes ahead; scaling down against a rising input is
    refused; scaling up against a falling input goes ahead only if the buffer would otherwise
    overflow (``BO(n+1) >= BS``).

    Parameters
    ----------
    direction : int
        ``AT``: > 0 scale up, < 0 scale down.
    trend : float
        ``IT = I(n+2) / I(n+1)``.
    buffer_next : float
        Eq. 9's predicted buffer in tuples (unclipped).
    buffer_size : float
        ``BS``.

    Returns
    -------
    bool
        Cost: O(1).

    Examples
    --------
    >>> cooperative_judgement(-1, 1.5, 0.0, 1000)   # scale down while the input rises
    False
    >>> cooperative_judgement(1, 0.5, 400.0, 1000)  # scale up against the trend, no overflow
    False
    >>> cooperative_judgement(1, 0.5, 1200.0, 1000)  # ... unless the buffer would overflow
    True
    """
    t = trend_relation(direction, trend)
    return t == 0 or (t == 1 and buffer_next >= buffer_size)


def admission_limit(processing_rate: float, buffer_now: float, buffer_size: float,
                    delta: float, window_s: float) -> float:
    """Eq. 5: ``UI(n+1) = P(n) dt + BS delta - BO(n)``, the most tuples the operator may
    receive next window so that its buffer ends at the warning level ``delta``.

    In tuples (the paper calls it a rate; multiplied out it is an amount). May be negative.

    Notes
    -----
    Cost: O(1).

    Examples
    --------
    >>> admission_limit(200.0, 900.0, 1000, 0.7, 5.0)
    800.0
    """
    return processing_rate * window_s + buffer_size * delta - buffer_now


@dataclass(frozen=True)
class Upstream:
    """What Algorithm 1 knows of one upstream operator ``Uo_i`` (all amounts in tuples).

    Parameters
    ----------
    name : str
        Its name.
    flag : int
        Its adjustment state this round: ``1`` scale up (or in a feedback adjustment of its
        own), ``-1`` scale down, ``0`` none. Only ``0`` may help.
    processed : float
        Tuples it processed in window ``n`` (``P_U(n) * dt`` when it was busy).
    buffer : float
        ``BO_U(n)``.
    buffer_size : float
        ``BS_U``.
    next_net_inflow : float
        Tuples its buffer gains in window ``n + 1`` if it keeps its rate
        (``(I_U(n+1) - e P_U(n+1)) dt``, negative when it drains).
    consumption_ratio : float
        ``CR_U``: output tuples per tuple held back.
    window_s : float
        ``dt``.

    Examples
    --------
    >>> u = Upstream("O3", 0, processed=1500, buffer=0, buffer_size=1000, next_net_inflow=0,
    ...              consumption_ratio=1.0, window_s=5)
    >>> feedback_capacity(u, tau=0.8)
    (140.0, 800.0)
    """

    name: str
    flag: int
    processed: float
    buffer: float
    buffer_size: float
    next_net_inflow: float
    consumption_ratio: float
    window_s: float


@dataclass(frozen=True)
class Feedback:
    """One feedback adjustment ``Fu(Uo_i, UP_Uo_i(n))`` of Algorithm 1.

    Attributes
    ----------
    name : str
        The upstream operator.
    rate : float
        ``UP``: its adjusted processing rate for window ``n`` (tuples/s).
    held_back : float
        Input tuples it keeps in its buffer instead of processing (``(P - UP) dt``).
    output_cut : float
        ``UO``: output tuples the downstream operator does not receive (``CR * held_back``).
    """

    name: str
    rate: float
    held_back: float
    output_cut: float


def feedback_capacity(upstream: Upstream, tau: float) -> tuple[float, float]:
    """Eq. 6-7 for one upstream: ``(UP, UO)``, its lowest allowed rate and its output cut.

    ``UP`` is the lowest processing rate for window ``n`` with both conditions of ``H``
    holding (each at equality at the bound): its buffer after holding back stays within
    ``tau * BS_U`` (Eq. 7: ``BOT <= 1``) and does not overflow in window ``n + 1``
    (``BO_U(n+1) <= BS_U``). ``UO`` is the output that lowering the rate to ``UP`` takes off
    the downstream operator's next input; the paper names it the upper bound of the output
    adjustment without a formula, and this is the amount Algorithm 1 compares with ``NDO``.

    Notes
    -----
    Cost: O(1).
    """
    dt = upstream.window_s
    room_tau = tau * upstream.buffer_size - upstream.buffer
    room_next = upstream.buffer_size - upstream.buffer - upstream.next_net_inflow
    held = max(0.0, min(upstream.processed, room_tau, room_next))
    return (upstream.processed - held) / dt, upstream.consumption_ratio * held


def feedback_adjustment(upstreams: Sequence[Upstream], expected_input: float,
                        limit: float, tau: float = 0.8) -> list[Feedback]:
    """Algorithm 1 (FAA): the fewest upstream operators, largest first, whose slow-down keeps
    the downstream operator's next input within ``limit``.

    Parameters
    ----------
    upstreams : sequence of Upstream
        ``U_Array``: the operator's neighbouring upstream operators.
    expected_input : float
        ``I_Oi(n+1) * dt``: tuples the operator would receive next window.
    limit : float
        ``UI_Oi(n+1)`` of Eq. 5 (:func:`admission_limit`).
    tau : float
        Upper threshold of an upstream buffer after its feedback adjustment, in ``(0, 1]``.

    Returns
    -------
    list of Feedback
        ``FU_List``; empty when no upstream is free (flag 0), when the input already fits, or
        when all free upstreams together cannot cut enough (the feedback is cancelled). Upstreams
        that cannot cut anything are left out of the ranking.

    Notes
    -----
    O(m log m) for ``m`` upstreams (the sort), as the paper states.

    Examples
    --------
    >>> def up(name, processed):
    ...     return Upstream(name, 0, processed, 0.0, 10_000, 0.0, 1.0, 5.0)
    >>> [f.name for f in feedback_adjustment([up("a", 300), up("b", 900), up("c", 600)],
    ...                                      expected_input=2000, limit=1000)]
    ['b', 'c']
    """
    tau = fraction(tau, "tau")
    free = [u for u in upstreams if u.flag == 0]
    if not free:
        return []
    need = number(expected_input, "expected_input") - number(limit, "limit")
    if need <= 0:
        return []
    ranked = []
    for u in free:
        rate, cut = feedback_capacity(u, tau)
        if cut > 0:
            ranked.append((cut, rate, u))
    ranked.sort(key=lambda item: -item[0])  # stable: ties keep the upstreams' order
    if need > sum(cut for cut, _, _ in ranked):
        return []
    out: list[Feedback] = []
    got = 0.0
    for cut, rate, u in ranked:
        if got >= need:
            break
        out.append(Feedback(u.name, rate, cut / u.consumption_ratio, cut))
        got += cut
    return out
