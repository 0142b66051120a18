"""Keyed state: per-partition versions, one per micro-batch, on any ``pyarrow.fs`` filesystem."""

from .batch import StatefulBatchFunction
from .store import KeyedStateStore

__all__ = ["KeyedStateStore", "StatefulBatchFunction"]
