"""Merging partial aggregates: the aggregate algebra, Local Merge, Global Merge and its stores.

The rooms, bottom to top (each imports only the rooms below it): :mod:`.algebra` (the one
aggregate algebra), :mod:`.engines` (Local Merge and its engines), :mod:`.stores` (Global
Merge and ``RedisStore``). The module paths of 0.x (``merge.aggregates``, ``merge.local``,
``merge.redis_store``, ...) still resolve, each name with a :class:`DeprecationWarning` naming
its home, until the next minor release; ``merge.global_merge`` is the function, as it always
was at this package's top (its module is :mod:`.stores.global_merge`).
"""

from types import ModuleType
from typing import Any

from .._internal.deprecation import ModuleShims

from .algebra.aggregates import AGGREGATES, Combine
from .algebra.partials import merge_partials
from .engines.bounds import MERGE_MODES
from .engines.engine import MERGE_ENGINES, EnginePlan, MergeEnginePlan
from .engines.local import explain_local_merge, local_merge
from .engines.stream import LocalMergeBatchFunction, local_merge_foreach_batch
from .stores.redis_store import RedisStore
from .stores.global_merge import GLOBAL_STORES, explain_global_merge, global_merge

__all__ = [
    "AGGREGATES",
    "Combine",
    "merge_partials",
    "MERGE_MODES",
    "local_merge",
    "explain_local_merge",
    "EnginePlan",
    "MergeEnginePlan",
    "MERGE_ENGINES",
    "LocalMergeBatchFunction",
    "local_merge_foreach_batch",
    "RedisStore",
    "GLOBAL_STORES",
    "global_merge",
    "explain_global_merge",
]

from . import algebra, engines, stores  # noqa: E402  (homes of the shims below)

#: The module paths this package had before its rooms, and the modules now holding their
#: names.
_HOMES: dict[str, ModuleType] = {
    "aggregates": algebra.aggregates, "kernels": algebra.kernels,
    "expressions": algebra.expressions, "partials": algebra.partials,
    "bounds": engines.bounds, "plan": engines.plan, "engine": engines.engine,
    "spark_engine": engines.spark_engine, "pandas_engine": engines.pandas_engine,
    "arrow_engine": engines.arrow_engine, "local": engines.local, "stream": engines.stream,
    "redis_store": stores.redis_store,
}
MOVED_MODULES: dict[str, tuple[ModuleType, ...]] = {
    f"{__name__}.{old}": (home,) for old, home in _HOMES.items()}
SHIMS = ModuleShims(MOVED_MODULES).install()


def __getattr__(name: str) -> Any:
    """A module path of :data:`MOVED_MODULES` read as an attribute of this package."""
    if f"{__name__}.{name}" in MOVED_MODULES:
        return SHIMS.module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
