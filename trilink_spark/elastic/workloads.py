"""Input workloads of the head operator: step, jitter, sine and random, and the paper's five.

A :class:`Workload` is a rate ``r(t)`` in tuples/s; :meth:`Workload.rates` gives its mean over
each window (exact: the integral of ``r`` over the window divided by its length).

The paper's settings (§7.4-7.5), by name (:func:`paper_workload`):

============ =====================================================================
``step``     1000, 2000, 5000, 6000, 5000, 2000 tuples/s, 5 s each, repeated (§7.4.1)
``jitter``   3000 for 50 s, 6000 for 5 s, 3000 for 100 s, 1000 for 5 s, repeated (§7.4.2)
``sine``     mean 5000, amplitude 2500, period 500 s (§7.5)
``step2``    5000 for 250 s, 10000 for 100 s, 2000 for 100 s, repeated (§7.5)
``random``   uniform in [1000, 50000], a new rate every 5 s (§7.5)
============ =====================================================================

Choices the paper leaves open: how long ``step2`` stays at 2000 (100 s here, like the phase
before it) and how often the random load changes (every window of 5 s here).

Examples
--------
>>> Workload.step([1000, 3000], 5).rates(5, 4).tolist()
[1000.0, 3000.0, 1000.0, 3000.0]
>>> Workload.sine(5000, 2500, 500).rates(5, 2).round(1).tolist()
[5078.5, 5235.2]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from .._internal.validation import count, number, positive, seconds

__all__ = ["Workload", "paper_workload", "PAPER_WORKLOADS", "MAX_WINDOWS"]

#: Most windows one call samples (and :func:`~trilink_spark.elastic.simulate` runs): a
#: million windows is 58 days of 5-second windows; the arrays stay within a few hundred MB.
MAX_WINDOWS = 1_000_000

#: The names :func:`paper_workload` knows.
PAPER_WORKLOADS: tuple[str, ...] = ("step", "jitter", "sine", "step2", "random")


def _piecewise_mean(levels: npt.NDArray[np.float64], durations: npt.NDArray[np.float64],
                    starts: npt.NDArray[np.float64], width: float,
                    periodic: bool) -> npt.NDArray[np.float64]:
    """Mean of a piecewise-constant rate over ``[s, s + width)`` for each start ``s``."""
    edges = np.concatenate([[0.0], np.cumsum(durations)])
    area = np.concatenate([[0.0], np.cumsum(levels * durations)])
    total_t, total_a = edges[-1], area[-1]

    def integral(t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        if periodic:
            cycles = np.floor(t / total_t)
            rest = t - cycles * total_t
        else:
            cycles = np.zeros_like(t)
            rest = np.minimum(t, total_t)
        i = np.clip(np.searchsorted(edges, rest, side="right") - 1, 0, len(levels) - 1)
        out: npt.NDArray[np.float64] = cycles * total_a + area[i] + levels[i] * (rest - edges[i])
        return out

    return (integral(starts + width) - integral(starts)) / width


@dataclass(frozen=True)
class Workload:
    """A head-operator input rate over time (build it with the class methods).

    Attributes
    ----------
    name : str
        Shown in results.
    kind : str
        ``"step"``, ``"sine"`` or ``"random"`` (a jitter is a step workload).
    params : dict
        The parameters of the kind.

    Notes
    -----
    Immutable. :meth:`rates` costs O(windows) (O(windows * log segments) for a step workload).
    """

    name: str
    kind: str
    params: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ builders
    @classmethod
    def step(cls, levels: Sequence[float] = (1000, 2000, 5000, 6000, 5000, 2000),
             durations_s: float | str | Sequence[float] = 5.0, *, repeat: bool = True,
             name: str = "step") -> Workload:
        """Piecewise-constant rates: ``levels[k]`` for ``durations_s[k]`` seconds, repeated.

        Parameters
        ----------
        levels : sequence of float
            Rates in tuples/s (>= 0). Default: the paper's step test (§7.4.1).
        durations_s : float, str or sequence of float
            One duration for every level, or one per level (seconds or interval strings).
        repeat : bool
            Start over after the last level (default); else stay at the last level.
        name : str
            Shown in results.

        Examples
        --------
        >>> Workload.step([10, 20], [1, 3]).rates(1, 5).tolist()
        [10.0, 20.0, 20.0, 20.0, 10.0]
        """
        lv = [positive(x, "levels", allow_zero=True) for x in _seq(levels, "levels")]
        if not lv:
            raise InvalidArgumentError("levels must hold at least one rate")
        if isinstance(durations_s, (str, int, float)) and not isinstance(durations_s, bool):
            ds = [seconds(durations_s, "durations_s")] * len(lv)
        else:
            ds = [seconds(x, "durations_s") for x in _seq(durations_s, "durations_s")]
        if len(ds) != len(lv):
            raise InvalidArgumentError(
                f"durations_s must be one duration or one per level ({len(lv)}), got {len(ds)}")
        return cls(name, "step", {"levels": lv, "durations_s": ds, "repeat": bool(repeat)})

    @classmethod
    def jitter(cls, base: float = 3000, high: float = 6000, low: float = 1000,
               before_high_s: float | str = 50, before_low_s: float | str = 100,
               burst_s: float | str = 5, *, name: str = "jitter") -> Workload:
        """Short bursts on a steady load: ``base`` for ``before_high_s``, ``high`` for
        ``burst_s``, ``base`` for ``before_low_s``, ``low`` for ``burst_s``, repeated.

        The defaults are the paper's jitter test (§7.4.2).

        Examples
        --------
        >>> Workload.jitter(before_high_s=5, before_low_s=5).rates(5, 4).tolist()
        [3000.0, 6000.0, 3000.0, 1000.0]
        """
        burst = seconds(burst_s, "burst_s")
        return cls.step([base, high, base, low],
                        [seconds(before_high_s, "before_high_s"), burst,
                         seconds(before_low_s, "before_low_s"), burst], name=name)

    @classmethod
    def sine(cls, mean: float, amplitude: float, period: float | str, *, noise: float = 0.0,
             seed: int | None = None, name: str = "sine") -> Workload:
        """``mean + amplitude * sin(2 pi t / period)``, plus optional Gaussian noise per window.

        Parameters
        ----------
        mean, amplitude : float
            Tuples/s; ``amplitude <= mean`` keeps the rate >= 0.
        period : float or str
            Seconds (or an interval string).
        noise : float
            Standard deviation (tuples/s) of independent noise added to each window's mean
            (default 0); rates are clipped at 0.
        seed : int, optional
            Seed of the noise; default the simulation's seed.
        name : str
            Shown in results.
        """
        m = positive(mean, "mean", allow_zero=True)
        a = positive(amplitude, "amplitude", allow_zero=True)
        if a > m:
            raise InvalidArgumentError(f"amplitude must be <= mean ({m:g}), got {a:g}")
        return cls(name, "sine", {"mean": m, "amplitude": a, "period_s": seconds(period, "period"),
                                  "noise": positive(noise, "noise", allow_zero=True),
                                  "seed": _seed(seed)})

    @classmethod
    def random(cls, low: float, high: float, seed: int | None = None, *,
               hold_s: float | str = 5.0, name: str = "random") -> Workload:
        """A rate drawn uniformly from ``[low, high]`` every ``hold_s`` seconds.

        Parameters
        ----------
        low, high : float
            Tuples/s, ``0 <= low <= high``.
        seed : int, optional
            Seed of the draws (NumPy's PCG64); default the simulation's seed.
        hold_s : float or str
            How long each rate holds (default 5 s, one window of the paper).
        name : str
            Shown in results.
        """
        lo = positive(low, "low", allow_zero=True)
        hi = positive(high, "high", allow_zero=True)
        if hi < lo:
            raise InvalidArgumentError(f"high must be >= low ({lo:g}), got {hi:g}")
        return cls(name, "random", {"low": lo, "high": hi, "seed": _seed(seed),
                                    "hold_s": seconds(hold_s, "hold_s")})

    # ------------------------------------------------------------------ sampling
    def rates(self, window_s: float | str, windows: int, seed: int = 0) -> npt.NDArray[np.float64]:
        """Mean rate (tuples/s) of each of ``windows`` windows of ``window_s`` seconds.

        ``seed`` is used when the workload has no seed of its own. O(windows).

        Raises
        ------
        InvalidArgumentError
            ``windows`` outside ``[1, MAX_WINDOWS]``, a random workload that would draw more
            than ``MAX_WINDOWS`` levels (``hold_s`` much shorter than ``window_s``), or rates
            whose means leave the float range (levels near 1e308).
        """
        dt = seconds(window_s, "window_s")
        n = count(windows, "windows")
        if n > MAX_WINDOWS:
            raise InvalidArgumentError(
                f"windows must be at most {MAX_WINDOWS:,}, got {n:,}: use longer windows or a "
                "shorter run")
        out = self._rates(dt, n, seed)
        if not bool(np.isfinite(out).all()):
            raise InvalidArgumentError(
                f"workload {self.name!r} has rates whose window means leave the float range; "
                "give levels far below 1e308 tuples/s")
        return out

    def _rates(self, dt: float, n: int, seed: int) -> npt.NDArray[np.float64]:
        starts = np.arange(n, dtype=np.float64) * dt
        p = self.params
        if self.kind == "step":
            with np.errstate(over="ignore", invalid="ignore"):
                return _piecewise_mean(np.asarray(p["levels"], dtype=np.float64),
                                       np.asarray(p["durations_s"], dtype=np.float64),
                                       starts, dt, periodic=p["repeat"])
        own = p.get("seed")
        rng = np.random.default_rng(_seed(seed) if own is None else own)
        if self.kind == "sine":
            w = 2 * math.pi / p["period_s"]
            # exact mean of the sine over [s, s + dt)
            out = p["mean"] + p["amplitude"] * (np.cos(w * starts) - np.cos(w * (starts + dt))) / (w * dt)
            if p["noise"] > 0:
                out = np.maximum(out + rng.normal(0.0, p["noise"], n), 0.0)
            return np.asarray(out, dtype=np.float64)
        if self.kind == "random":
            hold = p["hold_s"]
            span = n * dt / hold
            if not span <= MAX_WINDOWS:
                raise InvalidArgumentError(
                    f"hold_s {hold:g} s is too short for {n} windows of {dt:g} s: that draws "
                    f"{span:.3g} levels, at most {MAX_WINDOWS:,}; use a longer hold_s")
            pieces = int(math.ceil(span)) + 1
            levels = rng.uniform(p["low"], p["high"], pieces)
            return _piecewise_mean(levels, np.full(pieces, hold), starts, dt, periodic=False)
        raise InvalidArgumentError(f"unknown workload kind {self.kind!r}")


def _seq(value: Any, name: str) -> list[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence | np.ndarray):
        raise InvalidArgumentTypeError(f"{name} must be a sequence, got {type(value).__name__}")
    return list(value)


def _seed(seed: Any) -> int | None:
    if seed is None:
        return None
    return count(seed, "seed", low=0)


def paper_workload(name: str) -> Workload:
    """The paper's workload ``name``: one of ``"step"``, ``"jitter"``, ``"sine"``, ``"step2"``,
    ``"random"`` (see the module's table). O(1).

    The random workload has no seed of its own: the simulation's ``seed`` draws it.

    Examples
    --------
    >>> paper_workload("step2").rates(50, 10).tolist()
    [5000.0, 5000.0, 5000.0, 5000.0, 5000.0, 10000.0, 10000.0, 2000.0, 2000.0, 5000.0]
    """
    if not isinstance(name, str):
        raise InvalidArgumentTypeError(f"name must be a str, got {type(name).__name__}")
    if name == "step":
        return Workload.step(name="step")
    if name == "jitter":
        return Workload.jitter(name="jitter")
    if name == "sine":
        return Workload.sine(5000, 2500, 500, name="sine")
    if name == "step2":
        return Workload.step([5000, 10000, 2000], [250, 100, 100], name="step2")
    if name == "random":
        return Workload.random(1000, 50000, name="random")
    raise InvalidArgumentError(f"unknown workload {name!r}; choose from {', '.join(PAPER_WORKLOADS)}")
