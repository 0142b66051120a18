"""Merging partial aggregates: the aggregate algebra, Local Merge, Global Merge and its stores."""

from .aggregates import AGGREGATES, Combine
from .partials import merge_partials
from .bounds import MERGE_MODES
from .engine import MERGE_ENGINES, EnginePlan, MergeEnginePlan
from .local import explain_local_merge, local_merge
from .stream import LocalMergeBatchFunction, local_merge_foreach_batch
from .redis_store import RedisStore
from .global_merge import GLOBAL_STORES, explain_global_merge, global_merge

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
