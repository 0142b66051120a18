"""The key-placement strategies of the Trilink paper (§4.2.1), beside Spark's hash as the baseline,
the one catalogue of them, their evaluation, the balance metrics, their persistence, and the
key handling and hashes they share (Spark's Murmur3, Kafka's murmur2).

The strategy classes, :func:`partition_balance` and :func:`evaluate_strategies` are also at
the top level (``tl.HashPartitioner``); the rest live here, in three rooms: ``core`` (keys,
hashes, the base class, balance metrics, the stateless strategies), ``tables`` (the table
strategies and the overlay) and ``choosing`` (the catalogue, evaluation, scenarios, refit).
A module's path before the rooms (``trilink_spark.partitioners.table``) still resolves, each
name read there with a :class:`DeprecationWarning` naming its home, until the next minor
release.

Examples
--------
>>> from trilink_spark.partitioners import balance_degree, keyed_bound
>>> balance_degree([50, 100])
0.5
>>> keyed_bound({"a": 3, "b": 1}, 2)
0.3333333333333333
"""

from types import ModuleType
from typing import Any

from .._internal.deprecation import ModuleShims
from .core.balance import BalanceReport, balance_degree, extra_compute_time, keyed_bound
from .core.balance import partition_balance
from .core.base import Partitioner, resolve_strategy_name, strategy_class, strategy_names
from .core.block import BlockPartitioner
from .choosing.evaluation import CANDIDATES, StrategyScore, choose_best, evaluate_strategies
from .core.hash import HashPartitioner
from .core.kafka_hash import kafka_default_partition, kafka_murmur2
from .tables.least import LeastCountPartitioner, LeastKeyPartitioner
from .core.modulo import ModuloPartitioner
from .tables.overlay import OverlayPartitioner
from .choosing.refit import moved_units, rebalance_minimal
from .tables.table import TablePartitioner
from .tables.weight import WeightPartitioner

__all__ = [
    "Partitioner",
    "TablePartitioner",
    "HashPartitioner",
    "ModuloPartitioner",
    "LeastKeyPartitioner",
    "LeastCountPartitioner",
    "WeightPartitioner",
    "BlockPartitioner",
    "OverlayPartitioner",
    "rebalance_minimal",
    "moved_units",
    "resolve_strategy_name",
    "strategy_class",
    "strategy_names",
    "balance_degree",
    "extra_compute_time",
    "keyed_bound",
    "BalanceReport",
    "partition_balance",
    "StrategyScore",
    "evaluate_strategies",
    "choose_best",
    "CANDIDATES",
    "kafka_murmur2",
    "kafka_default_partition",
]


from . import choosing, core, tables  # noqa: E402  (homes of the shims below)
from .choosing import catalogue, scenarios  # noqa: E402  (every module of a room loaded)
from .core import persistence, spark_hash  # noqa: E402

del catalogue, scenarios, persistence, spark_hash  # reached through their rooms

#: The module paths this package had before its rooms, and the modules now holding their names.
MOVED_MODULES: dict[str, tuple[ModuleType, ...]] = {
    f"{__name__}.{name}": (getattr(room, name),) for room, names in (
    (core, ("keys", "spark_hash", "kafka_hash", "balance", "base", "persistence", "hash",
            "modulo", "block")),
    (tables, ("table", "least", "weight", "overlay")),
    (choosing, ("refit", "catalogue", "evaluation", "scenarios")),
) for name in names}
SHIMS = ModuleShims(MOVED_MODULES).install()


def __getattr__(name: str) -> Any:
    """The module paths of :data:`MOVED_MODULES` (before the rooms): each still resolves,
    its names with a :class:`DeprecationWarning` naming their home, until the next minor
    release removes them."""
    if f"{__name__}.{name}" in MOVED_MODULES:
        return SHIMS.module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
