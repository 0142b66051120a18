"""The key-placement strategies of the Trilink paper (§4.2.1), beside Spark's hash as the baseline,
the one catalogue of them, their evaluation and their persistence."""

from .base import Partitioner, resolve_strategy_name, strategy_class, strategy_names
from .hash import HashPartitioner
from .least import LeastCountPartitioner, LeastKeyPartitioner
from .modulo import ModuloPartitioner
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
    "resolve_strategy_name",
    "strategy_class",
    "strategy_names",
]
