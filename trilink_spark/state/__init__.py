"""Keyed state: per-partition versions, one per micro-batch, on any ``pyarrow.fs`` filesystem."""

from typing import Any

from .._internal.deprecation import ModuleShims
from . import foreach
from .foreach import StatefulBatchFunction
from .store import KeyedStateStore

__all__ = ["KeyedStateStore", "StatefulBatchFunction"]

#: ``trilink_spark.state.batch`` (the base of the stateful ``foreachBatch`` callables) is
#: :mod:`.foreach` now; the old path resolves, each name with a DeprecationWarning, until the
#: next minor release.
SHIMS = ModuleShims({f"{__name__}.batch": (foreach,)}).install()


def __getattr__(name: str) -> Any:
    """``trilink_spark.state.batch`` read as an attribute (module docs of :data:`SHIMS`)."""
    if name == "batch":
        return SHIMS.module(f"{__name__}.batch")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
