"""The key-placement strategies of the Trilink paper (§4.2.1), beside Spark's hash as the baseline,
the one catalogue of them, their evaluation, the balance metrics, their persistence, and the
key handling and hashes they share (Spark's Murmur3, Kafka's murmur2).

The strategy classes, :func:`partition_balance` and :func:`evaluate_strategies` are also at
the top level (``tl.HashPartitioner``); the rest live here.

Examples
--------
>>> from trilink_spark.partitioners import balance_degree, keyed_bound
>>> balance_degree([50, 100])
0.5
>>> keyed_bound({"a": 3, "b": 1}, 2)
0.3333333333333333
"""

from .balance import BalanceReport, balance_degree, extra_compute_time, keyed_bound
from .balance import partition_balance
from .base import Partitioner, resolve_strategy_name, strategy_class, strategy_names
from .block import BlockPartitioner
from .evaluation import CANDIDATES, StrategyScore, choose_best, evaluate_strategies
from .hash import HashPartitioner
from .kafka_hash import kafka_default_partition, kafka_murmur2
from .least import LeastCountPartitioner, LeastKeyPartitioner
from .modulo import ModuloPartitioner
from .overlay import OverlayPartitioner
from .refit import moved_units, rebalance_minimal
from .table import TablePartitioner
from .weight import WeightPartitioner

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
