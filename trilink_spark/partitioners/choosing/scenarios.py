"""Synthetic key distributions: the Trilink paper's four data scenarios (§6.4.1), Zipf, and Table 3's.

The paper crosses two questions: are the keys uniform (dense, contiguous integer ids) or not
(sparse, clustered ids such as district-prefixed sensor ids), and are the records uniform (every
key equally heavy) or not. Every generator is seeded and returns the distinct keys with their
record counts; :func:`records` expands them into a shuffled record stream.

========================= =========================================================================
scenario                  keys and counts (defaults: 1,000,000 records, 10,000 keys)
========================= =========================================================================
``uniform``               ids ``0..K-1``; every key the same count (+-1)
``skewed_keys``           20 districts ``d * 100000`` + sorted random in-district numbers; same count
``skewed_records``        ids ``0..K-1``; counts log-normal (sigma 1.5), so heavy keys
``skewed_both``           district ids; counts log-normal (sigma 2.0): a few keys dominate
``zipf``                  ids ``0..K-1``; counts proportional to ``1 / rank**s``, ranks shuffled
``autoincrement``         ids ``0..N-1``, one record each (Table 3: every record a new key)
========================= =========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..._internal.spark.compat import frame_of_arrow
from ...errors import InvalidArgumentError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "Scenario",
    "SCENARIOS",
    "PAPER_SCENARIOS",
    "MAX_SCENARIO_KEYS",
    "make_scenario",
    "records",
    "scenario_frame",
]

#: The four scenarios of the Trilink paper's Figure 15, in the paper's order.
PAPER_SCENARIOS: tuple[str, ...] = ("uniform", "skewed_keys", "skewed_records", "skewed_both")
SCENARIOS: tuple[str, ...] = PAPER_SCENARIOS + ("zipf", "autoincrement")
#: The most keys a scenario holds (``autoincrement``: records), one count each in memory.
MAX_SCENARIO_KEYS = 10_000_000


@dataclass(frozen=True)
class Scenario:
    """Distinct keys and their record counts.

    Attributes
    ----------
    name : str
    keys : numpy.ndarray of int64
    counts : numpy.ndarray of int64
        Records per key; sums to the scenario's record count.
    """

    name: str
    keys: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]

    @property
    def num_records(self) -> int:
        return int(self.counts.sum())

    def as_mapping(self) -> dict[int, int]:
        """``{key: count}`` for keys with at least one record."""
        nz = self.counts > 0
        return dict(zip(self.keys[nz].tolist(), self.counts[nz].tolist()))


def _district_keys(num_keys: int, rng: np.random.Generator, districts: int = 20) -> npt.NDArray[np.int64]:
    sizes = rng.multinomial(num_keys, np.full(districts, 1.0 / districts))
    parts = []
    for d, size in enumerate(sizes.tolist(), start=1):
        within = np.sort(rng.choice(100_000, size=size, replace=False))
        parts.append(d * 100_000 + within)
    return np.concatenate(parts).astype(np.int64)


def _spread(num_records: int, weights: npt.NDArray[np.float64], rng: np.random.Generator) -> npt.NDArray[np.int64]:
    return rng.multinomial(num_records, weights / weights.sum()).astype(np.int64)


def make_scenario(
    name: str,
    num_records: int = 1_000_000,
    num_keys: int = 10_000,
    *,
    zipf_s: float = 1.1,
    seed: int = 0,
) -> Scenario:
    """Generate a scenario (see the module table).

    Examples
    --------
    >>> s = make_scenario("uniform", num_records=1000, num_keys=10)
    >>> s.counts.tolist()
    [100, 100, 100, 100, 100, 100, 100, 100, 100, 100]
    """
    if name not in SCENARIOS:
        raise InvalidArgumentError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")
    if num_records < 1 or num_keys < 1:
        raise InvalidArgumentError("num_records and num_keys must be >= 1")
    held = num_records if name == "autoincrement" else num_keys  # entries held in memory
    if held > MAX_SCENARIO_KEYS:
        raise InvalidArgumentError(
            f"a {name} scenario of {held:,} keys is over MAX_SCENARIO_KEYS "
            f"({MAX_SCENARIO_KEYS:,}): it keeps one count per key in memory")
    rng = np.random.Generator(np.random.PCG64(seed))
    if name == "autoincrement":
        return Scenario(name, np.arange(num_records, dtype=np.int64), np.ones(num_records, np.int64))
    if name == "uniform":
        base, extra = divmod(num_records, num_keys)
        counts = np.full(num_keys, base, dtype=np.int64)
        counts[:extra] += 1
        return Scenario(name, np.arange(num_keys, dtype=np.int64), counts)
    dense = np.arange(num_keys, dtype=np.int64)
    if name == "skewed_keys":
        base, extra = divmod(num_records, num_keys)
        counts = np.full(num_keys, base, dtype=np.int64)
        counts[:extra] += 1
        return Scenario(name, _district_keys(num_keys, rng), counts)
    if name == "skewed_records":
        return Scenario(name, dense, _spread(num_records, rng.lognormal(0.0, 1.5, num_keys), rng))
    if name == "skewed_both":
        keys = _district_keys(num_keys, rng)
        return Scenario(name, keys, _spread(num_records, rng.lognormal(0.0, 2.0, num_keys), rng))
    if zipf_s <= 0:
        raise InvalidArgumentError(f"zipf s must be > 0, got {zipf_s}")
    ranks = rng.permutation(num_keys) + 1
    return Scenario(name, dense, _spread(num_records, ranks.astype(np.float64) ** -zipf_s, rng))


def records(scenario: Scenario, seed: int = 0) -> npt.NDArray[np.int64]:
    """One key per record, in a seeded random arrival order."""
    rng = np.random.Generator(np.random.PCG64(seed))
    stream = np.repeat(scenario.keys, scenario.counts)
    rng.shuffle(stream)
    return stream


def scenario_frame(spark: Any, scenario: Scenario, column: str = "key") -> DataFrame:
    """The scenario's records as a one-column Spark DataFrame, generated inside Spark.

    Only the ``(key, count)`` table leaves the driver; Spark expands it with
    ``explode(array_repeat(key, count))``, so a million records cost the driver nothing.
    """
    import pyarrow as pa
    from pyspark.sql import functions as F

    nz = scenario.counts > 0
    table = pa.table({"key": scenario.keys[nz], "count": scenario.counts[nz].astype(np.int32)})
    frame: DataFrame = frame_of_arrow(spark, table).select(
        F.explode(F.array_repeat(F.col("key"), F.col("count"))).alias(column)
    )
    return frame
