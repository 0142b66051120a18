"""A Kalman filter that predicts an input rate one or more windows ahead.

CRAA predicts the head operator's input with a Kalman filter (the paper's ref. 30, after
ref. 25), and KPA predicts every operator's input with one. The paper gives no state model;
this one is the local linear trend model: a level and a slope, each a random walk,

    x(n) = [level, slope],   x(n+1) = F x(n) + w,   F = [[1, 1], [0, 1]],   w ~ N(0, Q)
    z(n) = level(n) + v,     v ~ N(0, R)

so that a rising input is predicted to go on rising (the trend the cooperative judgement
needs). With ``trend=False`` it is the random-walk (local level) model.

Examples
--------
>>> kf = KalmanFilter()
>>> for z in [100.0, 110.0, 120.0, 130.0]:
...     _ = kf.update(z)
>>> round(kf.predict(1))
140
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError
from .._internal.validation import count, number, positive

__all__ = ["KalmanFilter"]


class KalmanFilter:
    """Kalman filter of a scalar series with a level and (optionally) a slope.

    Parameters
    ----------
    level_noise : float
        Variance of the level's random walk per window (> 0).
    slope_noise : float
        Variance of the slope's random walk per window (>= 0; unused with ``trend=False``).
    measurement_noise : float
        Variance of an observation (> 0).
    trend : bool
        Model a slope (default) or only a level.
    initial_variance : float
        Variance of the state before the first observation, as a multiple of
        ``measurement_noise`` (large: the first observations set the state).

    Notes
    -----
    After the diffuse start only the ratios of the three variances matter, not their scale, so
    the defaults (``1, 0.1, 1``) suit any rate: they follow a level shift within about two
    windows. Give the real variances when they are known: with a measurement noise of standard
    deviation ``s``, ``measurement_noise=s**2``. Each :meth:`update` and :meth:`predict` costs
    O(1) (2x2 matrices); the state is a handful of floats.

    Examples
    --------
    >>> kf = KalmanFilter(trend=False)
    >>> kf.update(10.0), kf.predict(3)
    (10.0, 10.0)
    """

    def __init__(self, level_noise: float = 1.0, slope_noise: float = 0.1,
                 measurement_noise: float = 1.0, *, trend: bool = True,
                 initial_variance: float = 1e6) -> None:
        self.level_noise = positive(level_noise, "level_noise")
        self.slope_noise = positive(slope_noise, "slope_noise", allow_zero=True)
        self.measurement_noise = positive(measurement_noise, "measurement_noise")
        self.initial_variance = positive(initial_variance, "initial_variance")
        if not isinstance(trend, bool):
            raise InvalidArgumentError(f"trend must be True or False, got {trend!r}")
        self.trend = trend
        k = 2 if trend else 1
        self._f: npt.NDArray[np.float64] = (np.array([[1.0, 1.0], [0.0, 1.0]]) if trend
                                            else np.eye(1))
        self._q: npt.NDArray[np.float64] = np.diag([self.level_noise, self.slope_noise][:k])
        self._x: npt.NDArray[np.float64] = np.zeros(k)
        self._p: npt.NDArray[np.float64] = np.eye(k) * self.initial_variance * self.measurement_noise
        #: Observations seen so far.
        self.count = 0

    def reset(self) -> None:
        """Forget every observation. O(1)."""
        k = 2 if self.trend else 1
        self._x = np.zeros(k)
        self._p = np.eye(k) * self.initial_variance * self.measurement_noise
        self.count = 0

    def copy(self) -> KalmanFilter:
        """An independent filter in the same state. O(1)."""
        out = KalmanFilter(self.level_noise, self.slope_noise, self.measurement_noise,
                           trend=self.trend, initial_variance=self.initial_variance)
        out._x, out._p, out.count = self._x.copy(), self._p.copy(), self.count
        return out

    def update(self, z: float) -> float:
        """Take the observation of the window that just ended; return the filtered level.

        The first observation sets the level (and a zero slope) exactly. O(1).
        """
        z = number(z, "z")
        if self.count == 0:
            self._x[:] = 0.0
            self._x[0] = z
            self._p = np.eye(len(self._x)) * self.initial_variance * self.measurement_noise
            self._p[0, 0] = self.measurement_noise
        else:
            x = self._f @ self._x
            p = self._f @ self._p @ self._f.T + self._q
            s = p[0, 0] + self.measurement_noise
            gain = p[:, 0] / s
            self._x = x + gain * (z - x[0])
            p = p - np.outer(gain, p[0, :])
            self._p = (p + p.T) / 2
        self.count += 1
        return float(self._x[0])

    def predict(self, steps: int = 1) -> float:
        """The expected observation ``steps`` windows after the last one (level plus ``steps``
        times the slope); ``0.0`` before any observation. O(1)."""
        steps = count(steps, "steps")
        if self.count == 0:
            return 0.0
        if self.trend:
            return float(self._x[0] + steps * self._x[1])
        return float(self._x[0])

    @property
    def level(self) -> float:
        """The filtered level (``0.0`` before any observation)."""
        return float(self._x[0])

    @property
    def slope(self) -> float:
        """The filtered slope per window (``0.0`` without a trend or an observation)."""
        return float(self._x[1]) if self.trend else 0.0
