"""Keyed state: per-partition versions, one per micro-batch, on any ``pyarrow.fs`` filesystem."""

from .store import KeyedStateStore, StatefulBatchFunction

__all__ = ["KeyedStateStore", "StatefulBatchFunction"]
