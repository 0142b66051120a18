"""The key-placement strategies of the Trilink paper (§4.2.1), beside Spark's hash as the baseline,
the one catalogue of them, their evaluation and their persistence."""

from .base import Partitioner, resolve_strategy_name, strategy_class, strategy_names
from .block import BlockPartitioner
from .hash import HashPartitioner
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
]
